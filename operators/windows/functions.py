"""Window functions: incremental ``reduce`` and ``aggregate``, and the full-window ``process``.

- ``reduce(a, b) -> same type``: the window keeps one value, folded as elements arrive.
- An ``AggregateFunction`` keeps an accumulator: ``create_accumulator()``, ``add(value, acc)``,
  ``merge(a, b)`` (for merging windows) and ``get_result(acc)``.
- A ``process`` function sees the whole window at once: ``process(key, context, elements)``
  returns (or yields) the output values. Given together with ``reduce`` or ``aggregate``, it gets
  the single incremental result as ``elements``; alone, it gets every element of the window.

The built-in aggregations (``Count``, ``Sum``, ``Min``, ``Max``, ``Mean``, and ``Aggregations``
of several) are the ones the Arrow path can compute for a whole batch at once.

>>> agg = Aggregations(n=Count(), total=Sum("amount"), avg=Mean("amount"))
>>> acc = agg.create_accumulator()
>>> for v in ({"amount": 2}, {"amount": 4}):
...     acc = agg.add(v, acc)
>>> agg.get_result(acc)
{'n': 2, 'total': 6, 'avg': 3.0}
"""

from __future__ import annotations

from typing import Any, Iterable, Protocol

from ..errors import ConfigurationError

__all__ = [
    "AggregateFunction",
    "Aggregations",
    "BuiltinAggregate",
    "Count",
    "Max",
    "Mean",
    "Min",
    "ProcessWindowFunction",
    "Sum",
    "WindowContext",
]


class WindowContext(Protocol):
    """What a ``process`` function may use besides the elements.

    ``window_state`` is a dict kept per key and window (dropped when the window is cleaned up);
    ``global_state`` a dict kept per key across windows. Both are in snapshots.
    """

    key: Any
    window: Any

    def current_watermark_ms(self) -> int: ...

    def current_processing_time_ms(self) -> int: ...

    @property
    def window_state(self) -> dict[str, Any]: ...

    @property
    def global_state(self) -> dict[str, Any]: ...

    def output(self, tag: str, value: Any) -> None:
        """Emit ``value`` to the side output ``tag``."""
        ...


class ProcessWindowFunction:
    """A full-window function as a class; ``clear`` runs when the window is cleaned up.

    A plain function ``fn(key, context, elements) -> iterable`` works too.
    """

    def process(self, key: Any, context: WindowContext, elements: list[Any]) -> Iterable[Any] | None:
        raise NotImplementedError

    def clear(self, context: WindowContext) -> None:
        pass


class AggregateFunction:
    """An incremental aggregation with an accumulator (Flink's ``AggregateFunction``)."""

    def create_accumulator(self) -> Any:
        raise NotImplementedError

    def add(self, value: Any, accumulator: Any) -> Any:
        raise NotImplementedError

    def get_result(self, accumulator: Any) -> Any:
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        raise NotImplementedError


class BuiltinAggregate(AggregateFunction):
    """An aggregation of one field (or of the value itself when ``field`` is None); nulls are skipped."""

    kind = ""

    def __init__(self, field: str | None = None) -> None:
        if field is not None and not isinstance(field, str):
            raise ConfigurationError(f"field must be a column name (str) or None, got {field!r}")
        self.field = field

    def _get(self, value: Any) -> Any:
        return value if self.field is None else value[self.field]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.field!r})" if self.field is not None else f"{type(self).__name__}()"


class Count(BuiltinAggregate):
    """The number of elements.

    >>> c = Count(); c.get_result(c.add("x", c.add("y", c.create_accumulator())))
    2
    """

    kind = "count"

    def create_accumulator(self) -> int:
        return 0

    def add(self, value: Any, accumulator: int) -> int:
        return accumulator + 1

    def get_result(self, accumulator: int) -> int:
        return accumulator

    def merge(self, a: int, b: int) -> int:
        return a + b


def _plus(a: Any, b: Any) -> Any:
    """``a + b``, where None (no value yet) adds nothing. A first value is added to 0, so that a
    value no number adds to (a string) fails at once, as it would after a number."""
    if b is None:
        return a
    return 0 + b if a is None else a + b


