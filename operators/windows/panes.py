"""Window state as Arrow tables: the Arrow path's state for tumbling and sliding windows.

The per-record path keeps a Python dict entry and a timer per ``(key, window)``. With many keys
and small windows that bookkeeping, not the aggregation, is the cost: about ten microseconds a
window to create, fire, emit and clean up. For the case the Arrow path handles without any
per-window decision (tumbling or sliding event-time windows, built-in aggregations, the event-time
trigger, no allowed lateness, no ``process`` function), ``Panes`` keeps the same state as tables
instead: each batch appends its partial aggregates, one row per key and window, and a watermark
fires every window it passes with one group-by over those rows.

Panes and the dict state are one state in two forms, never both at once. Before the dict state
is read or written (a record that takes the per-record path, a snapshot), ``move_to_dict`` moves
every pane into it, window by window, with the timers the per-record path would have registered,
in the order it would have registered them; the Arrow path then goes on with the dict state until
it is empty again.

Windows fire in the timer service's order: by end, and windows with one end in the order their
first record arrived.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from .arrow_aggregates import accumulators, group_aggregations
from .functions import Aggregations, BuiltinAggregate

if TYPE_CHECKING:
    from .window_operator import WindowOperator

__all__ = ["COUNT", "FIRST", "PANE_BASE", "Panes", "ROW", "START", "can_use_panes", "fired_windows", "group_rows"]

ROW = "__actorflow_row"
START = "__actorflow_window_start"
FIRST = f"{ROW}_min"  # the panes' registration order: a running row number over all batches
COUNT = f"{ROW}_count"
#: What every pane holds besides the parts' partials: its first row's number, and its row count.
PANE_BASE = [(ROW, "min"), (ROW, "count")]
_SAFE_INT_DOUBLE = 2**53  # integers of up to this size convert to a double exactly


def can_use_panes(op: "WindowOperator") -> bool:
    """Whether ``op``'s vectorised state may be kept as panes (the caller checked the Arrow path)."""
    return op.allowed_lateness_ms == 0 and op.process_fn is None and not op._contents


