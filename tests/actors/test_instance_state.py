"""An operator instance's part of a checkpoint (actors/instance_checkpoints.py) is plain data of
format 3: taken by the stream task at aligned barriers, with Arrow batches, partial aggregates,
watermarks and statuses in front of them, the output they overtook and the side outputs; it reads
back as the actor holds it, and a state of format 2 (those objects pickled) restores alike (no Ray
needed)."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import pyarrow as pa
import pytest

from actorflow.actors.arrow_rows import RowBatch, is_bare
from actorflow.actors.instance_checkpoints import InstanceCheckpoints, instance_state, restored_state
from actorflow.actors.output import LocalSink, Outbox
from actorflow.operators import DeadLetter, OperatorHarness, StateFormatError, Watermark, WatermarkStatus
from actorflow.operators.channel_items import END_OF_INPUT, PartialAggregates, Records
from actorflow.operators.elements import MIN_TIMESTAMP
from actorflow.operators.harness import HarnessCheckpoint
from actorflow.operators.state import STATE_FORMAT_VERSION, is_plain, pickled_modules
from actorflow.operators.windows import Sum, TumblingEventTimeWindows, WindowOperator
from actorflow.operators.windows.late import LateReason, LateRecord

# Rows of a piece picked out by a key split (their positions as an Arrow array), with event times.
PICKED = RowBatch(pa.table({"k": ["a", "b"], "v": [2, 3]}), pa.array([12, 14], pa.int64()),
                  (0, 2, pa.array([3, 7], pa.int64())))
PARTIALS = pa.table({"k": ["b"], "window_start": [0], "sum_v": [9]})
# Bare values (the schema's metadata says so), origins one per row, no event time.
BARE = RowBatch(pa.table({"value": [1, 2]}).replace_schema_metadata({b"actorflow.bare": b"1"}), None,
                [(1, 0, 0), (1, 0, 1)])
OVERTAKEN = [[Records(BARE), Watermark(10), END_OF_INPUT]]
SIDE_OUTPUTS: dict[str, list[Any]] = {
    "dead_letter": [DeadLetter({"k": "c"}, 7, 3, "TimeoutError", "timed out after 3 attempt(s)", "enrich")],
    "late": [LateRecord({"k": "a", "v": 0}, 1, LateReason.BEHIND_WATERMARK, ((0, 100),), 150)],
    "mine": [{"note": "a window function's own"}, ("a", "tuple")],  # a user's values, whatever they are
}


def make() -> list[WindowOperator]:
    return [WindowOperator("k", TumblingEventTimeWindows(100), aggregate=Sum("v"))]


def snapshot_at_aligned_barriers() -> tuple[HarnessCheckpoint, Any]:
    """The stream task's checkpoint 3, and its valve then (what formats 1 and 2 pickled)."""
    h = OperatorHarness(make(), num_inputs=2, auto_run=False)
    h.process_element({"k": "a", "v": 1}, timestamp_ms=5, channel=0)
    h.process_watermark(10, channel=0)
    h.process_watermark_status(True, channel=1)
    h.run_until_idle()
    # In front of the barriers, as an actor's input holds them: an Arrow batch, partial aggregates.
    h.channels.file(0, Records(PICKED))
    h.process_watermark(20, channel=0)
    h.channels.file(1, PartialAggregates(PARTIALS, 4))
    h.process_watermark_status(False, channel=1)
    h.process_barrier(3, channel=0)
    h.process_barrier(3, channel=1)
    h.process_element({"k": "a", "v": 100}, timestamp_ms=30, channel=0)  # behind the barrier: not in it
    h.step()  # the barriers are aligned at once: the checkpoint comes before the items in front run
    return pickle.loads(h.checkpoints[3]), pickle.loads(pickle.dumps(h.task.valve))


CHECKPOINT, VALVE = snapshot_at_aligned_barriers()


def format_3() -> dict[str, Any]:
    return instance_state(CHECKPOINT.chain, CHECKPOINT.task, CHECKPOINT.input, OVERTAKEN, None, SIDE_OUTPUTS)


