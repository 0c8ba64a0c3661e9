"""The Arrow path: a whole batch assigned and pre-aggregated at once, with the per-record path's results."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
import pyarrow as pa
import pytest

from actorflow.operators import OperatorHarness, Record, SchemaError
from actorflow.operators.windows import (
    Aggregations,
    DynamicEventTimeSessionWindows,
    Count,
    EventTimeSessionWindows,
    Max,
    Mean,
    Min,
    SlidingEventTimeWindows,
    Sum,
    TumblingEventTimeWindows,
    WindowOperator,
)
from actorflow.operators.windows.triggers import CountTrigger
from actorflow.operators.windows.vectorised import why_not_vectorised
from tests.properties import examples


def batch(rows):
    return pa.table({
        "user": pa.array([r[0] for r in rows], pa.string()),
        "region": pa.array([r[1] for r in rows], pa.int64()),
        "amount": pa.array([r[2] for r in rows], pa.int64()),
        "ts": pa.array([r[3] for r in rows], pa.int64()),
    })


class Spy(WindowOperator):
    """Counts the rows that took the per-record path."""

    per_record = 0

    def process_element(self, record):
        self.per_record += 1
        super().process_element(record)


def both(make_op, steps):
    """Run ``steps`` (batches of rows, or watermarks) per record and as Arrow batches."""
    slow, fast = make_op(), make_op()
    hs, hf = OperatorHarness(slow), OperatorHarness(fast)
    hs.open()
    hf.open()
    for step in steps:
        if isinstance(step, int):
            hs.process_watermark(step)
            hf.process_watermark(step)
        else:
            table = batch(step)
            for row in table.to_pylist():
                hs.process_element(row, row["ts"])
            fast.process_batch(table, "ts")
    return hs, hf, slow, fast


def test_an_on_time_batch_never_takes_the_per_record_path():
    op = Spy(("user", "region"), SlidingEventTimeWindows(20, 10), aggregate=Aggregations(n=Count(), total=Sum("amount")))
    h = OperatorHarness(op)
    h.open()
    op.process_batch(batch([("a", 1, 5, 3), ("b", 1, 7, 12), ("a", 1, 1, 15), ("a", 2, None, 15)]), "ts")
    assert op.per_record == 0 and op.metrics.records_in == 4
    h.process_watermark(100)
    assert h.output_values() == [
        {"user": "a", "region": 1, "window_start": -10, "window_end": 10, "n": 1, "total": 5},
        {"user": "a", "region": 1, "window_start": 0, "window_end": 20, "n": 2, "total": 6},
        {"user": "b", "region": 1, "window_start": 0, "window_end": 20, "n": 1, "total": 7},
        {"user": "a", "region": 2, "window_start": 0, "window_end": 20, "n": 1, "total": None},  # nulls only: as Spark's sum
        {"user": "b", "region": 1, "window_start": 10, "window_end": 30, "n": 1, "total": 7},
        {"user": "a", "region": 1, "window_start": 10, "window_end": 30, "n": 1, "total": 1},
        {"user": "a", "region": 2, "window_start": 10, "window_end": 30, "n": 1, "total": None},
    ]


def test_a_window_of_nulls_only_sums_to_null_and_a_null_adds_nothing_on_both_paths():
    # As Spark's sum() and SQL's SUM: null where no value is not null, else the sum of the others.
    # Min, Max and Mean give null there too; Count counts the rows. Over two batches, so that a
    # partial of nulls only merges with a later one, of values for "b" and of nulls for "a".
    def make_op():
        return WindowOperator("user", TumblingEventTimeWindows(10), aggregate=Aggregations(
            n=Count(), total=Sum("amount"), low=Min("amount"), high=Max("amount"), avg=Mean("amount")))

    steps = [[("a", 0, None, 1), ("b", 0, None, 2), ("c", 0, 4, 3)], [("b", 0, 5, 4), ("a", 0, None, 5)], 100]
    hs, hf, _, _ = both(make_op, steps)
    expected = [
        {"user": "a", "window_start": 0, "window_end": 10, "n": 2, "total": None, "low": None, "high": None, "avg": None},
        {"user": "b", "window_start": 0, "window_end": 10, "n": 2, "total": 5, "low": 5, "high": 5, "avg": 5.0},
        {"user": "c", "window_start": 0, "window_end": 10, "n": 1, "total": 4, "low": 4, "high": 4, "avg": 4.0},
    ]
    assert hs.output_values() == expected
    assert hf.output_values() == expected


def test_late_rows_take_the_per_record_path_and_fire_or_go_aside():
    op = Spy("user", TumblingEventTimeWindows(10), aggregate=Count(), allowed_lateness_ms=10, late_data_tag="late")
    h = OperatorHarness(op)
    h.process_element({"user": "a", "region": 0, "amount": 0, "ts": 1}, 1)
    h.process_watermark(15)
    h.clear_output()
    op.per_record = 0
    op.process_batch(batch([("a", 0, 0, 2), ("a", 0, 0, 16), ("b", 0, 0, -5)]), "ts")
    assert op.per_record == 2  # 2 is late but allowed (re-fires [0,10)); -5 is past cleanup
    assert h.output_values() == [{"user": "a", "window_start": 0, "window_end": 10, "result": 2}]
    assert [r.value for r in h.side_outputs["late"]] == [{"user": "b", "region": 0, "amount": 0, "ts": -5}]


@pytest.mark.parametrize(
    "make_op, reason",
    [
        (lambda: WindowOperator("user", DynamicEventTimeSessionWindows(lambda v: 5), aggregate=Count()), "not a tumbling, sliding or session"),
        (lambda: WindowOperator("user", TumblingEventTimeWindows(5), reduce=lambda a, b: a), "only built-in aggregations"),
        (lambda: WindowOperator("user", TumblingEventTimeWindows(5), aggregate=Count(), trigger=CountTrigger(2)), "not the event-time trigger"),
        (lambda: WindowOperator(lambda v: v["user"], TumblingEventTimeWindows(5), aggregate=Count()), "computed by a function"),
    ],
)
def test_what_falls_back_gives_the_same_result(make_op, reason):
    assert reason in (why_not_vectorised(make_op()) or "")
    hs, hf, _, _ = both(make_op, [[("a", 0, 1, 1), ("a", 0, 2, 3), ("b", 0, 3, 2)], 100])
    assert hf.output == hs.output and hs.output_values()


@pytest.mark.parametrize(
    "part, column, outcome",
    [
        (Sum("s"), pa.array(["x", "y"]), "TypeError"),  # Python cannot add them either: the record is named
        (Mean("s"), pa.array(["x", "y"]), "TypeError"),
        (Min("s"), pa.array([[2, 1], [1]]), [1]),  # lists compare in Python, not in Arrow's group-by
        (Max("s"), pa.array([[2, 1], [1]]), [2, 1]),
    ],
)
def test_an_aggregation_arrow_cannot_compute_takes_the_per_record_path(part, column, outcome):
    op = Spy("user", TumblingEventTimeWindows(10), aggregate=part)
    h = OperatorHarness(op)
    h.open()
    table = pa.table({"user": ["a", "a"], "s": column, "ts": pa.array([1, 2], pa.int64())})
    assert "has no Arrow kernel" in (why_not_vectorised(op, table.schema) or "")
    if outcome == "TypeError":
        with pytest.raises(Exception, match=r"aggregate function raised TypeError: .* on record \{'user': 'a', 's': '"):
            op.process_batch(table, "ts")
        return
    op.process_batch(table, "ts")
    h.process_watermark(100)
    assert op.per_record == 2
    assert h.output_values() == [{"user": "a", "window_start": 0, "window_end": 10, "result": outcome}]


@pytest.mark.parametrize(
    "column, message",
    [
        (pa.array([1, None], pa.int64()), "column 'ts' holds nulls in 1 rows; event time needs a timestamp on every record"),
        (pa.array(["1", "2"]), "column 'ts' is of type string; event time needs integer milliseconds"),
    ],
)
def test_bad_event_time_columns(column, message):
    op = WindowOperator("user", TumblingEventTimeWindows(5), aggregate=Count())
    OperatorHarness(op).open()
    with pytest.raises(SchemaError, match=message):
        op.process_batch(pa.table({"user": ["a", "b"], "ts": column}), "ts")


def test_timestamp_columns_are_read_as_milliseconds():
    op = WindowOperator("user", TumblingEventTimeWindows(1000), aggregate=Count())
    h = OperatorHarness(op)
    h.open()
    op.process_batch(pa.table({"user": ["a"], "ts": pa.array([1500], pa.timestamp("ms"))}), "ts")
    h.process_watermark(1999)
    assert h.output_values()[0]["window_start"] == 1000


# ----------------------------------------------------------------------------- property

AGGREGATES = [
    Count(), Sum("amount"), Min("amount"), Max("amount"), Mean("amount"),
    Aggregations(n=Count(), total=Sum("amount"), low=Min("amount"), high=Max("amount"), avg=Mean("amount")),
]


def draw_windows_and_stream(draw, *, lateness=None, operator=WindowOperator):
    """A tumbling or sliding window operator's factory (allowed lateness drawn unless given) and a
    stream for it: batches of rows, out of order within a bound, some around the watermark (on
    time, at a fired window's end, late but allowed, too late), and watermarks."""
    size = draw(st.integers(1, 30))
    sliding = draw(st.booleans())
    slide = draw(st.integers(1, size)) if sliding else size
    offset = draw(st.integers(-(slide - 1), slide - 1))
    assigner = SlidingEventTimeWindows(size, slide, offset) if sliding else TumblingEventTimeWindows(size, offset)
    aggregate = draw(st.sampled_from(AGGREGATES))
    key = draw(st.sampled_from(["user", ("user", "region"), "region"]))  # "region": one integer key
    lateness = draw(st.integers(0, 20)) if lateness is None else lateness
    tag = draw(st.sampled_from([None, "late"]))
    bound = draw(st.integers(0, 25))  # how far out of order records may be behind the largest so far

    def make_op():
        return operator(key, assigner, aggregate=aggregate, allowed_lateness_ms=lateness, late_data_tag=tag)

    steps = []
    top = draw(st.integers(-50, 50))
    wm = top - bound - 1
    for _ in range(draw(st.integers(1, 8))):
        rows = []
        for _ in range(draw(st.integers(0, 12))):
            top = max(top, top + draw(st.integers(-3, 8)))
            if draw(st.integers(0, 4)) == 0:
                ts = wm - draw(st.integers(-2, size + lateness + 2))
            else:
                ts = top - draw(st.integers(0, bound))
            amount = draw(st.one_of(st.none(), st.integers(-100, 100)))
            rows.append((draw(st.sampled_from("abc")), draw(st.integers(0, 1)), amount, ts))
        steps.append(rows)
        if draw(st.booleans()):
            wm = max(wm, top - bound - 1)  # a bounded-out-of-orderness watermark
            steps.append(wm)
    steps.append(top + 1000)
    return make_op, steps


@st.composite
def operators_and_streams(draw):
    return draw_windows_and_stream(draw)


@settings(max_examples=examples(200), deadline=None)
@given(case=operators_and_streams())
def test_vectorised_and_per_record_paths_agree(case):
    make_op, steps = case
    hs, hf, slow, fast = both(make_op, steps)
    assert hf.output == hs.output
    assert dict(hf.side_outputs) == dict(hs.side_outputs)
    assert fast.metrics.late_records_dropped == slow.metrics.late_records_dropped
    assert fast.metrics.records_in == slow.metrics.records_in
    assert fast._contents == slow._contents


@st.composite
def sessions_and_streams(draw):
    gap = draw(st.integers(1, 15))
    aggregate = draw(st.sampled_from(AGGREGATES))
    key = draw(st.sampled_from(["user", ("user", "region"), "region"]))  # "region": one integer key
    lateness = draw(st.integers(0, 20))
    tag = draw(st.sampled_from([None, "late"]))
    bound = draw(st.integers(0, 25))

    def make_op():
        return WindowOperator(key, EventTimeSessionWindows(gap), aggregate=aggregate, allowed_lateness_ms=lateness,
                              late_data_tag=tag)

    steps = []
    top = draw(st.integers(-50, 50))
    wm = top - bound - 1
    for _ in range(draw(st.integers(1, 8))):
        rows = []
        for _ in range(draw(st.integers(0, 12))):
            top = max(top, top + draw(st.integers(-3, 2 * gap)))
            if draw(st.integers(0, 4)) == 0:
                ts = wm - draw(st.integers(-2, gap + lateness + 2))  # around the watermark
            else:
                ts = top - draw(st.integers(0, bound))
            amount = draw(st.one_of(st.none(), st.integers(-100, 100)))
            rows.append((draw(st.sampled_from("abc")), draw(st.integers(0, 1)), amount, ts))
        steps.append(rows)
        if draw(st.booleans()):
            wm = max(wm, top - bound - 1)
            steps.append(wm)
    steps.append(top + 1000)
    return make_op, steps


@settings(max_examples=examples(200), deadline=None)
@given(case=sessions_and_streams())
def test_vectorised_sessions_give_the_per_record_sessions(case):
    # Sub-sessions merge in another order than single records: the same sessions and results
    # come out, but simultaneous firings may come out in another order.
    make_op, steps = case
    hs, hf, slow, fast = both(make_op, steps)
    assert sorted(hf.output, key=repr) == sorted(hs.output, key=repr)
    assert sorted(hf.side_outputs.get("late", []), key=repr) == sorted(hs.side_outputs.get("late", []), key=repr)
    assert fast.metrics.late_records_dropped == slow.metrics.late_records_dropped
    assert fast.metrics.records_in == slow.metrics.records_in
    assert fast._merging.keys() == slow._merging.keys()


def test_an_on_time_batch_of_sessions_never_takes_the_per_record_path():
    op = Spy("user", EventTimeSessionWindows(5), aggregate=Aggregations(n=Count(), total=Sum("amount")))
    h = OperatorHarness(op)
    h.open()
    op.process_batch(batch([("a", 0, 1, 10), ("b", 0, 2, 11), ("a", 0, 3, 15), ("a", 0, 4, 30), ("a", 0, 5, 3)]), "ts")
    assert op.per_record == 0
    h.process_watermark(100)
    assert sorted(h.output_values(), key=lambda r: (r["user"], r["window_start"])) == [
        {"user": "a", "window_start": 3, "window_end": 8, "n": 1, "total": 5},
        {"user": "a", "window_start": 10, "window_end": 20, "n": 2, "total": 4},  # [10, 15) and [15, 20) touch
        {"user": "a", "window_start": 30, "window_end": 35, "n": 1, "total": 4},
        {"user": "b", "window_start": 11, "window_end": 16, "n": 1, "total": 2},
    ]


def test_a_row_whose_session_already_fired_stays_late_when_a_later_row_of_its_batch_bridges_it():
    # Per record, b@-2 arrives while its own session [-2, 0) is already past the watermark, and is
    # dropped; b@-1, after it, bridges nothing for it any more. The Arrow path must not group the
    # batch's rows of "b" before deciding that.
    def make_op():
        return WindowOperator("user", EventTimeSessionWindows(2), aggregate=Count())

    steps = [[("a", 0, None, -1)] * 3, -1, [("b", 0, None, 1), ("b", 0, None, -2), ("a", 0, None, -1), ("b", 0, None, -1)], 1000]
    hs, hf, slow, fast = both(make_op, steps)
    sessions = [r.value for r in hf.output if isinstance(r, Record)]
    assert {"user": "b", "window_start": -1, "window_end": 3, "result": 2} in sessions
    assert sorted(hf.output, key=repr) == sorted(hs.output, key=repr)
    assert fast.metrics.late_records_dropped == slow.metrics.late_records_dropped == 1
