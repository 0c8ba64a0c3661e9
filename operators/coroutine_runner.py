"""Runs the coroutines of ``async def`` user functions on an asyncio loop.

The operator actor uses it on its event loop, the test harness on a private one.

Threading model: ``submit`` and the cancel it returns run on the loop's thread (the mailbox
thread); ``on_done`` is called on that loop.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

__all__ = ["AsyncioCoroutineRunner"]


class AsyncioCoroutineRunner:
    """Runs coroutines as tasks on one asyncio loop (the actor's, or the harness's own)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def submit(self, coro: Any, on_done: Callable[[Any, BaseException | None], None]) -> Callable[[], Any]:
        """Run ``coro``; ``on_done(result, error)`` gets its outcome. Returns what cancels it."""
        # Reporting from inside the task saves the loop round of a done-callback per request.
        # The task copies the current context (eagerly started or not), so the coroutine keeps
        # the idempotency key of the request that submitted it while other requests run.
        return self._loop.create_task(_report(coro, on_done)).cancel


async def _report(coro: Any, on_done: Callable[[Any, BaseException | None], None]) -> None:
    try:
        result = await coro
    except asyncio.CancelledError:
        raise  # its attempt was abandoned: nobody listens
    except Exception as error:
        on_done(None, error)
    else:
        on_done(result, None)
