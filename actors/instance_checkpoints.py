"""An operator instance's part in a checkpoint: the barrier at the source it reads, the snapshot
of its chain, task, in-flight input and queued output, the write and the acknowledgement, and
the restore.

A snapshot is taken on the mailbox thread when the task has aligned the barriers
(``operators.stream_task``); the write runs in a thread, off the event loop.

The state is plain data (``operators.state``'s ``instance``): ``instance_state`` writes it, and
``restored_state`` gives it back with its items, batches and side-output records as the actor
holds them. A state of format 1 or 2 holds those objects themselves and restores as it is.
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Awaitable
from typing import Any, Callable

import pyarrow as pa

from actorflow.operators.async_attempt import DeadLetter
from actorflow.operators.channel_items import ChannelItem, channels_of, plain_channels
from actorflow.operators.elements import CheckpointBarrier
from actorflow.operators.errors import StateFormatError
from actorflow.operators.operator import OperatorChain
from actorflow.operators.state import check_state, table_bytes, table_of, versioned
from actorflow.operators.stream_task import StreamTask
from actorflow.operators.windows.late import LateRecord

from .arrow_rows import RowBatch
from .chain_spec import ChainSpec
from .instance_rescale import reroute_output, rescaled_instance
from .naming import old_tasks
from .output import BatchingOutput, LocalSink, Outbox
from .source_actor import BlockReader, EpochReader

__all__ = [
    "PACKED_SIDE", "InstanceCheckpoints", "batch_of", "instance_state", "pack_side_records", "plain_batch",
    "restored_state", "unpack_side_records",
]


class InstanceCheckpoints:
    """The checkpoints of one instance (``spec.checkpoints`` is set: a checkpointed job)."""

    def __init__(self, spec: ChainSpec) -> None:
        self.spec = spec
        self.done = 0  # snapshots written and acknowledged
        self._reader_states: dict[int, Any] = {}  # the chained source's position at each barrier

    async def read_restored(self) -> dict[str, Any] | None:
        """The state to restore (``spec.restore``), or None for a fresh start."""
        spec = self.spec
        if spec.restore is None:
            return None
        return await asyncio.to_thread(self._read, spec.restore)

    def _read(self, checkpoint_id: int) -> dict[str, Any]:
        """This task's state in the checkpoint; or, where the stage ran at another parallelism
        then, this instance's part of the states of all its old instances (``instance_rescale``)."""
        spec = self.spec
        old = old_tasks(spec.checkpoints.tasks(checkpoint_id), spec.name)
        if spec.task in old or not old:
            return restored_state(pickle.loads(spec.checkpoints.read_state(checkpoint_id, spec.task)))
        olds = [restored_state(pickle.loads(spec.checkpoints.read_state(checkpoint_id, task))) for task in old]
        return rescaled_instance(olds, spec.index, spec.parallelism, stage=spec.name, num_inputs=spec.num_inputs,
                                 key=spec.input_key, max_parallelism=spec.max_parallelism)

    async def trigger(self, checkpoint_id: int, reader: BlockReader | None, gate: Any,
                      split_channels: list[Any] | None, between_items: asyncio.Event) -> None:
        """Start checkpoint ``checkpoint_id`` at the chained source ``reader``: its barrier goes
        into the input (or, for a keyed read, to every peer) behind what was read so far."""
        spec = self.spec
        if isinstance(reader, EpochReader):
            await reader.wait_caught_up()  # the barrier follows the epochs fed, whole
        if reader is None or reader.ended:
            spec.coordinator.decline.remote(spec.attempt, checkpoint_id, spec.task,
                                            "its input has ended" if reader is not None else "it reads no source")
            return
        if split_channels is not None:
            await between_items.wait()  # the parts of one batch go out before the barrier
            if reader.ended:
                spec.coordinator.decline.remote(spec.attempt, checkpoint_id, spec.task, "its input has ended")
                return
            self._reader_states[checkpoint_id] = reader.state()
            for channel in split_channels:
                channel.send_now(CheckpointBarrier(checkpoint_id))
            return
        self._reader_states[checkpoint_id] = reader.state()
        gate.file(0, CheckpointBarrier(checkpoint_id))

    def forget(self, up_to: int) -> None:
        """A checkpoint taken or aborted ends the wait of every one up to it (k+1 subsumes k)."""
        self._reader_states = {k: v for k, v in self._reader_states.items() if k > up_to}

    def snapshot(
        self, checkpoint_id: int, in_front: list[list[Any]], *, chain: OperatorChain, task: StreamTask,
        output: BatchingOutput, outbox: Outbox, side_outputs: dict[str, list[Any]], local_sink: LocalSink | None,
        fault_point: Callable[[str], None], spawn: Callable[[Awaitable[None], str], Any],
    ) -> None:
        """Take checkpoint ``checkpoint_id`` now, on the mailbox thread, whatever the operators
        wait for: the rows in hand and the input in front of the barriers are part of the state,
        and the barrier leaves ahead of the output still queued, which is part of it too."""
        output.flush()  # rows emitted so far belong before the barrier
        overtaken = outbox.put_barrier(checkpoint_id)
        reader_state = self._reader_states.get(checkpoint_id)
        self.forget(up_to=checkpoint_id)
        sides: dict[str, list[Any]] = {}
        if self.spec.side_index is not None:  # a stream's: they leave with this epoch, as its output does
            sides = {tag: values for tag, values in side_outputs.items() if values}
            side_outputs.clear()
        state = instance_state(chain.snapshot_state(), task.snapshot_state(), in_front, overtaken, reader_state,
                               side_outputs)
        data = pickle.dumps(state, protocol=5)
        fault_point("snapshot")
        staged = None if local_sink is None else local_sink.staged.pop(checkpoint_id, None)
        spawn(self._acknowledge(checkpoint_id, data, staged, sides), f"writing checkpoint {checkpoint_id}")

    async def _acknowledge(self, checkpoint_id: int, data: bytes, staged: Any, sides: dict[str, list[Any]]) -> None:
        spec = self.spec
        size = await asyncio.to_thread(spec.checkpoints.write_state, checkpoint_id, spec.task, data)
        if size is None:  # aborted meanwhile
            return
        if staged is not None:
            size += await staged
        for tag, values in sides.items():
            size += await asyncio.to_thread(spec.checkpoints.stage_side, tag, spec.side_index, checkpoint_id,
                                            pack_side_records(values))
        self.done += 1
        spec.coordinator.acknowledge.remote(spec.attempt, checkpoint_id, spec.task, size)

    @staticmethod
    def restore(state: dict[str, Any], task: StreamTask, outbox: Outbox, output: BatchingOutput | None = None) -> dict[str, list[Any]]:
        """Restore the task's part and requeue the output the barrier overtook (dealt anew where
        the next stage's parallelism changed); the side outputs."""
        task.restore_state(state)
        overtaken = state["output"]
        if overtaken and len(overtaken) != outbox.channels:
            if output is None:
                raise StateFormatError(f"the state holds output for {len(overtaken)} channels, and there are "
                                       f"{outbox.channels}: restore it with the output that routes it anew")
            overtaken = reroute_output(overtaken, outbox.channels, output.partitioner)
        for channel, items in enumerate(overtaken):
            for item in items:
                outbox.put(channel, item)
        return state["side_outputs"]  # type: ignore[no-any-return]


