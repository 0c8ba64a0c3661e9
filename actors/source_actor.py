"""Reading Arrow blocks from the object store into the pipeline.

``BlockReader`` turns blocks into channel items: batches of rows, watermarks, and the end. Its
position is ``(block, row)``: how many blocks it has finished and how many rows of the current
one it has handed on, so a restore can rewind to exactly where a checkpoint was taken. The first
stage's operator actors run a reader themselves when the source is chained into them (same
parallelism, forward), or when the first stage is keyed and has the source's parallelism: each
then routes its split by key, its own keys into its own input and the others' to them
(``route_items``). Otherwise a ``SourceActor`` runs the reader and sends over channels.
"""

from __future__ import annotations

import asyncio
import datetime
import pickle
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from actorflow.operators.clock import SystemClock
from actorflow.operators.channel_items import END_OF_INPUT, ChannelItem, PartialAggregates, Records
from actorflow.operators.elements import CheckpointBarrier, Watermark, WatermarkStatus
from actorflow.operators.errors import SchemaError
from actorflow.operators.watermarks import BoundedOutOfOrdernessWatermarks, WatermarksWithIdleness

from .arrow_rows import RowBatch, is_bare
from .channel import ChannelSender
from .heap import for_whole_batches
from .keys import KeyRouter, as_router
from .naming import instance_name, task_name
from .output import PreAggregate, partials_of, pre_aggregator
from .store_pages import process_pages

__all__ = ["BlockReader", "EPOCH_END", "EpochReader", "LocalChannel", "epoch_reader", "MaxTimestampRow", "SourceActor", "event_time_ms", "route_items"]


def event_time_ms(table: pa.Table, column: str) -> pa.Array:
    """The event-time column as int64 milliseconds; nulls are an error that says how many.

    Event time is in milliseconds: finer digits of a timestamp (Spark's microseconds) are
    truncated, toward the earlier millisecond.
    """
    if column not in table.column_names:
        raise SchemaError(f"event-time column {column!r} not found; the table has {table.column_names}")
    col = table.column(column)
    if col.null_count:
        raise SchemaError(
            f"column {column!r} holds nulls in {col.null_count} rows; event time needs a timestamp on every record"
        )
    if pa.types.is_timestamp(col.type):
        col = pc.cast(pc.cast(col, pa.timestamp("ms", tz=col.type.tz), safe=False), pa.int64())
    elif pa.types.is_date(col.type):
        col = pc.cast(pc.cast(col, pa.timestamp("ms")), pa.int64())
    elif pa.types.is_integer(col.type):
        col = pc.cast(col, pa.int64())
    else:
        raise SchemaError(
            f"event-time column {column!r} must be a timestamp, date or integer of milliseconds, got {col.type}"
        )
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


@dataclass
class MaxTimestampRow:
    """The row with the largest event time a reader has read: its watermark derives from it.

    ``row`` counts the split's rows from 0 (with one split and no ``key_by``, the input's row, in
    the order ``df.collect()`` gives). The row itself stays a one-row slice of its block until
    ``settle`` turns it into a short text of its values: once the reader leaves the block, or a
    checkpoint or the figures ask for it, so that the hot path converts nothing, and the slice
    keeps no block alive after the reader has left it.
    """

    timestamp_ms: int
    split: int
    row: int
    rows: pa.Table | None
    values: str | None = None

    def settle(self) -> None:
        if self.rows is not None:
            # Times as they read (9999-12-31 00:00:00+00:00), the rest as Python writes it.
            row = self.rows.to_pylist()[0]
            text = "{" + ", ".join(f"{k!r}: {v if isinstance(v, (datetime.date, datetime.time)) else repr(v)}"
                                   for k, v in row.items()) + "}"
            self.values = text if len(text) <= 160 else text[:157] + "..."
            self.rows = None

    def figures(self, out_of_orderness_ms: int) -> dict[str, Any]:
        """What the instance's figures say of it: ``max_timestamp_record``."""
        self.settle()
        return {"timestamp_ms": self.timestamp_ms, "watermark_ms": self.timestamp_ms - out_of_orderness_ms - 1,
                "split": self.split, "row": self.row, "values": self.values}