class Panes:
    """The open windows of a window operator as Arrow tables of partial aggregates.

    Columns: the key columns, ``START``, the first row's running number, the group's row count,
    then what ``parts`` need (``<field>_sum``, ``<field>_min``, ...), as ``group_aggregations`` names
    them.
    """

    def __init__(self, keys: list[str], parts: list[BuiltinAggregate], size_ms: int) -> None:
        self.keys = keys
        self.parts = parts
        self.size_ms = size_ms
        self.tables: list[pa.Table] = []
        self.earliest_start: int | None = None
        self.rows_seen = 0
        self._build_specs()

    def _build_specs(self) -> None:
        self._specs = group_aggregations(self.parts, PANE_BASE)
        # How partial results merge: counts and sums add up, minima and maxima stay what they are.
        # group_by names a result "<column>_<function>"; the merged ones get the partials' names back.
        merge = {"count": "sum", "sum": "sum", "min": "min", "max": "max"}
        self._merge_specs: list[Any] = []
        self._rename: dict[str, str] = {}
        for spec in self._specs:
            name, function = f"{spec[0]}_{spec[1]}", merge[spec[1]]
            # Partial sums that are all null (their rows held nulls only) merge to null.
            self._merge_specs.append((name, function, pc.ScalarAggregateOptions(min_count=1)) if function == "sum" else (name, function))
            self._rename[f"{name}_{function}"] = name

    def __bool__(self) -> bool:
        return bool(self.tables)

    def __getstate__(self) -> dict[str, Any]:
        # A snapshot holds the tables; the group-by specs (Arrow options) are made again.
        return {k: v for k, v in self.__dict__.items() if k not in ("_specs", "_merge_specs", "_rename")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._build_specs()

    def add(self, assigned: pa.Table, batch_rows: int) -> None:
        """Add a batch's rows, each with its window's start (``START``) and row number (``ROW``)."""
        self.add_partials(assigned.group_by([*self.keys, START], use_threads=False).aggregate(self._specs), batch_rows)

    def add_partials(self, table: pa.Table, batch_rows: int) -> None:
        """Add a batch's partial aggregates, one row per key and window, in the columns ``add``
        makes (``partial_aggregates`` makes them where the batch is read); ``batch_rows``: the
        batch's rows, which the first-row numbers count."""
        if table.num_rows:
            if self.rows_seen:
                index = table.schema.get_field_index(FIRST)
                table = table.set_column(index, FIRST, pc.add(table.column(FIRST), self.rows_seen))
            self.tables.append(table)
            earliest = pc.min(table.column(START)).as_py()
            self.earliest_start = earliest if self.earliest_start is None else min(self.earliest_start, earliest)
        self.rows_seen += batch_rows

    def due(self, watermark_ms: int) -> bool:
        return self.earliest_start is not None and self.earliest_start + self.size_ms - 1 <= watermark_ms

    def take_due(self, watermark_ms: int) -> pa.Table:
        """The windows that ``watermark_ms`` fires, merged, in firing order; they leave the panes."""
        table = self._all()
        fires = pc.less_equal(table.column(START), watermark_ms - self.size_ms + 1)
        fired, rest = table.filter(fires), table.filter(pc.invert(fires))
        self.tables = [rest] if rest.num_rows else []
        self.earliest_start = pc.min(rest.column(START)).as_py() if rest.num_rows else None
        return self._merged(fired).sort_by([(START, "ascending"), (FIRST, "ascending")])

    def take_all(self) -> pa.Table:
        """Every window, merged, in the order of their first rows; the panes are empty after."""
        table = self._merged(self._all())
        self.tables, self.earliest_start = [], None
        return table.sort_by([(FIRST, "ascending"), (START, "descending")])

    def _all(self) -> pa.Table:
        if len(self.tables) == 1:
            return self.tables[0]
        return pa.concat_tables(self.tables, promote_options="permissive")

    def _merged(self, table: pa.Table) -> pa.Table:
        # A window that several batches added to has several rows: one group-by adds them up.
        merged = table.group_by([*self.keys, START], use_threads=False).aggregate(self._merge_specs)
        return merged.rename_columns([self._rename.get(name, name) for name in merged.schema.names])

    # ------------------------------------------------------------------ results

    def result_columns(self, table: pa.Table) -> list[pa.Array]:
        """Each part's result over a merged table, as the per-record path's ``get_result`` gives it."""
        results: list[pa.Array] = []
        for p in self.parts:
            if p.kind == "count":
                results.append(_array(table.column(COUNT)))
            elif p.kind in ("sum", "min", "max"):
                results.append(_array(table.column(f"{p.field}_{p.kind}")))
            else:
                results.append(_mean(_array(table.column(f"{p.field}_sum")), _array(table.column(f"{p.field}_count"))))
        return results


def group_rows(table: pa.Table, keys: list[str], parts: list[BuiltinAggregate]) -> list[tuple[int, Any, int, list[Any]]]:
    """``(first row, key, window start, accumulators)`` per row of a table of partial aggregates
    (as ``Panes`` keeps them), the accumulators as the dict state holds them."""
    cols = {name: table.column(name).to_pylist() for name in table.schema.names}
    key_cols = [cols[k] for k in keys]
    out = []
    for i, (first, start, n) in enumerate(zip(cols[FIRST], cols[START], cols[COUNT])):
        key = key_cols[0][i] if len(keys) == 1 else tuple(c[i] for c in key_cols)
        out.append((first, key, start, accumulators(cols, i, parts, n)))
    return out


def _array(column: pa.ChunkedArray) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _mean(total: pa.Array, count: pa.Array) -> pa.Array:
    # The per-record path divides in Python: total / n, or None for no values. A double division
    # gives the same where both operands convert to doubles exactly; elsewhere Python divides.
    exact = pa.types.is_floating(total.type) or (
        pa.types.is_integer(total.type)
        and (len(total) == 0 or max(abs(pc.min(total).as_py() or 0), abs(pc.max(total).as_py() or 0)) < _SAFE_INT_DOUBLE)
    )
    if exact:
        quotient = pc.divide(pc.cast(total, pa.float64()), pc.cast(count, pa.float64()))
        return pc.if_else(pc.equal(count, 0), pa.scalar(None, pa.float64()), quotient)
    return pa.array([t / n if n else None for t, n in zip(total.to_pylist(), count.to_pylist())])


def window_bounds(starts: pa.Array, size_ms: int, as_datetime: bool) -> tuple[pa.Array, pa.Array]:
    """``window_start`` and ``window_end`` columns: ms, or UTC timestamps."""
    ends = pc.add(starts, size_ms)
    if as_datetime:
        return (pc.cast(starts, pa.timestamp("ms", tz="UTC")), pc.cast(ends, pa.timestamp("ms", tz="UTC")))
    return starts, ends


def fired_windows(op: "WindowOperator", panes: Panes, table: pa.Table) -> tuple[pa.Table, pa.Array]:
    """The output rows of the fired windows in ``table`` and their timestamps (each window's last ms).

    The columns are those of ``WindowOperator.output_row``: the key columns, the bounds, then the
    result's (a result named like an earlier column takes its place).
    """
    starts = _array(table.column(START))
    window_start, window_end = window_bounds(starts, panes.size_ms, op.bounds_as_datetime)
    columns: dict[str, pa.Array] = {}
    for k in panes.keys:
        columns[k] = _array(table.column(k))
    columns["window_start"], columns["window_end"] = window_start, window_end
    results = panes.result_columns(table)
    agg = op.aggregate_fn
    names = list(agg.named) if isinstance(agg, Aggregations) else ["result"]
    for name, values in zip(names, results):
        columns[name] = values
    timestamps = pc.subtract(pc.add(starts, panes.size_ms), 1)
    return pa.table(columns), timestamps

