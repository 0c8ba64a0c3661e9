"""Event-time windows through the harness, after the cases of Flink's WindowOperatorTest.

Each case is a transcript (see ``transcript.py``): records ``key:value@timestamp``, watermarks,
and the window rows they produce, ``key [start,end) result @output_timestamp``.
"""

from __future__ import annotations

import pytest

from actorflow.operators.windows import (
    ContinuousEventTimeTrigger,
    DynamicEventTimeSessionWindows,
    EventTimeSessionWindows,
    EventTimeTrigger,
    PurgingTrigger,
    SlidingEventTimeWindows,
    Sum,
    TumblingEventTimeWindows,
    WindowOperator,
)

from .transcript import run

MAX = 2**63 - 1


def add(a, b):
    return {"k": a["k"], "v": a["v"] + b["v"]}


def total(window, **kw):
    return lambda: WindowOperator("k", window, aggregate=Sum("v"), **kw)


def reduced(window, **kw):
    return lambda: WindowOperator("k", window, reduce=add, **kw)


# The stream of Flink's sliding and tumbling tests: two keys, out of order.
FLINK_STREAM = ["k2:1@3999", "k2:1@3000", "k1:1@20", "k1:1@0", "k1:1@999", "k2:1@1998", "k2:1@1999", "k2:1@1000"]

