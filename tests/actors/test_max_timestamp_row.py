"""A source split names the row with its largest event time (what its watermark derives from):
its place in the split and its values, found once per batch, kept across a checkpoint."""

from __future__ import annotations

import asyncio
import datetime as dt
import pickle

import pyarrow as pa

from actorflow.actors.source_actor import BlockReader
from actorflow.operators.channel_items import Records
from actorflow.operators.elements import Watermark
from actorflow.operators.state import is_plain

BASE_MS = 1_760_000_000_000
YEAR_9999_MS = 253_402_214_400_000  # 9999-12-31T00:00:00Z


def _clicks(first_id: int, times_ms: list[int]) -> pa.Table:
    return pa.table({
        "click_id": pa.array(range(first_id, first_id + len(times_ms)), pa.int64()),
        "ts": pa.array([dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc) for ms in times_ms], pa.timestamp("us", tz="UTC")),
    })


def _read(reader: BlockReader, stop_after: int | None = None) -> list:
    async def run() -> list:
        items = []
        async for item in reader.items():
            items.append(item)
            if stop_after is not None and sum(i.batch.num_rows for i in items if isinstance(i, Records)) >= stop_after:
                break
        return items

    return asyncio.run(run())


def _blocks_with_absurd_rows() -> list[pa.Table]:
    # 2,000 clicks a second apart in two blocks; rows 717, 1,300 and 1,301 are dated 9999-12-31.
    times = [BASE_MS + i * 1_000 for i in range(2_000)]
    for i in (717, 1_300, 1_301):
        times[i] = YEAR_9999_MS
    return [_clicks(0, times[:1_000]), _clicks(1_000, times[1_000:])]


def test_the_split_names_the_first_row_with_its_largest_event_time():
    reader = BlockReader(_blocks_with_absurd_rows(), batch_size=256, timestamp_column="ts", out_of_orderness_ms=5_000,
                         split=3)
    _read(reader)
    assert reader.max_timestamp_record() == {
        "timestamp_ms": YEAR_9999_MS, "watermark_ms": YEAR_9999_MS - 5_001, "split": 3, "row": 717,
        "values": "{'click_id': 717, 'ts': 9999-12-31 00:00:00+00:00}",
    }


def test_in_time_order_it_is_the_last_row_read():
    reader = BlockReader([_clicks(0, [BASE_MS + i for i in range(1_000)])], batch_size=100, timestamp_column="ts")
    _read(reader)
    record = reader.max_timestamp_record()
    assert (record["row"], record["timestamp_ms"], record["watermark_ms"]) == (999, BASE_MS + 999, BASE_MS + 998)


def test_without_event_time_there_is_no_row_to_name():
    reader = BlockReader([_clicks(0, [BASE_MS])], batch_size=100)
    _read(reader)
    assert reader.max_timestamp_record() is None


def test_a_checkpoint_keeps_the_row_and_a_restored_reader_goes_on_from_it():
    blocks = _blocks_with_absurd_rows()
    first = BlockReader(blocks, batch_size=256, timestamp_column="ts", split=0)
    _read(first, stop_after=768)  # past row 717, within the first block
    state = first.state()
    assert is_plain(state) is None  # as a checkpoint stores it: the row's values, no block, no class of ours
    assert state["watermarks"]["max_record"][:3] == (YEAR_9999_MS, 0, 717)
    again = BlockReader(blocks, batch_size=256, timestamp_column="ts", split=0)
    again.restore(pickle.loads(pickle.dumps(state)))
    items = _read(again)
    assert again.max_timestamp_record()["row"] == 717
    assert "'click_id': 717" in again.max_timestamp_record()["values"]
    # The watermark it had emitted is not emitted again, nor one behind it.
    assert not any(isinstance(i, Watermark) and i.timestamp_ms <= YEAR_9999_MS - 1 for i in items)


def test_a_reader_state_of_formats_1_and_2_holding_the_generator_restores():
    blocks = _blocks_with_absurd_rows()
    first = BlockReader(blocks, batch_size=256, timestamp_column="ts", split=0)
    _read(first, stop_after=768)
    first._settle_max_row()
    old = {"position": first.position, "rows_read": first.rows_read, "watermarks": first._watermarks}
    again = BlockReader(blocks, batch_size=256, timestamp_column="ts", split=0)
    again.restore(pickle.loads(pickle.dumps(old)))
    _read(again)
    assert again.max_timestamp_record()["row"] == 717 and again.rows_read == 2_000


def test_leaving_a_block_keeps_only_the_rows_values():
    reader = BlockReader(_blocks_with_absurd_rows(), batch_size=256, timestamp_column="ts")
    _read(reader)
    row = reader._watermarks.max_record
    assert row.rows is None and row.values.startswith("{'click_id': 717")  # the first block is not kept alive
