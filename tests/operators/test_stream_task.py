"""The stream task through the harness: several channels, the valve, barrier alignment, the end
of input, checkpoints with their in-flight input, and fault points. No Ray: these run in
milliseconds, and the operator actor hosts the same task."""

from __future__ import annotations

import pickle

import pytest

from actorflow.operators import OperatorHarness, Record, Watermark, WatermarkStatus
from actorflow.operators.channel_items import END_OF_INPUT, Records
from actorflow.operators.elements import MAX_WATERMARK
from actorflow.operators.operator import MapOperator, StreamOperator
from actorflow.operators.windows import Count, TumblingEventTimeWindows, WindowOperator


def window_counts(**options):
    return WindowOperator("k", TumblingEventTimeWindows(1_000), aggregate=Count(), **options)


def watermarks(h: OperatorHarness) -> list[int]:
    return [e.timestamp_ms for e in h.output if isinstance(e, Watermark)]


# ------------------------------------------------------------------------- the valve


def test_the_watermark_is_the_minimum_over_channels_so_a_slow_channel_is_never_late():
    # Channel 1 runs 100 s of event time ahead while channel 0 has not spoken: the operator's
    # watermark stays at channel 0's, and none of channel 0's records is late.
    # (Was tests/cluster/test_windows_keyed.py's Ray test of the same name, over two splits.)
    h = OperatorHarness(window_counts(late_data_tag="late"), num_inputs=2)
    h.process_element({"k": "a", "ts": 100_500}, 100_500, channel=1)
    h.process_watermark(100_999, channel=1)
    assert watermarks(h) == []  # channel 0 holds it back
    h.process_element({"k": "a", "ts": 500}, 500, channel=0)
    h.process_watermark(999, channel=0)
    assert watermarks(h) == [999]
    h.end_input()
    assert [r.value for r in h.side_output("late")] == []
    counts = {(v["window_start"], v["result"]) for v in h.output_values()}
    assert counts == {(0, 1), (100_000, 1)}
    # Channel 0's end lets channel 1's watermark through; the end of both ends event time.
    assert watermarks(h) == [999, 100_999, MAX_WATERMARK]


def test_a_channel_that_goes_idle_holds_back_no_one_and_its_later_records_are_late():
    # (Was tests/cluster/test_windows_keyed.py's
    # test_a_split_that_waits_longer_than_idleness_goes_idle_and_holds_back_no_one, which waited
    # 11 s of wall time on Ray for a split to go idle.)
    h = OperatorHarness(window_counts(late_data_tag="late"), num_inputs=2)
    h.process_element({"k": "a", "ts": 100_500}, 100_500, channel=1)
    h.process_watermark(100_999, channel=1)
    h.process_watermark_status(True, channel=0)  # channel 0 waited past its idleness
    assert watermarks(h) == [100_999]
    h.process_element({"k": "a", "ts": 500}, 500, channel=0)  # it comes back with old records
    h.process_watermark(999, channel=0)
    h.end_input()
    assert [r.value for r in h.side_output("late")] == [{"k": "a", "ts": 500}]  # late, kept: not lost
    assert [v["result"] for v in h.output_values()] == [1]


@pytest.mark.parametrize("fed, expected", [
    ([], []),  # no event time: the end fires nothing
    ([("wm", 0, 5)], [MAX_WATERMARK]),  # one channel spoke, the other held it back: the end fires it
    ([("wm", 0, 5), ("wm", 1, 7)], [5, 7, MAX_WATERMARK]),  # channel 0's end lets 7 through
    ([("wm", 0, 5), ("idle", 1)], [5, MAX_WATERMARK]),  # the output moved once the other went idle
])
def test_the_end_of_every_channel_ends_event_time_exactly_when_it_had_begun(fed, expected):
    h = OperatorHarness(StreamOperator(), num_inputs=2)
    for step in fed:
        if step[0] == "wm":
            h.process_watermark(step[2], channel=step[1])
        else:
            h.process_watermark_status(True, channel=step[1])
    h.end_input(channel=0)
    assert not h.task.finishing  # channel 1 is still open
    h.end_input(channel=1)
    assert [w for w in watermarks(h)] == expected
    assert h.is_finished


def test_the_end_of_a_channel_lets_the_others_move_the_watermark():
    h = OperatorHarness(StreamOperator(), num_inputs=2)
    h.process_watermark(10, channel=0)
    h.process_watermark(50, channel=1)
    assert watermarks(h) == [10]
    h.end_input(channel=0)  # it holds nothing back any more
    assert watermarks(h) == [10, 50]
    h.end_input(channel=0)  # a second end of the same channel changes nothing
    assert watermarks(h) == [10, 50] and not h.task.finishing


def test_the_last_watermark_before_the_end_is_kept_for_the_figures():
    # (The ring-1 half of tests/cluster/test_job_progress.py's
    # test_the_figures_keep_the_last_watermark_after_the_end_of_input_ended_event_time.)
    h = OperatorHarness(StreamOperator())
    h.process_watermark(42)
    h.end_input()
    assert h.task.current_watermark == MAX_WATERMARK and h.task.last_watermark == 42


def test_an_idle_status_passes_once_and_a_watermark_makes_the_channel_active_again():
    h = OperatorHarness(StreamOperator(), num_inputs=1)
    h.process_watermark(5)
    h.process_watermark_status(True)
    h.process_watermark_status(True)  # said once
    h.process_watermark(9)
    assert h.output == [Watermark(5), WatermarkStatus(True), WatermarkStatus(False), Watermark(9)]


