"""An operator instance's part in a checkpoint: the barrier at the source it reads, the snapshot
of its chain, task, in-flight input and queued output, the write and the acknowledgement, and
the restore.

A snapshot is taken on the mailbox thread when the task has aligned the barriers
(``operators.stream_task``); the write runs in a thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Awaitable
from typing import Any, Callable

from actorflow.operators.elements import CheckpointBarrier
from actorflow.operators.operator import OperatorChain
from actorflow.operators.stream_task import StreamTask

from .chain_spec import ChainSpec
from .output import BatchingOutput, LocalSink, Outbox
from .source_actor import BlockReader

__all__ = ["InstanceCheckpoints"]


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
        data = await asyncio.to_thread(spec.checkpoints.read_state, spec.restore, spec.task)
        return pickle.loads(data)  # type: ignore[no-any-return]

    async def trigger(self, checkpoint_id: int, reader: BlockReader | None, gate: Any,
                      split_channels: list[Any] | None, between_items: asyncio.Event) -> None:
        """Start checkpoint ``checkpoint_id`` at the chained source ``reader``: its barrier goes
        into the input (or, for a keyed read, to every peer) behind what was read so far."""
        spec = self.spec
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
        state = {
            "chain": chain.snapshot_state(),
            **task.snapshot_state(),
            "input": in_front,
            "output": overtaken,
            "reader": reader_state,
            "side_outputs": side_outputs,
        }
        data = pickle.dumps(state, protocol=5)
        fault_point("snapshot")
        staged = None if local_sink is None else local_sink.staged.pop(checkpoint_id, None)
        spawn(self._acknowledge(checkpoint_id, data, staged), f"writing checkpoint {checkpoint_id}")

    async def _acknowledge(self, checkpoint_id: int, data: bytes, staged: Any) -> None:
        spec = self.spec
        size = await asyncio.to_thread(spec.checkpoints.write_state, checkpoint_id, spec.task, data)
        if size is None:  # aborted meanwhile
            return
        if staged is not None:
            size += await staged
        self.done += 1
        spec.coordinator.acknowledge.remote(spec.attempt, checkpoint_id, spec.task, size)

    @staticmethod
    def restore(state: dict[str, Any], task: StreamTask, outbox: Outbox) -> dict[str, list[Any]]:
        """Restore the task's part and requeue the output the barrier overtook; the side outputs."""
        task.restore_state(state)
        for channel, items in enumerate(state["output"]):
            for item in items:
                outbox.put(channel, item)
        return state["side_outputs"]  # type: ignore[no-any-return]
