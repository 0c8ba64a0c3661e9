"""The output of an operator actor: rows buffered into Arrow batches, per downstream channel."""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, Callable

import pyarrow as pa

from actorflow.operators.channel_items import ChannelItem, PartialAggregates, Partitioning, Records
from actorflow.operators.elements import CheckpointBarrier, Record, Watermark, WatermarkStatus

from .arrow_rows import RowBatch, SchemaTracker, is_bare, rows_to_batch
from .channel import ChannelSender
from .keys import KeyRouter, as_router

__all__ = ["BatchingOutput", "LocalSink", "Outbox", "Partitioner", "PreAggregate", "partials_of", "pre_aggregator"]


#: A keyed window operator's ``pre_aggregate``: a batch's partial aggregates, or None.
PreAggregate = Callable[[pa.Table, pa.Array], "pa.Table | None"]


def pre_aggregator(head_factory: Callable[[], Any] | None) -> PreAggregate | None:
    """The ``pre_aggregate`` of the operator ``head_factory`` makes, or None: what a batch may
    become before a key split sends it to that operator's instances (a keyed window stage).
    None also where that operator never pre-aggregates (``pre_aggregates()`` says so)."""
    if head_factory is None:
        return None
    head = head_factory()
    function = getattr(head, "pre_aggregate", None)
    return function if function is not None and head.pre_aggregates() else None


def partials_of(pre_aggregate: PreAggregate | None, batch: RowBatch) -> pa.Table | None:
    """``batch``'s partial aggregates by ``pre_aggregate``, or None where its rows must go."""
    if pre_aggregate is None or batch.timestamps is None or is_bare(batch.table):
        return None
    return pre_aggregate(batch.table, batch.timestamps)


class Partitioner:
    """Which downstream channel a record goes to: forward, rebalance or hash by key."""

    def __init__(self, kind: Partitioning | str, num_targets: int, key: KeyRouter | Any = None) -> None:
        try:
            self.kind = kind = Partitioning(kind)
        except ValueError:
            raise ValueError(f"partitioning must be 'forward', 'rebalance' or 'hash', got {kind!r}") from None
        # A forward channel has exactly one target: the instance with the same index.
        self.num_targets = 1 if kind is Partitioning.FORWARD else num_targets
        self._router = as_router(key) if kind is Partitioning.HASH else None
        if kind is Partitioning.HASH and self._router is None:
            raise ValueError("hash partitioning needs a key, got None")
        self._round_robin = itertools.cycle(range(self.num_targets))

    def target(self, value: Any) -> int:
        if self.num_targets == 1:
            return 0
        if self._router is not None:  # hash partitioning (once per record: no enum read)
            # A stable hash: the same key goes to the same instance from every upstream actor.
            return self._router.target(value, self.num_targets)
        return 0  # rebalance picks per batch, see next_batch_target

    def next_batch_target(self) -> int:
        return next(self._round_robin)

    @property
    def router(self) -> KeyRouter | None:
        """The key's router, with hash partitioning."""
        return self._router

    def split(self, batch: RowBatch) -> list[RowBatch]:
        """``batch`` cut into one batch per target by key (hash partitioning only)."""
        assert self._router is not None
        return self._router.split(batch, self.num_targets)


