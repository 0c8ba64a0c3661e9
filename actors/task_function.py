"""Blocking user functions, run as Ray tasks: micro-batched, streamed back per record, bounded.

A Ray task costs about a millisecond, so one task per record would cap throughput far below
what an I/O-bound function allows. ``RayTaskFunction`` groups requests into a task, runs the
blocking calls of that task concurrently on a thread pool inside the worker, and streams the
results back as they finish: the task is a Ray streaming generator that yields the outcomes that
completed since its last yield (coalesced over ``_COALESCE_S``, so a batch of calls that finish
together costs one yield, not one each). Each record therefore keeps its own deadline and its own
outcome: a slow call times out alone, and the rows of its task that finished in time keep their
results.

The async operator's ``capacity`` bounds the requests in flight; ``max_tasks`` bounds the tasks
that are busy. A task stops counting as busy once no more than a quarter of its records wait
(stragglers, hung calls that will time out): a hung thread left in the worker costs nothing, and
the records queued behind it must not miss their own deadlines waiting for its slot. Once every
record of a task has an outcome (a result, or an abandoned attempt after a timeout), the actor
stops reading the task's stream.

Batching policy: a task leaves as soon as it is full (``ceil(capacity / max_tasks)`` requests),
or ``linger_ms`` after its first request. When a task returns, its results free slots one
mailbox round at a time; without the linger, the next task would leave with the few requests
of the first round, and the tasks would shrink until a handful of records shared ``max_tasks``.

Start-up: ``open()`` sends ``max_tasks`` empty tasks, so that the worker processes start while
the pipeline does, instead of under the first requests.

Idempotency keys: each call travels with the keys of its future (a record's, or a batch's), and
runs in the worker with them as the current request's, so ``current_request_key()`` (or
``current_request_keys()``) answers inside a blocking function as it does in a coroutine.
"""

from __future__ import annotations

import asyncio
import math
import os
import tempfile
import threading
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable, Iterator

import ray

from actorflow.operators.async_function import AsyncFunction, ResultFuture
from actorflow.operators.errors import ConfigurationError
from actorflow.operators.request_keys import call_in_request

__all__ = ["RayTaskFunction", "ran_tasks", "run_calls", "task_workers_dir", "worker_mark"]

# Outcomes that complete within this window of each other leave the worker in one yield.
_COALESCE_S = 0.002

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None

Outcome = tuple[int, bool, Any]  # (index in the task, succeeded, result or exception)
RequestKeys = tuple[str | None, list[str] | None]  # (a record's key, a batch's keys) of one call


def _worker_pool() -> ThreadPoolExecutor:
    # One pool per worker process, reused by every task that lands there.
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1024, thread_name_prefix="actorflow-blocking")
            _mark_task_worker()
        return _pool


def task_workers_dir() -> Path:
    """Where each worker process that ran blocking calls leaves a file named by ``worker_mark``."""
    return Path(tempfile.gettempdir()) / "actorflow-task-workers"


def worker_mark(pid: int, created: float) -> str:
    """The name of the mark of process ``pid`` started at ``created`` (``psutil``'s create time).

    A pid alone would not do: pids wrap around (at 32,768 on many machines, threads included),
    and a new worker that got a dead one's pid would pass for a worker that ran blocking calls.

    >>> worker_mark(4242, 1764262800.123456)
    '4242-1764262800.12'
    """
    return f"{pid}-{created:.2f}"


def ran_tasks(mark: str) -> bool:
    """Whether the worker process of ``mark`` (``worker_mark``) has run blocking calls: Ray does
    not start an actor in such a process, while it looks as idle as a fresh one."""
    return (task_workers_dir() / mark).exists()


def _mark_task_worker() -> None:
    import psutil

    try:
        task_workers_dir().mkdir(exist_ok=True)
        (task_workers_dir() / worker_mark(os.getpid(), psutil.Process().create_time())).touch()
    except (OSError, psutil.Error):  # the mark only saves processes: without it, more are prestarted
        pass