CASES = [
    pytest.param(
        reduced(SlidingEventTimeWindows(3000, 1000)),
        FLINK_STREAM + ["wm 999", "wm 1999", "wm 2999", "wm 3999", "wm 4999", "wm 5999"],
        [
            "k1 [-2000,1000) 3 @999", "wm 999",  # k1's three records; k2's earliest is at 1000
            "k1 [-1000,2000) 3 @1999", "k2 [-1000,2000) 3 @1999", "wm 1999",  # k1 registered its timer first
            "k1 [0,3000) 3 @2999", "k2 [0,3000) 3 @2999", "wm 2999",
            "k2 [1000,4000) 5 @3999", "wm 3999",  # every k2 record
            "k2 [2000,5000) 2 @4999", "wm 4999",
            "k2 [3000,6000) 2 @5999", "wm 5999",
        ],
        id="sliding-reduce",
    ),
    pytest.param(
        total(TumblingEventTimeWindows(3000)),
        FLINK_STREAM + ["wm 999", "wm 1999", "wm 2999", "wm 3999", "wm 5999"],
        [
            "wm 999", "wm 1999",
            "k1 [0,3000) 3 @2999", "k2 [0,3000) 3 @2999", "wm 2999",  # k2's first records are in [3000,6000)
            "wm 3999",
            "k2 [3000,6000) 2 @5999", "wm 5999",
        ],
        id="tumbling-aggregate",
    ),
    pytest.param(
        total(TumblingEventTimeWindows(3000, offset_ms=1000)),
        ["k1:1@500", "k1:1@1000", "k1:1@3999", "wm 3999"],
        [
            "k1 [-2000,1000) 1 @999",  # the offset moves the grid: 500 is in [-2000,1000)
            "k1 [1000,4000) 2 @3999", "wm 3999",
        ],
        id="tumbling-with-offset",
    ),
    pytest.param(
        total(TumblingEventTimeWindows(2000), allowed_lateness_ms=500),
        ["k1:1@500", "k1:1@1500", "wm 1500", "wm 1999", "k1:1@1400", "wm 2300", "k1:1@1900", "wm 2499", "k1:1@1999", "wm 5000"],
        [
            "wm 1500",
            "k1 [0,2000) 2 @1999", "wm 1999",  # on time
            "k1 [0,2000) 3 @1999",  # late but allowed: fires again, at once, with everything so far
            "wm 2300",
            "k1 [0,2000) 4 @1999",  # still allowed: 2300 < cleanup 1999 + 500
            "wm 2499",  # cleanup time: state dropped, nothing emitted
            "wm 5000",  # 1999 came after cleanup: dropped (counted), never reached the trigger
        ],
        id="tumbling-lateness-refires-then-drops",
    ),
    pytest.param(
        lambda: WindowOperator("k", TumblingEventTimeWindows(2000), aggregate=Sum("v"), trigger=PurgingTrigger(EventTimeTrigger()), allowed_lateness_ms=500),
        ["k1:1@500", "k1:1@1500", "wm 1999", "k1:1@1400", "k1:1@1800", "wm 2499", "k1:1@1000"],
        [
            "k1 [0,2000) 2 @1999", "wm 1999",
            "k1 [0,2000) 1 @1999",  # purged when it fired: a late record fires alone
            "k1 [0,2000) 1 @1999",
            "wm 2499",
        ],
        id="tumbling-lateness-purging",
    ),
    pytest.param(
        total(SlidingEventTimeWindows(2000, 1000), late_data_tag="late"),
        ["k1:1@1500", "wm 1999", "k1:2@1600", "k1:4@900", "wm 2999"],
        [
            "k1 [0,2000) 1 @1999", "wm 1999",
            # 1600 is late for [0,2000) but not for [1000,3000): it goes there, not to the side output;
            # 900 is late for both its windows: side output
            "k1 [1000,3000) 3 @2999", "wm 2999",
        ],
        id="sliding-late-for-some-windows-only",
    ),
    pytest.param(
        total(TumblingEventTimeWindows(1000), allowed_lateness_ms=2000),
        [f"k1:1@{MAX - 1750}", f"wm {MAX - 1500}", f"wm {MAX - 808}"],
        [
            # cleanup time would pass int64 and saturate: no early cleanup at MAX - 1500
            f"wm {MAX - 1500}",
            f"k1 [{MAX - 1807},{MAX + 193 - 1000}) 1 @{MAX - 808}", f"wm {MAX - 808}",
        ],
        id="cleanup-time-saturates",
    ),
    pytest.param(
        lambda: WindowOperator("k", TumblingEventTimeWindows(10_000), aggregate=Sum("v"), trigger=ContinuousEventTimeTrigger(3000)),
        ["k1:1@1000", "k1:1@2000", "wm 2999", "wm 3000", "k1:1@4000", "wm 6000", "wm 9000", "wm 9999", "wm 20000"],
        [
            "wm 2999",
            "k1 [0,10000) 2 @9999", "wm 3000",  # every 3 s of event time, aligned to the interval
            "k1 [0,10000) 3 @9999", "wm 6000",
            "k1 [0,10000) 3 @9999", "wm 9000",
            "k1 [0,10000) 3 @9999", "wm 9999",  # the window's end: once, not twice
            "wm 20000",
        ],
        id="continuous-event-time",
    ),
    pytest.param(
        total(EventTimeSessionWindows(1000)),
        ["k1:1@0", "k2:1@100", "k1:2@500", "k1:4@3000", "k2:8@1100", "wm 5000"],
        [
            "k1 [0,1500) 3 @1499",  # 0 and 500 merged
            "k2 [100,2100) 9 @2099",  # 100 and 1100 touch: merged
            "k1 [3000,4000) 4 @3999", "wm 5000",
        ],
        id="sessions",
    ),
    pytest.param(
        total(EventTimeSessionWindows(10)),
        ["k:1@0", "k:1@20", "k:1@9", "k:1@15", "wm 100"],
        [
            # [0,10) and [20,30) are bridged into [0,30): its contents add up once, and only the
            # merged window fires (the timers of the windows merged away were deleted)
            "k [0,30) 4 @29", "wm 100",
        ],
        id="sessions-bridged-fire-once",
    ),
    pytest.param(
        total(EventTimeSessionWindows(1000), allowed_lateness_ms=500, late_data_tag="late"),
        ["k1:1@0", "k1:1@500", "wm 1499", "k1:1@100", "k1:1@1200", "wm 2199", "k1:1@300", "wm 2699", "k1:1@10", "wm 3000"],
        [
            "k1 [0,1500) 2 @1499", "wm 1499",
            "k1 [0,1500) 3 @1499",  # late but allowed, inside the fired session: fires again at once
            # 1200 extends the session to [0,2200): no firing until the watermark passes its end
            "k1 [0,2200) 4 @2199", "wm 2199",
            "k1 [0,2200) 5 @2199",  # the merged session is still within its lateness
            "wm 2699",  # its cleanup
            # 10's own window [10,1010) is past cleanup: side output
            "wm 3000",
        ],
        id="sessions-with-lateness",
    ),
    pytest.param(
        total(EventTimeSessionWindows(1000)),
        ["k1:1@0", "wm 999", "k1:1@-100", "k1:1@500", "k1:1@1500", "wm 3000"],
        [
            "k1 [0,1000) 1 @999", "wm 999",
            # -100's session [-100,900) ended before the watermark: dropped. 500's [500,1500) has not
            # ended, but it overlaps the [0,1000) that fired and was cleaned up at 999: dropped too,
            # not a second session over what came out (Flink keeps it, and emits [500,2500))
            "k1 [1500,2500) 1 @2499", "wm 3000",
        ],
        id="sessions-zero-lateness-drop",
    ),
    pytest.param(
        lambda: WindowOperator("k", DynamicEventTimeSessionWindows(lambda v: v["v"] * 100), aggregate=Sum("v")),
        ["k1:1@0", "k1:5@150", "k1:1@700", "k1:1@2000", "wm 5000"],
        [
            # gaps: 100 → [0,100); 500 → [150,650); 100 → [700,800): apart; the gap is each record's own
            "k1 [0,100) 1 @99", "k1 [150,650) 5 @649", "k1 [700,800) 1 @799", "k1 [2000,2100) 1 @2099", "wm 5000",
        ],
        id="dynamic-sessions",
    ),
]