class BlockReader:
    """Blocks, in order, as ``Records`` items of ``batch_size`` rows, with watermarks
    trailing the largest event time by ``out_of_orderness_ms``, then ``EndOfInput``. The end
    of all inputs ends event time (the operator actor emits the final watermark).

    ``blocks`` holds ``ObjectRef``s (or tables) of whole blocks, or ``(block, offset, length)``
    pieces of them. With ``idleness_ms``, a reader that waits that long for its next block says
    it is idle (``WatermarkStatus(idle=True)``), so that it holds back no one's watermark; its next
    records make it active again (``WatermarkStatus(idle=False)`` before them). Waiting for room downstream
    (backpressure) never makes a reader idle.
    """

    def __init__(
        self,
        blocks: list[Any],
        *,
        batch_size: int = 2048,
        timestamp_column: str | None = None,
        out_of_orderness_ms: int = 0,
        idleness_ms: int | None = None,
        split: int = 0,
    ) -> None:
        self._blocks = blocks
        self._split = split
        self._batch_size = batch_size
        self._timestamp_column = timestamp_column
        self._out_of_orderness_ms = out_of_orderness_ms
        self._idleness_ms = idleness_ms
        self.position = (0, 0)
        self.rows_read = 0
        self.ended = False
        self._watermarks: Any = None

    @property
    def batch_size(self) -> int:
        return self._batch_size

    def state(self) -> dict[str, Any]:
        """Where the reader is, for a checkpoint, as plain data: the position, the rows read, and
        its watermarks (the largest event time seen, the last watermark emitted, and the row of
        that event time as ``(timestamp_ms, split, row, values)``). Idleness starts afresh."""
        watermarks = None
        if self._watermarks is not None:
            bounded = getattr(self._watermarks, "watermarks", self._watermarks)
            self._settle_max_row()
            row = bounded.max_record
            watermarks = {**bounded.snapshot_state(), "max_record": (
                (row.timestamp_ms, row.split, row.row, row.values) if isinstance(row, MaxTimestampRow) else None)}
        return {"position": self.position, "rows_read": self.rows_read, "watermarks": watermarks}

    def max_timestamp_record(self) -> dict[str, Any] | None:
        """The row with the largest event time read so far (``MaxTimestampRow.figures``), or None."""
        row = getattr(self._watermarks, "max_record", None)
        return row.figures(self._out_of_orderness_ms) if isinstance(row, MaxTimestampRow) else None

    def _settle_max_row(self) -> None:
        row = getattr(self._watermarks, "max_record", None)
        if isinstance(row, MaxTimestampRow):
            row.settle()

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; call it before ``items()``."""
        self.position = tuple(state["position"])
        self.rows_read = state["rows_read"]
        watermarks = state["watermarks"]
        if isinstance(watermarks, dict):
            self._watermarks = self._generator()
            bounded = getattr(self._watermarks, "watermarks", self._watermarks)
            bounded.restore_state(watermarks)
            row = watermarks["max_record"]
            bounded.max_record = None if row is None else MaxTimestampRow(row[0], row[1], row[2], None, row[3])
        else:  # None, or the generator object itself (state formats 1 and 2)
            self._watermarks = watermarks

    def _generator(self) -> Any:
        generator: Any = BoundedOutOfOrdernessWatermarks(self._out_of_orderness_ms)
        if self._idleness_ms is not None:
            generator = WatermarksWithIdleness(generator, self._idleness_ms, SystemClock())
        return generator

    async def items(self) -> AsyncIterator[ChannelItem]:
        """The items; the position moves once the consumer asks for the next one."""
        event_time = self._timestamp_column
        if self._watermarks is None:
            self._watermarks = self._generator()
        watermarks = self._watermarks
        # The generator that keeps the largest timestamp, inside the idleness wrapper if any.
        bounded = getattr(watermarks, "watermarks", watermarks)
        start_piece, start_rows = self.position
        tick_s = None if self._idleness_ms is None else min(self._idleness_ms, 100) / 1000
        last_ref: Any = None
        whole: RowBatch | None = None
        whole_bytes = 0
        async for next_piece in self._pieces(start_piece, watermarks, tick_s):
            if not isinstance(next_piece, tuple):  # a status or watermark while the next piece is awaited
                yield next_piece
                continue
            piece_index, piece = next_piece
            ref, first, length = piece if isinstance(piece, tuple) else (piece, 0, None)
            skip = start_rows if piece_index == start_piece else 0
            if whole is None or ref is not last_ref:
                if isinstance(ref, pa.Table):
                    table = ref
                else:
                    future = asyncio.ensure_future(ref)
                    while tick_s is not None:
                        done, _ = await asyncio.wait({future}, timeout=tick_s)
                        if done:
                            break
                        for element in watermarks.on_periodic_emit():  # idle after idleness_ms
                            yield element
                    table = await future
                if not isinstance(table, pa.Table):  # a pandas block
                    table = pa.Table.from_pandas(table, preserve_index=False)
                self._settle_max_row()  # its slice must not keep the block it leaves alive
                whole = RowBatch(table, event_time_ms(table, event_time) if event_time is not None else None)
                whole_bytes = table.nbytes
                last_ref = ref
            stop = whole.num_rows if length is None else min(whole.num_rows, first + length)
            for offset in range(first + skip, stop, self._batch_size):
                batch = whole.slice(offset, min(self._batch_size, stop - offset))._replace(
                    origins=(self._split, piece_index, offset - first))
                after: list[Any] = []
                if batch.timestamps is not None and batch.num_rows:
                    top = pc.max(batch.timestamps).as_py()
                    row = None
                    if bounded.max_timestamp_ms is None or top > bounded.max_timestamp_ms:
                        # The batch moves event time on: keep the row that does (a vectorised
                        # search, once per batch), so that late records can name it.
                        i = pc.index(batch.timestamps, top).as_py()
                        row = MaxTimestampRow(top, self._split, self.rows_read + i, batch.table.slice(i, 1))
                    watermarks.on_event(top, row)  # idleness counts every batch as activity
                    for element in watermarks.on_periodic_emit():
                        # Back from idleness before the records; a watermark only after them,
                        # or it would make them late.
                        if isinstance(element, WatermarkStatus):
                            yield element
                        else:
                            after.append(element)
                yield Records(batch)
                self.rows_read += batch.num_rows
                self.position = (piece_index, offset - first + batch.num_rows)
                for element in after:
                    yield element
            self.position = (piece_index + 1, 0)
            # Its pages in the store were read: count them (see store_pages).
            process_pages.passed(whole_bytes * max(0, stop - first - skip) // max(1, whole.num_rows))
            await asyncio.sleep(0)
        # No final watermark here: a split that ends holds nothing back, but must not carry event
        # time to its end while another split is idle; the receiver does that when all inputs end.
        self.ended = True
        yield END_OF_INPUT

    async def _pieces(self, start: int, watermarks: Any, tick_s: float | None) -> AsyncIterator[Any]:
        """``(index, piece)`` from piece ``start`` on; a bounded input has them all at once."""
        for index in range(start, len(self._blocks)):
            yield index, self._blocks[index]


class _EpochEnd:
    """Not a channel item: an ``EpochReader`` has handed over every item fed so far and waits.
    A consumer that holds items back (batches to pre-aggregate together) sends them now, so that a
    checkpoint after the epoch does not wait for the next one; others skip it."""

    def __repr__(self) -> str:
        return "EPOCH_END"


EPOCH_END = _EpochEnd()


class EpochReader(BlockReader):
    """An unbounded split: its pieces arrive an epoch at a time (``feed``), as a streaming
    query's micro-batches do, and it waits for the next epoch after each, for as long as the job
    runs. ``finish`` ends it after the epochs fed (an end of input, which drains the job).

    While it waits it is *caught up*: every item of the epochs fed has been taken, so a barrier
    put in now follows the last epoch's rows exactly (``caught_up``). Its state says which epoch
    it had read in full (``epoch``); a restore resumes after it, and the epochs that follow are
    fed again. Pieces are dropped once read, so the reader holds only those still to read. With
    ``idleness_ms``, a reader that waits that long for an epoch goes idle, as a bounded one
    that waits for a block does.
    """

    def __init__(self, **options: Any) -> None:
        super().__init__([], **options)
        self.epoch: int | None = None  # the last epoch fed and read in full
        self._first = 0  # the index of self._blocks[0] among all the pieces fed
        self._epoch_ends: list[tuple[int, int]] = []  # (epoch, index after its last piece)
        self._finished = False
        self._arrived: asyncio.Event | None = None  # made on the loop that reads

    def state(self) -> dict[str, Any]:
        return {**super().state(), "epoch": self._read_epoch()}

    def restore(self, state: dict[str, Any]) -> None:
        super().restore(state)
        self._first, self.epoch = self.position[0], state.get("epoch")
        if self.position[1] != 0:
            raise ValueError(f"an epoch reader resumes between epochs, not at row {self.position[1]} of a piece")

    def feed(self, epoch: int, pieces: list[Any]) -> None:
        """Add ``epoch``'s pieces (blocks, or ``(block, offset, length)``) after those fed so far."""
        if self._finished:
            raise ValueError(f"epoch {epoch} came after the end of the input")
        last = self._epoch_ends[-1][0] if self._epoch_ends else self.epoch
        if last is not None and epoch <= last:
            raise ValueError(f"epoch {epoch} came after epoch {last}; epochs are fed in increasing order")
        self._blocks.extend(pieces)
        self._epoch_ends.append((epoch, self._first + len(self._blocks)))
        self._signal()

    def finish(self) -> None:
        """End the input after the epochs fed."""
        self._finished = True
        self._signal()

    def caught_up(self) -> bool:
        """Whether every item of the epochs fed has been taken."""
        return self.position[0] >= self._first + len(self._blocks) and self.position[1] == 0

    async def wait_caught_up(self) -> None:
        while not self.caught_up():
            await asyncio.sleep(0.002)
        self.epoch = self._read_epoch()

    def _read_epoch(self) -> int | None:
        done = [epoch for epoch, end in self._epoch_ends if end <= self.position[0]]
        return done[-1] if done else self.epoch

    def _signal(self) -> None:
        if self._arrived is not None:
            self._arrived.set()

    async def _pieces(self, start: int, watermarks: Any, tick_s: float | None) -> AsyncIterator[Any]:
        if self._arrived is None:
            self._arrived = asyncio.Event()
        index = max(start, self._first)
        said = False
        while True:
            while index >= self._first + len(self._blocks):
                if self._finished:
                    return
                if not said:  # what the consumer holds back goes out before the reader waits
                    said = True
                    yield EPOCH_END
                    continue
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), tick_s)
                except TimeoutError:
                    for element in watermarks.on_periodic_emit():  # idle after idleness_ms
                        yield element
            said = False
            yield index, self._blocks[index - self._first]
            index += 1
            # What was read goes: a long stream must not keep every block it ever read.
            del self._blocks[: index - self._first]
            self._first = index
            self.epoch = self._read_epoch()
            self._epoch_ends = [(epoch, end) for epoch, end in self._epoch_ends if end > index]


