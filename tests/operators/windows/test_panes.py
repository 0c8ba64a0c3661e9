"""Panes: the Arrow path's window state as tables, with the per-record path's output, order and state."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
import pytest

from actorflow.operators import OperatorHarness, harness
from actorflow.operators.windows import Count, Sum, TumblingEventTimeWindows, WindowOperator
from actorflow.operators.windows.panes import Panes
from tests.operators.windows.test_vectorised import Spy, batch, draw_windows_and_stream
from tests.properties import examples


@st.composite
def streams(draw):
    """Tumbling or sliding windows without allowed lateness, a stream with late rows, and where
    a snapshot is taken and which batches come row by row instead."""
    make_op, steps = draw_windows_and_stream(draw, lateness=0, operator=Spy)
    snapshot_at = draw(st.integers(0, len(steps)))
    one_by_one = draw(st.sets(st.integers(0, len(steps) - 1), max_size=2))
    return make_op, steps, snapshot_at, one_by_one


def _per_record(make_op, steps):
    op = make_op()
    h = OperatorHarness(op)
    h.open()
    for step in steps:
        if isinstance(step, int):
            h.process_watermark(step)
        else:
            for row in batch(step).to_pylist():
                h.process_element(row, row["ts"])
    return h, op


def _arrow(make_op, steps, snapshot_at=None, one_by_one=frozenset(), feed=None, counts=None):
    """Run ``steps`` with batches through ``feed(op, table)`` (``process_batch`` by default).

    ``counts`` (metric names) adds up those of the operators that a restore replaced."""
    op = make_op()
    h = OperatorHarness(op)
    h.open()
    output, side = [], {}
    for i, step in enumerate(steps):
        if i == snapshot_at:  # a restored operator goes on where this one stopped
            state = h.snapshot()
            for name in counts or {}:
                counts[name] += getattr(op.metrics, name)
            output += h.output
            for tag, values in h.side_outputs.items():
                side.setdefault(tag, []).extend(values)
            op = make_op()
            h = OperatorHarness(op)
            h.restore(state)
            h.open()
        if isinstance(step, int):
            h.process_watermark(step)
        elif i in one_by_one:  # through the per-record path: the panes move into the dict state
            for row in batch(step).to_pylist():
                h.process_element(row, row["ts"])
        elif feed is not None:
            feed(op, batch(step))
        else:
            op.process_batch(batch(step), "ts")
    output += h.output
    for tag, values in h.side_outputs.items():
        side.setdefault(tag, []).extend(values)
    return output, side, op


@settings(max_examples=examples(300), deadline=None)
@given(case=streams())
def test_panes_give_the_per_record_output_in_its_order(case):
    make_op, steps, _, _ = case
    slow, slow_op = _per_record(make_op, steps)
    output, side, fast = _arrow(make_op, steps)
    assert output == slow.output
    assert side == dict(slow.side_outputs)
    assert fast.metrics.late_records_dropped == slow_op.metrics.late_records_dropped
    assert fast.metrics.records_in == slow_op.metrics.records_in
    assert fast.per_record == 0  # late rows too: none took the per-record path
    assert not fast._panes and not fast._contents


@settings(max_examples=examples(300), deadline=None)
@given(case=streams())
def test_panes_survive_a_snapshot_and_give_way_to_records_one_by_one(case):
    make_op, steps, snapshot_at, one_by_one = case
    slow, _ = _per_record(make_op, steps)
    output, side, _ = _arrow(make_op, steps, snapshot_at, one_by_one)
    assert output == slow.output
    assert side == dict(slow.side_outputs)


@settings(max_examples=examples(100), deadline=None)
@given(case=streams())
def test_an_output_that_takes_no_tables_gets_a_record_per_window(case):
    make_op, steps, _, _ = case
    slow, _ = _per_record(make_op, steps)
    with pytest.MonkeyPatch.context() as patch:
        patch.delattr(harness._CollectingOutput, "collect_table")
        output, side, _ = _arrow(make_op, steps)
    assert output == slow.output
    assert side == dict(slow.side_outputs)


def test_a_window_that_several_batches_add_to_fires_once_with_all_of_them():
    op = WindowOperator("user", TumblingEventTimeWindows(10), aggregate=Sum("amount"))
    h = OperatorHarness(op)
    h.open()
    op.process_batch(batch([("a", 0, 1, 1), ("b", 0, 2, 2)]), "ts")
    op.process_batch(batch([("a", 0, 3, 5), ("a", 0, 4, 12)]), "ts")
    assert isinstance(op._panes, Panes) and len(op._panes.tables) == 2 and not op._contents
    h.process_watermark(9)
    assert h.output_values() == [
        {"user": "a", "window_start": 0, "window_end": 10, "result": 4},
        {"user": "b", "window_start": 0, "window_end": 10, "result": 2},
    ]
    h.process_watermark(19)
    assert h.output_values()[2:] == [{"user": "a", "window_start": 10, "window_end": 20, "result": 4}]
    assert not op._panes


def test_allowed_lateness_or_a_process_function_keeps_the_dict_state():
    lateness = WindowOperator("user", TumblingEventTimeWindows(10), aggregate=Count(), allowed_lateness_ms=5)
    process = WindowOperator("user", TumblingEventTimeWindows(10), aggregate=Count(), process=lambda k, c, e: e)
    for op in (lateness, process):
        OperatorHarness(op).open()
        op.process_batch(batch([("a", 0, 1, 1)]), "ts")
        assert not op._panes and op._contents
