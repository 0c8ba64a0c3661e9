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
import dataclasses
import gc
import os
import pickle
import functools
import time
from dataclasses import dataclass
from collections.abc import AsyncIterator
from typing import Any, Callable

import pyarrow as pa

from actorflow.operators.clock import SystemClock
from actorflow.operators.errors import ActorflowError, portable
from actorflow.operators.async_batch_operator import AsyncBatchWaitOperator
from actorflow.operators.async_wait_operator import AsyncWaitOperator
from actorflow.operators.channel_items import END_OF_INPUT, ChannelItem, Partitioning, Records
from actorflow.operators.elements import MAX_WATERMARK, MIN_TIMESTAMP, CheckpointBarrier
from actorflow.operators.coroutine_runner import AsyncioCoroutineRunner
from actorflow.operators.mailbox_processor import DefaultActionController, MailboxProcessor
from actorflow.operators.operator import OperatorChain, OperatorContext, StreamOperator, no_fault_point
from actorflow.operators.stream_task import Rows, StreamTask

from .arrow_rows import is_bare, table_to_rows
from .channel import ChannelSender, InputGate
from .metrics import OperatorMetricsExporter
from .keys import KeyRouter, as_router
from .naming import instance_name, task_name
from .output import BatchingOutput, LocalSink, Outbox, Partitioner, pre_aggregator
from .processing_time import AsyncioProcessingTimeService
from .source_actor import BlockReader, LocalChannel, route_items
from .heap import for_whole_batches
from .store_pages import process_pages
from .upstream.cpython import relax_collector
from .upstream.ray import bind_private_methods, current_runtime_env

__all__ = ["ChainSpec", "OperatorActor"]


@dataclass
class ChainSpec:
    """What one operator actor runs, and how it talks to its neighbours."""

    job: str
    name: str
    index: int
    parallelism: int
    num_inputs: int
    operator_factories: list[Callable[[], StreamOperator]]
    partitioning: Partitioning = Partitioning.FORWARD
    key: Callable[[Any], Any] | None = None
    # With hash partitioning: the factory of the next stage's head operator, whose
    # pre_aggregate a batch may go through before the split (a keyed window stage).
    downstream_head: Callable[[], StreamOperator] | None = None
    output_schema: pa.Schema | None = None
    input_schema: pa.Schema | None = None  # the source's column types, which output columns keep
    batch_size: int = 2048
    input_capacity: int = 4
    outbox_capacity: int = 8
    credits: int = 4
    rows_per_round: int = 256
    mails_per_round: int = 4
    linger_ms: int = 20
    # A checkpointed job: where states and output epochs go (``write_state``, ``read_state``,
    # ``stage``), who is told of each snapshot, the attempt, and the checkpoint to restore.
    checkpoints: Any = None
    coordinator: Any = None
    attempt: int = 0
    restore: int | None = None

    def __post_init__(self) -> None:
        self.partitioning = Partitioning(self.partitioning)

    @property
    def instance_name(self) -> str:
        return instance_name(self.job, self.name, self.index, self.parallelism, self.attempt)

    @property
    def task(self) -> str:
        return task_name(self.name, self.index, self.parallelism)


