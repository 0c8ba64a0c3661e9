"""Blocking user functions, run as Ray tasks: micro-batched, awaited, bounded.

A Ray task costs about a millisecond, so one task per record would cap throughput far below
what an I/O-bound function allows. ``RayTaskFunction`` groups requests into a task, runs the
blocking calls of that task concurrently on a thread pool inside the worker, and awaits the
task's ``ObjectRef`` on the actor's loop. The async operator's ``capacity`` bounds the requests
in flight; ``max_tasks`` bounds the tasks.

Batching policy: a task leaves as soon as it is full (``ceil(capacity / max_tasks)`` requests),
or ``linger_ms`` after its first request. When a task returns, its results free slots one
mailbox round at a time; without the linger, the next task would leave with the few requests
of the first round, and the tasks would shrink until a handful of records shared ``max_tasks``.

Start-up: ``open()`` sends ``max_tasks`` empty tasks, so that the worker processes start while
the pipeline does, instead of under the first requests.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import ray

from operators.async_function import AsyncFunction, ResultFuture
from operators.errors import ConfigurationError

__all__ = ["RayTaskFunction"]

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def _worker_pool() -> ThreadPoolExecutor:
    # One pool per worker process, reused by every task that lands there.
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1024, thread_name_prefix="actorflow-blocking")
        return _pool


def _run_batch(fn: Callable[[Any], Any], values: list[Any]) -> list[tuple[bool, Any]]:
    """Run ``fn`` on every value concurrently; ``(True, result)`` or ``(False, exception)`` each."""
    futures = [_worker_pool().submit(fn, v) for v in values]
    out: list[tuple[bool, Any]] = []
    for f in futures:
        try:
            out.append((True, f.result()))
        except Exception as error:  # reported per record, never as a failed task
            out.append((False, error))
    return out


class RayTaskFunction(AsyncFunction):
    """Runs ``fn(value) -> list`` (blocking) in Ray tasks.

    ``max_tasks`` tasks run at once per operator instance; each carries up to
    ``ceil(capacity / max_tasks)`` requests.
    """

    def __init__(
        self,
        fn: Callable[[Any], Any],
        *,
        capacity: int,
        max_tasks: int = 2,
        num_cpus: float = 0.0,
        linger_ms: float = 2.0,
    ) -> None:
        if not callable(fn):
            raise ConfigurationError(f"expected a callable, got {type(fn).__name__}")
        if max_tasks < 1:
            raise ConfigurationError(f"max_tasks must be >= 1, got {max_tasks}")
        if linger_ms < 0:
            raise ConfigurationError(f"linger_ms must be >= 0, got {linger_ms}")
        self.fn = fn
        self.max_tasks = max_tasks
        self.max_batch = max(1, math.ceil(capacity / max_tasks))
        self.num_cpus = num_cpus
        self.linger_s = linger_ms / 1000.0
        self._pending: deque[tuple[Any, ResultFuture]] = deque()
        self._running = 0
        self._timer: asyncio.TimerHandle | None = None

    def open(self, context: Any) -> None:
        self._loop = asyncio.get_running_loop()
        self._fn_ref = ray.put(self.fn)
        self._remote = ray.remote(_run_batch).options(num_cpus=self.num_cpus, name=f"{context.name}/blocking")
        self._name = context.name
        for _ in range(self.max_tasks):
            self._remote.remote(self._fn_ref, [])  # warm-up: start the workers now

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def async_invoke(self, value: Any, result_future: ResultFuture) -> None:
        self._pending.append((value, result_future))
        if len(self._pending) >= self.max_batch:
            self._launch()
        elif self._timer is None:
            self._timer = self._loop.call_later(self.linger_s, self._launch)

    def _launch(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._pending and self._running < self.max_tasks:
            batch = [self._pending.popleft() for _ in range(min(self.max_batch, len(self._pending)))]
            batch = [(v, f) for v, f in batch if not f.done]  # abandoned after a timeout
            if not batch:
                continue
            self._running += 1
            ref = self._remote.remote(self._fn_ref, [v for v, _ in batch])
            self._loop.create_task(self._await(ref, [f for _, f in batch]))

    async def _await(self, ref: Any, futures: list[ResultFuture]) -> None:
        try:
            outcomes = await ref
        except Exception as error:  # the task itself failed (worker died): every request fails
            outcomes = [(False, error)] * len(futures)
        finally:
            self._running -= 1
        for (ok, payload), future in zip(outcomes, futures):
            if ok:
                future.complete(payload)
            else:
                future.complete_exceptionally(payload)
        # A full batch leaves now; a partial one gets the linger to fill up.
        if len(self._pending) >= self.max_batch:
            self._launch()
        elif self._pending and self._timer is None:
            self._timer = self._loop.call_later(self.linger_s, self._launch)
