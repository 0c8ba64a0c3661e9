"""Pre-aggregation ahead of a key split: a batch's partial aggregates per key and window, made where
the batch is read and merged by the window operator that owns the keys, with the per-record path's
output, late count and state."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from actorflow.operators import OperatorHarness
from actorflow.operators.windows import Count, Mean, SlidingEventTimeWindows, Sum, TumblingEventTimeWindows, WindowOperator
from actorflow.operators.windows.panes import ROW
from tests.operators.windows.test_panes import _arrow, _per_record
from tests.operators.windows.test_vectorised import batch, draw_windows_and_stream
from tests.properties import examples


def _pre_aggregated(make_op, steps, snapshot_at=None, one_by_one=frozenset(), halves=False):
    """Run ``steps`` with every batch pre-aggregated (where the operator allows it) and merged.

    With ``halves``, a batch's partials arrive as two items, those whose first key column holds
    the first partial's value first, as from two instances that each route their share of the
    keys here."""
    taken = []

    def feed(op, table):
        partials = op.pre_aggregate(table, table.column("ts"))
        if partials is None:
            op.process_batch(table, "ts")
            return
        taken.append(table.num_rows)
        if halves:
            first = partials.column(op.key_fields[0])
            first_half = pc.equal(first, first[0])
            op.process_partials(partials.filter(first_half), table.num_rows)
            op.process_partials(partials.filter(pc.invert(first_half)), table.num_rows)
        else:
            op.process_partials(partials, table.num_rows)

    counts = {"records_in": 0, "late_records_dropped": 0}
    output, side, op = _arrow(make_op, steps, snapshot_at, one_by_one, feed, counts)
    return output, side, op, {name: n + getattr(op.metrics, name) for name, n in counts.items()}, len(taken)


@st.composite
def streams(draw):
    make_op, steps = draw_windows_and_stream(draw, operator=WindowOperator)
    snapshot_at = draw(st.integers(0, len(steps)))
    one_by_one = draw(st.sets(st.integers(0, len(steps) - 1), max_size=2))
    return make_op, steps, snapshot_at, one_by_one, draw(st.booleans())


@settings(max_examples=examples(300), deadline=None)
@given(case=streams())
def test_pre_aggregated_batches_give_the_per_record_output(case):
    make_op, steps, snapshot_at, one_by_one, halves = case
    h, slow = _per_record(make_op, steps)
    output, side, fast, counts, taken = _pre_aggregated(make_op, steps, snapshot_at, one_by_one, halves)
    if halves:  # two channels: windows that fire together may come in either channel's order
        assert sorted(map(repr, output)) == sorted(map(repr, h.output))
    else:
        assert output == h.output
    assert side == dict(h.side_outputs)
    assert counts == {"records_in": slow.metrics.records_in, "late_records_dropped": slow.metrics.late_records_dropped}
    assert fast._contents == slow._contents
    probe = make_op()
    exact = (type(probe.assigner) is TumblingEventTimeWindows and probe.allowed_lateness_ms == 0
             and probe.late_data_tag is None)
    batches = [i for i, s in enumerate(steps) if not isinstance(s, int) and s and i not in one_by_one]
    assert taken == (len(batches) if exact else 0)


def test_partials_hold_a_row_per_key_and_window_with_the_first_row_and_count():
    op = WindowOperator("user", TumblingEventTimeWindows(10), aggregate=Sum("amount"))
    OperatorHarness(op).open()
    table = batch([("a", 0, 1, 3), ("b", 0, 2, 4), ("a", 0, 3, 5), ("a", 0, 4, 12)])
    partials = op.pre_aggregate(table, table.column("ts"))
    got = sorted(partials.to_pylist(), key=lambda r: r[f"{ROW}_min"])
    assert [(r["user"], r["__actorflow_window_start"], r[f"{ROW}_min"], r[f"{ROW}_count"], r["amount_sum"]) for r in got] == [
        ("a", 0, 0, 2, 4), ("b", 0, 1, 1, 2), ("a", 10, 3, 1, 4)]


def test_a_partial_for_a_window_that_fired_is_counted_as_dropped():
    op = WindowOperator("user", TumblingEventTimeWindows(10), aggregate=Count())
    h = OperatorHarness(op)
    h.open()
    h.process_watermark(9)
    table = batch([("a", 0, 1, 3), ("a", 0, 1, 5), ("b", 0, 1, 14)])
    assert op.process_partials(op.pre_aggregate(table, table.column("ts")), table.num_rows) == 3
    assert op.metrics.late_records_dropped == 2 and op.metrics.records_in == 3
    h.process_watermark(19)
    assert h.output_values() == [{"user": "b", "window_start": 10, "window_end": 20, "result": 1}]


@pytest.mark.parametrize(
    "make_op",
    [
        lambda: WindowOperator("user", SlidingEventTimeWindows(10, 5), aggregate=Count()),  # a row in several windows
        lambda: WindowOperator("user", TumblingEventTimeWindows(10), aggregate=Count(), allowed_lateness_ms=5),
        lambda: WindowOperator("user", TumblingEventTimeWindows(10), aggregate=Count(), late_data_tag="late"),
        lambda: WindowOperator("user", TumblingEventTimeWindows(10), reduce=lambda a, b: a),
        lambda: WindowOperator(lambda v: v["user"], TumblingEventTimeWindows(10), aggregate=Count()),
    ],
)
def test_what_needs_the_rows_is_not_pre_aggregated(make_op):
    op = make_op()
    OperatorHarness(op).open()
    table = batch([("a", 0, 1, 3)])
    assert op.pre_aggregate(table, table.column("ts")) is None
    # Known before any batch: a key split hands such an operator's batches on as they are.
    assert not op.pre_aggregates()
    assert WindowOperator("user", TumblingEventTimeWindows(10), aggregate=Count()).pre_aggregates()


def test_null_or_missing_event_times_and_key_columns_are_not_pre_aggregated():
    op = WindowOperator("user", TumblingEventTimeWindows(10), aggregate=Mean("amount"))
    OperatorHarness(op).open()
    table = batch([("a", 0, 1, 3), ("b", 0, 1, 4)])
    assert op.pre_aggregate(table, pa.array([3, None], pa.int64())) is None  # the row path names the row
    assert op.pre_aggregate(table.drop_columns(["user"]), table.column("ts")) is None
    assert op.pre_aggregate(table.slice(0, 0), table.column("ts").slice(0, 0)) is None