def run_calls(
    fn: Callable[[Any], Any], values: list[Any], keys: list[RequestKeys] | None = None
) -> Iterator[list[Outcome]]:
    """Run ``fn`` on every value concurrently; yield the outcomes as they complete.

    Each yield is a list of ``(index, True, result)`` or ``(index, False, exception)``; every
    index appears exactly once over all yields. An exception is reported for its record, never
    as a failed task. ``keys[i]`` are the idempotency keys of call ``i``: its thread serves it
    with them as the current request's.
    """
    pool = _worker_pool()
    futures: dict[Future[Any], int] = {}
    for i, (value, (key, batch_keys)) in enumerate(zip(values, keys or [(None, None)] * len(values), strict=True)):
        futures[pool.submit(call_in_request, key, batch_keys, fn, value)] = i
    pending = set(futures)
    while pending:
        done, pending = wait(pending, return_when=FIRST_COMPLETED)
        if pending:
            more, pending = wait(pending, timeout=_COALESCE_S)
            done |= more
        chunk: list[Outcome] = []
        for future in done:
            error = future.exception()
            chunk.append((futures[future], False, error) if error is not None else (futures[future], True, future.result()))
        yield chunk


class RayTaskFunction(AsyncFunction):
    """Runs ``fn(value) -> list`` (blocking) in Ray tasks.

    ``max_tasks`` tasks run at once per operator instance; each carries up to
    ``ceil(capacity / max_tasks)`` requests.

    Threading model: every method runs on the operator actor's event loop (the mailbox thread).
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
        self._tasks: set[asyncio.Task[None]] = set()

    def open(self, context: Any) -> None:
        self._loop = asyncio.get_running_loop()
        self._fn_ref = ray.put(self.fn)
        self._remote = ray.remote(run_calls).options(
            num_cpus=self.num_cpus, name=f"{context.name}/blocking", num_returns="streaming"
        )
        self._name = context.name
        self._executor = context.mailbox_executor
        for _ in range(self.max_tasks):
            self._remote.remote(self._fn_ref, [])  # warm-up: start the workers now

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in list(self._tasks):
            task.cancel()

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
            keys = [(f.idempotency_key, f.idempotency_keys) for _, f in batch]
            generator = self._remote.remote(self._fn_ref, [v for v, _ in batch], keys)
            task = self._loop.create_task(self._consume(generator, [f for _, f in batch]))
            self._tasks.add(task)
            task.add_done_callback(self._task_done)

    def _task_done(self, task: "asyncio.Task[None]") -> None:
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()

        def rethrow() -> None:  # fails the operator on its mailbox thread, naming the cause
            raise error  # type: ignore[misc]

        self._executor.execute(rethrow, f"{self._name}: blocking task bookkeeping failed")

    async def _consume(self, generator: Any, futures: list[ResultFuture]) -> None:
        size = len(futures)
        settled = [False] * size
        unsettled = size
        active = True
        all_settled = asyncio.Event()

        def settle(index: int) -> None:
            # A task holds a slot only while a real share of its records waits: once no more
            # than a quarter are left (stragglers, hung calls), the next task may leave.
            nonlocal unsettled, active
            if settled[index]:
                return
            settled[index] = True
            unsettled -= 1
            if active and unsettled * 4 <= size:
                active = False
                self._release()
            if unsettled == 0:
                all_settled.set()

        def settle_later(index: int) -> Callable[[], None]:
            def hook() -> None:
                self._loop.call_soon(settle, index)

            return hook

        for index, future in enumerate(futures):
            # A record that times out abandons its future: it is settled, without waiting for
            # the hung call behind it.
            future.add_cancel_hook(settle_later(index))
        reader = self._loop.create_task(self._read(generator, futures, settle))
        waiter = self._loop.create_task(all_settled.wait())
        try:
            await asyncio.wait({reader, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if active:
                active = False
                self._release()
            if not reader.done():
                # Stop reading; the task ends on its own when its last call returns. Never
                # ray.cancel() it: in Ray 2.50 a cancel that races with the task's completion
                # trips a check in the caller's core worker and kills the actor
                # ("Tried to complete task that was not pending").
                reader.cancel()
            waiter.cancel()
        if reader.done() and not reader.cancelled() and reader.exception() is not None:
            raise reader.exception()  # type: ignore[misc]

    def _release(self) -> None:
        self._running -= 1
        # A full batch leaves now; a partial one gets the linger to fill up.
        if len(self._pending) >= self.max_batch:
            self._launch()
        elif self._pending and self._timer is None:
            self._timer = self._loop.call_later(self.linger_s, self._launch)

    async def _read(self, generator: Any, futures: list[ResultFuture], settle: Callable[[int], None]) -> None:
        try:
            async for ref in generator:
                for index, ok, payload in await ref:
                    if ok:
                        futures[index].complete(payload)
                    else:
                        futures[index].complete_exceptionally(payload)
                    settle(index)
        except Exception as error:  # the task itself failed (its worker died): the rest fail
            for index, future in enumerate(futures):
                future.complete_exceptionally(error)  # no effect on those already complete
                settle(index)
