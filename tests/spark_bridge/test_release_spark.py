"""What a job leaves behind: nothing in Ray's object store, and a Spark cache that unpersist() frees."""

from __future__ import annotations

import asyncio
import gc
import re
import threading
import time

import pandas as pd
import pyarrow as pa
import pytest
from ray._private.internal_api import memory_summary

from actorflow.spark_bridge import enrich
from actorflow.spark_bridge.arrow_io import tables_to_dataframe

pytestmark = [pytest.mark.spark, pytest.mark.ray]

ROWS = 200_000


def _plasma_mib() -> int:
    found = re.search(r"Plasma memory usage (\d+) MiB", memory_summary(stats_only=True))
    assert found, memory_summary(stats_only=True)
    return int(found.group(1))


def _settled_plasma_mib(at_most: int | None = None, timeout_s: float = 60) -> int:
    # Objects are freed asynchronously once their last reference goes.
    deadline = time.monotonic() + timeout_s
    while True:
        gc.collect()
        used = _plasma_mib()
        if at_most is None or used <= at_most or time.monotonic() > deadline:
            return used
        time.sleep(0.5)


def _persistent_rdds(spark) -> set[int]:
    return {int(k) for k in spark.sparkContext._jsc.getPersistentRDDs().keySet()}


def test_enrich_leaves_nothing_in_ray_and_unpersist_frees_the_rest(spark):
    async def plus_one(row):
        await asyncio.sleep(0)
        return {"x": row["id"] + 1}

    # About 45 MiB of Arrow data each way: far above what a leak could hide in.
    df = spark.range(0, ROWS, 1, 4).selectExpr("id", "repeat('p', 200) AS payload")
    rdds_before = _persistent_rdds(spark)
    before = _settled_plasma_mib()

    out = enrich(df, plus_one, parallelism=2, progress=False, checkpoint_interval_ms=None)
    assert out.is_cached
    assert out.filter("x = id + 1").count() == ROWS
    # Once enrich() returned, Spark holds the output: the input and output blocks are gone from Ray.
    after = _settled_plasma_mib(at_most=before + 2)
    assert after <= before + 2, f"{after - before} MiB still pinned in Ray's object store"
    # The input's Spark-side snapshot went with enrich()'s stream; the output's cache is what is left.
    left = _persistent_rdds(spark) - rdds_before
    assert len(left) == 1, left
    out.unpersist(blocking=True)
    assert not out.is_cached
    assert _persistent_rdds(spark) - rdds_before == set()


def test_the_input_snapshot_is_released_when_enrich_returns_without_a_collection_of_ours(spark):
    async def plus_one(row):
        return {"x": row["id"] + 1}

    df = spark.range(0, 5_000, 1, 2).selectExpr("id")
    before = _persistent_rdds(spark)
    gc.disable()  # what frees the snapshot must be enrich() itself, not the cyclic collector
    try:
        out = enrich(df, plus_one, parallelism=2, progress=False, checkpoint_interval_ms=None)
        assert out.count() == 5_000  # the first action fills the output's cache
        left = _persistent_rdds(spark) - before
    finally:
        gc.enable()
    assert len(left) == 1, left  # the output's cache alone
    out.unpersist(blocking=True)


def _enrich_unread(spark):
    """Plasma MiB before, and an enrich() result of about 45 MiB that no action has read yet."""

    async def plus_one(row):
        return {"x": row["id"] + 1}

    df = spark.range(0, ROWS, 1, 4).selectExpr("id", "repeat('p', 200) AS payload")
    before = _settled_plasma_mib()
    return before, enrich(df, plus_one, parallelism=2, progress=False, checkpoint_interval_ms=None)


def test_the_output_stays_in_ray_until_the_first_action_has_cached_it(spark):
    before, out = _enrich_unread(spark)
    # No Spark job has read the result yet: its blocks wait in Ray for the first one.
    waiting = _settled_plasma_mib()
    assert waiting >= before + 30, f"only {waiting - before} MiB of output in Ray before the first action"
    assert out.filter("x = id + 1").count() == ROWS
    after = _settled_plasma_mib(at_most=before + 2)
    assert after <= before + 2, f"{after - before} MiB still pinned once Spark cached the result"
    # Read from Spark's cache now, not from the freed blocks.
    assert out.agg({"x": "sum"}).first()[0] == ROWS * (ROWS + 1) // 2
    out.unpersist(blocking=True)


