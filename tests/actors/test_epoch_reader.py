"""An unbounded split reads its epochs as they are fed, waits between them (idle after
``idleness_ms``), is caught up once every item fed is taken, and resumes after the epoch its
checkpoint had read in full."""

from __future__ import annotations

import asyncio
import pickle

import pyarrow as pa
import pytest

from actorflow.actors.source_actor import EPOCH_END, EpochReader
from actorflow.operators.channel_items import END_OF_INPUT, Records
from actorflow.operators.elements import Watermark, WatermarkStatus


def _rows(first: int, count: int) -> pa.Table:
    return pa.table({"id": pa.array(range(first, first + count), pa.int64()),
                     "ts": pa.array(range(first * 10, (first + count) * 10, 10), pa.int64())})


async def _take(items, until) -> list:
    taken = []
    while True:
        item = await asyncio.wait_for(items.__anext__(), 2)
        taken.append(item)
        if until(item):
            return taken


async def _next(items):
    """The next item that is not the reader's word that it has handed over all it was fed."""
    item = await items.__anext__()
    return await items.__anext__() if item is EPOCH_END else item


def _ids(items: list) -> list[int]:
    return [i for item in items if isinstance(item, Records) for i in item.batch.table.column("id").to_pylist()]


def test_epochs_are_read_as_they_come_and_the_reader_waits_caught_up_between_them():
    async def run():
        reader = EpochReader(batch_size=4, timestamp_column="ts")
        items = reader.items()
        reader.feed(0, [_rows(0, 6), (_rows(6, 10), 2, 3)])
        first = await _take(items, lambda item: isinstance(item, Watermark) and item.timestamp_ms == 99)
        pending = asyncio.ensure_future(_next(items))  # the consumer asks: the reader waits
        await asyncio.sleep(0.05)
        assert not pending.done() and reader.caught_up()
        await reader.wait_caught_up()
        assert reader.epoch == 0 and reader.state()["epoch"] == 0 and reader.state()["position"] == (2, 0)
        reader.feed(1, [])  # a micro-batch without rows is an epoch too
        await reader.wait_caught_up()
        assert reader.epoch == 1
        reader.feed(2, [_rows(100, 3)])
        assert not reader.caught_up()
        second = [await pending, *await _take(items, lambda item: isinstance(item, Watermark))]
        reader.finish()
        assert await asyncio.wait_for(_next(items), 2) is END_OF_INPUT
        await reader.wait_caught_up()
        return first, second, reader

    first, second, reader = asyncio.run(run())
    assert _ids(first) == [0, 1, 2, 3, 4, 5, 8, 9, 10] and _ids(second) == [100, 101, 102]
    assert second[-1] == Watermark(1019) and reader.epoch == 2 and reader.ended
    assert reader._blocks == []  # nothing read is kept


def test_a_restored_reader_goes_on_after_the_epoch_its_state_had_read():
    async def run():
        reader = EpochReader(batch_size=100, timestamp_column="ts")
        items = reader.items()
        reader.feed(3, [_rows(0, 5)])
        reader.feed(4, [_rows(5, 5)])
        await _take(items, lambda item: isinstance(item, Watermark) and item.timestamp_ms == 89)
        pending = asyncio.ensure_future(_next(items))
        await reader.wait_caught_up()
        state = pickle.loads(pickle.dumps(reader.state()))
        pending.cancel()

        again = EpochReader(batch_size=100, timestamp_column="ts")
        again.restore(state)
        assert again.epoch == 4
        with pytest.raises(ValueError, match="epoch 4 came after epoch 4"):
            again.feed(4, [_rows(5, 5)])
        again.feed(5, [_rows(10, 2)])
        return await _take(again.items(), lambda item: isinstance(item, Watermark))

    items = asyncio.run(run())
    # The watermark goes on from where the state left it: the restored rows come first, then it moves.
    assert _ids(items) == [10, 11] and items[-1] == Watermark(109)


def test_a_reader_that_waits_for_its_next_epoch_goes_idle_and_comes_back():
    async def run():
        reader = EpochReader(batch_size=100, timestamp_column="ts", idleness_ms=30)
        items = reader.items()
        reader.feed(0, [_rows(0, 2)])
        seen = await _take(items, lambda item: isinstance(item, WatermarkStatus))
        reader.feed(1, [_rows(2, 2)])
        seen += await _take(items, lambda item: isinstance(item, Records))
        return seen

    seen = asyncio.run(run())
    assert WatermarkStatus(idle=True) in seen
    assert seen[-2:] == [WatermarkStatus(idle=False), seen[-1]] and _ids(seen[-1:]) == [2, 3]


def test_an_epoch_after_the_end_or_out_of_order_is_refused():
    reader = EpochReader()
    reader.feed(2, [])
    with pytest.raises(ValueError, match="epoch 1 came after epoch 2"):
        reader.feed(1, [])
    reader.finish()
    with pytest.raises(ValueError, match="after the end of the input"):
        reader.feed(3, [])
