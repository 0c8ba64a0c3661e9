"""Exactly-once from Spark to Spark: instances killed while a job runs, against the real
enrichment service over HTTP and a keyed window, compared with failure-free runs."""

from __future__ import annotations

import asyncio
from collections import Counter

import aiohttp
import pyarrow as pa
import pytest

from actorflow.cluster.chaos import ChaosMonkey, compare_outputs
from examples.enrich_service import EnrichmentService, lookup_user, user_profile
from actorflow.operators.windows import TumblingEventTimeWindows
from actorflow.spark_bridge import enrich, from_spark
from actorflow.spark_bridge.enrich import AUTO_CHECKPOINT_INTERVAL_MS, auto_checkpoint_interval

pytestmark = [pytest.mark.spark, pytest.mark.ray]


def test_enrich_under_kills_returns_every_row_once_with_the_services_answer(spark, tmp_path):
    from pyspark.sql import functions as F

    n = 20_000
    df = spark.range(n).withColumnRenamed("id", "click_id").withColumn("user_id", F.col("click_id") % 300)
    with EnrichmentService(latency_ms_median=3, latency_sigma=0.3, failure_rate=0.0, hang_rate=0.0) as service:
        url = service.url

        async def segment(row):
            async with aiohttp.ClientSession() as session:
                user = await lookup_user(session, url, row["user_id"])
            return {"segment": user["segment"]}

        with ChaosMonkey("enrich-chaos", every_s=2.0, max_kills=2, first_after_s=2.0, operator="enrich", seed=7) as monkey:
            out = enrich(df, segment, capacity=50, parallelism=2, job_name="enrich-chaos", progress=False,
                         checkpoint_interval_ms=500, checkpoint_dir=str(tmp_path))
    table = pa.Table.from_pandas(out.toPandas(), preserve_index=False)
    expected = pa.table({
        "click_id": list(range(n)),
        "user_id": [i % 300 for i in range(n)],
        "segment": [user_profile(i % 300)["segment"] for i in range(n)],
    })
    report = compare_outputs(expected, table, key="click_id")
    assert report.exact, report.lines()
    assert out.schema["click_id"].dataType.simpleString() == "bigint"
    assert len(monkey.kills) >= 1, "the job ended before the first kill"


def test_keyed_windows_from_spark_are_exact_after_kills(spark, tmp_path):
    from pyspark.sql import functions as F

    n = 30_000
    df = (spark.range(n).withColumn("user", F.col("id") % 17)
          .withColumn("ts", (F.col("id") * 10).cast("timestamp"))  # id * 10 seconds
          .repartitionByRange(2, "id").sortWithinPartitions("id"))

    async def tag(row):
        await asyncio.sleep(0.0005)
        return [row]

    stream = (from_spark(df, timestamp_column="ts", parallelism=2, job_name="windows-chaos")
              .async_map(tag, capacity=40, ordered=False)
              .key_by("user", parallelism=2).window(TumblingEventTimeWindows.of(60_000)).count())
    with ChaosMonkey("windows-chaos", every_s=1.5, max_kills=2, first_after_s=1.5, seed=8) as monkey:
        out = stream.to_spark(checkpoint_interval_ms=400, checkpoint_dir=str(tmp_path), progress=False)
    got = Counter({(r["user"], round(r["window_start"].timestamp() * 1000)): r["count"] for r in out.collect()})
    want = Counter((i % 17, (i * 10_000 // 60_000) * 60_000) for i in range(n))
    assert got == want
    assert out.count() == len(want)
    assert stream.last_result.restarts == len(monkey.kills)


def test_enrich_takes_checkpoints_on_its_own_only_for_a_long_job(spark):
    assert auto_checkpoint_interval(spark.range(5_000_000)) == AUTO_CHECKPOINT_INTERVAL_MS
    assert auto_checkpoint_interval(spark.range(1_000)) is None
