"""The operator actor: one operator chain and its mailbox, on one Ray actor.

Threading model
    The actor is an asyncio actor. Its event loop's thread is the mailbox thread: the mailbox
    loop runs there as a task, beside the coroutines of ``async def`` user functions. Remote
    methods only hand work to the mailbox, or wait for room in the input gate; they never touch
    operator state. Any ``async def`` method lets Ray interleave up to 1000 calls; the mailbox,
    not Ray, makes sure one mail runs at a time. Nothing on the loop calls ``ray.get``.

Lifecycle
    ``__init__`` → ``connect`` → ``start`` → (``push`` ...) → the chain drains after the last
    channel ends → ``wait`` returns the final figures, or raises the operator's error.

Chaining
    An actor of the first stage may read the source itself (``connect(reader=...)``), and an
    actor of the last stage keeps its output (``connect(downstream=None)``) for ``take_table``.
    A job whose operators share one parallelism then runs on exactly that many actors. Side
    outputs (dead letters) always stay in the actor that produced them, for ``take_side``.

Input
    Ring 1's ``StreamTask`` decides the order of the input (``operators.stream_task``): the
    watermark valve, barrier alignment, the end of input, whole Arrow batches for a head that
    ``TakesArrowBatches``. The actor hosts it: its remote methods fill the task's channels (the
    ``InputGate``), and it provides the output, the snapshot's writing and the chaos moments.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import pyarrow as pa

from actorflow.operators.clock import SystemClock
from actorflow.operators.errors import portable
from actorflow.operators.channel_items import END_OF_INPUT, ChannelItem, Records
from actorflow.operators.mailbox_processor import DefaultActionController, MailboxProcessor
from actorflow.operators.operator import OperatorChain, no_fault_point
from actorflow.operators.stream_task import StreamTask

from .chain_spec import ChainSpec
from .channel import ChannelSender, InputGate
from .instance_checkpoints import InstanceCheckpoints
from .instance_figures import InstanceFigures
from .instance_wiring import BackgroundTasks, chaos_moments, context_factory, instance_output, tick
from .metrics import OperatorMetricsExporter
from .keys import KeyRouter, as_router
from .output import LocalSink
from .source_actor import EPOCH_END, BlockReader, LocalChannel, epoch_reader, route_items
from .task_host import ActorTaskHost
from .heap import for_whole_batches
from .store_pages import process_pages
from .upstream.cpython import relax_collector
from .upstream.ray import bind_private_methods, current_runtime_env, quiet_arrow_fallback

__all__ = ["ChainSpec", "OperatorActor", "end_node"]



def end_node() -> None:
    """Kill the node this process runs on, as a machine's death would: its raylet, which every
    worker process of the node and its object store end with (the chaos tool's node kill)."""
    raylet = os.getppid()
    with open(f"/proc/{raylet}/cmdline", "rb") as f:
        command = f.read()
    if b"raylet" not in command:
        raise RuntimeError(f"this worker's parent (pid {raylet}) is not a raylet: {command[:200]!r}")
    os.kill(raylet, signal.SIGKILL)
    os._exit(1)  # and this worker with it, as every worker of the node ends

class OperatorActor:
    """Hosts an operator chain; ``ray.remote`` is applied at the edge (``cluster``)."""

    def __init__(self, spec: ChainSpec) -> None:
        bind_private_methods(self)  # the mailbox calls some of them once per record
        quiet_arrow_fallback()  # batches leave through Ray's serializer
        self.spec = spec
        self.name = spec.instance_name
        self._chain = OperatorChain([factory() for factory in spec.operator_factories])
        self._run_task: asyncio.Task[dict[str, Any]] | None = None
        self._chain_open = False
        # The input's order, the valve, alignment and the end of input: ring 1's, over the gate.
        self._gate = InputGate(spec.num_inputs, capacity=spec.input_capacity, on_item=self._wake)
        self._host = ActorTaskHost(snapshot=self._snapshot, finished=self._finished, fault_point=self._chaos_point)
        self._task = StreamTask(self._chain, self._gate, self._host, rows_per_round=spec.rows_per_round)
        if self._task.takes_arrow_batches or spec.downstream_head is not None:
            for_whole_batches()  # whole columns of a batch at a time (see actors.heap)
        self._reader: BlockReader | None = None
        self._connected = asyncio.Event()  # set once connect() has made the input gate
        self._clock = SystemClock()
        self._local_sink: LocalSink | None = None
        self._side_outputs: dict[str, list[Any]] = {}
        self._background = BackgroundTasks(self.name, on_failure=self._fail)
        self._checkpoints = InstanceCheckpoints(spec)
        self._figures = InstanceFigures(self.name, spec.attempt, self._chain, self._task, self._gate, self._clock)
        self._armed: str | None = None  # a chaos moment at which this process ends
        self._armed_node = False  # and its node with it
        # A full collection takes about 40 ms with Ray, pyarrow and pandas loaded: here it runs
        # while the driver prepares the input, not on the job's critical path in start(). In a
        # prepared worker (cluster.warm_workers) what the imports built is frozen already, and
        # the collection walks only what came after: about a millisecond.
        gc.collect()

    def __repr__(self) -> str:
        # Ray names the actor with it even when the constructor never ran: its arguments
        # could not be unpickled in this worker, and that error is the one to report.
        return getattr(self, "name", type(self).__name__)

    # ------------------------------------------------------------ remote methods

    async def connect(
        self, downstream: list[Any] | None, reader: BlockReader | None = None, peers: list[Any] | None = None,
        key: KeyRouter | Any = None,
    ) -> None:
        """``downstream``: the next stage's actors, or None to keep the output here; ``reader``:
        the source blocks this actor reads itself, as its one input channel; or, with ``peers``
        (every instance of this stage, this one included), its split of them, routed by ``key``
        over the peers' inputs: channel ``i`` of every instance is instance ``i``'s split."""
        spec = self.spec
        if reader is not None and peers is None and spec.num_inputs != 1:
            raise ValueError(f"{self.name}: a chained source must be the only input, got {spec.num_inputs} inputs")
        if peers is not None and (len(peers) != spec.num_inputs or as_router(key) is None):
            raise ValueError(f"{self.name}: a keyed read needs a key and one peer per input, got {len(peers)} for {spec.num_inputs}")
        self._downstream = downstream
        self._reader = reader
        self._peer_key = as_router(key)
        self._between_items = asyncio.Event()
        self._between_items.set()
        stage = None
        if downstream is None and spec.checkpoints is not None:
            stage = functools.partial(spec.checkpoints.stage, spec.index)
        self._local_sink = LocalSink(stage) if downstream is None else None
        # A keyed read: where this instance's split goes by key, its own input or a peer's,
        # always on channel `index`.
        self._split_channels: list[Any] | None = None if peers is None else [
            LocalChannel(self._gate, spec.index) if i == spec.index else ChannelSender(peer, spec.index, credits=spec.credits)
            for i, peer in enumerate(peers)
        ]
        self._restored = state = await self._checkpoints.read_restored()
        if state is not None:
            for channel, items in enumerate(state["input"]):
                for item in items:
                    self._gate.file(channel, item)
            if reader is not None:
                reader.restore(state["reader"])
        self._connected.set()

    async def start(self) -> None:
        await self._connected.wait()  # the job may ask for both at once
        spec, clock = self.spec, self._clock
        self.processor = MailboxProcessor(self._task.default_action)
        self.processor.mailbox.bind_to_current_thread()
        self._outbox, self._output = instance_output(
            spec, self._downstream, self._local_sink, on_room=self._wake, on_side=self._on_side,
            on_error=lambda error: self._background.failed("sending output downstream", error))
        self._chain.setup(context_factory(
            spec, self.name, self.processor, clock, len(self._chain.operators), signal_progress=self._wake,
            fault_point=self._chaos_point if self._armed is not None else no_fault_point), self._output)
        restored = self._restored
        self._chain.initialize_state(None if restored is None else restored["chain"])
        if restored is not None:
            self._side_outputs = InstanceCheckpoints.restore(restored, self._task, self._outbox, self._output)
        self._chain.open()
        self._chain_open = True  # the operators' metrics and queues exist from here
        self._figures.started(self.processor, self._outbox, self._output, self._reader)
        self._host.attach(self._outbox, self._output, self._figures)
        self._exporter = OperatorMetricsExporter(spec.job, spec.name, f"{spec.index}/{spec.parallelism}")
        self._exporter.export(self._figures.figures())
        # Records are mostly acyclic and freed by reference counting; what was built so far lives
        # as long as the actor. Freezing it and collecting less often keeps the cyclic collector's
        # full passes (tens of ms each) from stalling the event loop under every request. The
        # collection before it ran in __init__, while the job's input was being prepared.
        relax_collector()
        self._run_task = asyncio.get_running_loop().create_task(self._run())
        self._ticker = self._background.spawn(
            tick(self.processor.executor(0), self._output, spec.linger_ms, last_stage=self._local_sink is not None,
                 export=lambda: self._exporter.export(self._figures.figures())),
            "the metrics and flush ticker")
        if self._reader is not None:
            self._background.spawn(self._read(self._reader), "reading the source")

    def _fail(self, failure: BaseException) -> None:
        self.processor.report_throwable(failure)
        self._wake()

    async def push(self, channel: int, seq: int, items: list[ChannelItem]) -> None:
        if not self._connected.is_set():  # a peer that started first (see cluster.job's deploy)
            await self._connected.wait()
        for item in items:
            if isinstance(item, Records):
                process_pages.passed(item.batch.table.nbytes)  # a large batch came through the store
        await self._gate.push(channel, seq, items)

    async def wait(self) -> dict[str, Any]:
        """The final figures once the chain has drained; raises the error that stopped it."""
        assert self._run_task is not None, "start() first"
        try:
            return await self._run_task
        except Exception as error:
            # Ray pickles the error for the caller; a user's exception may not survive that.
            converted = portable(error)
            if converted is error:
                raise
            raise converted  # noqa: B904 - its own __cause__ is the stand-in for the user's error

    async def stats(self) -> dict[str, Any]:
        return self._figures.figures()

    async def actor_runtime_env(self) -> str:
        """This process's runtime environment as Ray serialised it (see cluster.warm_workers)."""
        return current_runtime_env()

    async def progress(self) -> int:
        """Rows read from the chained source, or else records taken in."""
        return self._reader.rows_read if self._reader is not None else self._task.records_in

    async def record_progress(self) -> dict[str, Any]:
        """Records with an outcome, requests in flight, and the oldest one's wait (ms, or None)."""
        return self._figures.record_progress()

    async def take_table(self) -> pa.Table | None:
        """The last stage's output, in order; None if it produced nothing."""
        if self._local_sink is None:
            raise ValueError(f"{self.name}: not the last stage, its output went downstream")
        return self._local_sink.table()

    async def output_blocks(self) -> AsyncIterator[pa.Table]:
        """The last stage's output as it is produced, in blocks of a few MiB, in order.

        Call it with ``num_returns="streaming"`` once ``connect`` returned: each block then goes
        to the object store owned by the caller, and this actor keeps at most a few blocks.
        """
        if self._local_sink is None:
            raise ValueError(f"{self.name}: not the last stage, its output went downstream")
        async for table in self._local_sink.drain():
            yield table
            process_pages.passed(table.nbytes)  # it is in the store now

    async def output_schema(self) -> pa.Schema | None:
        return self._local_sink.schema() if self._local_sink is not None else None

    async def output_sample(self) -> dict[str, Any] | None:
        return self._local_sink.sample() if self._local_sink is not None else None

    async def take_side(self, tag: str) -> list[Any]:
        return self._side_outputs.get(tag, [])

    async def _read(self, reader: BlockReader) -> None:
        # A bad block fails the job through wait(), like an operator error (BackgroundTasks). Room
        # first, then the item goes in at once: the reader's position always matches what the
        # gate holds, whenever a barrier comes in between.
        if self._split_channels is not None:
            # Every instance runs the same chain: what this head can pre-aggregate, the peers' heads merge.
            pre_aggregate = getattr(self._chain.head, "pre_aggregate", None)
            await route_items(reader, self._split_channels, self._peer_key, self._between_items, pre_aggregate)
            return
        async for item in reader.items():
            if item is EPOCH_END:
                continue
            await self._gate.room(0)
            self._gate.file(0, item)

    # ---------------------------------------------------------------- checkpoints

    async def trigger_checkpoint(self, checkpoint_id: int) -> None:
        """Start checkpoint ``checkpoint_id`` at the chained source this actor reads."""
        await self._checkpoints.trigger(checkpoint_id, self._reader, self._gate, self._split_channels, self._between_items)

    async def feed_epoch(self, epoch: int, pieces: list[Any]) -> None:
        """The chained unbounded source's next epoch (``EpochReader.feed``)."""
        await self._connected.wait()
        epoch_reader(self._reader, self.name).feed(epoch, pieces)

    async def finish_input(self) -> None:
        """End the chained unbounded source after the epochs fed: the job drains."""
        await self._connected.wait()
        epoch_reader(self._reader, self.name).finish()

    async def checkpoints_done(self) -> int:
        """Snapshots this instance wrote and acknowledged."""
        return self._checkpoints.done

    async def arm_chaos(self, moment: str, node: bool = False) -> bool:
        """End this actor's process when it reaches ``moment`` (see ``cluster.chaos.MOMENTS``),
        or with ``node`` its whole node (``end_node``); False if it never can (no async operator,
        no window, no checkpoints)."""
        if moment not in chaos_moments(self._chain, checkpointed=self.spec.checkpoints is not None):
            return False
        self._armed = moment
        self._armed_node = node
        self._task.watch_fault_points = True
        if self._chain_open:  # else the contexts, made at start(), arm the operators
            for op in self._chain.operators:
                op.context.fault_point = self._chaos_point
        return True

    def _chaos_point(self, moment: str) -> None:
        if self._armed == moment:
            if self._armed_node:
                end_node()
            os._exit(1)  # a crash, as the chaos tool asked: no clean-up, no goodbye

    async def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.processor.executor(0).execute_if_open(
            self._chain.notify_checkpoint_complete, "checkpoint complete", checkpoint_id)

    async def abort_checkpoint(self, checkpoint_id: int) -> None:
        self._gate.drop_barriers(checkpoint_id)
        self._wake()  # a channel the barrier held may have input, and no push may come to wake the task
        self._checkpoints.forget(up_to=checkpoint_id)
        self.processor.executor(0).execute_if_open(
            self._chain.notify_checkpoint_aborted, "checkpoint aborted", checkpoint_id)

    def _snapshot(self, checkpoint_id: int, in_front: list[list[Any]]) -> None:
        self._checkpoints.snapshot(
            checkpoint_id, in_front, chain=self._chain, task=self._task, output=self._output, outbox=self._outbox,
            side_outputs=self._side_outputs, local_sink=self._local_sink, fault_point=self._chaos_point,
            spawn=self._background.spawn)

    # -------------------------------------------------------------- mailbox side

    async def _run(self) -> dict[str, Any]:
        try:
            await self.processor.run_mailbox_loop_async(mails_per_round=self.spec.mails_per_round)
            self._output.flush()
            self._outbox.broadcast(END_OF_INPUT)
            await self._outbox.close()
            if self._local_sink is not None and self.spec.checkpoints is not None:
                await self._local_sink.cut(self.spec.checkpoints.final_epoch)
            if self._local_sink is not None:
                self._local_sink.end()
            self._chain.close()
            return self._figures.figures()
        except BaseException:
            self._abort()
            raise
        finally:
            self._ticker.cancel()
            self._exporter.export(self._figures.figures())

    def _abort(self) -> None:
        """The failure path: stop reading and sending, close the operators, cancel their tasks."""
        self._background.cancel_all()
        self._outbox.cancel()
        if self._local_sink is not None:
            self._local_sink.end()  # the caller's stream of blocks ends; the job reports the error
        try:
            self._chain.close()  # user functions close; Ray-task functions cancel their tasks
        except Exception:  # noqa: BLE001 - the first error is the one the job reports
            pass

    def _wake(self) -> None:
        self._figures.output_may_have_room()
        self._task.wake()

    def _finished(self, controller: DefaultActionController) -> None:
        self._output.flush()
        controller.all_actions_completed()

    def _on_side(self, tag: str, values: list[Any]) -> None:
        self._side_outputs.setdefault(tag, []).extend(values)