class Sum(BuiltinAggregate):
    """The sum of a field's non-null values; None where there are none, as Spark's ``sum`` and
    SQL's ``SUM`` give (a window of nulls only sums to null, not to 0).

    >>> s = Sum(); s.get_result(s.add(3, s.add(None, s.create_accumulator())))
    3
    >>> s.get_result(s.add(None, s.create_accumulator())) is None
    True
    """

    kind = "sum"

    def create_accumulator(self) -> Any:
        return None

    def add(self, value: Any, accumulator: Any) -> Any:
        return _plus(accumulator, self._get(value))

    def get_result(self, accumulator: Any) -> Any:
        return accumulator

    def merge(self, a: Any, b: Any) -> Any:
        return _plus(a, b)


class _Extreme(BuiltinAggregate):
    _smallest = True

    def _pick(self, a: Any, b: Any) -> Any:
        if self._smallest:
            return b if b < a else a
        return b if b > a else a

    def create_accumulator(self) -> Any:
        return None

    def add(self, value: Any, accumulator: Any) -> Any:
        v = self._get(value)
        if v is None:
            return accumulator
        return v if accumulator is None else self._pick(accumulator, v)

    def get_result(self, accumulator: Any) -> Any:
        return accumulator

    def merge(self, a: Any, b: Any) -> Any:
        if a is None:
            return b
        return a if b is None else self._pick(a, b)


class Min(_Extreme):
    """The smallest non-null value (None for none).

    >>> m = Min(); m.get_result(m.add(3, m.add(5, m.create_accumulator())))
    3
    """

    kind = "min"


class Max(_Extreme):
    """The largest non-null value (None for none).

    >>> m = Max(); m.get_result(m.add(3, m.add(5, m.create_accumulator())))
    5
    """

    kind = "max"
    _smallest = False


class Mean(BuiltinAggregate):
    """The mean of the non-null values (None for none); the accumulator is ``(sum, count)``.

    >>> m = Mean(); m.get_result(m.add(3, m.add(5, m.create_accumulator())))
    4.0
    """

    kind = "mean"

    def create_accumulator(self) -> tuple[Any, int]:
        return (0, 0)

    def add(self, value: Any, accumulator: tuple[Any, int]) -> tuple[Any, int]:
        v = self._get(value)
        return accumulator if v is None else (_plus(accumulator[0], v), accumulator[1] + 1)

    def get_result(self, accumulator: tuple[Any, int]) -> float | None:
        total, n = accumulator
        return total / n if n else None

    def merge(self, a: tuple[Any, int], b: tuple[Any, int]) -> tuple[Any, int]:
        # A partial of the Arrow path with no values has a null sum: (None, 0).
        return (_plus(a[0], b[0]), a[1] + b[1])


class Aggregations(AggregateFunction):
    """Several aggregations at once; the result is a dict of their results by name.

    >>> Aggregations(n=Count()).get_result([3])
    {'n': 3}
    """

    def __init__(self, **named: AggregateFunction) -> None:
        if not named:
            raise ConfigurationError("Aggregations needs at least one named aggregation, got none")
        for name, agg in named.items():
            if not isinstance(agg, AggregateFunction):
                raise ConfigurationError(f"aggregation {name!r} must be an AggregateFunction, got {type(agg).__name__}")
        self.named = named
        self._aggs = list(named.values())
        self._names = list(named)

    def create_accumulator(self) -> list[Any]:
        return [a.create_accumulator() for a in self._aggs]

    def add(self, value: Any, accumulator: list[Any]) -> list[Any]:
        return [a.add(value, acc) for a, acc in zip(self._aggs, accumulator)]

    def get_result(self, accumulator: list[Any]) -> dict[str, Any]:
        return {n: a.get_result(acc) for n, a, acc in zip(self._names, self._aggs, accumulator)}

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        return [f.merge(x, y) for f, x, y in zip(self._aggs, a, b)]

    def __repr__(self) -> str:
        return "Aggregations(" + ", ".join(f"{n}={a!r}" for n, a in self.named.items()) + ")"
