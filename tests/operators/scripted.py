"""A scripted async function: the test decides when and how each request completes."""

from __future__ import annotations

from typing import Any

from actorflow.operators import AsyncBatchFunction, AsyncFunction, ResultFuture


def _key(value: Any) -> Any:
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)


class Scripted(AsyncFunction):
    """Records every request; the test completes them by value.

    ``calls`` lists ``(value, attempt_number)`` in the order requests started.
    """

    def __init__(self, fallback: Any = None) -> None:
        self.pending: dict[Any, list[ResultFuture]] = {}
        self.calls: list[tuple[Any, int]] = []
        self.timeouts: list[Any] = []
        self.fallback = fallback

    def async_invoke(self, value: Any, result_future: ResultFuture) -> None:
        futures = self.pending.setdefault(_key(value), [])
        futures.append(result_future)
        self.calls.append((value, sum(1 for v, _ in self.calls if v == value) + 1))

    def timeout(self, value: Any, result_future: ResultFuture) -> None:
        self.timeouts.append(value)
        if self.fallback is None:
            super().timeout(value, result_future)
        else:
            result_future.complete([self.fallback(value)])

    def complete(self, value: Any, results: list[Any] | None = None) -> None:
        """Complete the newest request for ``value`` (default result: ``[value]``)."""
        self.pending[_key(value)][-1].complete([value] if results is None else results)

    def fail(self, value: Any, error: BaseException) -> None:
        self.pending[_key(value)][-1].complete_exceptionally(error)

    def in_flight(self) -> list[Any]:
        return [v for v, fs in self.pending.items() if fs and not fs[-1].done]

    def future(self, value: Any, attempt: int = 1) -> ResultFuture:
        return self.pending[_key(value)][attempt - 1]


class Immediate(AsyncFunction):
    """Completes every request at once with ``fn(value)``."""

    def __init__(self, fn: Any = lambda v: [v]) -> None:
        self.fn = fn

    def async_invoke(self, value: Any, result_future: ResultFuture) -> None:
        result_future.complete(self.fn(value))


class ScriptedBatch(AsyncBatchFunction):
    """Records every batch request; the test completes them by position.

    ``calls`` lists ``(values, attempt_of_that_batch)`` in the order requests started; a retry
    is recognised by its values (the same list as an earlier call).
    """

    def __init__(self, fallback: Any = None) -> None:
        self.calls: list[tuple[list[Any], int]] = []
        self.futures: list[ResultFuture] = []
        self.timeouts: list[list[Any]] = []
        self.fallback = fallback

    def async_invoke_batch(self, values: list[Any], result_future: ResultFuture) -> None:
        attempt = 1 + sum(1 for v, _ in self.calls if v == values)
        self.calls.append((list(values), attempt))
        self.futures.append(result_future)

    def timeout_batch(self, values: list[Any], result_future: ResultFuture) -> None:
        self.timeouts.append(list(values))
        if self.fallback is None:
            super().timeout_batch(values, result_future)
        else:
            result_future.complete([[self.fallback(v)] for v in values])

    def in_flight(self) -> list[int]:
        """Positions (in ``calls``) of the requests not yet completed."""
        return [i for i, f in enumerate(self.futures) if not f.done]

    def complete(self, i: int, results: list[list[Any]] | None = None) -> None:
        values = self.calls[i][0]
        self.futures[i].complete([[v] for v in values] if results is None else results)

    def fail(self, i: int, error: BaseException) -> None:
        self.futures[i].complete_exceptionally(error)

    def batches(self) -> list[list[Any]]:
        return [v for v, _ in self.calls]
