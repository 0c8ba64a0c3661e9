"""The merging window set: state windows, and which merges it reports (after Flink's MergingWindowSetTest)."""

from __future__ import annotations

import pytest

from actorflow.operators import ActorflowError
from actorflow.operators.windows import EventTimeSessionWindows, MergingWindowSet, TimeWindow


def W(start, end):
    return TimeWindow(start, end)


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, result, merged, state_window, merged_state_windows):
        self.calls.append((result, sorted(merged), state_window, sorted(merged_state_windows)))


# (window added, window it ends in, the merge reported or None, the state window of the result)
INCREMENTAL = [
    (W(0, 4), W(0, 4), None, W(0, 4)),  # the first window is its own state window
    (W(0, 4), W(0, 4), None, W(0, 4)),  # the same window again: nothing to merge
    (W(3, 5), W(0, 5), (W(0, 5), [W(0, 4)], W(0, 4), []), W(0, 4)),  # it grows; contents stay where they were
    (W(4, 6), W(0, 6), (W(0, 6), [W(0, 5)], W(0, 4), []), W(0, 4)),
    (W(1, 4), W(0, 6), None, W(0, 4)),  # inside the merged window: no merge, no growth
    (W(11, 14), W(11, 14), None, W(11, 14)),  # apart: a window of its own
    (W(10, 13), W(10, 14), (W(10, 14), [W(11, 14)], W(11, 14), []), W(11, 14)),  # grows to the left
    (W(12, 15), W(10, 15), (W(10, 15), [W(10, 14)], W(11, 14), []), W(11, 14)),
    (W(7, 10), W(7, 15), (W(7, 15), [W(10, 15)], W(11, 14), []), W(11, 14)),  # 7 does not touch 6: joins the right one
    (W(6, 9), W(0, 15), (W(0, 15), [W(0, 6), W(7, 15)], W(0, 4), [W(11, 14)]), W(0, 4)),  # bridges both: one move
]


def test_incremental_merging():
    s = MergingWindowSet(EventTimeSessionWindows(3))
    for added, result, merge, state_window in INCREMENTAL:
        rec = Recorder()
        assert s.add_window(added, rec) == result
        assert rec.calls == ([] if merge is None else [merge])
        assert s.get_state_window(result) == state_window
    assert s.mapping == {W(0, 15): W(0, 4)}


def test_a_new_window_covering_existing_ones_merges_them_and_never_shrinks():
    s = MergingWindowSet(EventTimeSessionWindows(3))
    for w in (W(1, 3), W(5, 8), W(10, 13)):
        s.add_window(w, Recorder())
    rec = Recorder()
    assert s.add_window(W(0, 13), rec) == W(0, 13)
    [(result, merged, state_window, moved)] = rec.calls
    assert result == W(0, 13) and merged == [W(1, 3), W(5, 8), W(10, 13)]
    assert state_window == W(1, 3) and moved == [W(5, 8), W(10, 13)]  # every other state window moves in, once
    assert all(result.cover(m) == result for m in merged)


def test_a_large_window_over_a_small_one_is_a_merge():
    s = MergingWindowSet(EventTimeSessionWindows(3))
    s.add_window(W(1, 2), Recorder())
    rec = Recorder()
    assert s.add_window(W(0, 3), rec) == W(0, 3)
    assert rec.calls == [(W(0, 3), [W(1, 2)], W(1, 2), [])]  # the trigger must learn of the new end
    assert s.get_state_window(W(0, 3)) == W(1, 2)


def test_retire_and_restore():
    s = MergingWindowSet(EventTimeSessionWindows(3))
    s.add_window(W(0, 3), Recorder())
    s.add_window(W(10, 13), Recorder())
    restored = MergingWindowSet(EventTimeSessionWindows(3), dict(s.mapping))
    restored.retire_window(W(0, 3))
    assert restored.get_state_window(W(0, 3)) is None and len(restored) == 1
    assert len(s) == 2  # the restored set is a copy
    with pytest.raises(ActorflowError, match=r"window TimeWindow\(start_ms=0, end_ms=3\) is not in the merging window set"):
        restored.retire_window(W(0, 3))