class LocalSink:
    """The end of the last stage: keeps its batches in the actor instead of sending them on.

    It stands in for a ``ChannelSender`` in the ``Outbox``. By default it keeps the whole output
    until the job takes it with ``table()``, as the return value of an actor call, so that the
    caller owns it and it outlives the actor.

    Once ``drain()`` runs, the output leaves as it is produced instead: the rows are sealed into
    blocks of about ``block_bytes`` that ``drain()`` yields (from a streaming actor method, so
    that the caller owns each block), and ``send`` waits while ``max_ready`` sealed blocks wait
    for the caller. The actor's memory then no longer grows with the input.

    With ``stage`` (a checkpointed job's two-phase output), a checkpoint barrier cuts an epoch:
    the rows since the last barrier go to ``stage(epoch, table)`` in a worker thread, and
    ``staged[epoch]`` is the future the actor awaits before it acknowledges the checkpoint.
    """

    channel_id = 0

    def __init__(
        self, stage: Callable[[int, pa.Table | None], int] | None = None, *,
        block_bytes: int = 8 << 20, max_ready: int = 2,
    ) -> None:
        self._tables: list[pa.Table] = []
        self._bytes = 0
        self._schemas: list[pa.Schema] = []
        self._first: dict[str, Any] | None = None
        self._stage = stage
        self.staged: dict[int, "asyncio.Future[int]"] = {}
        self.sent = 0
        self._block_bytes, self._max_ready = block_bytes, max_ready
        self._ready: deque[pa.Table] = deque()
        self._draining = self._ended = False
        self._changed = asyncio.Event()  # a block was sealed, or the output ended
        self._room = asyncio.Event()  # the caller took a block

    async def send(self, item: ChannelItem) -> None:
        self.send_now(item)
        while self._draining and len(self._ready) > self._max_ready and not self._ended:
            self._room.clear()
            await self._room.wait()

    def send_now(self, item: ChannelItem) -> None:
        match item:
            case Records(batch=batch) if batch.num_rows:
                self._tables.append(batch.table)
                self._bytes += batch.table.nbytes
                if self._first is None:
                    self._first = batch.table.slice(0, 1).to_pylist()[0]
                if not self._schemas or batch.table.schema != self._schemas[-1]:
                    self._schemas.append(batch.table.schema)
                if self._draining and self._bytes >= self._block_bytes:
                    self._seal()
            case CheckpointBarrier(checkpoint_id=checkpoint_id):
                self.cut(checkpoint_id)
        self.sent += 1

    def _take(self) -> pa.Table | None:
        tables, self._tables, self._bytes = self._tables, [], 0
        return pa.concat_tables(tables, promote_options="permissive") if tables else None

    def _seal(self) -> None:
        table = self._take()
        if table is not None:
            # One chunk per column: Ray serialises an Arrow table chunk by chunk in Python, and a
            # block of a hundred batches took 3-10 times as long as the same block in one chunk.
            self._ready.append(table.combine_chunks())
            self._changed.set()

    def end(self) -> None:
        """No more output: ``drain()`` yields what is left, then returns."""
        self._ended = True
        self._changed.set()
        self._room.set()

    async def drain(self) -> AsyncIterator[pa.Table]:
        """The output as blocks, in order, as it is produced, until ``end()``."""
        self._draining = True
        self._seal()  # what came before the caller did
        while True:
            if self._ready:
                table = self._ready.popleft()
                self._room.set()
                yield table
            elif self._ended:
                self._seal()
                if self._ready:
                    yield self._ready.popleft()
                return
            else:
                self._changed.clear()
                await self._changed.wait()

    def cut(self, epoch: int) -> "asyncio.Future[int]":
        """Stage the rows since the last cut as ``epoch`` (with ``stage``); returns the future."""
        if self._stage is None:
            raise RuntimeError("this sink keeps its output in memory; it has no epochs to stage")
        table = self._take()
        future = asyncio.get_running_loop().run_in_executor(None, self._stage, epoch, table)
        self.staged[epoch] = future
        return future

    async def flush(self) -> None:
        return None

    def schema(self) -> pa.Schema | None:
        """The schema of the output; None if nothing came out."""
        if not self._schemas:
            return None
        return pa.unify_schemas(self._schemas, promote_options="permissive")

    def sample(self) -> dict[str, Any] | None:
        """The first output row, for error messages."""
        return self._first

    def table(self) -> pa.Table | None:
        """All the output kept here (none, once ``drain()`` ran and took it)."""
        tables = [*self._ready, *self._tables]
        if not tables:
            return None
        return pa.concat_tables(tables, promote_options="permissive")