@pytest.mark.parametrize("make_op, steps, expected", CASES)
def test_event_time_transcripts(make_op, steps, expected):
    h, out = run(make_op(), steps)
    assert out == expected


def test_late_records_go_to_the_side_output_or_are_counted():
    steps = ["k1:1@1500", "wm 1999", "k1:2@1600", "k1:4@900", "wm 2999"]
    h, _ = run(total(SlidingEventTimeWindows(2000, 1000), late_data_tag="late")(), steps)
    assert [r.value for r in h.side_outputs["late"]] == [{"k": "k1", "v": 4}]  # not 1600: it still had a window
    assert h.chain.head.metrics.late_records_dropped == 0  # type: ignore[attr-defined]

    h, _ = run(total(SlidingEventTimeWindows(2000, 1000))(), steps)
    assert dict(h.side_outputs) == {}
    assert h.chain.head.metrics.late_records_dropped == 1  # type: ignore[attr-defined]


def test_session_late_record_goes_to_the_side_output():
    h, _ = run(total(EventTimeSessionWindows(1000), allowed_lateness_ms=500, late_data_tag="late")(),
               ["k1:1@0", "k1:1@500", "wm 1499", "k1:1@1200", "wm 2699", "k1:7@10", "wm 3000"])
    assert [r.value for r in h.side_outputs["late"]] == [{"k": "k1", "v": 7}]


def test_cleanup_timer_is_at_max_timestamp_plus_lateness_and_saturates():
    op = total(TumblingEventTimeWindows(1000), allowed_lateness_ms=2000)()
    h, _ = run(op, ["k1:1@10", f"k2:1@{MAX - 1750}"])
    assert [t[0] for t in h.timers()["event"]] == [999, 2999, MAX - 808]  # k1: trigger, cleanup; k2: trigger only


def test_state_is_gone_after_cleanup():
    op = total(SlidingEventTimeWindows(2000, 1000), allowed_lateness_ms=100)()
    h, _ = run(op, ["a:1@10", "b:1@1500", "wm 5000"])
    assert h.window_state() == {} and op._trigger_state == {}
    assert h.timers() == {"event": [], "processing": []}


def test_output_timestamp_is_the_window_max_timestamp_and_rows_carry_the_window():
    h, _ = run(total(TumblingEventTimeWindows(10))(), ["a:3@4", "wm 9"])
    assert [(r.value, r.timestamp_ms) for r in h.output_records()] == [
        ({"k": "a", "window_start": 0, "window_end": 10, "result": 3}, 9)
    ]


def test_records_past_cleanup_never_reach_the_trigger():
    from actorflow.operators.windows import Trigger, TriggerResult

    seen = []

    class Spy(EventTimeTrigger):
        def on_element(self, value, timestamp_ms, window, ctx):
            seen.append(timestamp_ms)
            return super().on_element(value, timestamp_ms, window, ctx)

    assert issubclass(Spy, Trigger) and TriggerResult.FIRE.is_fire
    h, out = run(WindowOperator("k", TumblingEventTimeWindows(10), aggregate=Sum("v"), trigger=Spy(), allowed_lateness_ms=5),
                 ["a:1@3", "wm 12", "a:1@4", "wm 14", "a:1@5", "wm 30"])
    assert seen == [3, 4]  # 4 is late but allowed (cleanup at 14); 5 came after the cleanup
    assert out == ["a [0,10) 1 @9", "wm 12", "a [0,10) 2 @9", "wm 14", "wm 30"]
    assert h.chain.head.metrics.late_records_dropped == 1  # type: ignore[attr-defined]


def test_with_an_evictor_a_window_keeps_its_raw_elements_with_timestamps():
    from actorflow.operators.windows import CountEvictor, TimestampedValue, TimeWindow

    op = WindowOperator("k", TumblingEventTimeWindows(10), aggregate=Sum("v"), evictor=CountEvictor(1))
    h, out = run(op, ["a:1@3", "a:2@4", "wm 9"])
    assert out == ["a [0,10) 2 @9", "wm 9"]  # the last element only
    h, _ = run(op := WindowOperator("k", TumblingEventTimeWindows(10), aggregate=Sum("v"), evictor=CountEvictor(1)), ["a:1@3", "a:2@4"])
    assert h.window_state() == {"a": {TimeWindow(0, 10): [TimestampedValue({"k": "a", "v": 1}, 3), TimestampedValue({"k": "a", "v": 2}, 4)]}}