class LocalChannel:
    """A channel into this actor's own input gate, for a reader that routes some items to itself."""

    def __init__(self, gate: Any, channel_id: int) -> None:
        self._gate, self.channel_id = gate, channel_id

    async def send(self, item: ChannelItem) -> None:
        # Room first, then the item goes in at once, as the chained reader files them.
        await self._gate.room(self.channel_id)
        self._gate.file(self.channel_id, item)

    def send_now(self, item: ChannelItem) -> None:
        self._gate.file(self.channel_id, item)

    async def flush(self) -> None:
        return None


async def route_items(
    reader: BlockReader, senders: list[Any], router: KeyRouter | None, between_items: asyncio.Event,
    pre_aggregate: PreAggregate | None = None,
) -> None:
    """Send ``reader``'s items over ``senders``: batches round-robin, or by key with ``router``;
    watermarks, statuses and the end to all of them. ``between_items`` is clear while the parts of
    one item go out, so that a checkpoint barrier only ever comes between two items.

    With ``pre_aggregate`` (the receiving window operator's), a batch it can pre-aggregate goes
    as ``PartialAggregates`` items, a row per key and window, split by key. A
    reader's batch ends where a piece of its input ends: consecutive batches of small pieces
    (blocks of fewer than ``batch_size`` rows) are pre-aggregated together, up to ``batch_size``
    rows, and the last watermark among them follows their partials, as if the pieces were one.
    The window stage's work is per batch, and its cost per row falls as batches grow. Until
    those partials leave, ``between_items`` stays clear: a checkpoint's position never passes
    rows that have not gone out."""
    turn = 0
    held = _HeldBatches(reader.batch_size) if router is not None and pre_aggregate is not None else None
    async for item in reader.items():
        if item is EPOCH_END:
            if held is not None and held.items:
                await _send_held(held, senders, router, pre_aggregate)
            between_items.set()
            continue
        if isinstance(item, Records) and router is None:
            # A barrier may overtake a batch that waits for credit: it has no number yet.
            await senders[turn].send(item)
            turn = (turn + 1) % len(senders)
            continue
        between_items.clear()
        if held is not None:
            if held.take(item):
                continue
            await _send_held(held, senders, router, pre_aggregate)
            if held.take(item):
                continue
        if isinstance(item, Records):
            assert router is not None
            await _send_batch(item.batch, senders, router, pre_aggregate)
        else:
            for sender in senders:
                await sender.send(item)
        between_items.set()
    for sender in senders:
        await sender.flush()


