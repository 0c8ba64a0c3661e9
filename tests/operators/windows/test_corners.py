"""Corners of the window operator that Flink's own tests and bug reports reach: purged windows'
timers, merge results, sessions that fired, windows past the largest timestamp, a continuous
trigger at a window's end, and arguments given the wrong way round."""

from __future__ import annotations

import pytest

from actorflow.operators import OperatorHarness, ResultTypeError
from actorflow.operators.windows import (
    ContinuousEventTimeTrigger,
    ContinuousProcessingTimeTrigger,
    Count,
    EventTimeSessionWindows,
    EventTimeTrigger,
    GlobalWindows,
    MergingWindowAssigner,
    PurgingTrigger,
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
    assert op._contents and op._timers.event_time_timers() == []
    h.process_element({"k": "a", "late": True}, 3)  # late for the window it lands in, which must go
    assert h.side_output("late") == [{"k": "a", "late": True}]
    assert op._contents == {} and op._trigger_state == {} and op._merging == {}
    assert op._timers.event_time_timers() == [] and op._timers.processing_time_timers() == []
