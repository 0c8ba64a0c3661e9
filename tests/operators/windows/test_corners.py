"""Corners of the window operator that Flink's own tests and bug reports reach: purged windows'
timers, merge results, sessions that fired, windows past the largest timestamp, a continuous
trigger at a window's end, and arguments given the wrong way round."""

from __future__ import annotations

import pyarrow as pa
import pytest

from actorflow.operators import ConfigurationError, OperatorHarness, ResultTypeError, Watermark
from actorflow.operators.windows import (
    ContinuousEventTimeTrigger,
    ContinuousProcessingTimeTrigger,
    Count,
    DynamicEventTimeSessionWindows,
    EventTimeSessionWindows,
    EventTimeTrigger,
    GlobalWindows,
    MergingWindowAssigner,
    PurgingTrigger,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    Sum,
    TimeWindow,
    TriggerResult,
    TumblingEventTimeWindows,
    WindowOperator,
)

from .transcript import run

MAX = 2**63 - 1


# ------------------------------------------------------------- a purged window's timers


def test_a_purged_global_window_keeps_its_continuous_processing_time_trigger_going():
    op = WindowOperator("k", GlobalWindows(), aggregate=Count(), trigger=PurgingTrigger(ContinuousProcessingTimeTrigger(1000)))
    _, out = run(op, ["pt 100", "a", "pt 1000", "pt 2000", "pt 2500", "a", "pt 3000"])
    # At 2000 the window is empty: nothing is emitted, but the trigger still sets its next firing.
    assert out == [f"a global 1 @{MAX}", f"a global 1 @{MAX}"]


def test_a_purged_event_time_window_fires_at_the_next_continuous_firing():
    op = WindowOperator("k", TumblingEventTimeWindows(100), aggregate=Count(), trigger=PurgingTrigger(ContinuousEventTimeTrigger(10)))
    _, out = run(op, ["a@5", "wm 10", "wm 20", "a@25", "wm 30", "wm 99"])
    # At 20 the window was empty (purged at 10); the record at 25 comes out at 30, not at the end.
    assert out == ["a [0,100) 1 @99", "wm 10", "wm 20", "a [0,100) 1 @99", "wm 30", "wm 99"]


# ------------------------------------------------------------------- merge results


class Shrinking(MergingWindowAssigner):
    """Windows of 10 ms that merge, when they overlap, into what ``result`` makes of them."""

    def __init__(self, result, event_time=True):
        self.result = result
        self.is_event_time = event_time

    def assign_windows(self, value, timestamp_ms, processing_time_ms):
        t = timestamp_ms if self.is_event_time else processing_time_ms
        return [TimeWindow(t, t + 10)]

    def merge_windows(self, windows, merge):
        ordered = sorted(windows)
        for a, b in zip(ordered, ordered[1:]):
            if a.end_ms >= b.start_ms:
                merge([a, b], self.result(a, b))

    def __repr__(self):
        return "Shrinking()"


def test_a_merge_that_ends_an_event_time_window_before_the_watermark_is_refused():
    h = OperatorHarness(WindowOperator("k", Shrinking(lambda a, b: TimeWindow(a.start_ms, a.start_ms + 1)), aggregate=Count()))
    h.process_element({"k": "a"}, 100)
    h.process_watermark(105)
    with pytest.raises(ResultTypeError) as info:
        h.process_element({"k": "a"}, 106)
    message = str(info.value)
    assert "Shrinking()" in message and "TimeWindow(start_ms=100, end_ms=110)" in message
    assert "TimeWindow(start_ms=106, end_ms=116)" in message and "TimeWindow(start_ms=100, end_ms=101)" in message
    assert "watermark 105" in message


def test_a_merge_that_ends_a_processing_time_window_before_now_is_refused():
    h = OperatorHarness(WindowOperator("k", Shrinking(lambda a, b: TimeWindow(a.start_ms, a.start_ms + 1), event_time=False), aggregate=Count()))
    h.set_processing_time(100)
    h.process_element({"k": "a"})
    h.set_processing_time(106)
    with pytest.raises(ResultTypeError, match=r"TimeWindow\(start_ms=100, end_ms=101\), which ends at or before the processing time 106"):
        h.process_element({"k": "a"})
    assert h.output == []  # it was not emitted at once


def test_a_merge_result_that_does_not_cover_the_windows_it_merges_is_refused():
    # Not late (the watermark is far behind), but 106..115 would fall out of the window.
    h = OperatorHarness(WindowOperator("k", Shrinking(lambda a, b: TimeWindow(a.start_ms, 112)), aggregate=Count()))
    h.process_element({"k": "a"}, 100)
    with pytest.raises(ResultTypeError, match=r"into TimeWindow\(start_ms=100, end_ms=112\), which does not cover them"):
        h.process_element({"k": "a"}, 106)


