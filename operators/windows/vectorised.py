"""The Arrow path: assign windows and pre-aggregate a whole batch at once.

For the common case (built-in aggregations on tumbling, sliding or session event-time windows with the
event-time trigger, keyed by columns) the per-record work of the window operator is a group-by:
each row is placed in its windows with array arithmetic, and ``pyarrow.compute`` sums, counts,
and takes minima and maxima per ``(key, window)``. The partial results are merged into the same
operator state the per-record path keeps, and the same timers are registered, so both paths can
be mixed freely and snapshot alike.

Without allowed lateness or a ``process`` function, tumbling and sliding windows keep their state
as Arrow tables too (``panes.py``): nothing is done per window until it fires, and then for all
the windows a watermark fires at once. Event-time sessions with a static gap take a path of their
own (``vectorised_sessions.py``).
Everything else falls back to the per-record path, one ``Record`` per row: user functions,
custom triggers, evictors, dynamic gaps, processing time. Rows that are late for one of their windows
(fired already, or past cleanup) also take the per-record path, since each of them may fire a
window or go to the side output on its own.

Both paths give identical results on integers. On floating-point columns sums may differ in the
last bits, as the order of additions differs.

>>> import pyarrow as pa
>>> from actorflow.operators import OperatorHarness
>>> from actorflow.operators.windows import TumblingEventTimeWindows, Sum, WindowOperator
>>> op = WindowOperator("user", TumblingEventTimeWindows(10), aggregate=Sum("amount"))
>>> h = OperatorHarness(op); h.open()
>>> op.process_batch(pa.table({"user": ["a", "b", "a"], "amount": [1, 2, 3], "ts": [1, 2, 3]}), "ts")
>>> h.process_watermark(9); h.output_values()
[{'user': 'a', 'window_start': 0, 'window_end': 10, 'result': 4}, {'user': 'b', 'window_start': 0, 'window_end': 10, 'result': 2}]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..elements import MAX_WATERMARK, MIN_TIMESTAMP, Record
from ..errors import SchemaError
from .assigners import EventTimeSessionWindows, SlidingEventTimeWindows, TimeWindow, TumblingEventTimeWindows
from .functions import Aggregations, BuiltinAggregate
from .late import LateReason
from .triggers import EventTimeTrigger
from .arrow_aggregates import group_aggregations, input_columns
from .panes import FIRST as _FIRST, COUNT as _COUNT, PANE_BASE, ROW as _ROW, START as _START, Panes, can_use_panes, group_rows
from .vectorised_sessions import add_session_partial, session_groups

if TYPE_CHECKING:
    from .window_operator import WindowOperator

__all__ = [
    "move_panes_to_dict", "partial_aggregates", "pre_aggregates", "process_batch", "process_partials", "process_timestamped_batch",
    "why_not_vectorised",
]

_EMPTY: Any = object()


def _builtins(op: "WindowOperator") -> list[BuiltinAggregate] | None:
    agg = op.aggregate_fn
    parts = list(agg.named.values()) if isinstance(agg, Aggregations) else [agg]
    if all(isinstance(p, BuiltinAggregate) and type(p).__module__ == BuiltinAggregate.__module__ for p in parts):
        return parts  # type: ignore[return-value]
    return None


def why_not_vectorised(op: "WindowOperator", schema: pa.Schema | None = None) -> str | None:
    """Why a batch for ``op`` must take the per-record path, or None if it can be vectorised."""
    if type(op.assigner) not in (TumblingEventTimeWindows, SlidingEventTimeWindows, EventTimeSessionWindows):
        return f"the assigner {op.assigner!r} is not a tumbling, sliding or session (static gap) event-time one"
    if type(op.trigger) is not EventTimeTrigger:
        return f"the trigger {op.trigger!r} is not the event-time trigger"
    if op.evictor is not None:
        return "an evictor needs every element"
    if op.aggregate_fn is None or _builtins(op) is None:
        return "only built-in aggregations (Count, Sum, Min, Max, Mean) are vectorised"
    if op.key_fields is None:
        return "the key is computed by a function, not named columns"
    if schema is not None:
        for field in op.key_fields:
            if field not in schema.names:
                return f"the key column {field!r} is not in the batch"
            if pa.types.is_nested(schema.field(field).type):
                return f"the key column {field!r} is of nested type {schema.field(field).type}"
        for part in _builtins(op) or []:
            if part.field is None:
                continue
            if part.field not in schema.names:
                return f"the column {part.field!r} is not in the batch"
            # What Arrow's group-by cannot aggregate, the per-record path does, or fails naming a record.
            kind = schema.field(part.field).type
            summable = pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind) \
                or pa.types.is_boolean(kind)
            if (part.kind in ("sum", "mean") and not summable) or (part.kind in ("min", "max") and pa.types.is_nested(kind)):
                return f"{type(part).__name__}({part.field!r}) of a {kind} column has no Arrow kernel"
    return None


def _event_time(op: "WindowOperator", table: pa.Table, timestamp_column: str) -> pa.ChunkedArray:
    if timestamp_column not in table.schema.names:
        raise SchemaError(f"{op.context.name}: the batch has no column {timestamp_column!r}; its columns are {table.schema.names}")
    ts = table.column(timestamp_column)
    if ts.null_count:
        raise SchemaError(
            f"{op.context.name}: column {timestamp_column!r} holds nulls in {ts.null_count} rows; "
            "event time needs a timestamp on every record"
        )
    if pa.types.is_timestamp(ts.type):
        ts = pc.cast(pc.cast(ts, pa.timestamp("ms")), pa.int64())
    elif not pa.types.is_integer(ts.type):
        raise SchemaError(
            f"{op.context.name}: column {timestamp_column!r} is of type {ts.type}; event time needs integer milliseconds"
        )
    return pc.cast(ts, pa.int64())


def process_batch(op: "WindowOperator", batch: pa.Table | pa.RecordBatch, timestamp_column: str) -> None:
    """Process every row of ``batch`` (a dict per row, its event time from ``timestamp_column``)."""
    table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
    if table.num_rows == 0:
        return
    process_timestamped_batch(op, table, _event_time(op, table, timestamp_column))


def process_timestamped_batch(op: "WindowOperator", table: pa.Table, timestamps_ms: Any) -> None:
    """Process every row of ``table`` (a dict per row) at the event time beside it, an int64 array.

    A null event time takes the per-record path, whose error names the record.
    """
    ts = timestamps_ms
    if table.num_rows == 0:
        return
    assigner: Any = op.assigner
    vectorise = ts.null_count == 0 and why_not_vectorised(op, table.schema) is None
    sessions = type(assigner) is EventTimeSessionWindows
    if vectorise:
        vectorise = _in_safe_range(ts, assigner.gap_ms if sessions else assigner.size_ms)
    cut = session_groups(op, table, ts, _builtins(op) or []) if vectorise and sessions else None
    if vectorise and sessions and cut is not None:
        session_windows, late_rows = cut

        def add_session(key: Any, window: Any, partial: Any) -> None:
            add_session_partial(op, key, window, partial)

        _interleave(op, table, ts, session_windows, late_rows, add_session)
        return
    if not vectorise or sessions:
        for row, t in zip(table.to_pylist(), ts.to_pylist()):
            op.process_element(Record(row, t))
        return

    size = assigner.size_ms
    slide = getattr(assigner, "slide_ms", size)
    watermark = op._watermark
    newest = _newest_starts(ts, slide, assigner.offset_ms)
    lower = pc.subtract(ts, size)

    starts, exists, fireds = [], [], []
    late = None
    for j in range((size + slide - 1) // slide):
        start = pc.subtract(newest, j * slide)
        has = pc.greater(start, lower)
        # max_timestamp = start + size - 1 <= watermark: the window fired already, or is gone
        fired = pc.and_(has, pc.less_equal(start, pa.scalar(max(watermark - size + 1, MIN_TIMESTAMP), pa.int64())))
        late = fired if late is None else pc.or_(late, fired)
        starts.append(start)
        exists.append(has)
        fireds.append(fired)
    assert late is not None
    rows = pa.array(np.arange(table.num_rows, dtype=np.int64))
    if op._panes or can_use_panes(op):
        _add_to_panes(op, table, ts, rows, starts, exists, fireds)
        return
    fallback_rows = pc.indices_nonzero(late).to_pylist()

    parts = _builtins(op) or []
    base = table.select(input_columns(list(op.key_fields or ()), parts)).append_column(_ROW, rows)
    pieces = []
    for start, has in zip(starts, exists):
        keep = pc.and_(has, pc.invert(late))
        pieces.append(base.append_column(_START, start).filter(keep))
    assigned = pa.concat_tables(pieces)
    groups = _pre_aggregate(assigned, list(op.key_fields or ()), parts)


    def add_window(key: Any, start: Any, partial: Any) -> None:
        _add_partial(op, key, TimeWindow(start, start + size), partial)

    _interleave(op, table, ts, groups, fallback_rows, add_window)


def _newest_starts(ts: Any, slide: int, offset: int) -> pa.Array:
    """The start of each row's newest window (no nulls, and away from the ends of int64: see
    ``_in_safe_range``). numpy's floor division rounds toward minus infinity, as the window's
    start needs for times before the offset; by a scalar it is four times as fast as ``np.mod``."""
    values = ts.to_numpy()
    return pa.array((values - offset) // slide * slide + offset)


def pre_aggregates(op: "WindowOperator") -> bool:
    """Whether ``partial_aggregates`` may give partials for ``op`` at all, whatever the batch.

    Tumbling windows only: a row late for its one window is late, and is dropped and counted
    (nothing fires on a late row without allowed lateness, no side output needs it), so a
    partial late at the window operator is as exact as its rows.
    """
    return (type(op.assigner) is TumblingEventTimeWindows and op.allowed_lateness_ms == 0 and op.late_data_tag is None
            and why_not_vectorised(op) is None)


def _can_pre_aggregate(op: "WindowOperator", table: pa.Table, ts: Any) -> bool:
    return (
        pre_aggregates(op) and table.num_rows > 0 and ts.null_count == 0 and why_not_vectorised(op, table.schema) is None
        and _in_safe_range(ts, op.assigner.size_ms)  # type: ignore[attr-defined]  # tumbling
    )


def _in_safe_range(ts: Any, margin_ms: int) -> bool:
    # Window arithmetic near the ends of the int64 range would wrap: Python's ints do not.
    bounds = pc.min_max(ts).as_py()
    return MIN_TIMESTAMP + 2 * margin_ms < bounds["min"] and bounds["max"] < MAX_WATERMARK - 2 * margin_ms


def partial_aggregates(op: "WindowOperator", table: pa.Table, timestamps_ms: Any) -> pa.Table | None:
    """The partial aggregates of ``table`` per key and window, in the columns ``Panes`` keep; or
    None where the window operator needs the rows themselves.

    Made where a batch is read, before it is split by key: the split and the channels carry a
    row per key and window instead of a row per record. ``process_partials`` merges them.
    """
    ts = timestamps_ms
    if not _can_pre_aggregate(op, table, ts):
        return None
    parts = _builtins(op) or []
    keys = list(op.key_fields or ())
    assigner: Any = op.assigner
    assigned = (table.select(input_columns(keys, parts))
                .append_column(_ROW, pa.array(np.arange(table.num_rows, dtype=np.int64)))
                .append_column(_START, _newest_starts(ts, assigner.size_ms, assigner.offset_ms)))
    return assigned.group_by([*keys, _START], use_threads=False).aggregate(group_aggregations(parts, PANE_BASE))


def process_partials(op: "WindowOperator", partials: pa.Table, batch_rows: int) -> int:
    """Merge the partial aggregates of a batch of ``batch_rows`` rows (``partial_aggregates``), as
    processing its rows would: a window that fired already counts them as late records dropped.
    Returns the number of records they stand for."""
    size: int = op.assigner.size_ms  # type: ignore[attr-defined]  # tumbling
    counts = partials.column(_COUNT)
    records: int = pc.sum(counts).as_py() or 0
    op.metrics.records_in += records
    fired = pc.less_equal(partials.column(_START), pa.scalar(max(op._watermark - size + 1, MIN_TIMESTAMP), pa.int64()))
    late = pc.sum(pc.filter(counts, fired)).as_py() or 0
    if late:  # no late-data side output and no lateness where partials are made: counted only
        op.metrics.late_records_dropped += late
        op.metrics.count_late(LateReason.BEHIND_WATERMARK, late)
        partials = partials.filter(pc.invert(fired))
    if op._panes or can_use_panes(op):
        _panes_of(op).add_partials(partials, batch_rows)
        return records
    for _, key, start, accs in group_rows(_in_first_row_order(partials), list(op.key_fields or ()), _builtins(op) or []):
        _add_partial(op, key, TimeWindow(start, start + size), accs)
    return records


def _in_first_row_order(partials: pa.Table) -> pa.Table:
    return partials.sort_by([(_FIRST, "ascending"), (_START, "descending")])


def _add_to_panes(
    op: "WindowOperator", table: pa.Table, ts: Any, rows: pa.Array, starts: list[Any], exists: list[Any], fireds: list[Any],
) -> None:
    """Add a batch to the operator's panes: each row to its windows that are still open.

    A row none of whose windows is open is late: it goes where the per-record path sends it (the
    late-data side output, or the dropped count), in row order. Without allowed lateness no window
    fires on an element, so nothing else happens before the next watermark.
    """
    base = table.select(input_columns(list(op.key_fields or ()), _builtins(op) or [])).append_column(_ROW, rows)
    pieces, kept = [], None
    for start, has, fired in zip(starts, exists, fireds):
        keep = pc.and_(has, pc.invert(fired))
        kept = keep if kept is None else pc.or_(kept, keep)
        pieces.append(base.append_column(_START, start).filter(keep))
    _panes_of(op).add(pa.concat_tables(pieces), table.num_rows)
    op.metrics.records_in += table.num_rows
    late = pc.indices_nonzero(pc.invert(kept)).to_pylist()
    if late:
        now = op._pts.now_ms()
        for value, t in zip(table.take(late).to_pylist(), pc.take(ts, late).to_pylist()):
            op._on_late(Record(value, t), op.assigner.assign_windows(value, t, now))


def _panes_of(op: "WindowOperator") -> Panes:
    """The operator's panes, made at their first use."""
    if op._panes is None:
        size: int = op.assigner.size_ms  # type: ignore[attr-defined]  # tumbling or sliding
        op._panes = Panes(list(op.key_fields or ()), _builtins(op) or [], size)
    return op._panes


