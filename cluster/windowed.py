"""Keyed streams and windows in the ``DataStream`` builder: ``key_by(...).window(...).aggregate(...)``.

>>> import pyarrow as pa
>>> from actorflow.operators.windows import TumblingEventTimeWindows
>>> clicks = pa.table({"country": ["DE", "FR", "DE"], "ts": [1_000, 2_000, 61_000]})
>>> counts = (from_arrow([clicks], timestamp_column="ts", parallelism=2)     # doctest: +SKIP
...           .key_by("country")
...           .window(TumblingEventTimeWindows.of(size_ms=60_000))
...           .count())
>>> counts.execute().to_arrow().sort_by("window_start").to_pylist()[0]     # doctest: +SKIP
{'country': 'DE', 'window_start': 0, 'window_end': 60000, 'count': 1}

Keys route by a stable hash (``actors.keys``): a key reaches the same instance of the window
stage from every upstream actor, in every run. Each window stage starts a new stage of actors
connected by hashing channels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Generic, Iterable, TypeVar

import pyarrow as pa

from actorflow.operators.channel_items import Partitioning
from actorflow.operators.errors import ConfigurationError, SchemaError
from actorflow.operators.windows import (
    AggregateFunction,
    Aggregations,
    BuiltinAggregate,
    Count,
    Evictor,
    Mean,
    ProcessWindowFunction,
    Sum,
    Trigger,
    WindowAssigner,
    WindowOperator,
    WindowSpec,
)
from actorflow.operators.windows.records import key_function

from .job_graph import OperatorNode

if TYPE_CHECKING:
    from .datastream import DataStream

__all__ = ["KeyedStream", "WindowedStream"]

D = TypeVar("D", bound="DataStream")


class KeyedStream(Generic[D]):
    """A stream partitioned by key; ``window(...)`` makes it a ``WindowedStream``."""

    def __init__(self, stream: D, key_selector: Any, parallelism: int) -> None:
        key_function(key_selector)  # a clear error for anything that is not a column, columns or a callable
        if isinstance(key_selector, list):
            key_selector = tuple(key_selector)
        self._stream = stream
        self.key_selector = key_selector
        self.parallelism = parallelism
        _check_key_columns(stream, key_selector)

    def window(self, window: WindowAssigner[Any] | WindowSpec) -> "WindowedStream[D]":
        if not isinstance(window, (WindowAssigner, WindowSpec)):
            raise ConfigurationError(f"window() needs a WindowAssigner or count_window(...), got {type(window).__name__}")
        assigner = window.assigner if isinstance(window, WindowSpec) else window
        source = self._stream.graph.source
        if assigner.is_event_time and source.timestamp_column is None:
            raise ConfigurationError(
                f"an event-time window ({assigner!r}) needs event time on every record; pass timestamp_column= "
                "to from_spark() or from_arrow(), got none"
            )
        return WindowedStream(self, window)


class WindowedStream(Generic[D]):
    """A keyed stream cut into windows; a function (``aggregate``, ``reduce``, ``process``,
    ``sum``, ``count``) makes it a ``DataStream`` of one row per key and window firing."""

    def __init__(self, keyed: KeyedStream[D], window: WindowAssigner[Any] | WindowSpec) -> None:
        self._keyed = keyed
        self._window = window
        self._trigger: Trigger | None = None
        self._evictor: Evictor | None = None
        self._allowed_lateness_ms = 0
        self._late_data_tag: str | None = None

    def _copy(self, **changes: Any) -> "WindowedStream[D]":
        other = WindowedStream(self._keyed, self._window)
        other.__dict__.update(self.__dict__)
        other.__dict__.update(changes)
        return other

    def trigger(self, trigger: Trigger) -> "WindowedStream[D]":
        return self._copy(_trigger=trigger)

    def evictor(self, evictor: Evictor) -> "WindowedStream[D]":
        return self._copy(_evictor=evictor)

    def allowed_lateness(self, allowed_lateness_ms: int) -> "WindowedStream[D]":
        """Keep windows ``allowed_lateness_ms`` past their end; a late record fires its window again."""
        if isinstance(allowed_lateness_ms, bool) or not isinstance(allowed_lateness_ms, int) or allowed_lateness_ms < 0:
            raise ConfigurationError(f"allowed_lateness_ms must be an int >= 0, got {allowed_lateness_ms!r}")
        return self._copy(_allowed_lateness_ms=allowed_lateness_ms)

    def side_output_late_data(self, tag: str) -> "WindowedStream[D]":
        """Records too late for all their windows go to the side output ``tag`` instead of being dropped."""
        if not isinstance(tag, str) or not tag:
            raise ConfigurationError(f"the late-data tag must be a non-empty str, got {tag!r}")
        return self._copy(_late_data_tag=tag)

    # ----------------------------------------------------------------- functions

    def aggregate(
        self, function: AggregateFunction, process: ProcessWindowFunction | Callable[..., Iterable[Any] | None] | None = None,
        *, name: str = "window",
    ) -> D:
        """Incremental aggregation; with ``process``, it gets the one result of each window."""
        return self._build(name, aggregate=function, process=process)

    def reduce(
        self, function: Callable[[Any, Any], Any],
        process: ProcessWindowFunction | Callable[..., Iterable[Any] | None] | None = None, *, name: str = "window",
    ) -> D:
        """Incremental ``function(a, b) -> value``; the result is the window's output (or goes to ``process``)."""
        return self._build(name, reduce=function, process=process)

    def process(self, function: ProcessWindowFunction | Callable[..., Iterable[Any] | None], *, name: str = "window") -> D:
        """A full-window function ``(key, context, elements) -> rows``; ``context.window`` has the bounds."""
        return self._build(name, process=function)

    def sum(self, column: str, *, name: str = "window") -> D:
        """The sum of ``column`` per key and window, in a column of the same name."""
        return self._build(name, aggregate=Aggregations(**{column: Sum(column)}))

    def count(self, *, name: str = "window") -> D:
        """The number of records per key and window, in a column ``count``."""
        return self._build(name, aggregate=Aggregations(count=Count()))

    def _build(self, name: str, **functions: Any) -> D:
        stream = self._keyed._stream
        source = stream.graph.source
        bounds_as_datetime = False
        if source.schema is not None and source.timestamp_column in source.schema.names:
            # As Spark's window() gives them: a date's windows are timestamps too, for a date
            # holds no time of day and a window of hours would have none to show.
            kind = source.schema.field(source.timestamp_column).type
            bounds_as_datetime = pa.types.is_timestamp(kind) or pa.types.is_date(kind)
        settings = dict(
            trigger=self._trigger, evictor=self._evictor, allowed_lateness_ms=self._allowed_lateness_ms,
            late_data_tag=self._late_data_tag, name=name, bounds_as_datetime=bounds_as_datetime, **functions,
        )
        key, window = self._keyed.key_selector, self._window
        WindowOperator(key, window, **settings)  # validate now, not in the actor at the first record
        if functions.get("aggregate") is not None:
            _check_aggregate_columns(stream, functions["aggregate"])

        def factory() -> WindowOperator:
            return WindowOperator(key, window, **settings)

        node = OperatorNode(name, factory, self._keyed.parallelism, Partitioning.HASH, key)
        node.side_tags = () if self._late_data_tag is None else (self._late_data_tag,)
        return stream._with(node)


