"""Idleness never swallows a pending watermark: the first look after activity emits it (as Flink's
``WatermarksWithIdleness.IdlenessTimer`` never reports idle on its first check after activity)."""

from __future__ import annotations

from actorflow.operators import OperatorHarness, Record, Watermark, WatermarkStatus
from actorflow.operators.clock import ManualClock
from actorflow.operators.watermarks import (
    BoundedOutOfOrdernessWatermarks,
    TimestampsAndWatermarksOperator,
    WatermarksWithIdleness,
)
from actorflow.operators.windows import Count, TumblingEventTimeWindows, WindowOperator

IDLE, ACTIVE = WatermarkStatus(True), WatermarkStatus(False)


def test_the_first_check_after_records_emits_their_watermark_however_late_it_comes():
    clock = ManualClock(0)
    g = WatermarksWithIdleness(BoundedOutOfOrdernessWatermarks(0), idleness_ms=100, clock=clock)
    for ts in range(1, 7):
        g.on_event(ts)
    clock.advance_to(200)  # the tick comes after the idleness: the records still count
    assert g.on_periodic_emit() == [Watermark(5)]
    clock.advance_to(400)
    assert g.on_periodic_emit() == [IDLE]


def test_back_from_idle_the_watermark_goes_out_before_idle_again():
    clock = ManualClock(0)
    g = WatermarksWithIdleness(BoundedOutOfOrdernessWatermarks(0), idleness_ms=100, clock=clock)
    clock.advance_to(200)
    assert g.on_periodic_emit() == []  # no record yet: quiet from this look on
    clock.advance_to(400)
    assert g.on_periodic_emit() == [IDLE]
    g.on_event(50)
    clock.advance_to(600)
    assert g.on_periodic_emit() == [ACTIVE, Watermark(49)]
    clock.advance_to(800)
    assert g.on_periodic_emit() == [IDLE]


def test_the_window_before_the_pending_watermark_fires():
    h = OperatorHarness([
        TimestampsAndWatermarksOperator(
            WatermarksWithIdleness(BoundedOutOfOrdernessWatermarks(0), idleness_ms=100), interval_ms=200,
        ),
        WindowOperator("k", TumblingEventTimeWindows(5), aggregate=Count()),
    ])
    for ts in range(1, 7):
        h.process_element({"k": "a"}, ts)
    h.set_processing_time(200)
    h.set_processing_time(400)
    h.set_processing_time(600)
    assert h.output == [
        Record({"k": "a", "window_start": 0, "window_end": 5, "result": 4}, 4),
        Watermark(5),
        IDLE,
    ]