def move_panes_to_dict(op: "WindowOperator") -> None:
    """Move the operator's panes into its dict state, with the timers the per-record path would
    have registered, in its order (see ``panes.py``)."""
    panes = op._panes
    if not panes:
        return
    size = panes.size_ms
    for _, key, start, accs in group_rows(panes.take_all(), panes.keys, panes.parts):
        _add_partial(op, key, TimeWindow(start, start + size), accs)


def _interleave(op: "WindowOperator", table: pa.Table, ts: Any, groups: list[Any], fallback_rows: list[int], add: Any) -> None:
    """Add the pre-aggregated groups and process the fallback rows, in the order of their rows."""
    values = table.to_pylist() if fallback_rows else None
    times = ts.to_pylist() if fallback_rows else None
    next_fallback = 0
    op.metrics.records_in += table.num_rows - len(fallback_rows)
    for first_row, key, window, partial in groups:
        # Interleave by row so that timers are registered in the order the per-record path would.
        while next_fallback < len(fallback_rows) and fallback_rows[next_fallback] < first_row:
            i = fallback_rows[next_fallback]
            op.process_element(Record(values[i], times[i]))  # type: ignore[index]
            next_fallback += 1
        add(key, window, partial)
    for i in fallback_rows[next_fallback:]:
        op.process_element(Record(values[i], times[i]))  # type: ignore[index]


