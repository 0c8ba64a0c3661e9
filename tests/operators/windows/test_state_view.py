"""The read-only view of a window operator's state and timers (``window_state()``, ``timers()``) that
a test reads instead of unpickling a snapshot."""

from __future__ import annotations

import pyarrow as pa
import pytest

from actorflow.operators import ConfigurationError, OperatorHarness
from actorflow.operators.operator import MapOperator
from actorflow.operators.windows import (
    ContinuousProcessingTimeTrigger,
    Count,
    CountEvictor,
    EventTimeSessionWindows,
    PurgingTrigger,
    Sum,
    TimestampedValue,
    TimeWindow,
    TumblingEventTimeWindows,
    WindowOperator,
)

from .transcript import feed


def add(a, b):
    return {"k": a["k"], "v": a["v"] + b["v"]}


def elements(key, ctx, values):
    yield [v["v"] for v in values]


@pytest.mark.parametrize("function, contents", [
    (dict(aggregate=Sum("v")), 3),  # the accumulator
    (dict(reduce=add), {"k": "a", "v": 3}),  # the reduced value
    (dict(process=elements), [{"k": "a", "v": 1}, {"k": "a", "v": 2}]),  # the elements
    (dict(aggregate=Sum("v"), evictor=CountEvictor(5)), [TimestampedValue({"k": "a", "v": 1}, 3), TimestampedValue({"k": "a", "v": 2}, 4)]),
], ids=["aggregate", "reduce", "process", "evictor"])
def test_each_window_of_each_key_with_what_it_holds(function, contents):
    h = OperatorHarness(WindowOperator("k", TumblingEventTimeWindows(10), **function))
    feed(h, ["a:1@3", "a:2@4", "b:5@12"])
    view = h.window_state()
    assert view["a"] == {TimeWindow(0, 10): contents} and list(view["b"]) == [TimeWindow(10, 20)]
    assert h.timers() == {"event": [(9, "a", TimeWindow(0, 10)), (19, "b", TimeWindow(10, 20))], "processing": []}


def test_merged_sessions_show_as_the_merged_window_and_the_view_is_a_copy():
    h = OperatorHarness(WindowOperator("k", EventTimeSessionWindows(10), process=elements))
    feed(h, ["a:1@0", "a:2@5"])
    view = h.window_state()
    assert view == {"a": {TimeWindow(0, 15): [{"k": "a", "v": 1}, {"k": "a", "v": 2}]}}
    assert h.timers()["event"] == [(14, "a", TimeWindow(0, 15))]  # the merged-away window's timer is gone
    view["a"][TimeWindow(0, 15)].clear()
    feed(h, ["wm 14"])
    assert h.output_values() == [[1, 2]]


def test_a_purged_window_holds_nothing_but_its_trigger_timer_stays():
    op = WindowOperator("k", TumblingEventTimeWindows(10_000), aggregate=Count(), trigger=PurgingTrigger(ContinuousProcessingTimeTrigger(100)))
    h = OperatorHarness(op)
    feed(h, ["a@3", "pt 100"])
    assert h.window_state() == {}
    assert h.timers() == {"event": [(9999, "a", TimeWindow(0, 10_000))], "processing": [(200, "a", TimeWindow(0, 10_000))]}


def test_windows_the_arrow_path_keeps_as_tables_are_read_where_they_are():
    op = WindowOperator("user", TumblingEventTimeWindows(10), aggregate=Count())
    h = OperatorHarness(op)
    h.open()
    op.process_batch(pa.table({"user": ["a", "b", "a"], "ts": [1, 2, 13]}), "ts")
    assert h.window_state() == {"a": {TimeWindow(0, 10): 1, TimeWindow(10, 20): 1}, "b": {TimeWindow(0, 10): 1}}
    assert [t[0] for t in h.timers()["event"]] == [9, 9, 19]
    assert op._panes  # still tables: reading moved nothing
    h.process_watermark(9)
    assert h.window_state() == {"a": {TimeWindow(10, 20): 1}}


def test_in_a_chain_the_window_operator_is_found_or_named():
    h = OperatorHarness([MapOperator(lambda v: v), WindowOperator("k", TumblingEventTimeWindows(10), aggregate=Count())])
    h.process_element({"k": "a"}, 1)
    assert h.window_state() == h.window_state(operator=1) == {"a": {TimeWindow(0, 10): 1}}
    with pytest.raises(ConfigurationError, match=r"operator 0 of the chain .* has no window_state\(\)"):
        h.window_state(operator=0)
    with pytest.raises(ConfigurationError, match="it holds 0"):
        OperatorHarness(MapOperator(lambda v: v)).timers()