class _HeldBatches:
    """Consecutive items of a reader, batches and the watermarks between them, waiting for their
    batches to be pre-aggregated together."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.items: list[ChannelItem] = []
        self.rows = 0

    def take(self, item: ChannelItem) -> bool:
        """Hold the item if it may join those held: a batch shorter than ``batch_size`` (cut where
        its piece ended) with event time, of plain columns and the same schema, while they stay
        within ``batch_size`` rows; or a watermark after one. False if the held ones must go
        first, or the item need not wait: a whole batch is never held, so between whole batches
        a checkpoint is not kept waiting."""
        match item:
            case Watermark():
                if not self.items:
                    return False
            case Records(batch=batch) if not (
                    batch.timestamps is None or is_bare(batch.table) or batch.num_rows >= self.batch_size
                    or self.rows + batch.num_rows > self.batch_size):
                first = self.items[0] if self.items else None
                if isinstance(first, Records) and batch.table.schema != first.batch.table.schema:
                    return False
                self.rows += batch.num_rows
            case _:
                return False
        self.items.append(item)
        return True

    def release(self) -> list[ChannelItem]:
        items, self.items, self.rows = self.items, [], 0
        return items


async def _send_held(
    held: _HeldBatches, senders: list[Any], router: KeyRouter | None, pre_aggregate: PreAggregate | None,
) -> None:
    items = held.release()
    batches = [item.batch for item in items if isinstance(item, Records)]
    if len(batches) > 1:
        whole = RowBatch(pa.concat_tables([b.table for b in batches]),
                         pa.concat_arrays([b.timestamps for b in batches]))
        partials = partials_of(pre_aggregate, whole)
        if partials is not None:
            await _send_partials(partials, whole.num_rows, senders, router)
            # Watermarks never go back: the last one says all the others did.
            watermarks: list[ChannelItem] = [item for item in items if isinstance(item, Watermark)]
            items = watermarks[-1:]
    # Else the items as they came: rows the operator must see one by one (with their origins),
    # each batch before the watermark that followed it.
    for item in items:
        if isinstance(item, Records):
            await _send_batch(item.batch, senders, router, pre_aggregate)
        else:
            for sender in senders:
                await sender.send(item)


async def _send_batch(batch: RowBatch, senders: list[Any], router: Any, pre_aggregate: PreAggregate | None) -> None:
    partials = partials_of(pre_aggregate, batch)
    if partials is not None:
        await _send_partials(partials, batch.num_rows, senders, router)
        return
    for sender, part in zip(senders, router.split(batch, len(senders))):
        if part.num_rows:
            await sender.send(Records(part))


async def _send_partials(partials: pa.Table, rows: int, senders: list[Any], router: Any) -> None:
    for sender, part in zip(senders, router.split(RowBatch(partials, None), len(senders))):
        if part.num_rows:
            await sender.send(PartialAggregates(part.table, rows))


class SourceActor:
    """Runs a ``BlockReader`` and sends its items over channels to the first stage.

    With ``checkpoints`` (a checkpointed job), ``trigger_checkpoint(id)`` sends the barrier on
    every channel between two items, ahead of any batch still waiting for credit, and stores the
    reader's position at that point; ``restore`` (a state from such a checkpoint) starts the
    reader there.

    The reader comes with ``connect``: the actor's process starts while the input is still being
    snapshotted, and only then are its splits known.
    """

    def __init__(
        self, job: str, name: str, index: int, parallelism: int, *, credits: int = 4,
        key: KeyRouter | Any = None, checkpoints: Any = None, coordinator: Any = None, attempt: int = 0,
        restore: int | None = None, head: Callable[[], Any] | None = None,
    ) -> None:
        if head is not None:
            for_whole_batches()  # it may pre-aggregate whole batches for a keyed window stage
        self.name = instance_name(job, name, index, parallelism, attempt)
        self.task = task_name(name, index, parallelism)
        self._reader: BlockReader | None = None
        self._credits = credits
        self._router = as_router(key)
        self._head = head  # the factory of the next stage's head operator, when it is keyed
        self._checkpoints = checkpoints
        self._coordinator = coordinator
        self._attempt = attempt
        self._restore = restore
        self._between_items = asyncio.Event()
        self._between_items.set()

    def __repr__(self) -> str:
        # Ray names the actor with it even when the constructor never ran: its arguments
        # could not be unpickled in this worker, and that error is the one to report.
        return getattr(self, "name", type(self).__name__)

    async def progress(self) -> int:
        return 0 if self._reader is None else self._reader.rows_read

    async def connect(self, downstream: list[Any], channel_id: int, reader: BlockReader) -> None:
        self._reader = reader
        self._senders = [ChannelSender(h, channel_id, credits=self._credits) for h in downstream]
        if self._restore is not None:
            state = pickle.loads(await asyncio.to_thread(self._checkpoints.read_state, self._restore, self.task))
            reader.restore(state["reader"])

    def _connected_reader(self) -> BlockReader:
        assert self._reader is not None, f"{self.name}: connect() first"
        return self._reader

    async def trigger_checkpoint(self, checkpoint_id: int) -> None:
        reader = self._connected_reader()
        if isinstance(reader, EpochReader):
            await reader.wait_caught_up()  # the barrier follows the epochs fed, whole
        await self._between_items.wait()
        if reader.ended:
            self._coordinator.decline.remote(self._attempt, checkpoint_id, self.task, "its input has ended")
            return
        state = pickle.dumps({"reader": reader.state()}, protocol=5)
        for sender in self._senders:
            sender.send_now(CheckpointBarrier(checkpoint_id))
        size = await asyncio.to_thread(self._checkpoints.write_state, checkpoint_id, self.task, state)
        if size is not None:  # else aborted meanwhile
            self._coordinator.acknowledge.remote(self._attempt, checkpoint_id, self.task, size)

    async def feed_epoch(self, epoch: int, pieces: list[Any]) -> None:
        """An unbounded input's next epoch (``EpochReader.feed``)."""
        epoch_reader(self._connected_reader(), self.name).feed(epoch, pieces)

    async def finish_input(self) -> None:
        """End an unbounded input after the epochs fed: the job drains."""
        epoch_reader(self._connected_reader(), self.name).finish()

    async def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        return None

    async def abort_checkpoint(self, checkpoint_id: int) -> None:
        return None

    async def run(self) -> dict[str, Any]:
        """Batches go round-robin over the targets, or by key with ``key``; watermarks, statuses
        and the end go to all of them."""
        reader = self._connected_reader()
        await route_items(reader, self._senders, self._router, self._between_items, pre_aggregator(self._head))
        return {"name": self.name, "rows_sent": reader.rows_read, "max_timestamp_record": reader.max_timestamp_record()}


def epoch_reader(reader: BlockReader | None, name: str) -> EpochReader:
    if not isinstance(reader, EpochReader):
        raise ValueError(f"{name}: its input is bounded (or it reads none); only an unbounded one takes epochs")
    return reader
