"""Processing-time windows, count windows, purging, evictors, custom triggers and process functions."""

from __future__ import annotations

import pytest

from actorflow.operators.windows import (
    ContinuousProcessingTimeTrigger,
    Count,
    CountEvictor,
    CountTrigger,
    DeltaEvictor,
    EventTimeSessionWindows,
    GlobalWindows,
    ProcessingTimeSessionWindows,
    ProcessWindowFunction,
    PurgingTrigger,
    SlidingProcessingTimeWindows,
    Sum,
    TimeEvictor,
    Trigger,
    TriggerResult,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowOperator,
    count_window,
)

from .transcript import run

MAX = 2**63 - 1


def add(a, b):
    return {"k": a["k"], "v": a["v"] + b["v"]}


def values(key, ctx, elements):
    """A process function that shows what the window held."""
    yield f"{key} {[e['v'] for e in elements]}"


CASES = [
    pytest.param(
        lambda: WindowOperator("k", TumblingProcessingTimeWindows(3000), aggregate=Sum("v")),
        ["k1:1", "k2:1", "pt 1000", "k1:1", "pt 2998", "pt 2999", "k1:1", "pt 3000", "k1:1", "pt 7000"],
        [
            "k1 [0,3000) 2 @2999", "k2 [0,3000) 1 @2999",  # processing time reaches the end: both fire
            "k1 [0,3000) 1 @2999",  # arrived at 2999: a new [0,3000) whose timer is already due
            "k1 [3000,6000) 1 @5999",
        ],
        id="tumbling-processing-time",
    ),
    pytest.param(
        lambda: WindowOperator("k", SlidingProcessingTimeWindows(2000, 1000), aggregate=Sum("v")),
        ["pt 500", "k1:1", "pt 1500", "k1:2", "pt 5000"],
        ["k1 [-1000,1000) 1 @999", "k1 [0,2000) 3 @1999", "k1 [1000,3000) 2 @2999"],
        id="sliding-processing-time",
    ),
    pytest.param(
        lambda: WindowOperator("k", ProcessingTimeSessionWindows(3000), aggregate=Sum("v")),
        ["k1:1", "pt 1000", "k1:2", "pt 3999", "k1:4", "pt 9000"],
        ["k1 [0,4000) 3 @3999", "k1 [3999,6999) 4 @6998"],
        id="processing-time-sessions",
    ),
    pytest.param(
        lambda: WindowOperator("k", TumblingProcessingTimeWindows(10_000), aggregate=Sum("v"), trigger=ContinuousProcessingTimeTrigger(3000)),
        ["pt 1000", "k1:1", "pt 2999", "pt 3000", "k1:1", "pt 6500", "pt 10000"],
        [
            "k1 [0,10000) 1 @9999",  # at 3000, aligned to the interval
            "k1 [0,10000) 2 @9999",  # at 6000
            "k1 [0,10000) 2 @9999",  # at 9000
            "k1 [0,10000) 2 @9999",  # at 9999: the next firing is capped at the window's end, then cleanup
        ],
        id="continuous-processing-time",
    ),
    pytest.param(
        lambda: WindowOperator("k", count_window(3), reduce=add),
        ["k1:1", "k1:2", "k2:5", "k1:3", "k1:4", "k1:5", "k1:6"],
        ["k1 global 6 @9223372036854775807", "k1 global 15 @9223372036854775807"],  # every 3 per key, purged
        id="tumbling-count-window",
    ),
    pytest.param(
        lambda: WindowOperator("k", count_window(3, 2), reduce=add),
        ["k1:1", "k1:2", "k1:3", "k1:4", "k1:5", "k1:6"],
        [
            "k1 global 3 @9223372036854775807",  # every 2 elements: 1+2
            "k1 global 9 @9223372036854775807",  # the last 3: 2+3+4
            "k1 global 15 @9223372036854775807",  # 4+5+6
        ],
        id="sliding-count-window",
    ),
    pytest.param(
        lambda: WindowOperator("k", GlobalWindows(), aggregate=Sum("v"), trigger=CountTrigger(2)),
        ["k1:1", "k1:2", "k1:3", "k1:4"],
        ["k1 global 3 @9223372036854775807", "k1 global 10 @9223372036854775807"],  # keeps accumulating
        id="count-trigger-without-purge",
    ),
    pytest.param(
        lambda: WindowOperator("k", GlobalWindows(), aggregate=Sum("v"), trigger=PurgingTrigger(CountTrigger(2))),
        ["k1:1", "k1:2", "k1:3", "k1:4"],
        ["k1 global 3 @9223372036854775807", "k1 global 7 @9223372036854775807"],  # starts over after firing
        id="purging-count-trigger",
    ),
    pytest.param(
        lambda: WindowOperator("k", GlobalWindows(), process=values, trigger=CountTrigger(2), evictor=CountEvictor(2, do_evict_after=True)),
        ["k1:1", "k1:2", "k1:3", "k1:4", "k1:5", "k1:6"],
        ["k1 [1, 2] @9223372036854775807", "k1 [1, 2, 3, 4] @9223372036854775807", "k1 [3, 4, 5, 6] @9223372036854775807"],
        id="count-evictor-after",  # evicts after the function: the next firing sees the last 2 plus the new
    ),
    pytest.param(
        lambda: WindowOperator("k", TumblingEventTimeWindows(10_000), process=values, evictor=TimeEvictor(1000)),
        ["k1:1@0", "k1:2@500", "k1:3@1500", "k1:4@1200", "wm 9999"],
        ["k1 [3, 4] @9999", "wm 9999"],  # newest is 1500: elements at or before 500 go
        id="time-evictor",
    ),
    pytest.param(
        lambda: WindowOperator("k", GlobalWindows(), reduce=add, trigger=CountTrigger(4), evictor=DeltaEvictor(3, lambda a, b: abs(a["v"] - b["v"]))),
        ["k1:1", "k1:5", "k1:2", "k1:6"],
        ["k1 global 11 @9223372036854775807"],  # delta to the newest (6) below 3: 5 and 6
        id="delta-evictor-with-reduce",
    ),
    pytest.param(
        lambda: WindowOperator("k", EventTimeSessionWindows(10), aggregate=Sum("v"), trigger=CountTrigger(3)),
        ["k:1@0", "k:1@20", "k:1@10", "k:1@40", "k:1@45"],
        # [0,10) and [20,30) each hold 1; 10 bridges them: counts merge (1 + 1) and its own makes 3
        ["k [0,30) 3 @29"],
        id="session-count-trigger-merges-counts",
    ),
]


