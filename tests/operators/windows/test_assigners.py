"""Window assigners: which windows an element falls in, and what they refuse at construction."""

from __future__ import annotations

import pytest

from actorflow.operators import ConfigurationError
from actorflow.operators.windows import (
    CountTrigger,
    DynamicEventTimeSessionWindows,
    EventTimeSessionWindows,
    GlobalWindow,
    GlobalWindows,
    NeverTrigger,
    ProcessingTimeSessionWindows,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    count_window,
    window_start_with_offset,
)
from actorflow.operators.windows.assigners import merge_time_windows
from actorflow.operators.windows.triggers import EventTimeTrigger, ProcessingTimeTrigger


def test_time_window_bounds_intersection_and_cover():
    w = TimeWindow(0, 10)
    assert w.max_timestamp() == 9
    assert w.intersects(TimeWindow(10, 20))  # touching windows intersect: sessions that touch merge
    assert not w.intersects(TimeWindow(11, 20))
    assert w.cover(TimeWindow(5, 30)) == TimeWindow(0, 30)
    assert TimeWindow(3, 4).cover(TimeWindow(0, 10)) == TimeWindow(0, 10)


@pytest.mark.parametrize(
    "timestamp, offset, size, start",
    [
        (17, 0, 10, 10),  # plain
        (10, 0, 10, 10),  # the start belongs to the window
        (9, 0, 10, 0),  # the last millisecond of the previous one
        (-3, 0, 10, -10),  # negative time rounds down, not toward zero
        (17, 8, 10, 8),  # a positive offset shifts the grid
        (17, -3, 10, 17),  # a negative offset too
        (3_600_000 * 5 + 1, 3_600_000 * 2, 3_600_000 * 24, 3_600_000 * 2),  # days starting at 02:00
    ],
)
def test_window_start_with_offset(timestamp, offset, size, start):
    assert window_start_with_offset(timestamp, offset, size) == start


@pytest.mark.parametrize(
    "assigner, timestamp, now, windows",
    [
        (TumblingEventTimeWindows(10), 17, 999, [TimeWindow(10, 20)]),  # event time ignores the clock
        (TumblingEventTimeWindows(10, offset_ms=5), 17, 0, [TimeWindow(15, 25)]),
        (TumblingProcessingTimeWindows(10), 999, 17, [TimeWindow(10, 20)]),  # processing time ignores the timestamp
        (SlidingEventTimeWindows(10, 5), 17, 0, [TimeWindow(15, 25), TimeWindow(10, 20)]),  # newest first
        (SlidingEventTimeWindows(10, 3), 7, 0, [TimeWindow(6, 16), TimeWindow(3, 13), TimeWindow(0, 10)]),
        (SlidingEventTimeWindows(10, 5, offset_ms=2), 8, 0, [TimeWindow(7, 17), TimeWindow(2, 12)]),
        (SlidingEventTimeWindows(10, 10), 3, 0, [TimeWindow(0, 10)]),  # a slide of the size: tumbling
        (SlidingProcessingTimeWindows(10, 5), 0, 12, [TimeWindow(10, 20), TimeWindow(5, 15)]),
        (EventTimeSessionWindows(5), 3, 0, [TimeWindow(3, 8)]),
        (ProcessingTimeSessionWindows(5), 0, 3, [TimeWindow(3, 8)]),
        (DynamicEventTimeSessionWindows(lambda v: v), 3, 0, [TimeWindow(3, 10)]),  # value 7 is the gap
        (GlobalWindows(), 3, 0, [GlobalWindow()]),
    ],
)
def test_assign_windows(assigner, timestamp, now, windows):
    assert list(assigner.assign_windows(7, timestamp, now)) == windows


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: TumblingEventTimeWindows(0), "size_ms must be > 0, got 0"),
        (lambda: TumblingProcessingTimeWindows(-5), "size_ms must be > 0, got -5"),
        (lambda: TumblingEventTimeWindows(10, offset_ms=10), "offset_ms must be smaller than size_ms"),
        (lambda: SlidingEventTimeWindows(10, 0), "slide_ms must be > 0, got 0"),
        (lambda: SlidingEventTimeWindows(0, 5), "size_ms must be > 0, got 0"),
        (lambda: SlidingEventTimeWindows(10, 5, offset_ms=-5), "offset_ms must be smaller than slide_ms"),
        (lambda: EventTimeSessionWindows(0), "gap_ms must be > 0, got 0"),
        (lambda: ProcessingTimeSessionWindows(-1), "gap_ms must be > 0, got -1"),
        (lambda: TumblingEventTimeWindows(1.5), "size_ms must be an int"),  # type: ignore[arg-type]
        (lambda: DynamicEventTimeSessionWindows(5), "gap_fn must be a callable"),  # type: ignore[arg-type]
        (lambda: count_window(0), "max_count must be an int > 0, got 0"),
        (lambda: count_window(3, 0), "max_count must be an int > 0, got 0"),
    ],
)
def test_bad_sizes_are_refused_at_construction(build, message):
    with pytest.raises(ConfigurationError, match=message):
        build()


def test_default_triggers():
    assert isinstance(TumblingEventTimeWindows(10).default_trigger(), EventTimeTrigger)
    assert isinstance(SlidingProcessingTimeWindows(10, 5).default_trigger(), ProcessingTimeTrigger)
    assert isinstance(GlobalWindows().default_trigger(), NeverTrigger)


def test_count_windows_are_global_windows_with_count_trigger_and_evictor():
    tumbling = count_window(3)
    assert isinstance(tumbling.assigner, GlobalWindows) and tumbling.evictor is None
    assert repr(tumbling.trigger) == "PurgingTrigger(CountTrigger(max_count=3))"
    sliding = count_window(3, 2)
    assert isinstance(sliding.trigger, CountTrigger) and sliding.trigger.max_count == 2
    assert sliding.evictor is not None and sliding.evictor.max_count == 3  # type: ignore[attr-defined]


def test_global_window_is_one_window_that_survives_pickling():
    import pickle

    assert GlobalWindow() is GlobalWindow()
    assert pickle.loads(pickle.dumps(GlobalWindow())) is GlobalWindow()
    assert GlobalWindow().max_timestamp() == 2**63 - 1


@pytest.mark.parametrize(
    "windows, merges",
    [
        ([(0, 5), (10, 15)], []),  # apart: nothing merges
        ([(0, 5), (5, 10)], [([(0, 5), (5, 10)], (0, 10))]),  # touching windows merge
        ([(10, 15), (0, 5), (3, 12)], [([(0, 5), (3, 12), (10, 15)], (0, 15))]),  # a bridge joins two
        ([(0, 20), (5, 6)], [([(0, 20), (5, 6)], (0, 20))]),  # a merge never shrinks the covering window
        ([(0, 2), (1, 3), (10, 12), (11, 13)], [([(0, 2), (1, 3)], (0, 3)), ([(10, 12), (11, 13)], (10, 13))]),
    ],
)
def test_session_merging_reports_groups_of_two_or_more(windows, merges):
    got = []
    merge_time_windows([TimeWindow(*w) for w in windows], lambda group, result: got.append((group, result)))
    assert got == [([TimeWindow(*w) for w in group], TimeWindow(*result)) for group, result in merges]
