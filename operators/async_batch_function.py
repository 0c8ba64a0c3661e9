"""The user's side of batched async calls: one request serves a list of records.

A batch function gets the values of a batch, in input order, and completes its ``ResultFuture``
with one result list per value (a list of lists, of the same length)::

    class Score(AsyncBatchFunction):
        def async_invoke_batch(self, values, result_future):
            result_future.complete([[model(v)] for v in values])

An ``async def f(values) -> list[list]`` is accepted too, and so is any object with an
``async_invoke_batch(values, result_future)`` method (an ``async def`` one included). That method
is the plug: the Ray shell can pass a function that runs the batch as Ray tasks, or one that
builds an Arrow table from the values and calls a vectorised model.

>>> async def score(values):
...     return [[len(v)] for v in values]
>>> as_async_batch_function(score).__class__.__name__
'CoroutineBatchFunction'
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

from .async_function import ResultFuture, errors_only, reject_async_generator
from .errors import AsyncTimeoutError, ConfigurationError, describe_value

_BATCH_EXPECTED = "an async def that returns one result list per value"

__all__ = ["AsyncBatchFunction", "CoroutineBatchFunction", "FallbackOnBatchTimeout", "as_async_batch_function"]


class AsyncBatchFunction:
    """A request per batch, completed through its ``ResultFuture`` with one list per value.

    ``timeout_batch`` runs when a batch's deadline passes; by default every record of the batch
    fails with ``AsyncTimeoutError``. Override it to complete with fallbacks instead.
    """

    def open(self, context: Any) -> None:
        pass

    def async_invoke_batch(self, values: list[Any], result_future: ResultFuture) -> None:
        raise NotImplementedError

    def timeout_batch(self, values: list[Any], result_future: ResultFuture) -> None:
        result_future.complete_exceptionally(
            AsyncTimeoutError(
                f"async batch request timed out for {len(values)} record(s), the first {describe_value(values[:1])}",
            )
        )

    def close(self) -> None:
        pass


class CoroutineBatchFunction(AsyncBatchFunction):
    """Runs ``async def fn(values) -> list[list]`` on the operator's coroutine runner.

    Also adapts an object whose ``async_invoke_batch`` is an ``async def`` taking ``(values)``
    (its return value completes the batch) or ``(values, result_future)`` (it completes the
    future itself). A timeout cancels the coroutine.
    """

    def __init__(self, fn: Callable[..., Any], *, takes_future: bool = False, owner: Any = None) -> None:
        if not inspect.iscoroutinefunction(fn) and not inspect.iscoroutinefunction(getattr(fn, "__call__", None)):
            raise ConfigurationError(f"expected an async def batch function, got {describe_value(fn)}")
        self.fn = fn
        self._takes_future = takes_future
        self._owner = owner
        self._runner: Any = None

    def open(self, context: Any) -> None:
        runner = getattr(context, "coroutine_runner", None)
        if runner is None:
            raise ConfigurationError("an async def batch function needs a coroutine runner in the operator context, got none")
        self._runner = runner
        if self._owner is not None and hasattr(self._owner, "open"):
            self._owner.open(context)

    def async_invoke_batch(self, values: list[Any], result_future: ResultFuture) -> None:
        if self._takes_future:
            coro, on_done = self.fn(values, result_future), errors_only(result_future)
        else:
            coro, on_done = self.fn(values), result_future.settle
        result_future.add_cancel_hook(self._runner.submit(coro, on_done))

    def timeout_batch(self, values: list[Any], result_future: ResultFuture) -> None:
        owner_timeout = getattr(self._owner, "timeout_batch", None)
        if owner_timeout is not None:
            owner_timeout(values, result_future)
        else:
            super().timeout_batch(values, result_future)

    def close(self) -> None:
        if self._owner is not None and hasattr(self._owner, "close"):
            self._owner.close()


class FallbackOnBatchTimeout(AsyncBatchFunction):
    """Wraps a batch function so that a timeout completes each record with ``fallback(value)``."""

    def __init__(self, inner: AsyncBatchFunction, fallback: Callable[[Any], Sequence[Any]]) -> None:
        if not callable(fallback):
            raise ConfigurationError(f"fallback must be callable, got {type(fallback).__name__}")
        self.inner = inner
        self.fallback = fallback

    def open(self, context: Any) -> None:
        self.inner.open(context)

    def async_invoke_batch(self, values: list[Any], result_future: ResultFuture) -> None:
        self.inner.async_invoke_batch(values, result_future)

    def timeout_batch(self, values: list[Any], result_future: ResultFuture) -> None:
        result_future.complete([list(self.fallback(v)) for v in values])

    def close(self) -> None:
        self.inner.close()


class _DuckBatchFunction(AsyncBatchFunction):
    """Any object with a plain ``async_invoke_batch(values, result_future)``."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def open(self, context: Any) -> None:
        if hasattr(self.obj, "open"):
            self.obj.open(context)

    def async_invoke_batch(self, values: list[Any], result_future: ResultFuture) -> None:
        self.obj.async_invoke_batch(values, result_future)

    def timeout_batch(self, values: list[Any], result_future: ResultFuture) -> None:
        if hasattr(self.obj, "timeout_batch"):
            self.obj.timeout_batch(values, result_future)
        else:
            super().timeout_batch(values, result_future)

    def close(self) -> None:
        if hasattr(self.obj, "close"):
            self.obj.close()


def _positional_count(method: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return 2
    return sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def as_async_batch_function(fn: Any) -> AsyncBatchFunction:
    """Accept an ``AsyncBatchFunction``, an object with ``async_invoke_batch``, or an ``async def f(values)``."""
    method = getattr(fn, "async_invoke_batch", None)
    if method is not None:
        reject_async_generator(method, f"{type(fn).__name__}.async_invoke_batch", _BATCH_EXPECTED)
        if inspect.iscoroutinefunction(method):
            count = _positional_count(method)
            if count not in (1, 2):
                raise ConfigurationError(
                    f"async def async_invoke_batch must take (values) or (values, result_future), got {count} parameters"
                )
            return CoroutineBatchFunction(method, takes_future=count == 2, owner=fn)
        if isinstance(fn, AsyncBatchFunction):
            return fn
        return _DuckBatchFunction(fn)
    if callable(fn):
        reject_async_generator(fn, describe_value(fn), _BATCH_EXPECTED)
        return CoroutineBatchFunction(fn)
    raise ConfigurationError(
        f"expected an AsyncBatchFunction, an object with async_invoke_batch or an async def f(values), "
        f"got {type(fn).__name__}"
    )