@pytest.mark.parametrize("make_op, steps, expected", CASES)
def test_transcripts(make_op, steps, expected):
    h, out = run(make_op(), steps)
    assert out == expected


class FireSoonAfterFirst(Trigger):
    """Fires 100 ms of processing time after a window's first element, and at the window's end."""

    def on_element(self, value, timestamp_ms, window, ctx):
        if ctx.get_state("armed") is None:
            at = ctx.current_processing_time_ms() + 100
            ctx.set_state("armed", at)
            ctx.register_processing_time_timer(at)
        ctx.register_event_time_timer(window.max_timestamp())
        return TriggerResult.CONTINUE

    def on_processing_time(self, time_ms, window, ctx):
        ctx.clear_state("armed")
        return TriggerResult.FIRE

    def on_event_time(self, time_ms, window, ctx):
        return TriggerResult.FIRE if time_ms == window.max_timestamp() else TriggerResult.CONTINUE

    def clear(self, window, ctx):
        armed = ctx.get_state("armed")
        if armed is not None:
            ctx.delete_processing_time_timer(armed)
            ctx.clear_state("armed")
        ctx.delete_event_time_timer(window.max_timestamp())


def test_user_trigger_with_state_and_its_own_timers():
    op = WindowOperator("k", TumblingEventTimeWindows(1000), aggregate=Sum("v"), trigger=FireSoonAfterFirst())
    h, out = run(op, ["k1:1@10", "k1:1@20", "pt 100", "k1:1@30", "wm 999", "pt 300"])
    assert out == [
        "k1 [0,1000) 2 @999",  # 100 ms of processing time after the first
        "k1 [0,1000) 3 @999", "wm 999",  # the window's end; its cleanup deleted the timer armed for 200
    ]
    assert op._trigger_state == {}


class Refires(ProcessWindowFunction):
    cleared: list = []

    def process(self, key, ctx, elements):
        ctx.window_state["firings"] = ctx.window_state.get("firings", 0) + 1
        ctx.global_state["firings"] = ctx.global_state.get("firings", 0) + 1
        if elements[0]["v"] > 2:
            ctx.output("big", (key, ctx.window.start_ms))
        yield (key, ctx.window.start_ms, elements[0]["v"], ctx.window_state["firings"], ctx.global_state["firings"], ctx.current_watermark_ms())

    def clear(self, ctx):
        self.cleared.append((ctx.key, ctx.window.start_ms))


def test_process_function_with_reduce_sees_window_and_global_state():
    fn = Refires()
    op = WindowOperator("k", TumblingEventTimeWindows(1000), reduce=add, process=fn, allowed_lateness_ms=1000)
    h, out = run(op, ["a:1@10", "wm 999", "a:2@20", "a:1@1500", "wm 2000", "wm 3000"])
    assert out == [
        "('a', 0, 1, 1, 1, 999) @999", "wm 999",
        "('a', 0, 3, 2, 2, 999) @999",  # a late re-firing: the window's second, the key's second
        "('a', 1000, 1, 1, 3, 2000) @1999", "wm 2000",  # a new window: its first, the key's third
        "wm 3000",
    ]
    assert h.side_outputs["big"] == [("a", 0)]
    assert fn.cleared == [("a", 0), ("a", 1000)]  # at cleanup, with the window's state dropped
    assert op._window_state == {} and op._global_state == {"a": {"firings": 3}}


def test_aggregate_function_is_incremental_and_results_become_columns():
    from actorflow.operators.windows import Aggregations, Max, Mean

    op = WindowOperator(("k", "g"), TumblingEventTimeWindows(10), aggregate=Aggregations(n=Count(), top=Max("v"), avg=Mean("v")))
    h = run(op, [])[0]
    for v, ts in [(1, 1), (5, 2), (3, 3)]:
        h.process_element({"k": "a", "g": 1, "v": v}, ts)
    h.process_watermark(9)
    assert h.output_values() == [{"k": "a", "g": 1, "window_start": 0, "window_end": 10, "n": 3, "top": 5, "avg": 3.0}]
    assert op._contents == {}


def test_callable_key_selector_puts_the_key_under_key():
    h, _ = run(WindowOperator(lambda v: v["k"].upper(), TumblingEventTimeWindows(10), aggregate=Count()), ["a:1@1", "wm 9"])
    assert h.output_values() == [{"key": "A", "window_start": 0, "window_end": 10, "result": 1}]
