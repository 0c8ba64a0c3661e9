"""Jobs that read one DataFrame at once: each keeps its own snapshot until it is done with it."""

from __future__ import annotations

import gc
import threading

import pytest

from actorflow.spark_bridge import arrow_io, enrich, from_spark

pytestmark = [pytest.mark.spark, pytest.mark.ray]


def test_a_snapshot_being_fetched_survives_another_stream_over_the_same_dataframe_going(spark, monkeypatch):
    df = spark.range(1_000).repartition(2).cache()
    first = from_spark(df, parallelism=1)
    assert first.map(lambda row: row).to_spark(progress=False).count() == 1_000
    second = from_spark(df, parallelism=1)
    groups = arrow_io._fetch_groups

    def first_goes_meanwhile(partitions: int, tasks: int) -> list[list[int]]:
        # The second snapshot is cached in Spark and about to be fetched when the first stream
        # goes (another thread's enrich() ending): freeing it must not free the second.
        nonlocal first
        first = None
        gc.collect()
        return groups(partitions, tasks)

    monkeypatch.setattr(arrow_io, "_fetch_groups", first_goes_meanwhile)
    # RayDP said "Still cannot get the block after recache!" here when the first stream's
    # release freed every snapshot of df.
    out = second.map(lambda row: {"id": row["id"] * 2}).to_spark(progress=False)
    assert sorted(r.id for r in out.collect()) == list(range(0, 2_000, 2))
    assert first is None and df in arrow_io._snapshots  # the second's snapshot stays until it goes
    del second
    gc.collect()
    assert df not in arrow_io._snapshots
    df.unpersist()


def test_two_threads_enrich_one_cached_dataframe_at_once_with_different_job_names(spark):
    df = spark.range(20_000).selectExpr("id", "id % 7 AS k").repartition(4).cache()
    df.count()
    results: dict[str, object] = {}

    def run(name: str) -> None:
        try:
            out = enrich(df, lambda row: {"x": row["id"] + 1}, job_name=name, parallelism=1, progress=False)
            results[name] = sorted(r.x for r in out.select("x").collect()) == list(range(1, 20_001))
        except Exception as error:  # noqa: BLE001 - reported below, with its thread's job
            results[name] = f"{type(error).__name__}: {error}"

    for round_ in range(3):
        threads = [threading.Thread(target=run, args=(f"reader-{round_}-{i}",)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert results == {f"reader-{r}-{i}": True for r in range(3) for i in range(2)}
    df.unpersist()