def _check_key_columns(stream: "DataStream", key_selector: Any) -> None:
    """A key column the input cannot have is an error now: the source's schema is known when
    nothing before the ``key_by`` changes the records."""
    _, fields = key_function(key_selector)
    schema = stream.graph.source.schema
    if fields is None or schema is None or stream.graph.nodes:
        return
    missing = [f for f in fields if f not in schema.names]
    if missing:
        raise SchemaError(f"key_by: key column {missing[0]!r} not found; the input has columns {schema.names}")
    for name in fields:
        kind = schema.field(name).type
        if pa.types.is_nested(kind):
            # A struct, list or map is a dict or list in Python: unhashable, it would fail at the
            # first record. Spark groups by a struct, but a key made hashable here would come back
            # as a tuple, not as the column's type; its fields as columns keep their types.
            hint = (f"select its fields as columns (df.select('*', '{name}.*')) and key by a tuple of them, "
                    f"e.g. key_by({tuple(kind.field(i).name for i in range(kind.num_fields))!r})"
                    if pa.types.is_struct(kind) else
                    f"key by a tuple of scalar columns, or derive one from it first (e.g. F.to_json('{name}'))")
            raise SchemaError(f"key_by: key column {name!r} is a {kind}, which cannot key a record; {hint}")


_NUMERIC = (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal)


def _check_aggregate_columns(stream: "DataStream", function: Any) -> None:
    """An aggregation of a column the input lacks, or a sum or mean of a column that is not a
    number, is an error when the pipeline is built: at run time it would fail on some record
    with a bare KeyError or TypeError. The schema is known when nothing before the window
    changes the records."""
    schema = stream.graph.source.schema
    if schema is None or stream.graph.nodes:
        return
    named = function.named.items() if isinstance(function, Aggregations) else [(None, function)]
    for name, agg in named:
        if not isinstance(agg, BuiltinAggregate) or agg.field is None:
            continue
        what = f"{agg!r}" if name is None else f"{name}={agg!r}"
        if agg.field not in schema.names:
            raise SchemaError(f"aggregate {what}: column {agg.field!r} not found; the input has columns {schema.names}")
        kind = schema.field(agg.field).type
        if isinstance(agg, (Sum, Mean)) and not any(test(kind) for test in _NUMERIC):
            raise SchemaError(
                f"aggregate {what}: column {agg.field!r} is a {kind}, and {agg.kind} needs numbers "
                f"(integer, floating or decimal); the input has columns {schema.names}"
            )
