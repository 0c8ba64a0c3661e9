"""enrich_async() and to_spark_async() on a running event loop, and last_job() after them."""

from __future__ import annotations

import asyncio

import pytest

from actorflow.operators import ConfigurationError
from actorflow.spark_bridge import enrich_async, from_spark, last_job, streams
from tests.loop_watch import while_ticking

pytestmark = [pytest.mark.spark, pytest.mark.ray]

ROWS = 300


def _clicks(spark, n):
    from pyspark.sql import functions as F

    return spark.range(n).withColumnRenamed("id", "click_id").withColumn("user_id", F.col("click_id") % 7)


async def _segment(row):
    await asyncio.sleep(0.02)
    if row["user_id"] == 6 and row["click_id"] % 50 == 6:
        raise LookupError(f"no user {row['user_id']}")
    return {"segment": f"s{row['user_id']}"}


def test_enrich_async_leaves_the_loop_free_and_last_job_holds_its_figures(spark):
    df = _clicks(spark, ROWS)
    # 300 calls of 20 ms, 4 at a time: 1.5 s of calls, besides Spark's conversions both ways.
    watched = asyncio.run(while_ticking(lambda: enrich_async(
        df, _segment, capacity=4, parallelism=1, on_error="dead_letter", job_name="enrich-async", progress=False)))
    enriched, dead = watched.result
    rows = enriched.orderBy("click_id").collect()
    assert [r.click_id for r in rows] == [i for i in range(ROWS) if not (i % 7 == 6 and i % 50 == 6)]
    assert all(r.segment == f"s{r.user_id}" for r in rows)
    assert sorted(r.click_id for r in dead.collect()) == [i for i in range(ROWS) if i % 7 == 6 and i % 50 == 6]
    assert watched.elapsed_s >= 1.5
    assert watched.longest_gap_s < 0.5, watched

    job = last_job()
    assert (job.job, job.input_rows, job.output_rows) == ("enrich-async", ROWS, len(rows))
    assert job.progress_samples[-1][1] == ROWS
    assert "enrich-async" in job._repr_html_() and "<code>enrich</code>" in job._repr_html_()


def test_to_spark_async_returns_the_dataframe_and_becomes_the_last_job(spark):
    stream = from_spark(_clicks(spark, 40), parallelism=1, job_name="to-spark-async").map(
        lambda row: {**row, "twice": 2 * row["click_id"]})
    out = asyncio.run(stream.to_spark_async(progress=False))
    assert [(r.click_id, r.twice) for r in out.collect()] == [(i, 2 * i) for i in range(40)]
    assert last_job() is stream.last_result and last_job().job == "to-spark-async"


def test_last_job_says_when_no_job_has_finished(monkeypatch):
    monkeypatch.setattr(streams, "_last_job", None)
    with pytest.raises(ConfigurationError, match="no to_spark\\(\\) or enrich\\(\\) has finished"):
        last_job()
