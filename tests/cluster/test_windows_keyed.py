"""Keyed windows on Ray actors: stable key routing, the watermark minimum over splits, idleness,
a second window stage, and bad input."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
import ray
from hypothesis import given, settings
from hypothesis import strategies as st

from actorflow.actors.keys import KeyRouter, stable_hash
from actorflow.operators.key_groups import index_of_key_group, key_group_of
from actorflow.cluster import from_arrow, from_blocks
from actorflow.operators import JobFailedError, SchemaError
from actorflow.operators.channel_items import END_OF_INPUT, PartialAggregates, Records
from actorflow.operators.elements import Watermark
from actorflow.operators.windows import Count, TumblingEventTimeWindows
from tests.properties import examples

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]
KEYS = [f"user-{i}" for i in range(40)] + list(range(20))  # string and integer keys


def _table(first_ms: int, n: int, keys: list) -> pa.Table:
    return pa.table({
        "k": [str(keys[i % len(keys)]) for i in range(n)],
        "v": list(range(n)),
        "ts": [first_ms + i for i in range(n)],
    })


def test_a_key_hashes_alike_in_processes_with_different_hash_seeds():
    code = "from actors.keys import stable_hash; print([stable_hash(k) for k in %r])" % (KEYS + [("a", 1)],)
    seen = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, cwd=ROOT)
        seen.append(out.stdout)
    assert seen[0] == seen[1] == f"{[stable_hash(k) for k in KEYS + [('a', 1)]]}\n"


@pytest.mark.parametrize("equal_keys", [(1, 1.0, True), (0.5,), (("a", 2), ("a", 2.0))])
def test_keys_that_are_equal_in_python_hash_alike(equal_keys):
    from decimal import Decimal

    assert len({stable_hash(k) for k in equal_keys}) == 1
    assert stable_hash(Decimal("2.50")) == stable_hash(2.5) and stable_hash(Decimal(3)) == stable_hash(3)
    assert stable_hash(1) != stable_hash("1")


def test_a_batch_split_by_key_column_routes_each_row_as_the_per_record_path(ray_session):
    from actorflow.actors.arrow_rows import RowBatch

    table = pa.table({"k": [str(k) for k in KEYS] * 3, "n": list(range(len(KEYS) * 3))})
    router = KeyRouter("k")
    parts = router.split(RowBatch(table, None), 3)
    for target, part in enumerate(parts):
        assert all(router.target(row, 3) == target for row in part.table.to_pylist())
    assert sum(p.num_rows for p in parts) == table.num_rows


_KEY_COLUMNS = {
    "string": st.one_of(st.none(), st.text(max_size=3)),
    "int": st.one_of(st.none(), st.integers(-3, 3)),
    "float": st.one_of(st.none(), st.floats(-2, 2).map(lambda f: round(f, 1)), st.just(float("nan")), st.just(-0.0)),
}


@settings(max_examples=examples(60), deadline=None)
@given(st.sampled_from(sorted(_KEY_COLUMNS)).flatmap(
    lambda kind: st.tuples(st.just(kind), st.lists(st.lists(_KEY_COLUMNS[kind], max_size=30), min_size=1, max_size=6))))
def test_batch_after_batch_every_row_goes_where_its_key_alone_would(column):
    from actorflow.actors.arrow_rows import RowBatch

    # One router for every batch: later batches find their keys among those seen, or add new ones.
    kind, batches = column
    arrow_type = {"string": pa.string(), "int": pa.int64(), "float": pa.float64()}[kind]
    router = KeyRouter("k")
    for keys in batches:
        table = pa.table({"k": pa.array(keys, arrow_type), "n": list(range(len(keys)))})
        parts = router.split(RowBatch(table, None), 3)
        routed = sorted((row["n"], target) for target, part in enumerate(parts) for row in part.table.to_pylist())
        groups = router.max_parallelism
        assert routed == [(i, index_of_key_group(key_group_of(k, groups), groups, 3)) for i, k in enumerate(keys)]


class _Collect:
    """A channel that keeps what it is sent."""

    def __init__(self) -> None:
        self.items: list = []

    async def send(self, item) -> None:
        self.items.append(item)

    def of(self, kind) -> list:
        return [item for item in self.items if isinstance(item, kind)]

    def kinds(self) -> list[str]:
        return [type(item).__name__ for item in self.items]

    async def flush(self) -> None:
        return None


def _route(window_operator, table: pa.Table | list[pa.Table], batch_size: int) -> list[_Collect]:
    import asyncio

    from actorflow.actors.source_actor import BlockReader, route_items

    senders = [_Collect(), _Collect()]
    reader = BlockReader(table if isinstance(table, list) else [table], batch_size=batch_size, timestamp_column="ts")
    between = asyncio.Event()
    asyncio.run(route_items(reader, senders, KeyRouter("k"), between, window_operator.pre_aggregate))
    return senders


def test_a_keyed_read_sends_a_row_per_key_and_window_where_the_window_operator_allows_it():
    from actorflow.operators.windows import WindowOperator

    table = _table(0, 3_000, KEYS)
    senders = _route(WindowOperator("k", TumblingEventTimeWindows(1_000), aggregate=Count()), table, 1_000)
    router = KeyRouter("k")
    for target, sender in enumerate(senders):
        parts = [(p.table, p.rows) for p in sender.of(PartialAggregates)]
        assert len(parts) == 3 and set(sender.kinds()) == {"PartialAggregates", "Watermark", "EndOfInput"}
        for partials, batch_rows in parts:
            assert batch_rows == 1_000 and partials.num_rows <= len(KEYS)  # a row per key in each 1 s window
            assert {router.target(row, 2) for row in partials.to_pylist()} == {target}
    counts = [n for s in senders for p in s.of(PartialAggregates)
              for n in p.table.column("__actorflow_row_count").to_pylist()]
    assert sum(counts) == 3_000
    # A late-data side output needs the rows: they go as they are.
    senders = _route(WindowOperator("k", TumblingEventTimeWindows(1_000), aggregate=Count(), late_data_tag="late"),
                     table, 1_000)
    assert sum(r.batch.num_rows for s in senders for r in s.of(Records)) == 3_000
    assert not any(s.of(PartialAggregates) for s in senders)


def _as_lists(senders: list[_Collect]) -> list[list]:
    """The items each sender got, with tables as lists of rows."""
    def plain(item):
        match item:
            case PartialAggregates(table=table, rows=rows):
                return "partials", table.to_pylist(), rows
            case Records(batch=batch):
                return "records", batch.table.to_pylist(), batch.origins
        return item
    return [[plain(item) for item in sender.items] for sender in senders]


def test_blocks_smaller_than_a_batch_are_pre_aggregated_together_as_if_they_were_one_block():
    from actorflow.operators.windows import WindowOperator

    def window():
        return WindowOperator("k", TumblingEventTimeWindows(1_000), aggregate=Count())

    table = _table(0, 3_000, KEYS)
    blocks = [table.slice(i, 500) for i in range(0, 3_000, 500)]
    one_block = _route(window(), table, 1_000)
    small_blocks = _route(window(), blocks, 1_000)
    # Per sender: the partials of 1,000 rows, then the watermark after them, three times; the
    # same partials and watermarks as of one block read in batches of 1,000 rows.
    assert _as_lists(small_blocks) == _as_lists(one_block)
    for sender in small_blocks:
        assert sender.kinds() == ["PartialAggregates", "Watermark"] * 3 + ["EndOfInput"]
    # Blocks that do not add up to a batch are not merged across it: 700 + 700 > 1,000.
    uneven = _route(window(), [table.slice(i, 700) for i in range(0, 2_100, 700)], 1_000)
    assert [p.rows for p in uneven[0].of(PartialAggregates)] == [700, 700, 700]


def test_rows_a_window_needs_one_by_one_keep_their_order_origins_and_watermarks_across_small_blocks():
    from actorflow.operators.windows import WindowOperator

    from actorflow.actors.output import pre_aggregator

    # A late-data side output needs the rows themselves: the key split gets no pre-aggregator.
    assert pre_aggregator(lambda: WindowOperator("k", TumblingEventTimeWindows(1_000), aggregate=Count(),
                                                 late_data_tag="late")) is None
    assert pre_aggregator(lambda: WindowOperator("k", TumblingEventTimeWindows(1_000), aggregate=Count())) is not None
    # Handed one anyway, it finds nothing to merge across blocks, and reorders nothing.
    table = _table(0, 2_000, KEYS)
    blocks = [table.slice(i, 500) for i in range(0, 2_000, 500)]
    senders = _route(WindowOperator("k", TumblingEventTimeWindows(1_000), aggregate=Count(), late_data_tag="late"),
                     blocks, 1_000)
    for sender in senders:
        assert sender.kinds() == ["Records", "Watermark"] * 4 + ["EndOfInput"]  # a watermark after each block's rows
        origins = [r.batch.origins[:2] for r in sender.of(Records)]
        assert origins == [(0, piece) for piece in range(4)]  # (split, piece): each row's own
        watermarks = [w.timestamp_ms for w in sender.of(Watermark)]
        assert watermarks == [498, 998, 1_498, 1_998]  # the largest event time so far, less 1


def test_a_checkpoint_waits_while_read_batches_are_held_for_pre_aggregation():
    import asyncio

    from actorflow.actors.arrow_rows import RowBatch
    from actorflow.actors.source_actor import route_items
    from actorflow.operators.windows import WindowOperator

    between = asyncio.Event()
    table = _table(0, 1_000, KEYS)
    seen = []

    class Reader:
        batch_size = 1_000

        async def items(self):
            for i, start in enumerate((0, 500)):
                part = table.slice(start, 500)
                yield Records(RowBatch(part, part.column("ts").cast(pa.int64()).combine_chunks(), (0, i, 0)))
                seen.append(("after records", between.is_set()))
                yield Watermark(start + 499)
                seen.append(("after watermark", between.is_set()))
            yield END_OF_INPUT
            seen.append(("after end", between.is_set()))

    senders = [_Collect(), _Collect()]
    window = WindowOperator("k", TumblingEventTimeWindows(1_000), aggregate=Count())
    asyncio.run(route_items(Reader(), senders, KeyRouter("k"), between, window.pre_aggregate))
    # Held rows have not gone out: no barrier may pass them until their partials have.
    assert seen == [("after records", False), ("after watermark", False), ("after records", False),
                    ("after watermark", False), ("after end", True)]
    assert senders[0].kinds() == ["PartialAggregates", "Watermark", "EndOfInput"]


def test_an_operator_whose_output_is_split_by_key_sends_partials_for_a_keyed_window_stage():
    import asyncio

    from actorflow.actors.output import BatchingOutput, Outbox, Partitioner, pre_aggregator
    from actorflow.operators import Record
    from actorflow.operators.windows import WindowOperator

    def collect(**window_options):
        senders = [_Collect(), _Collect()]

        async def run():
            outbox = Outbox(senders, max_pending=100, on_room=lambda: None)
            head = pre_aggregator(lambda: WindowOperator("k", TumblingEventTimeWindows(1_000), aggregate=Count(), **window_options))
            output = BatchingOutput(outbox, Partitioner("hash", 2, "k"), batch_size=500, schema=None,
                                    side=lambda tag, values: None, pre_aggregate=head)
            for row in _table(0, 3_000, KEYS).to_pylist():
                output.collect(Record(row, row["ts"]))
            output.flush()
            await outbox.close()

        asyncio.run(run())
        return senders

    router = KeyRouter("k")
    senders = collect()
    for target, sender in enumerate(senders):
        assert set(sender.kinds()) == {"PartialAggregates"}
        for i, (partials, rows) in enumerate((p.table, p.rows) for p in sender.items):
            last = i == len(sender.items) - 1  # the rest, at the flush
            assert (rows <= 500 if last else rows == 500) and partials.num_rows < rows
            assert {router.target(row, 2) for row in partials.to_pylist()} == {target}
    assert sum(n for s in senders for p in s.items for n in p.table.column("__actorflow_row_count").to_pylist()) == 3_000
    # With a late-data side output the window operator needs the rows themselves.
    senders = collect(late_data_tag="late")
    assert {kind for s in senders for kind in s.kinds()} == {"Records"}
    assert sum(r.batch.num_rows for s in senders for r in s.items) == 3_000


def test_source_actors_that_split_by_key_give_exact_windows(ray_session):
    # Three source splits feed two window instances: source actors route by key, pre-aggregated.
    tables = [_table(j * 1_000, 1_000, KEYS) for j in range(6)]
    result = (
        from_arrow(tables, timestamp_column="ts", parallelism=3, batch_size=250)
        .key_by("k", parallelism=2).window(TumblingEventTimeWindows.of(2_000)).count()
        .execute(progress=False)
    )
    assert any("rows_sent" in f for f in result.figures)  # source actors ran
    rows = result.to_arrow().to_pylist()
    expected = Counter((r["k"], r["ts"] // 2_000 * 2_000) for t in tables for r in t.to_pylist())
    assert {(r["k"], r["window_start"]): r["count"] for r in rows} == dict(expected)
    assert sum(f.get("late_records_dropped", 0) for f in result.figures) == 0


def test_every_instance_fires_its_windows_when_one_split_holds_all_the_input(ray_session):
    # One block: split 0 reads it all and routes half the keys to instance 1; split 1 ends at once.
    # Instance 0 may see its own watermark, then its own end, before split 1's end: the minimum
    # over its inputs never moves, yet the end of input must fire its windows.
    table = pa.table({"k": list(range(16)), "ts": list(range(0, 16_000, 1_000))})
    for _ in range(5):  # the order of those items is a race: one run in ten gets it right
        result = (from_arrow([table], timestamp_column="ts", parallelism=2).key_by("k")
                  .window(TumblingEventTimeWindows.of(60_000)).count().execute(progress=False))
        rows = result.to_arrow().to_pylist()
        assert sorted((r["k"], r["count"]) for r in rows) == [(k, 1) for k in range(16)], result.figures


def _instances_of_keys(result) -> dict:
    """Which instance of the last stage emitted each key."""
    owner: dict = {}
    for index, table in enumerate(ray.get(result.tables)):
        for row in (table.to_pylist() if table is not None else []):
            assert owner.setdefault(row["k"], index) == index, f"key {row['k']!r} came out of two instances"
    return owner


def test_a_key_reaches_one_instance_from_every_upstream_actor_and_in_every_run(ray_session):
    tables = [_table(j * 1_000, 1_000, KEYS) for j in range(6)]

    def run(before_key_by):
        stream = from_arrow(tables, timestamp_column="ts", parallelism=2, batch_size=250)
        if before_key_by:  # records reach the window from the map's actors, one by one
            stream = stream.map(lambda r: r)
        result = stream.key_by("k").window(TumblingEventTimeWindows.of(2_000)).count().execute(progress=False)
        rows = result.to_arrow().to_pylist()
        # Every (key, window) once, with every record: no key was split between instances.
        assert Counter((r["k"], r["window_start"]) for r in rows).most_common(1)[0][1] == 1
        assert sum(r["count"] for r in rows) == 6_000
        return _instances_of_keys(result)

    first, second, through_a_map = run(False), run(False), run(True)
    assert first == second == through_a_map
    assert set(first.values()) == {0, 1}  # both instances got keys


def _slow_blocks(first_delay_s: float, last_delay_s: float) -> tuple[list, list[int]]:
    """Four blocks of 1,000 rows: split 0 reads the first and third, split 1 the second and fourth.

    Split 0's first block (event time 0..999) arrives after ``first_delay_s``; split 1 has
    already sent event time 100,000.. and waits ``last_delay_s`` for its last block.
    """

    @ray.remote
    def later(table: pa.Table, delay_s: float) -> pa.Table:
        time.sleep(delay_s)
        return table

    early = later.remote(_table(0, 1_000, KEYS), first_delay_s)
    ahead = ray.put(_table(100_000, 1_000, KEYS))
    next_early = ray.put(_table(1_000, 1_000, KEYS))
    last = later.remote(_table(101_000, 1_000, KEYS), last_delay_s)
    return [early, ahead, next_early, last], [1_000] * 4


def _late_and_counted(idleness_ms, first_delay_s, last_delay_s):
    # The delays run from now, and starting the job's actors takes seconds on a busy machine.
    blocks, rows = _slow_blocks(first_delay_s, last_delay_s)
    result = (
        from_blocks(blocks, rows, timestamp_column="ts", parallelism=2, batch_size=1_000, idleness_ms=idleness_ms,
                    schema=_table(0, 1, KEYS).schema)
        .key_by("k").window(TumblingEventTimeWindows.of(1_000)).side_output_late_data("late").count()
        .execute(progress=False)
    )
    return len(result.side_outputs["late"]), sum(r["count"] for r in result.to_arrow().to_pylist())


def test_the_watermark_is_the_minimum_over_splits_so_a_slow_split_is_never_late(ray_session):
    # Split 1 runs 100 s of event time ahead while split 0 waits for its data: the window stage's
    # watermark stays at split 0's, and none of split 0's records is late. The valve's cases
    # (idleness, ends) are ring 1's, in tests/operators/test_stream_task.py; this one proves the
    # actors' wiring of splits to channels.
    assert _late_and_counted(None, 3.0, 0.0) == (0, 4_000)


def test_a_second_window_stage_treats_none_of_the_first_ones_output_as_late(ray_session):
    tables = [_table(j * 5_000, 5_000, KEYS) for j in range(4)]
    result = (
        from_arrow(tables, timestamp_column="ts", parallelism=2, batch_size=500)
        .key_by("k").window(TumblingEventTimeWindows.of(1_000)).count()
        .key_by("k").window(TumblingEventTimeWindows.of(10_000)).side_output_late_data("late").sum("count")
        .execute(progress=False)
    )
    assert result.side_outputs["late"] == []
    rows = result.to_arrow().to_pylist()
    expected = Counter((r["k"], r["ts"] // 10_000 * 10_000) for t in tables for r in t.to_pylist())
    assert {(r["k"], r["window_start"]): r["count"] for r in rows} == dict(expected)


def test_a_missing_key_column_and_an_unhashable_key_fail_naming_the_record(ray_session):
    tables = [_table(0, 100, KEYS)]
    missing = (from_arrow(tables, timestamp_column="ts", parallelism=2).map(lambda r: {"v": r["v"]})
               .key_by("k").window(TumblingEventTimeWindows.of(10)).count())
    with pytest.raises(JobFailedError, match=r"key column 'k' not found in record \{'v': 0\}"):
        missing.execute(progress=False)
    unhashable = (from_arrow(tables, timestamp_column="ts", parallelism=2)
                  .key_by(lambda r: [r["k"]]).window(TumblingEventTimeWindows.of(10)).count())
    with pytest.raises(JobFailedError, match=r"key \['user-0'\] of type list is unhashable"):
        unhashable.execute(progress=False)
    with pytest.raises(SchemaError, match="key column 'region' not found"):
        from_arrow(tables, timestamp_column="ts", parallelism=2).key_by("region")
    with pytest.raises(SchemaError, match="event-time column 'k' must be a timestamp, date or integer"):
        from_arrow(tables, timestamp_column="k", parallelism=2)
