"""Runs the coroutines of ``async def`` user functions on an asyncio loop.

The operator actor uses it on its event loop, the test harness on a private one.

Threading model: ``submit`` and the cancel it returns run on the loop's thread (the mailbox
thread); ``on_done`` is called on that loop.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Callable

from .request_keys import CURRENT_REQUEST, RequestKey

__all__ = ["AsyncioCoroutineRunner"]


class AsyncioCoroutineRunner:
    """Runs coroutines as tasks on one asyncio loop (the actor's, or the harness's own)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        # A loop without a task factory (Ray's, asyncio's own) makes an asyncio.Task in
        # create_task and nothing more (but in debug mode): made here directly, a request saves
        # create_task's own checks. A loop with a factory, or in debug mode, keeps its way.
        self._new_task: Callable[[Any], asyncio.Task[Any]] = loop.create_task
        if loop.get_task_factory() is None and not loop.get_debug() and type(loop).create_task is asyncio.BaseEventLoop.create_task:
            self._new_task = functools.partial(asyncio.Task, loop=loop)

    def submit(
        self, coro: Any, on_done: Callable[[Any, BaseException | None], None], key: RequestKey | None = None,
    ) -> Callable[[], Any]:
        """Run ``coro``; ``on_done(result, error)`` gets its outcome. Returns what cancels it.

        ``key``: the record's idempotency key, which the coroutine then sees as its request's.
        """
        # Reporting from inside the task saves the loop round of a done-callback per request.
        # The task copies the current context, so the coroutine keeps the idempotency key of the
        # request that submitted it while other requests run; ``key`` is set in that copy.
        return self._new_task(_report(coro, on_done, key)).cancel


async def _report(coro: Any, on_done: Callable[[Any, BaseException | None], None], key: RequestKey | None) -> None:
    if key is not None:
        # In the task's own copy of the context, which ends with it: nothing to reset, and one
        # change of the context a request instead of a set and a reset around the submit.
        CURRENT_REQUEST.set((key, None))
    try:
        result = await coro
    except asyncio.CancelledError:
        raise  # its attempt was abandoned: nobody listens
    except Exception as error:
        on_done(None, error)
    else:
        on_done(result, None)