class Outbox:
    """Items waiting to be sent, one queue and one sender task per channel.

    ``is_full`` tells the default action to stop taking input until the senders catch up.
    """

    def __init__(
        self,
        senders: list[ChannelSender | LocalSink],
        *,
        max_pending: int,
        on_room: Callable[[], None],
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._senders = senders
        self._queues: list[deque[ChannelItem]] = [deque() for _ in senders]
        self._wakeups = [asyncio.Event() for _ in senders]
        self._max_pending = max_pending
        self._on_room = on_room
        self._tasks = [asyncio.get_running_loop().create_task(self._pump(i)) for i in range(len(senders))]
        self._on_error = on_error
        for task in self._tasks:
            task.add_done_callback(self._pump_done)
        self._closed = False

    def _pump_done(self, task: "asyncio.Task[None]") -> None:
        # A sender that fails (its receiver died, a batch that cannot be sent) must fail the
        # job: otherwise the outbox stays full and the operator waits for room forever.
        if not task.cancelled() and task.exception() is not None and self._on_error is not None:
            self._on_error(task.exception())  # type: ignore[arg-type]

    def cancel(self) -> None:
        """Stop the senders without sending what is queued (the failure path)."""
        self._closed = True
        for task in self._tasks:
            task.cancel()

    @property
    def channels(self) -> int:
        """How many channels it sends on: the next stage's instances (or the one local sink)."""
        return len(self._senders)

    def put(self, channel: int, item: ChannelItem) -> None:
        self._queues[channel].append(item)
        self._wakeups[channel].set()

    def broadcast(self, item: ChannelItem) -> None:
        for channel in range(len(self._senders)):
            self.put(channel, item)

    def put_barrier(self, checkpoint_id: int) -> list[list[ChannelItem]]:
        """Send checkpoint ``checkpoint_id``'s barrier ahead of what is queued; return, per
        channel, the items it overtook.

        The checkpoint holds the overtaken items as in-flight output, to be sent again after a
        restore; downstream, they arrive after the barrier, outside the checkpoint. The barrier
        leaves at once, even in front of an item waiting for credit: that item has no number yet.
        """
        overtaken = []
        barrier = CheckpointBarrier(checkpoint_id)
        for queue, sender in zip(self._queues, self._senders):
            overtaken.append(list(queue))
            sender.send_now(barrier)
        return overtaken

    @property
    def pending(self) -> int:
        return sum(len(q) for q in self._queues)

    def is_full(self) -> bool:
        return self.pending >= self._max_pending

    async def close(self) -> None:
        """Send everything queued, wait for the acknowledgements, and stop the senders."""
        self._closed = True
        for event in self._wakeups:
            event.set()
        await asyncio.gather(*self._tasks)
        await asyncio.gather(*(s.flush() for s in self._senders))

    async def _pump(self, channel: int) -> None:
        queue, wake, sender = self._queues[channel], self._wakeups[channel], self._senders[channel]
        while True:
            while queue:
                await sender.send(queue[0])
                queue.popleft()
                if self.pending == self._max_pending - 1:
                    self._on_room()
            if self._closed:
                return
            wake.clear()
            if not queue:
                await wake.wait()


class BatchingOutput:
    """The chain's ``Output``: buffers records per target, cuts Arrow batches of ``batch_size``.

    Side outputs (dead letters) are buffered the same way and handed to ``side`` on a flush.
    With ``pre_aggregate`` (the next stage's keyed window operator's), a batch it can
    pre-aggregate leaves as ``("partials", (table, rows))``, a row per key and window.
    """

    def __init__(
        self,
        outbox: Outbox,
        partitioner: Partitioner,
        *,
        batch_size: int,
        schema: pa.Schema | None,
        side: Callable[[str, list[Any]], None],
        hint: pa.Schema | None = None,
        pre_aggregate: PreAggregate | None = None,
    ) -> None:
        self._outbox = outbox
        self._pre_aggregate = pre_aggregate
        self._partitioner = partitioner
        self._batch_size = batch_size
        self._schema = schema
        self._tracker = SchemaTracker(hint)
        self._side = side
        self._keyed = partitioner.kind is Partitioning.HASH and partitioner.num_targets > 1
        n = max(1, partitioner.num_targets)
        self._values: list[list[Any]] = [[] for _ in range(n)]
        self._timestamps: list[list[int | None]] = [[] for _ in range(n)]
        self._origins: list[list[Any]] = [[] for _ in range(n)]
        self._side_buffers: dict[str, list[Any]] = {}
        self.records_out = 0


    @property
    def partitioner(self) -> Partitioner:
        """Which channel each record goes to (a restore deals overtaken output anew with it)."""
        return self._partitioner
    def collect(self, record: Record) -> None:
        self.collect_value(record.value, record.timestamp_ms, record.origin)

    def collect_value(self, value: Any, timestamp_ms: int | None, origin: tuple[Any, ...] | None) -> None:
        # Only a hash partitioner picks a target per record; the others send batches.
        target = self._partitioner.target(value) if self._keyed else 0
        values = self._values[target]
        values.append(value)
        self._timestamps[target].append(timestamp_ms)
        self._origins[target].append(origin)
        if len(values) >= self._batch_size:
            self._flush_target(target)

    def collect_table(self, table: pa.Table, timestamps: pa.Array) -> None:
        """Collect the rows of ``table`` at once, each at its timestamp (int64 ms), after the rows
        collected before; the same batches as ``collect`` of each row as a dict would give."""
        if self._schema is not None:
            # An exact output schema is checked row by row, naming the row that does not fit.
            for value, ts in zip(table.to_pylist(), timestamps.to_pylist()):
                self.collect(Record(value, ts))
            return
        self.flush_records()
        table = self._tracker.table_of_arrow(table)
        for offset in range(0, table.num_rows, self._batch_size):
            batch = RowBatch(table.slice(offset, self._batch_size), timestamps.slice(offset, self._batch_size))
            self.records_out += batch.num_rows
            if self._partitioner.kind is Partitioning.HASH:
                for target, part in enumerate(self._partitioner.split(batch)):
                    if part.num_rows:
                        self._put(target, part)
            else:
                self._put(0, batch)

    def emit_watermark(self, watermark: Watermark) -> None:
        # Records before the watermark must leave before it, on every channel.
        self.flush()
        self._outbox.broadcast(watermark)

    def emit_watermark_status(self, status: WatermarkStatus) -> None:
        self.flush()
        self._outbox.broadcast(status)

    @property
    def buffered(self) -> int:
        """Records collected and not yet cut into a batch."""
        return sum(len(v) for v in self._values)

    def collect_side(self, tag: str, value: Any) -> None:
        self._side_buffers.setdefault(tag, []).append(value)

    def flush_records(self) -> None:
        """Cut the records collected so far into batches (side outputs stay buffered)."""
        for target in range(len(self._values)):
            if self._values[target]:
                self._flush_target(target)

    def flush(self) -> None:
        self.flush_records()
        for tag, values in self._side_buffers.items():
            if values:
                self._side(tag, values)
        self._side_buffers = {}

    def _flush_target(self, target: int) -> None:
        values, timestamps, origins = self._values[target], self._timestamps[target], self._origins[target]
        self._values[target], self._timestamps[target], self._origins[target] = [], [], []
        batch = rows_to_batch(values, timestamps, self._schema, self._tracker, origins)
        self.records_out += batch.num_rows
        self._put(target, batch)

    def _put(self, target: int, batch: RowBatch) -> None:
        # Rebalancing picks a channel per batch; otherwise the target is the channel.
        channel = self._partitioner.next_batch_target() if self._partitioner.kind is Partitioning.REBALANCE else target
        partials = partials_of(self._pre_aggregate, batch)
        if partials is not None:
            self._outbox.put(channel, PartialAggregates(partials, batch.num_rows))
        else:
            self._outbox.put(channel, Records(batch))