# ------------------------------------------------------------------------ alignment


def test_a_barrier_holds_its_channel_until_every_channel_delivered_it():
    h = OperatorHarness(MapOperator(lambda v: v), num_inputs=2)
    h.process_element("a0", channel=0)
    h.process_barrier(1, channel=0)
    h.process_element("a1", channel=0)  # behind the barrier: held
    h.process_element("b0", channel=1)  # channel 1 goes on
    assert h.output_values() == ["a0", "b0"] and 1 not in h.checkpoints
    h.process_barrier(1, channel=1)
    assert 1 in h.checkpoints
    assert h.output_values() == ["a0", "b0", "a1"]  # released once aligned


def test_a_checkpoint_holds_the_input_in_front_of_the_barriers_and_a_restore_replays_it():
    def make():
        return MapOperator(lambda v: v.upper())

    h = OperatorHarness(make(), num_inputs=2, auto_run=False)
    h.process_element("a", channel=0)
    h.process_barrier(7, channel=0)
    h.process_element("b", channel=1)
    h.process_barrier(7, channel=1)
    h.process_element("c", channel=1)
    h.step()  # the barriers are aligned at once: the checkpoint comes before "a" and "b" run
    checkpoint = pickle.loads(h.checkpoints[7])
    assert checkpoint.input == [[Records([Record("a")])], [Records([Record("b")])]]
    h.run_until_idle()
    assert sorted(h.output_values()) == ["A", "B", "C"]

    restored = OperatorHarness(make(), num_inputs=2)
    restored.restore(h.checkpoints[7])
    restored.run_until_idle()
    assert sorted(restored.output_values()) == ["A", "B"]  # "c" came after the barrier


def test_an_older_barrier_behind_a_newer_one_is_dropped_and_does_not_hold_its_channel():
    h = OperatorHarness(MapOperator(lambda v: v), num_inputs=2)
    h.process_barrier(1, channel=0)  # checkpoint 1 never reaches channel 1 (declined upstream)
    h.process_element("a", channel=0)
    h.process_barrier(2, channel=1)
    h.process_barrier(2, channel=0)
    assert sorted(h.checkpoints) == [2]
    assert h.output_values() == ["a"]


def test_a_channel_that_ended_counts_as_aligned():
    h = OperatorHarness(MapOperator(lambda v: v), num_inputs=2)
    h.end_input(channel=1)
    h.process_barrier(3, channel=0)
    assert 3 in h.checkpoints


def test_an_aborted_checkpoint_releases_the_channels_it_held():
    h = OperatorHarness(MapOperator(lambda v: v), num_inputs=2)
    h.process_barrier(4, channel=0)
    h.process_element("a", channel=0)
    assert h.output_values() == []
    h.notify_checkpoint_aborted(4)
    assert h.output_values() == ["a"] and 4 not in h.checkpoints


def test_a_checkpoint_restores_the_valve_and_the_channels_that_ended():
    h = OperatorHarness(StreamOperator(), num_inputs=2)
    h.process_watermark(10, channel=0)
    h.end_input(channel=1)
    h.process_barrier(1, channel=0)
    restored = OperatorHarness(StreamOperator(), num_inputs=2)
    restored.restore(h.checkpoints[1])
    restored.end_input(channel=0)  # channel 1 ended before the checkpoint
    assert restored.is_finished
    assert watermarks(restored) == [MAX_WATERMARK]  # event time had begun before the checkpoint


# ---------------------------------------------------------- notifications, views, faults


class _Notified(StreamOperator):
    def __init__(self) -> None:
        self.completed: list[int] = []

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.completed.append(checkpoint_id)


def test_checkpoint_notifications_reach_the_operators_as_mails():
    op = _Notified()
    h = OperatorHarness(op, auto_run=False)
    h.notify_checkpoint_complete(3)
    assert op.completed == []  # a mail: it runs with the others
    h.run_until_idle()
    assert op.completed == [3]


def test_a_side_output_is_read_without_creating_its_tag():
    h = OperatorHarness(window_counts(late_data_tag="late"))
    assert [r.value for r in h.side_output("late")] == []
    assert "late" not in h.side_outputs
    h.process_watermark(5_000)
    h.process_element({"k": "a", "ts": 10}, 10)
    assert [r.value for r in h.side_output("late")] == [{"k": "a", "ts": 10}]


def test_the_window_fire_fault_point_is_reached_when_a_watermark_fires_a_window():
    h = OperatorHarness(window_counts(), watch_fault_points=True)
    h.process_element({"k": "a", "ts": 10}, 10)
    h.process_watermark(500)
    assert h.fault_points == []  # nothing fired
    h.process_watermark(1_000)
    assert h.fault_points == ["window_fire"]


def test_items_of_an_unknown_kind_fail_naming_the_item():
    h = OperatorHarness(StreamOperator())
    h.channels.file(0, "records")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown channel item 'records' on channel 0"):
        h.run_until_idle()


def test_the_end_marker_is_one_item_like_the_others():
    h = OperatorHarness(StreamOperator(), num_inputs=1)
    h.channels.file(0, END_OF_INPUT)
    h.run_until_idle()
    assert h.is_finished