class OperatorActor:
    """Hosts an operator chain; ``ray.remote`` is applied at the edge (``cluster``)."""

    def __init__(self, spec: ChainSpec) -> None:
        bind_private_methods(self)  # the mailbox calls some of them once per record
        self.spec = spec
        self.name = spec.instance_name
        self._chain = OperatorChain([factory() for factory in spec.operator_factories])
        self._run_task: asyncio.Task[dict[str, Any]] | None = None
        self._chain_open = False
        # The input's order, the valve, alignment and the end of input: ring 1's, over the gate.
        self._gate = InputGate(spec.num_inputs, capacity=spec.input_capacity, on_item=self._wake)
        self._task = StreamTask(self._chain, self._gate, _ActorTaskHost(self), rows_per_round=spec.rows_per_round)
        if self._task.takes_arrow_batches or spec.downstream_head is not None:
            for_whole_batches()  # whole columns of a batch at a time (see actors.heap)
        self._reader: BlockReader | None = None
        self._connected = asyncio.Event()  # set once connect() has made the input gate
        self._clock = SystemClock()
        self._local_sink: LocalSink | None = None
        self._side_outputs: dict[str, list[Any]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._reader_states: dict[int, Any] = {}  # the chained source's position at each barrier
        self._armed: str | None = None  # a chaos moment at which this process ends
        self._backpressured_ms = 0  # time the output could not leave (the outbox was full)
        self._backpressured_since: int | None = None
        self._checkpoints_done = 0
        self._cpu_at_start: tuple[float, float] | None = None  # (event-loop thread, process) CPU seconds
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
        self._restored: dict[str, Any] | None = None
        if spec.restore is not None:
            data = await asyncio.to_thread(spec.checkpoints.read_state, spec.restore, spec.task)
            self._restored = state = pickle.loads(data)
            for channel, items in enumerate(state["input"]):
                for item in items:
                    self._gate.file(channel, item)
            if reader is not None:
                reader.restore(state["reader"])
        self._connected.set()

    async def start(self) -> None:
        await self._connected.wait()  # the job may ask for both at once
        loop = asyncio.get_running_loop()
        spec = self.spec
        self.processor = MailboxProcessor(self._task.default_action)
        self.processor.mailbox.bind_to_current_thread()
        executor = self.processor.executor(0)
        clock = self._clock = SystemClock()
        channel_id = 0 if spec.partitioning is Partitioning.FORWARD else spec.index
        senders: list[ChannelSender | LocalSink]
        if self._local_sink is not None:
            senders = [self._local_sink]
        else:
            senders = [ChannelSender(h, channel_id, credits=spec.credits) for h in self._downstream or []]
        self._outbox = Outbox(senders, max_pending=spec.outbox_capacity, on_room=self._wake,
                              on_error=lambda error: self._background_failed("sending output downstream", error))
        partitioner = Partitioner(spec.partitioning, len(senders), spec.key)
        self._output = BatchingOutput(
            self._outbox, partitioner, batch_size=spec.batch_size, schema=spec.output_schema, side=self._on_side,
            hint=spec.input_schema,
            pre_aggregate=pre_aggregator(spec.downstream_head) if spec.partitioning is Partitioning.HASH else None,
        )
        processing_time = AsyncioProcessingTimeService(loop, executor, clock)
        runner = AsyncioCoroutineRunner(loop)
        n_ops = len(self._chain.operators)

        def context_for(i: int, op: StreamOperator) -> OperatorContext:
            # Each operator's mails (results, timers) carry its position in the chain: a
            # downstream operator that yields never runs an upstream operator's mail.
            op_executor = self.processor.executor(i)
            return OperatorContext(
                name=self.name if n_ops == 1 else f"{self.name}#{op.name}",
                mailbox_executor=op_executor,
                processing_time=processing_time.with_executor(op_executor),
                clock=clock,
                coroutine_runner=runner,
                subtask_index=spec.index,
                parallelism=spec.parallelism,
                signal_progress=self._wake,
                # The operators' own moments ("retry_wait", "completion"); unarmed, none is called.
                fault_point=self._chaos_point if self._armed is not None else no_fault_point,
                # Without the subtask: after a restore, a record may go to another instance.
                request_key_prefix=f"{spec.job}/{op.name}",
            )

        self._chain.setup(context_for, self._output)
        restored = self._restored
        self._chain.initialize_state(None if restored is None else restored["chain"])
        if restored is not None:
            self._restore_actor_state(restored)
        self._chain.open()
        self._chain_open = True  # the operators' metrics and queues exist from here
        # Called on the event loop's thread, as _figures always is (every caller is on the loop).
        self._cpu_at_start = (time.thread_time(), time.process_time())
        self._exporter = OperatorMetricsExporter(spec.job, spec.name, f"{spec.index}/{spec.parallelism}")
        self._exporter.export(self._figures())
        # Records are mostly acyclic and freed by reference counting; what was built so far lives
        # as long as the actor. Freezing it and collecting less often keeps the cyclic collector's
        # full passes (tens of ms each) from stalling the event loop under every request. The
        # collection before it ran in __init__, while the job's input was being prepared.
        relax_collector()
        self._run_task = loop.create_task(self._run())
        self._buffered_at_tick = 0
        self._ticker = self._spawn(self._tick(), "the metrics and flush ticker")
        if self._reader is not None:
            self._read_task = self._spawn(self._read(self._reader), "reading the source")

    def _spawn(self, coro: Any, what: str) -> "asyncio.Task[Any]":
        """A background task whose failure fails the job with its cause, instead of dying unseen."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)

        def done(t: "asyncio.Task[Any]") -> None:
            self._background.discard(t)
            if not t.cancelled() and t.exception() is not None:
                self._background_failed(what, t.exception())  # type: ignore[arg-type]

        task.add_done_callback(done)
        return task

    def _background_failed(self, what: str, error: BaseException) -> None:
        failure = ActorflowError(f"{self.name}: {what} failed: {type(error).__name__}: {error}")
        failure.__cause__ = error
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
        return self._figures()

    async def actor_runtime_env(self) -> str:
        """This process's runtime environment as Ray serialised it (see cluster.warm_workers)."""
        return current_runtime_env()

    async def progress(self) -> int:
        """Rows read from the chained source, or else records taken in."""
        return self._reader.rows_read if self._reader is not None else self._task.records_in

    async def record_progress(self) -> dict[str, Any]:
        """Records with an outcome (taken in and emitted, filtered or dead-lettered), requests in
        flight, and how long the oldest of them has been waiting (ms, or None)."""
        pending = 0
        in_flight = 0
        oldest: int | None = None
        if not hasattr(self, "processor"):  # not started yet
            return {"done": 0, "in_flight": 0, "oldest_ms": None}
        for op in self._async_operators():
            pending += op.records_pending
            in_flight += op.requests_in_flight
            started = op.oldest_request_started_ms()
            if started is not None and (oldest is None or started < oldest):
                oldest = started
        now = self._clock.now_ms()
        return {
            "done": self._task.records_in - pending,
            "in_flight": in_flight,
            "oldest_ms": None if oldest is None else now - oldest,
        }

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
        # A bad block fails the job through wait(), like an operator error (see _spawn). Room
        # first, then the item goes in at once: the reader's position always matches what the
        # gate holds, whenever a barrier comes in between.
        if self._split_channels is not None:
            # Every instance runs the same chain: what this head can pre-aggregate, the peers' heads merge.
            pre_aggregate = getattr(self._chain.head, "pre_aggregate", None)
            await route_items(reader, self._split_channels, self._peer_key, self._between_items, pre_aggregate)
            return
        async for item in reader.items():
            await self._gate.room(0)
            self._gate.file(0, item)

    # ---------------------------------------------------------------- checkpoints

    async def trigger_checkpoint(self, checkpoint_id: int) -> None:
        """Start checkpoint ``checkpoint_id`` at the chained source this actor reads."""
        reader = self._reader
        if reader is None or reader.ended:
            self.spec.coordinator.decline.remote(self.spec.attempt, checkpoint_id, self.spec.task,
                                                 "its input has ended" if reader is not None else "it reads no source")
            return
        if self._split_channels is not None:
            await self._between_items.wait()  # the parts of one batch go out before the barrier
            if reader.ended:
                self.spec.coordinator.decline.remote(self.spec.attempt, checkpoint_id, self.spec.task, "its input has ended")
                return
            self._reader_states[checkpoint_id] = reader.state()
            for channel in self._split_channels:
                channel.send_now(CheckpointBarrier(checkpoint_id))
            return
        self._reader_states[checkpoint_id] = reader.state()
        self._gate.file(0, CheckpointBarrier(checkpoint_id))

    async def checkpoints_done(self) -> int:
        """Snapshots this instance wrote and acknowledged."""
        return self._checkpoints_done

    async def arm_chaos(self, moment: str) -> bool:
        """End this actor's process when it reaches ``moment`` (see ``cluster.chaos.MOMENTS``);
        False if it never can (no async operator, no window, no checkpoints)."""
        has_async = bool(self._async_operators())
        reachable = {
            "snapshot": self.spec.checkpoints is not None,
            "queue_full": has_async, "retry_wait": has_async, "completion": has_async,
            "window_fire": any(op.fires_on_event_time for op in self._chain.operators),
        }
        if not reachable.get(moment, False):
            return False
        self._armed = moment
        self._task.watch_fault_points = True
        if self._chain_open:  # else the contexts, made at start(), arm the operators
            for op in self._chain.operators:
                op.context.fault_point = self._chaos_point
        return True

    def _async_operators(self) -> list[AsyncWaitOperator | AsyncBatchWaitOperator]:
        return [op for op in self._chain.operators if isinstance(op, (AsyncWaitOperator, AsyncBatchWaitOperator))]

    def _chaos_point(self, moment: str) -> None:
        if self._armed == moment:
            os._exit(1)  # a crash, as the chaos tool asked: no clean-up, no goodbye

    async def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.processor.executor(0).execute_if_open(
            self._chain.notify_checkpoint_complete, "checkpoint complete", checkpoint_id)

    async def abort_checkpoint(self, checkpoint_id: int) -> None:
        self._gate.drop_barriers(checkpoint_id)
        self._wake()  # a channel the barrier held may have input, and no push may come to wake the task
        self._forget_reader_states(up_to=checkpoint_id)
        self.processor.executor(0).execute_if_open(
            self._chain.notify_checkpoint_aborted, "checkpoint aborted", checkpoint_id)

    def _forget_reader_states(self, up_to: int) -> None:
        # A checkpoint taken or aborted ends the wait of every one up to it (k+1 subsumes k).
        self._reader_states = {k: v for k, v in self._reader_states.items() if k > up_to}

    def _snapshot(self, checkpoint_id: int, in_front: list[list[Any]]) -> None:
        """Take checkpoint ``checkpoint_id`` now, on the mailbox thread, whatever the operator
        waits for: the rows in hand and the input in front of the barriers are part of the state,
        and the barrier leaves ahead of the output still queued, which is part of it too."""
        self._output.flush()  # rows emitted so far belong before the barrier
        overtaken = self._outbox.put_barrier(checkpoint_id)
        reader_state = self._reader_states.get(checkpoint_id)
        self._forget_reader_states(up_to=checkpoint_id)
        state = {
            "chain": self._chain.snapshot_state(),
            **self._task.snapshot_state(),
            "input": in_front,
            "output": overtaken,
            "reader": reader_state,
            "side_outputs": self._side_outputs,
        }
        data = pickle.dumps(state, protocol=5)
        self._chaos_point("snapshot")
        staged = None if self._local_sink is None else self._local_sink.staged.pop(checkpoint_id, None)
        self._spawn(self._acknowledge(checkpoint_id, data, staged), f"writing checkpoint {checkpoint_id}")

    async def _acknowledge(self, checkpoint_id: int, data: bytes, staged: Any) -> None:
        spec = self.spec
        size = await asyncio.to_thread(spec.checkpoints.write_state, checkpoint_id, spec.task, data)
        if size is None:  # aborted meanwhile
            return
        if staged is not None:
            size += await staged
        self._checkpoints_done += 1
        spec.coordinator.acknowledge.remote(spec.attempt, checkpoint_id, spec.task, size)

    def _restore_actor_state(self, state: dict[str, Any]) -> None:
        self._task.restore_state(state)
        self._side_outputs = state["side_outputs"]
        for channel, items in enumerate(state["output"]):
            for item in items:
                self._outbox.put(channel, item)

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
            return self._figures()
        except BaseException:
            self._abort()
            raise
        finally:
            self._ticker.cancel()
            self._exporter.export(self._figures())

    def _abort(self) -> None:
        """The failure path: stop reading and sending, close the operators, cancel their tasks."""
        for task in list(self._background):
            task.cancel()
        self._outbox.cancel()
        if self._local_sink is not None:
            self._local_sink.end()  # the caller's stream of blocks ends; the job reports the error
        try:
            self._chain.close()  # user functions close; Ray-task functions cancel their tasks
        except Exception:  # noqa: BLE001 - the first error is the one the job reports
            pass

    def _wake(self) -> None:
        if self._backpressured_since is not None and not self._outbox.is_full():
            self._backpressured_ms += self._clock.now_ms() - self._backpressured_since
            self._backpressured_since = None
        self._task.wake()

    def _finished(self, controller: DefaultActionController) -> None:
        self._output.flush()
        controller.all_actions_completed()

    def _on_side(self, tag: str, values: list[Any]) -> None:
        self._side_outputs.setdefault(tag, []).extend(values)

    async def _tick(self) -> None:
        # Latency bound for slow streams, and live metrics: once per linger / once a second.
        executor = self.processor.executor(0)
        beats = 0
        while True:
            await asyncio.sleep(self.spec.linger_ms / 1000)
            executor.execute(self._flush_lingering, "flush output", deferrable=True)
            beats += 1
            if beats * self.spec.linger_ms >= 1000:
                beats = 0
                self._exporter.export(self._figures())

    def _flush_lingering(self) -> None:
        # Rows for a downstream actor leave within a linger. The last stage's rows only move into
        # its sink, where they wait for a block to fill anyway: while they keep coming they leave
        # in whole batches, and on the tick only once they stop (a stalled or slow stream).
        buffered = self._output.buffered
        if self._local_sink is None or buffered == self._buffered_at_tick:
            self._output.flush()
        self._buffered_at_tick = self._output.buffered

    def _figures(self) -> dict[str, Any]:
        in_flight = 0
        queue_depth = 0
        totals = {"records_out": self._output.records_out if hasattr(self, "_output") else 0,
                  "retries": 0, "timeouts": 0, "dead_letters": 0, "failures": 0,
                  "late_records_dropped": 0}
        for async_op in self._async_operators() if self._chain_open else ():  # queues come with open
            queue_depth += len(async_op.queue)
            in_flight += sum(1 for e in async_op.queue if not e.done)
        for op in self._chain.operators if self._chain_open else ():
            for k, v in dataclasses.asdict(op.metrics).items():
                if k in totals and k != "records_out":
                    totals[k] += v
        task = self._task
        wm = task.current_watermark
        now = self._clock.now_ms()
        backpressured = self._backpressured_ms + (
            0 if self._backpressured_since is None else now - self._backpressured_since)
        return {
            "name": self.name,
            "records_in": task.records_in,
            "batches_in": task.batches_in,
            "in_flight_requests": in_flight,
            "async_queue_depth": queue_depth,
            "input_queue_depth": len(self._gate),
            "mailbox_depth": self.processor.mailbox.size() if hasattr(self, "processor") else 0,
            "outbox_depth": self._outbox.pending if hasattr(self, "_outbox") else 0,
            "watermark_ms": None if wm in (MIN_TIMESTAMP, MAX_WATERMARK) else wm,
            # How far event time trails the wall clock (Flink's currentInputWatermark lag).
            "watermark_lag_ms": None if wm in (MIN_TIMESTAMP, MAX_WATERMARK) else now - wm,
            "backpressured_ms": backpressured,
            "last_watermark_ms": task.last_watermark,
            "restarts": self.spec.attempt,
            **self._cpu_figures(),
            **totals,
        }

    def _cpu_figures(self) -> dict[str, float | None]:
        """CPU time since start, in ms: the event loop's thread (the mailbox, the reader, ``async
        def`` user code) and the whole process (also Ray's own threads: calls in and out, the
        object store). Against the job's wall time they say whether an instance was busy, waited,
        or paid for Ray. Only right on the loop's thread, where every caller of _figures runs."""
        if self._cpu_at_start is None:
            return {"event_loop_cpu_ms": None, "process_cpu_ms": None}
        loop_s, process_s = self._cpu_at_start
        return {"event_loop_cpu_ms": round((time.thread_time() - loop_s) * 1000, 1),
                "process_cpu_ms": round((time.process_time() - process_s) * 1000, 1)}


class _ActorTaskHost:
    """The actor's side of its stream task (``operators.stream_task.TaskHost``), on the mailbox thread."""

    def __init__(self, actor: OperatorActor) -> None:
        self._actor = actor

    def output_is_full(self) -> bool:
        actor = self._actor
        if actor._outbox.is_full():
            if actor._backpressured_since is None:
                actor._backpressured_since = actor._clock.now_ms()  # downstream takes no more
            return True
        return False

    def rows_of(self, batch: Any) -> Rows:
        return list(table_to_rows(batch)), batch.origin_list()

    def whole_batch(self, batch: Any) -> tuple[pa.Table, pa.Array] | None:
        return None if batch.timestamps is None or is_bare(batch.table) else (batch.table, batch.timestamps)

    def snapshot(self, checkpoint_id: int, in_front: list[list[ChannelItem]]) -> None:
        self._actor._snapshot(checkpoint_id, in_front)

    def finished(self, controller: DefaultActionController) -> None:
        self._actor._finished(controller)

    def fault_point(self, moment: str) -> None:
        self._actor._chaos_point(moment)

    def emitted(self) -> int:
        output = self._actor._output
        return output.records_out + output.buffered
