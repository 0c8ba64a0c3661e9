"""The last stage's sink: whole output kept by default, or blocks that leave as they are produced."""

from __future__ import annotations

import asyncio

import pyarrow as pa

from actorflow.actors.arrow_rows import RowBatch
from actorflow.actors.output import LocalSink
from actorflow.operators.channel_items import Records


def _batch(start: int, n: int = 1_000) -> RowBatch:
    return RowBatch(pa.table({"user": list(range(start, start + n)), "pad": ["x" * 100] * n}), None)


def test_without_a_drain_the_sink_keeps_everything_for_table():
    async def run():
        sink = LocalSink()
        for i in range(20):
            await sink.send(Records(_batch(i * 1_000)))
        sink.end()
        return sink.table()

    table = asyncio.run(run())
    assert table.column("user").to_pylist() == list(range(20_000))


def test_drained_blocks_are_bounded_in_order_and_complete():
    async def run():
        block_bytes = 300_000  # about three batches
        sink = LocalSink(block_bytes=block_bytes, max_ready=2)
        blocks: list[pa.Table] = []
        held: list[int] = []

        async def produce():
            for i in range(100):
                await sink.send(Records(_batch(i * 1_000)))
                held.append(sum(t.nbytes for t in sink._ready) + sink._bytes)
            sink.end()

        async def consume():
            async for block in sink.drain():
                blocks.append(block)
                await asyncio.sleep(0.001)  # a slow caller: the producer must wait for it

        await asyncio.gather(consume(), produce())  # the drain starts first, as the job starts it
        return blocks, held, block_bytes, sink.table()

    blocks, held, block_bytes, left = asyncio.run(run())
    assert [u for b in blocks for u in b.column("user").to_pylist()] == list(range(100_000))
    assert len(blocks) > 10 and all(b.nbytes < 2 * block_bytes for b in blocks)
    # Each block leaves as one chunk per column, whatever number of batches filled it.
    assert {c.num_chunks for b in blocks for c in b.columns} == {1}
    # What the sink holds never exceeds the blocks it may keep waiting plus the one it fills.
    assert max(held) <= 4 * block_bytes
    assert left is None  # everything left through drain()


def test_a_drain_that_starts_late_gets_what_came_before_it_first():
    async def run():
        sink = LocalSink(block_bytes=1 << 30)
        await sink.send(Records(_batch(0)))
        out: list[int] = []

        async def consume():
            async for block in sink.drain():
                out.extend(block.column("user").to_pylist())

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.01)
        await sink.send(Records(_batch(1_000)))
        sink.end()
        await task
        return out

    assert asyncio.run(run()) == list(range(2_000))


def _through_batching_output(schema, steps):
    """Rows and tables collected in ``steps`` order, as the last stage's sink keeps them."""
    from actorflow.actors.output import BatchingOutput, Outbox, Partitioner
    from actorflow.operators.elements import Record

    async def run():
        sink = LocalSink()
        outbox = Outbox([sink], max_pending=100, on_room=lambda: None)
        output = BatchingOutput(outbox, Partitioner("forward", 1), batch_size=2, schema=schema, side=lambda t, v: None)
        for step in steps:
            if isinstance(step, dict):
                output.collect(Record(step, 7))
            else:
                output.collect_table(step, pa.array([9] * step.num_rows, pa.int64()))
        output.flush()
        await outbox.close()
        sink.end()
        return sink.table()

    return asyncio.run(run())


def test_a_collected_table_follows_the_rows_collected_before_it_with_the_types_rows_would_take():
    table = pa.table({"user": pa.array([1, 2, 3], pa.int32()), "avg": pa.array([0.5, None, 2.0], pa.float32())})
    steps = [{"user": 0, "avg": 1.5}, table, {"user": 4, "avg": None}]
    as_rows = _through_batching_output(None, [{"user": 0, "avg": 1.5}, *table.to_pylist(), {"user": 4, "avg": None}])
    got = _through_batching_output(None, steps)
    assert got.equals(as_rows) and got.column("user").to_pylist() == [0, 1, 2, 3, 4]
    assert got.schema.field("user").type == pa.int64() and got.schema.field("avg").type == pa.float64()


def test_a_collected_table_meets_an_exact_output_schema_row_by_row():
    schema = pa.schema([("user", pa.int16()), ("avg", pa.float64())])
    got = _through_batching_output(schema, [pa.table({"user": pa.array([1, 2], pa.int64()), "avg": [0.5, 1.0]})])
    assert got.schema == schema and got.column("user").to_pylist() == [1, 2]