def test_unpersist_before_any_action_frees_the_output_at_once(spark):
    before, out = _enrich_unread(spark)
    assert _settled_plasma_mib() >= before + 30
    out.unpersist(blocking=True)
    # The blocks go within moments, not at the end of the session.
    deadline = time.monotonic() + 5
    while _plasma_mib() > before + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _plasma_mib() <= before + 2, f"{_plasma_mib() - before} MiB still pinned after unpersist()"


def test_on_read_waits_for_the_first_action_that_reads_the_blocks(spark):
    table = pa.table({"id": list(range(1_000))})
    read = threading.Event()
    df = tables_to_dataframe(spark, [table], table.schema, on_read=read.set)
    # Nothing has read the blocks yet: well past the watcher's polls, the hook has not run.
    assert not read.wait(1.0)
    assert df.count() == 1_000
    assert read.wait(10.0)
    df.unpersist()


def test_on_read_waits_for_the_action_that_read_the_blocks_to_end(spark):
    table = pa.table({"id": list(range(1_000))})
    read_at = []
    df = tables_to_dataframe(spark, [table], table.schema, on_read=lambda: read_at.append(time.time()))

    def slow_tail(batches):
        rows = sum(len(b) for b in batches)  # the partition is read, and so in the cache
        time.sleep(2.0)  # the action goes on after that
        yield pd.DataFrame({"rows": [rows]})

    # One Spark job: the first action of the result is one, usually.
    df.mapInPandas(slow_tail, "rows long").write.format("noop").mode("overwrite").save()
    # Not while the action still ran (the blocks were cached about 2 s before it ended).
    _assert_on_read_came_after_the_last_job(spark, read_at)
    df.unpersist()


def _assert_on_read_came_after_the_last_job(spark, read_at: list[float]) -> None:
    # Spark's own record of when its last job ended, on the wall clock: the time the action
    # returned here would add the driver's own work after the job, seconds on a busy machine.
    deadline = time.monotonic() + 10
    while not read_at and time.monotonic() < deadline:
        time.sleep(0.05)
    assert read_at, "on_read never ran"
    jobs = spark.sparkContext._jsc.sc().statusStore().jobsList(None)
    ends = [jobs.apply(i).completionTime() for i in range(jobs.size())]
    ended = max(end.get().getTime() / 1000 for end in ends if end.isDefined())
    # The store keeps milliseconds; an on_read at the time the blocks were cached comes 2 s early.
    assert read_at[0] >= ended - 0.01, f"on_read ran {ended - read_at[0]:.2f} s before Spark's last job ended"


def test_on_read_waits_through_a_pause_between_the_jobs_of_an_action(spark):
    table = pa.table({"id": list(range(1_000))})
    read_at = []
    df = tables_to_dataframe(spark, [table], table.schema, on_read=lambda: read_at.append(time.time()))

    def slow(batches):
        for batch in batches:
            time.sleep(2.0)  # so that an on_read before this job would come 2 s early
            yield batch

    # What a user's cell may do: one job reads the blocks, and a moment later another one runs.
    assert df.count() == 1_000
    time.sleep(0.1)
    df.mapInPandas(slow, "id long").write.format("noop").mode("overwrite").save()
    _assert_on_read_came_after_the_last_job(spark, read_at)
    df.unpersist()


def test_on_read_runs_at_once_when_there_is_nothing_to_read(spark):
    schema = pa.schema([("id", pa.int64())])
    read = threading.Event()
    df = tables_to_dataframe(spark, [schema.empty_table()], schema, on_read=read.set)
    assert read.is_set()
    assert df.count() == 0


def test_a_result_refused_for_its_unasked_dead_letters_leaves_nothing_in_ray(spark):
    from actorflow.operators.errors import ConfigurationError
    from actorflow.spark_bridge import from_spark

    async def plus_one_but_not_7(row):
        if row["id"] == 7:
            raise ValueError("no 7")
        return [{**row, "x": row["id"] + 1}]

    df = spark.range(0, ROWS, 1, 4).selectExpr("id", "repeat('p', 200) AS payload")
    before = _settled_plasma_mib()
    stream = from_spark(df, parallelism=2).async_map(plus_one_but_not_7, on_error="dead_letter")
    with pytest.raises(ConfigurationError, match="1 records went to dead letters"):
        stream.to_spark(progress=False)
    del stream  # and with it the input's snapshot
    after = _settled_plasma_mib(at_most=before + 2)
    assert after <= before + 2, f"{after - before} MiB of a refused result still pinned in Ray"