def _pre_aggregate(assigned: pa.Table, keys: list[str], parts: list[BuiltinAggregate]) -> list[tuple[int, Any, int, Any]]:
    """``(first row, key, window start, accumulator)`` per group, in the per-record path's order."""
    if assigned.num_rows == 0:
        return []
    aggregations = group_aggregations(parts, PANE_BASE)
    result = assigned.group_by([*keys, _START], use_threads=False).aggregate(aggregations)
    return group_rows(_in_first_row_order(result), keys, parts)


def _add_partial(op: "WindowOperator", key: Any, window: TimeWindow, accs: list[Any]) -> None:
    agg = op.aggregate_fn
    partial = accs if isinstance(agg, Aggregations) else accs[0]
    state_key = (key, window)
    existing = op._contents.get(state_key, _EMPTY)
    if existing is not _EMPTY:
        # A window with contents that has not fired has both its timers already (registering
        # them again would change nothing): only the accumulators merge.
        op._contents[state_key] = agg.merge(existing, partial)  # type: ignore[union-attr]
        return
    op._contents[state_key] = partial
    # What the event-time trigger's on_element does for a window still open, then the cleanup
    # timer; without allowed lateness, that is the same timer.
    op._timers.register_event_time_timer(window.max_timestamp(), key, window)
    if op.allowed_lateness_ms:
        op._register_cleanup_timer(key, window)
