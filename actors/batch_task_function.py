"""Batch functions on the operator actor: which kind a user's function is, and how it runs.

``async_map_batch`` accepts four kinds of function, each called with the values of one batch and
returning one result list per value:

=================  ==========================================================================
``coroutine``      ``async def f(values)``: a coroutine on the actor's loop
``blocking``       ``def f(values)``: one Ray task per batch, awaited from the actor's loop
``batch_function`` an ``AsyncBatchFunction`` (or an object with ``async_invoke_batch``)
``arrow_*``        ``arrow_batch(f)``, ``f(pa.Table) -> pa.Table``: the rows go in as one table,
                   as a coroutine (``arrow_coroutine``) or in a Ray task (``arrow_blocking``,
                   where the conversions run too, off the actor's loop)
=================  ==========================================================================

A blocking batch never runs on the actor's thread, which is the mailbox thread: it would stop
every mail (timers, results, input) for as long as it runs. Its task streams its outcome back
(``RayTaskFunction`` with one batch per task), and the actor awaits it; no ``ray.get``. The
operator bounds the batches in flight to ``capacity``; a batch whose deadline passes is
abandoned (its task is cancelled if it still runs, and a late result is ignored) and its
records get the fallback or fail, each on its own. The batch's idempotency keys travel with it:
in the task, ``current_request_keys()`` gives them, one per value.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from actorflow.operators.arrow_batch import ArrowBatchFunction
from actorflow.operators.async_batch_function import AsyncBatchFunction, as_async_batch_function
from actorflow.operators.async_function import ResultFuture
from actorflow.operators.errors import ConfigurationError, describe_value

from .task_function import RayTaskFunction

__all__ = ["RayBatchTaskFunction", "batch_function_kind", "make_batch_function"]


class RayBatchTaskFunction(AsyncBatchFunction):
    """Runs a blocking ``fn(values) -> list[list]`` as one Ray task per batch.

    ``capacity`` tasks may run at once per operator instance (the operator sends no more batches
    than that). Threading model: every method runs on the operator actor's event loop.
    """

    def __init__(self, fn: Callable[[list[Any]], Any], *, capacity: int, num_cpus: float = 0.0) -> None:
        if not callable(fn):
            raise ConfigurationError(f"expected a blocking function of a batch's values, got {type(fn).__name__}")
        if not isinstance(capacity, int) or capacity <= 0:
            raise ConfigurationError(f"capacity (batches in flight) must be > 0, got {capacity!r}")
        # One request per task: each request is a whole batch, and leaves at once (no linger).
        self._tasks = RayTaskFunction(fn, capacity=capacity, max_tasks=capacity, num_cpus=num_cpus, linger_ms=0.0)

    def open(self, context: Any) -> None:
        self._tasks.open(context)

    def async_invoke_batch(self, values: list[Any], result_future: ResultFuture) -> None:
        self._tasks.async_invoke(values, result_future)

    def close(self) -> None:
        self._tasks.close()


def _is_coroutine(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def batch_function_kind(fn: Any) -> str:
    """``coroutine``, ``blocking``, ``batch_function``, ``arrow_coroutine`` or ``arrow_blocking``.

    Raises ``ConfigurationError`` for anything else, at construction.

    >>> async def score(values):
    ...     return [[v] for v in values]
    >>> batch_function_kind(score), batch_function_kind(lambda values: values)
    ('coroutine', 'blocking')
    """
    if inspect.isclass(fn):
        raise ConfigurationError(
            f"async_map_batch() needs a function or an instance, got the class {fn.__name__}; expected {fn.__name__}()"
        )
    if isinstance(fn, ArrowBatchFunction):
        return "arrow_coroutine" if fn.is_coroutine else "arrow_blocking"
    if isinstance(fn, AsyncBatchFunction) or hasattr(fn, "async_invoke_batch"):
        as_async_batch_function(fn)  # its signature is checked now, not at the first batch
        return "batch_function"
    if inspect.isasyncgenfunction(fn) or inspect.isasyncgenfunction(getattr(fn, "__call__", None)):
        as_async_batch_function(fn)  # raises, naming the async generator
    if _is_coroutine(fn):
        return "coroutine"
    if callable(fn):
        return "blocking"
    raise ConfigurationError(
        "async_map_batch() needs an async def f(values), a blocking def f(values), an AsyncBatchFunction "
        f"or arrow_batch(f); got {type(fn).__name__}: {describe_value(fn)}"
    )


def make_batch_function(fn: Any, *, capacity: int) -> AsyncBatchFunction:
    """The ``AsyncBatchFunction`` that runs ``fn`` on the operator actor (see the module docstring)."""
    kind = batch_function_kind(fn)
    if kind.startswith("arrow_"):
        fn = fn.rows_function()
    if kind in ("blocking", "arrow_blocking"):
        return RayBatchTaskFunction(fn, capacity=capacity)
    return as_async_batch_function(fn)
