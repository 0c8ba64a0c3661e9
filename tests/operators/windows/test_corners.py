"""Corners of the window operator that Flink's own tests and bug reports reach: purged windows'
timers, merge results, sessions that fired, windows past the largest timestamp, a continuous
trigger at a window's end, and arguments given the wrong way round."""

from __future__ import annotations

from actorflow.operators.windows import (
    ContinuousEventTimeTrigger,
    ContinuousProcessingTimeTrigger,
    Count,
    GlobalWindows,
    PurgingTrigger,
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
