"""The Arrow path for event-time sessions: cut a batch into sub-sessions, then merge those.

Within one batch, the rows of a key sorted by event time form a sub-session as long as each is
at most ``gap_ms`` after the one before (windows that touch merge, as in ``TimeWindow``). A
sub-session's window is ``[first, last + gap_ms)`` and its accumulator the built-in aggregations
of its rows; it then enters the merging window set exactly as one record's window would, merging
with the key's open sessions. The final sessions and their results are those of the per-record
path; only the order of additions (and so the last bits of float sums) may differ.

Rows whose own window already reached the watermark (``ts + gap_ms - 1 <= watermark``) take the
per-record path: each of them may fire a session or go to the side output on its own. So do rows
that may overlap a closed session, when there is one (``window_operator.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..elements import MIN_TIMESTAMP
from .arrow_aggregates import accumulators, group_aggregations, input_columns
from .assigners import TimeWindow
from .functions import Aggregations, BuiltinAggregate
from .merging import MergingWindowSet

if TYPE_CHECKING:
    from .window_operator import WindowOperator

__all__ = ["session_groups"]

_ROW = "__actorflow_row"
_TS = "__actorflow_ts"
_SESSION = "__actorflow_session"
_EMPTY: Any = object()


def session_groups(
    op: "WindowOperator", table: pa.Table, ts: Any, parts: list[BuiltinAggregate]
) -> tuple[list[tuple[int, Any, TimeWindow, list[Any]]], list[int]] | None:
    """``(first row, key, sub-session window, accumulators)`` in row order, and the rows for the
    per-record path; None when the batch cannot be cut (a key column holds nulls)."""
    keys = list(op.key_fields or ())
    gap = op.assigner.gap_ms  # type: ignore[attr-defined]
    if any(table.column(k).null_count for k in keys):
        return None
    ts = pa.chunked_array([ts]) if isinstance(ts, pa.Array) else ts
    rows = pa.array(np.arange(table.num_rows, dtype=np.int64))
    threshold = max(op._watermark - gap + 1, MIN_TIMESTAMP)
    if op._closed_sessions:
        # A row that overlaps a closed session starts before its end, at most the watermark less
        # the allowed lateness: it is late or not by that session, which the per-record path knows.
        threshold = max(threshold, op._watermark - op.allowed_lateness_ms)
    early = pc.less_equal(ts, pa.scalar(threshold, pa.int64()))
    fallback_rows = pc.indices_nonzero(early).to_pylist()
    if fallback_rows:
        # A row whose own session already fired is late or not depending on the rows of its key
        # that came before it (one may have bridged it to an open session): every row of such a
        # key takes the per-record path, in row order. Rows that are not late merge alike in any
        # order, so the other keys stay vectorised.
        key_rows = table.select(keys).to_pylist()
        late_keys = {tuple(key_rows[i][k] for k in keys) for i in fallback_rows}
        mask = [tuple(row[k] for k in keys) in late_keys for row in key_rows]
        early = pa.array(mask, pa.bool_())
        fallback_rows = [i for i, late in enumerate(mask) if late]
    columns = input_columns(keys, parts)
    base = table.select(columns).append_column(_ROW, rows).append_column(_TS, ts).filter(pc.invert(early))
    if base.num_rows == 0:
        return [], fallback_rows
    ordered = base.sort_by([*((k, "ascending") for k in keys), (_TS, "ascending"), (_ROW, "ascending")])
    n = ordered.num_rows
    times = ordered.column(_TS).combine_chunks()
    new = pc.greater(pc.subtract(times.slice(1), times.slice(0, n - 1)), gap)
    for k in keys:
        column = ordered.column(k).combine_chunks()
        new = pc.or_(new, pc.not_equal(column.slice(1), column.slice(0, n - 1)))
    starts = pa.concat_arrays([pa.array([True]), new])
    session = pc.cumulative_sum(pc.cast(starts, pa.int64()))
    with_session = ordered.append_column(_SESSION, session)

    aggregations = group_aggregations(parts, [(_ROW, "min"), (_ROW, "count"), (_TS, "min"), (_TS, "max")])
    result = with_session.group_by([_SESSION, *keys], use_threads=False).aggregate(aggregations)
    result = result.sort_by([(f"{_ROW}_min", "ascending")])
    cols = {name: result.column(name).to_pylist() for name in result.schema.names}
    key_cols = [cols[k] for k in keys]
    out = []
    for i, (first, count, low, high) in enumerate(
        zip(cols[f"{_ROW}_min"], cols[f"{_ROW}_count"], cols[f"{_TS}_min"], cols[f"{_TS}_max"])
    ):
        key = key_cols[0][i] if len(keys) == 1 else tuple(c[i] for c in key_cols)
        out.append((first, key, TimeWindow(low, high + gap), accumulators(cols, i, parts, count)))
    return out, fallback_rows


def add_session_partial(op: "WindowOperator", key: Any, window: TimeWindow, accs: list[Any]) -> None:
    """What the per-record path does for one record's window, with a sub-session's accumulator."""
    agg = op.aggregate_fn
    assert agg is not None
    partial = accs if isinstance(agg, Aggregations) else accs[0]
    merging = op._merging.get(key)
    if merging is None:
        merging = op._merging[key] = MergingWindowSet(op._merging_assigner)  # type: ignore[arg-type]
    actual = merging.add_window(window, op._ctx.merge_function(key))
    state_key = (key, merging.get_state_window(actual))
    existing = op._contents.get(state_key, _EMPTY)
    op._contents[state_key] = partial if existing is _EMPTY else agg.merge(existing, partial)
    ctx = op._ctx.trigger
    ctx.key = key
    ctx.window = actual
    result = op.trigger.on_element(None, window.max_timestamp(), actual, ctx)
    op._on_element_result(result, key, actual, state_key)