class EarlyThenForget(EventTimeTrigger):
    """Fires at processing time 100 or at the window's end, whichever comes first; firing early,
    it deletes its timer at the end, and with it the cleanup timer that shares it (as in Flink)."""

    def on_element(self, value, timestamp_ms, window, ctx):
        ctx.register_processing_time_timer(100)
        return super().on_element(value, timestamp_ms, window, ctx)

    def on_processing_time(self, time_ms, window, ctx):
        ctx.delete_event_time_timer(window.max_timestamp())
        return TriggerResult.FIRE

    def clear(self, window, ctx):
        ctx.delete_processing_time_timer(100)
        super().clear(window, ctx)


@pytest.mark.parametrize("assigner", [TumblingEventTimeWindows(10), EventTimeSessionWindows(10)], ids=["tumbling", "session"])
def test_a_window_found_late_at_assignment_with_state_is_cleared(assigner):
    op = WindowOperator("k", assigner, aggregate=Count(), trigger=EarlyThenForget(), late_data_tag="late")
    h = OperatorHarness(op)
    h.process_element({"k": "a"}, 0)
    h.process_element({"k": "a"}, 5)
    h.set_processing_time(100)  # fires early; nothing cleans the window up now
    h.process_watermark(30)
    assert h.window_state() and h.timers() == {"event": [], "processing": []}
    h.process_element({"k": "a", "late": True}, 3)  # late for the window it lands in, which must go
    assert [r.value for r in h.side_output("late")] == [{"k": "a", "late": True}]
    assert h.window_state() == {} and op._trigger_state == {} and op._merging == {}
    assert h.timers() == {"event": [], "processing": []}


# ------------------------------------------------------------ sessions that closed


def session_op(**kwargs):
    return WindowOperator("k", EventTimeSessionWindows(5), aggregate=Count(), **kwargs)


def test_a_record_that_would_reopen_a_fired_session_goes_to_the_side_output():
    h, out = run(session_op(late_data_tag="late"), ["a@0", "wm 6", "a@3", "wm 20"])
    # Not a second session [3,8) overlapping the [0,5) that came out.
    assert out == ["a [0,5) 1 @4", "wm 6", "wm 20"]
    assert [r.value for r in h.side_output("late")] == [{"k": "a", "v": 1}]


def test_without_a_side_output_it_is_counted_as_dropped():
    op = session_op()
    _, out = run(op, ["a@0", "wm 6", "a@3", "wm 20"])
    assert out == ["a [0,5) 1 @4", "wm 6", "wm 20"] and op.metrics.late_records_dropped == 1


def test_within_the_allowed_lateness_it_joins_the_session_and_past_it_is_late():
    h, out = run(session_op(allowed_lateness_ms=10, late_data_tag="late"), ["a@0", "wm 6", "a:2@3", "wm 20", "a:3@7", "wm 40"])
    # 3 joins [0,5) while it may (a late firing, as in Flink); 7 comes after [0,8) was cleaned up at 17.
    assert out == ["a [0,5) 1 @4", "wm 6", "a [0,8) 2 @7", "wm 20", "wm 40"]
    assert [r.value for r in h.side_output("late")] == [{"k": "a", "v": 3}]


def test_a_session_that_only_touches_the_fired_one_is_on_time():
    h, out = run(session_op(late_data_tag="late"), ["a@0", "wm 4", "a@5", "b@2", "wm 20"])
    # 5 is ahead of the watermark: its session [5,10) touches [0,5) but overlaps nothing emitted.
    # Other keys know nothing of a's sessions.
    assert out == ["a [0,5) 1 @4", "wm 4", "b [2,7) 1 @6", "a [5,10) 1 @9", "wm 20"]
    assert [r.value for r in h.side_output("late")] == []


def test_a_closed_session_is_remembered_only_while_a_record_could_still_reopen_it():
    op = session_op(late_data_tag="late")
    h, _ = run(op, ["a@0", "wm 6"])
    assert op._closed_sessions == {"a": [TimeWindow(0, 5)]}
    h.process_watermark(9)  # a record at 4 would still open [4,9), not late by itself
    assert op._closed_sessions
    h.process_watermark(10)  # end 5 + lateness 0 + gap 5: every record that overlaps [0,5) is late by itself now
    assert op._closed_sessions == {}


def test_the_closed_sessions_survive_a_snapshot():
    h, _ = run(session_op(late_data_tag="late"), ["a@0", "wm 6"])
    restored = OperatorHarness(session_op(late_data_tag="late"))
    restored.restore(h.snapshot())
    restored.process_element({"k": "a", "v": 1}, 3)
    restored.process_watermark(20)
    assert restored.output == [Watermark(20)] and [r.value for r in restored.side_output("late")] == [{"k": "a", "v": 1}]


def test_a_batch_on_the_arrow_path_finds_the_closed_session_too():
    op = WindowOperator("k", EventTimeSessionWindows(5), aggregate=Sum("v"), late_data_tag="late")
    h = OperatorHarness(op)
    h.open()
    op.process_batch(pa.table({"k": ["a"], "v": [1], "ts": [0]}), "ts")
    h.process_watermark(6)
    op.process_batch(pa.table({"k": ["a", "b"], "v": [2, 3], "ts": [3, 3]}), "ts")
    h.process_watermark(20)
    assert h.output_values() == [
        {"k": "a", "window_start": 0, "window_end": 5, "result": 1},
        {"k": "b", "window_start": 3, "window_end": 8, "result": 3},
    ]
    assert [r.value for r in h.side_output("late")] == [{"k": "a", "v": 2, "ts": 3}]