def format_2() -> dict[str, Any]:
    """The same checkpoint as formats 1 and 2 wrote it: actorflow's objects, no version of its own."""
    return {"chain": CHECKPOINT.chain, **CHECKPOINT.task, "valve": VALVE, "input": CHECKPOINT.input,
            "output": OVERTAKEN, "reader": None, "side_outputs": SIDE_OUTPUTS}


def test_the_snapshot_holds_the_input_in_front_of_the_barriers():
    assert CHECKPOINT.input == [[Records(PICKED), Watermark(20)], [PartialAggregates(PARTIALS, 4), WatermarkStatus(False)]]


def test_the_instance_state_is_plain_data_of_the_current_version_and_its_pickle_names_no_class_of_ours():
    state = format_3()
    assert is_plain(state) is None
    assert state["format"] == "instance" and state["version"] == STATE_FORMAT_VERSION
    assert [[plain[0] for plain in items] for items in state["input"]] == [["records", "watermark"], ["partials", "status"]]
    assert [plain[0] for plain in state["side_outputs"]["late"]] == ["late"]
    assert {m for m in pickled_modules(pickle.dumps(state, protocol=5)) if m.split(".")[0] == "actorflow"} == set()
    # Formats 1 and 2 pickled the valve, the items and the records themselves.
    assert "actorflow.operators.watermarks" in pickled_modules(pickle.dumps(format_2(), protocol=5))


def test_the_plain_state_reads_back_as_the_actor_holds_it():
    restored = restored_state(pickle.loads(pickle.dumps(format_3(), protocol=5)))
    assert restored["input"] == CHECKPOINT.input
    assert restored["output"] == OVERTAKEN and is_bare(restored["output"][0][0].batch.table)
    assert restored["side_outputs"] == SIDE_OUTPUTS
    assert restored["chain"] == CHECKPOINT.chain and restored["reader"] is None


def restore_in_an_actor(state: dict[str, Any]) -> tuple[Any, ...]:
    """What an operator actor restores of ``state`` beside its chain (``InstanceCheckpoints.restore``):
    the task's valve and watermark, the side outputs, and the overtaken output sent again."""
    h = OperatorHarness(make(), num_inputs=2, auto_run=False)

    async def requeue() -> tuple[dict[str, list[Any]], pa.Table | None]:
        sink = LocalSink()
        outbox = Outbox([sink], max_pending=8, on_room=lambda: None)
        side_outputs = InstanceCheckpoints.restore(state, h.task, outbox)
        await outbox.close()
        return side_outputs, sink.table()

    side_outputs, output = asyncio.run(requeue())
    return h.task.valve.snapshot_state(), h.task.current_watermark, side_outputs, output


@pytest.mark.parametrize("make_state", [format_2, format_3], ids=["format 2, objects", "format 3, plain"])
def test_an_instance_state_of_format_2_and_one_of_format_3_restore_alike(make_state):
    restored = restored_state(pickle.loads(pickle.dumps(make_state(), protocol=5)))
    valve, watermark, side_outputs, output = restore_in_an_actor(restored)
    # Channel 0 at 10, channel 1 idle: its watermark of 20 and its status were in front of the barriers.
    assert valve == {"watermarks": [10, MIN_TIMESTAMP], "idle": [False, True], "ended": [False, False],
                     "aligned": [True, False], "current_watermark_ms": 10, "is_idle": False}
    assert watermark == 10 and restored["input"] == CHECKPOINT.input
    assert side_outputs == SIDE_OUTPUTS
    assert output is not None and output.to_pylist() == [{"value": 1}, {"value": 2}]


def test_another_version_of_the_instance_state_is_refused_naming_both():
    with pytest.raises(StateFormatError) as info:
        restored_state({**format_3(), "version": 4})
    assert str(info.value) == (
        "instance operator state has format version 4, but this actorflow restores state format versions 1, 2 and 3 only"
    )


def test_an_unknown_side_output_record_is_refused():
    state = {**format_3(), "side_outputs": {"late": [("too_late", 1)]}}
    with pytest.raises(StateFormatError, match=r"^a side-output record in a snapshot is .*, got \('too_late', 1\)$"):
        restored_state(state)
