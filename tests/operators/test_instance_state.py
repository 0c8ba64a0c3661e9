"""The task's part of an instance's checkpoint as plain data (operators/state.py, ``instance``): the
valve's state, channel items written and read back, and a task state of format 2 (the valve itself)
still restored."""

from __future__ import annotations

import doctest
import pickle

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actorflow.operators import OperatorHarness, Record, StateFormatError, Watermark, WatermarkStatus, async_wait
import actorflow.operators.channel_items as channel_items
from actorflow.operators.channel_items import (
    END_OF_INPUT, PartialAggregates, Records, channels_of, item_of, plain_channels, plain_item,
)
from actorflow.operators.elements import MAX_WATERMARK, CheckpointBarrier
from actorflow.operators.harness import HarnessCheckpoint
from actorflow.operators.operator import StreamOperator
from actorflow.operators.state import is_plain
from actorflow.operators.watermarks import StatusWatermarkValve
from tests.properties import examples

from .scripted import Scripted

# The harness's batches are lists of records; the runtime's are Arrow (tests/actors/test_instance_state.py).
def plain_records(batch: list[Record]) -> list[tuple[object, ...]]:
    return [(r.value, r.timestamp_ms, r.origin) for r in batch]


def records_of(plain: list[tuple[object, ...]]) -> list[Record]:
    return [Record(*row) for row in plain]


# ------------------------------------------------------------------------------ the valve

W, I, A, E = "watermark", "idle", "active", "ended"


def drive(valve: StatusWatermarkValve, step: tuple[object, ...]) -> list[object]:
    kind, channel, *rest = step
    if kind == W:
        return valve.input_watermark(channel, rest[0])  # type: ignore[arg-type]
    if kind == E:
        return valve.input_ended(channel)  # type: ignore[arg-type]
    return valve.input_watermark_status(channel, idle=(kind == I))  # type: ignore[arg-type]


STEPS = st.lists(
    st.one_of(
        st.tuples(st.just(W), st.integers(0, 2), st.integers(0, 100)),
        st.tuples(st.sampled_from([I, A, E]), st.integers(0, 2)),
    ),
    max_size=30,
)


@settings(max_examples=examples(100), deadline=None)
@given(before=STEPS, after=STEPS)
def test_a_valve_restored_from_its_plain_state_goes_on_as_the_uninterrupted_one(before, after):
    valve = StatusWatermarkValve(3)
    for step in before:
        drive(valve, step)
    state = valve.snapshot_state()
    assert is_plain(state) is None
    restored = StatusWatermarkValve(3)
    restored.restore_state(pickle.loads(pickle.dumps(state)))
    assert [drive(restored, s) for s in after] == [drive(valve, s) for s in after]
    assert restored.snapshot_state() == valve.snapshot_state()


def test_a_valve_state_of_another_number_of_inputs_is_refused():
    with pytest.raises(StateFormatError) as info:
        StatusWatermarkValve(2).restore_state(StatusWatermarkValve(3).snapshot_state())
    assert str(info.value) == "the valve's state has 3 inputs, but this valve has 2"


# ------------------------------------------------------------------------ channel items

ITEMS = [
    Records([Record({"v": 1}, 5, (0, 0, 1)), Record("bare", None)]),  # a user's values stay as they are
    PartialAggregates(pa.table({"k": ["a"], "window_start": [0], "sum_v": [3]}), 4),
    Watermark(10),
    WatermarkStatus(True),
    CheckpointBarrier(7),
    END_OF_INPUT,
]


@pytest.mark.parametrize("item", ITEMS, ids=lambda item: type(item).__name__)
def test_each_channel_item_is_written_as_plain_data_and_read_back_equal(item):
    plain = plain_item(item, plain_records)
    assert is_plain(plain) is None
    assert item_of(pickle.loads(pickle.dumps(plain)), records_of) == item


def test_a_channels_items_keep_their_channel_and_their_order():
    channels = [ITEMS[:3], [], ITEMS[3:]]
    assert channels_of(plain_channels(channels, plain_records), records_of) == channels


def test_an_unknown_item_is_refused_naming_what_a_snapshot_holds():
    with pytest.raises(StateFormatError, match=r"^a channel item in a snapshot is \('records', batch\).*, got \('punctuation', 3\)$"):
        item_of(("punctuation", 3), records_of)
    with pytest.raises(StateFormatError, match=r"^a channel item must be one of Records, .*, got Record$"):
        plain_item(Record(1), plain_records)  # type: ignore[arg-type]


def test_the_channel_items_modules_examples_hold():
    result = doctest.testmod(channel_items)
    assert result.attempted > 0 and result.failed == 0


# --------------------------------------------------------------------------- the task


def test_the_tasks_state_with_a_batch_half_fed_is_plain_data():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, mode="ordered", capacity=1, timeout_ms=1_000), num_inputs=2)
    h.process_watermark(4, channel=0)
    h.process_watermark_status(True, channel=1)
    # Three rows in one batch: the first fills the queue, the second waits inside the operator for
    # room, the third in the task.
    h.channels.file(0, Records([Record("a", 5, (0, 0, 0)), Record("b", 6, (0, 0, 1)), Record("c", 7, (0, 0, 2))]))
    h.task.wake()
    h.run_until_idle()
    state = h.task.snapshot_state()
    assert is_plain(state) is None
    assert state["rows"] == [("c", 7)] and state["row_origins"] == [(0, 0, 2)]
    assert state["valve"] == {
        "watermarks": [4, -(2**63)], "idle": [False, True], "ended": [False, False], "aligned": [True, False],
        "current_watermark_ms": 4, "is_idle": False,
    }


def _valve_then_end(task_state: dict[str, object]) -> list[object]:
    """What a task restored from ``task_state`` emits when channel 0 says 20 and then ends."""
    h = OperatorHarness(StreamOperator(), num_inputs=2)
    h.restore(pickle.dumps(HarnessCheckpoint(None, [None], task_state, [])))
    h.process_watermark(20, channel=0)
    h.end_input(channel=0)
    return h.output


def test_a_task_state_of_format_2_with_the_valve_itself_restores_as_one_of_format_3():
    h = OperatorHarness(StreamOperator(), num_inputs=2)
    h.process_watermark(10, channel=0)
    h.process_watermark_status(True, channel=1)
    h.end_input(channel=1)
    state = h.task.snapshot_state()
    format_2 = {**state, "valve": pickle.loads(pickle.dumps(h.task.valve))}  # as versions 1 and 2 wrote it
    # Channel 1 ended idle: channel 0 alone moves event time, and its end ends it.
    assert _valve_then_end(state) == _valve_then_end(format_2) == [Watermark(20), Watermark(MAX_WATERMARK)]
