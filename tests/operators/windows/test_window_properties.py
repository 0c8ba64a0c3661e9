"""Properties of the window operator against a plain model: nothing lost, nothing counted twice."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from actorflow.operators import OperatorHarness, Record, Watermark
from actorflow.operators.windows import Count, EventTimeSessionWindows, SlidingEventTimeWindows, WindowOperator
from tests.properties import examples


@st.composite
def streams(draw):
    steps, wm = [], -1
    for _ in range(draw(st.integers(1, 60))):
        if draw(st.integers(0, 3)) == 0:
            wm += draw(st.integers(1, 20))
            steps.append(("wm", wm))
        else:
            steps.append(("rec", draw(st.sampled_from("ab")), wm + draw(st.integers(-30, 30))))
    steps.append(("wm", wm + 10_000))
    return steps


@settings(max_examples=examples(200), deadline=None)
@given(steps=streams(), size=st.integers(1, 20), slide=st.integers(1, 20), lateness=st.integers(0, 15))
def test_sliding_windows_count_every_accepted_record_once(steps, size, slide, lateness):
    slide = min(slide, size)
    op = WindowOperator("k", SlidingEventTimeWindows(size, slide), aggregate=Count(), allowed_lateness_ms=lateness, late_data_tag="late")
    h = OperatorHarness(op)
    expected: dict[tuple[str, int], int] = defaultdict(int)
    side = []
    wm = -(2**63)
    for i, step in enumerate(steps):
        if step[0] == "wm":
            h.process_watermark(step[1])
            wm = max(wm, step[1])
            continue
        _, key, ts = step
        h.process_element({"k": key, "i": i}, ts)
        starts = [s for s in range(ts - ts % slide, ts - size, -slide)]
        open_starts = [s for s in starts if s + size - 1 + lateness > wm]
        for s in open_starts:
            expected[(key, s)] += 1
        if not open_starts and starts:
            side.append({"k": key, "i": i})
    last: dict[tuple[str, int], int] = {}
    for e in h.output:
        if isinstance(e, Record):
            assert e.timestamp_ms == e.value["window_end"] - 1
            last[(e.value["k"], e.value["window_start"])] = e.value["result"]
    assert last == dict(expected)  # each window's last firing counts exactly the records it accepted
    assert [r.value for r in h.side_outputs.get("late", [])] == side
    watermarks = [e.timestamp_ms for e in h.output if isinstance(e, Watermark)]
    assert watermarks == [s[1] for s in steps if s[0] == "wm"]  # every watermark forwarded, in order
    assert h.window_state() == {} and h.timers()["event"] == []  # all cleaned up at the end


@settings(max_examples=examples(200), deadline=None)
@given(steps=streams(), gap=st.integers(1, 15))
def test_sessions_partition_the_accepted_records(steps, gap):
    op = WindowOperator("k", EventTimeSessionWindows(gap), process=lambda key, ctx, els: [sorted(e["i"] for e in els)])
    h = OperatorHarness(op)
    accepted = set()
    for i, step in enumerate(steps):
        if step[0] == "wm":
            h.process_watermark(step[1])
        else:
            h.process_element({"k": step[1], "i": i}, step[2])
            accepted.add(i)
    sessions = [e.value for e in h.output if isinstance(e, Record)]
    fired = [i for s in sessions for i in s]
    assert len(fired) == len(set(fired))  # no record in two firings: zero lateness fires each session once
    dropped = op.metrics.late_records_dropped
    assert len(fired) + dropped == len(accepted)  # and every record fired or was counted as dropped
    assert h.window_state() == {} and op._merging == {}