def test_with_dynamic_gaps_the_widest_gap_seen_keeps_a_closed_session():
    op = WindowOperator("k", DynamicEventTimeSessionWindows(lambda v: v["gap"]), aggregate=Count(), late_data_tag="late")
    h = OperatorHarness(op)
    h.process_element({"k": "b", "gap": 50}, 100)  # another key's wide gap
    h.process_element({"k": "a", "gap": 5}, 0)
    h.process_watermark(30)  # [0,5) fires; [3,53) would still be open
    h.process_element({"k": "a", "gap": 50}, 3)
    assert [r.value for r in h.side_output("late")] == [{"k": "a", "gap": 50}]


# ------------------------------------------------- windows past the largest timestamp

LAST_START = MAX - MAX % 1000  # the window of MAX - 100 would end 193 ms past MAX


@pytest.mark.parametrize("assigner", [TumblingEventTimeWindows(1000), SlidingEventTimeWindows(1000, 500)], ids=["tumbling", "sliding"])
def test_a_window_that_would_end_past_the_largest_timestamp_ends_there_and_fires_at_the_final_watermark(assigner):
    op = WindowOperator("k", assigner, aggregate=Count())
    h, out = run(op, ["a@9223372036854775707", f"wm {MAX}"])
    assert out[-2:] == [f"a [{LAST_START},{MAX}) 1 @{MAX - 1}", f"wm {MAX}"]
    assert h.window_state() == {} and h.timers()["event"] == []  # fired and cleaned up


def test_a_session_that_would_end_past_the_largest_timestamp_ends_there():
    op = WindowOperator("k", EventTimeSessionWindows(1000), aggregate=Count())
    h, out = run(op, ["a@9223372036854775707", f"wm {MAX}"])
    assert out == [f"a [{MAX - 100},{MAX}) 1 @{MAX - 1}", f"wm {MAX}"]
    assert h.window_state() == {} and h.timers()["event"] == []


def test_on_the_arrow_path_too():
    op = WindowOperator("k", TumblingEventTimeWindows(1000), aggregate=Count())
    h = OperatorHarness(op)
    h.open()
    table = pa.table({"k": ["a", "a"]})
    timestamps = pa.array([5, MAX - 100], pa.int64())
    assert op.pre_aggregate(table, timestamps) is None  # the rows go to the operator themselves
    op.process_timestamped_batch(table, timestamps)
    h.process_watermark(MAX)
    assert h.output_values() == [
        {"k": "a", "window_start": 0, "window_end": 1000, "result": 1},
        {"k": "a", "window_start": LAST_START, "window_end": MAX, "result": 1},
    ]
    assert h.window_state() == {}


# ------------------------------------- a continuous processing-time trigger at the end


class AtMost(ContinuousProcessingTimeTrigger):
    """Fails the test, instead of hanging it, if it is asked too often."""

    calls = 0

    def on_processing_time(self, time_ms, window, ctx):
        AtMost.calls += 1
        if AtMost.calls > 50:
            raise AssertionError(f"on_processing_time({time_ms}) called over and over")
        return super().on_processing_time(time_ms, window, ctx)


@pytest.mark.parametrize("steps", [
    ["a@5", "pt 50", "pt 99", "pt 5000", "wm 99"],  # processing time reaches the window's last millisecond
    ["pt 5000", "a@5", "pt 5001", "pt 9000", "wm 99"],  # the record comes when it is long past
], ids=["reaches-the-end", "past-the-end"])
def test_a_continuous_processing_time_trigger_stops_at_an_event_time_windows_end(steps):
    AtMost.calls = 0
    op = WindowOperator("k", TumblingEventTimeWindows(100), aggregate=Count(), trigger=AtMost(1000))
    h, out = run(op, steps)
    assert out == ["a [0,100) 1 @99", "wm 99"]  # once, at the window's end, then cleaned up
    assert h.timers() == {"event": [], "processing": []}


# ------------------------------------------------------- arguments the wrong way round


@pytest.mark.parametrize("assigner", [SlidingEventTimeWindows, SlidingProcessingTimeWindows])
def test_a_slide_larger_than_the_size_is_refused_as_probably_swapped(assigner):
    with pytest.raises(ConfigurationError) as info:
        assigner.of(1_000, 5_000)
    assert str(info.value) == (
        "slide_ms must be <= size_ms, got size_ms=1000 and slide_ms=5000: the rows between two windows would fall in "
        f"none. The size comes first: {assigner.__name__}(5000, 1000) if the arguments were swapped"
    )


def test_merge_time_windows_is_there_for_a_custom_merging_assigner():
    from actorflow.windows import merge_time_windows

    merged = []
    merge_time_windows([TimeWindow(0, 5), TimeWindow(20, 25), TimeWindow(4, 9)], lambda ws, w: merged.append((ws, w)))
    assert merged == [([TimeWindow(0, 5), TimeWindow(4, 9)], TimeWindow(0, 9))]
