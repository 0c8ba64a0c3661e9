"""Snapshot and restore: window contents, trigger state, timers and merge sets survive a restart.

A run cut anywhere, snapshotted and restored into a fresh operator, must give exactly the output
of the same run without the cut.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
import pytest

from actorflow.operators import OperatorHarness
from actorflow.operators.windows import (
    ContinuousProcessingTimeTrigger,
    Count,
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    Sum,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowOperator,
    count_window,
)

from .test_triggers_evictors import FireSoonAfterFirst, Refires
from .transcript import compact, feed
from tests.properties import examples


def add(a, b):
    return {"k": a["k"], "v": a["v"] + b["v"]}


SCENARIOS = {
    "sliding-lateness-side-output": (
        lambda: WindowOperator("k", SlidingEventTimeWindows(2000, 1000), aggregate=Sum("v"), allowed_lateness_ms=500, late_data_tag="late"),
        ["a:1@100", "b:2@1500", "wm 999", "a:3@900", "a:4@2500", "wm 1999", "a:5@1200", "b:6@400", "wm 2600", "a:7@1000", "wm 5000"],
    ),
    "sessions-merging-lateness": (
        lambda: WindowOperator("k", EventTimeSessionWindows(1000), reduce=add, allowed_lateness_ms=500, late_data_tag="late"),
        ["a:1@0", "a:1@2000", "b:1@100", "a:1@1000", "wm 1500", "b:1@50", "wm 3100", "a:1@2500", "wm 3600", "a:1@10", "wm 9000"],
    ),
    "user-trigger-state-and-processing-timers": (
        lambda: WindowOperator("k", TumblingEventTimeWindows(1000), aggregate=Count(), trigger=FireSoonAfterFirst()),
        ["a:1@10", "pt 50", "b:1@20", "pt 100", "a:1@30", "pt 160", "wm 999", "a:1@1001", "pt 400", "wm 2000"],
    ),
    "continuous-processing-time": (
        lambda: WindowOperator("k", TumblingProcessingTimeWindows(10_000), aggregate=Sum("v"), trigger=ContinuousProcessingTimeTrigger(3000)),
        ["pt 1000", "a:1", "pt 3000", "b:1", "a:2", "pt 6500", "a:1", "pt 10000", "a:1", "pt 20000"],
    ),
    "sliding-count-window-evictor": (
        lambda: WindowOperator("k", count_window(3, 2), reduce=add),
        ["a:1", "a:2", "b:1", "a:3", "a:4", "b:2", "a:5", "b:3", "a:6"],
    ),
    "process-window-and-global-state": (
        lambda: WindowOperator("k", TumblingEventTimeWindows(1000), reduce=add, process=Refires(), allowed_lateness_ms=1000),
        ["a:1@10", "wm 999", "a:2@20", "a:1@1500", "wm 2000", "a:1@2100", "wm 3000"],
    ),
}


def uninterrupted(make_op, steps):
    h = OperatorHarness(make_op())
    feed(h, steps)
    return compact(h.output), dict(h.side_outputs)


def with_restart(make_op, steps, cut):
    first = OperatorHarness(make_op())
    feed(first, steps[:cut])
    snapshot = first.snapshot()
    second = OperatorHarness(make_op(), start_ms=first.clock.now_ms())
    second.restore(snapshot)
    second.open()
    feed(second, steps[cut:])
    side = {tag: first.side_outputs.get(tag, []) + second.side_outputs.get(tag, []) for tag in {*first.side_outputs, *second.side_outputs}}
    return compact(first.output) + compact(second.output), side


CUTS = [(name, cut) for name, (_, steps) in SCENARIOS.items() for cut in range(len(steps) + 1)]


@pytest.mark.parametrize("name, cut", CUTS, ids=[f"{n}@{c}" for n, c in CUTS])
def test_restore_at_every_cut_gives_the_uninterrupted_output(name, cut):
    make_op, steps = SCENARIOS[name]
    expected = uninterrupted(make_op, steps)
    assert expected[0], "a scenario that emits nothing would prove nothing"
    assert with_restart(make_op, steps, cut) == expected


def test_snapshot_holds_contents_trigger_state_timers_and_merge_sets():
    import pickle

    op = WindowOperator("k", EventTimeSessionWindows(10), aggregate=Count())
    h = OperatorHarness(op)
    feed(h, ["a:1@0", "a:1@5", "b:1@100"])
    state = pickle.loads(h.snapshot()).chain[0]
    assert state["merging"] == [("a", [(("time", 0, 15), ("time", 0, 10))]), ("b", [(("time", 100, 110), ("time", 100, 110))])]
    assert state["contents"] == [("a", ("time", 0, 10), "value", 2), ("b", ("time", 100, 110), "value", 1)]
    assert [t[0] for t in state["timers"]["event"]] == [14, 109]  # the merged-away window's timer at 9 is gone


# ----------------------------------------------------------------------------- property

FACTORIES = [
    lambda: WindowOperator("k", SlidingEventTimeWindows(30, 10), aggregate=Sum("v"), allowed_lateness_ms=15, late_data_tag="late"),
    lambda: WindowOperator("k", EventTimeSessionWindows(7), reduce=add, allowed_lateness_ms=5, late_data_tag="late"),
    lambda: WindowOperator("k", TumblingEventTimeWindows(20), aggregate=Count(), trigger=FireSoonAfterFirst()),
    lambda: WindowOperator("k", count_window(3, 2), reduce=add),
]


@st.composite
def streams(draw):
    steps = []
    wm = 0
    pt = 0
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["rec", "rec", "rec", "wm", "pt"]))
        if kind == "rec":
            key = draw(st.sampled_from("abc"))
            ts = wm + draw(st.integers(-25, 30))  # some behind the watermark: late, or late but allowed
            steps.append(f"{key}:{draw(st.integers(1, 9))}@{ts}")
        elif kind == "wm":
            wm += draw(st.integers(1, 25))
            steps.append(f"wm {wm}")
        else:
            pt += draw(st.integers(1, 150))
            steps.append(f"pt {pt}")
    return steps


@settings(max_examples=examples(150), deadline=None)
@given(factory=st.sampled_from(FACTORIES), steps=streams(), data=st.data())
def test_snapshot_restore_continue_equals_an_uninterrupted_run(factory, steps, data):
    cut = data.draw(st.integers(0, len(steps)))
    assert with_restart(factory, steps, cut) == uninterrupted(factory, steps)