def instance_state(
    chain: list[Any], task: dict[str, Any], in_front: list[list[ChannelItem]], overtaken: list[list[ChannelItem]],
    reader: dict[str, Any] | None, side_outputs: dict[str, list[Any]],
) -> dict[str, Any]:
    """An instance's part of a checkpoint as plain data (``operators.state``'s ``instance``): the
    chain's and the task's states, each channel's input in front of the barriers and output they
    overtook, the chained source's position, and the side outputs so far."""
    return versioned("instance", {
        "chain": chain,
        **task,
        "input": plain_channels(in_front, plain_batch),
        "output": plain_channels(overtaken, plain_batch),
        "reader": reader,
        "side_outputs": {tag: [_plain_side_record(value) for value in values] for tag, values in side_outputs.items()},
    })


def restored_state(state: dict[str, Any]) -> dict[str, Any]:
    """The state to restore, with its input, output and side outputs as the actor holds them:
    channel items and records. A state of format 1 or 2, which has no version of its own and
    holds those objects pickled, as it is (its chain's states say their versions)."""
    if "version" not in state:
        return state
    check_state("instance", state)
    side_outputs = {tag: [_side_record(plain) for plain in records] for tag, records in state["side_outputs"].items()}
    return {**state, "input": channels_of(state["input"], batch_of), "output": channels_of(state["output"], batch_of),
            "side_outputs": side_outputs}


def plain_batch(batch: RowBatch) -> dict[str, Any]:
    """A ``Records`` item's batch as plain data: its table as an Arrow IPC stream, the event times
    and the origins (a piece's rows picked out as a list of their positions)."""
    origins = batch.origins
    if isinstance(origins, tuple) and not isinstance(origins[2], int):
        split, piece, rows = origins
        origins = (split, piece, rows.to_pylist())
    timestamps = None if batch.timestamps is None else batch.timestamps.to_pylist()
    return {"table": table_bytes(batch.table), "timestamps": timestamps, "origins": origins}


def batch_of(plain: dict[str, Any]) -> RowBatch:
    """The batch that ``plain_batch`` wrote."""
    origins, timestamps = plain["origins"], plain["timestamps"]
    if isinstance(origins, tuple) and isinstance(origins[2], list):
        split, piece, rows = origins
        origins = (split, piece, pa.array(rows, pa.int64()))
    return RowBatch(table_of(plain["table"]), None if timestamps is None else pa.array(timestamps, pa.int64()), origins)


#: The one column of a staged side-output epoch: each record in its plain form, pickled.
PACKED_SIDE = pa.schema([pa.field("record", pa.binary())])


def pack_side_records(records: list[Any]) -> pa.Table:
    """Side-output records to stage with a checkpoint (a streaming job's): one row each, the
    record pickled in the plain form a checkpoint's state holds it in."""
    return pa.table([pa.array([pickle.dumps(_plain_side_record(r), protocol=5) for r in records], pa.binary())],
                    schema=PACKED_SIDE)


def unpack_side_records(table: pa.Table) -> list[Any]:
    """The records that ``pack_side_records`` staged."""
    return [_side_record(pickle.loads(b)) for b in table.column("record").to_pylist()]


def _plain_side_record(value: Any) -> tuple[Any, ...]:
    # A user's own side output (a window function's ``output(tag, value)``) is the user's value.
    if isinstance(value, (DeadLetter, LateRecord)):
        return value.to_state()
    return ("value", value)


def _side_record(plain: Any) -> Any:
    match plain:
        case ("value", value):
            return value
        case ("dead_letter", *_):
            return DeadLetter.from_state(plain)
        case ("late", *_):
            return LateRecord.from_state(plain)
    raise StateFormatError(
        f"a side-output record in a snapshot is ('value', value), ('dead_letter', ...) or ('late', ...), got {plain!r}"
    )
