"""Spark DataFrame → async I/O on Ray actors → Spark DataFrame, through RayDP, for real."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from examples.enrich_service import EnrichmentService, NotFoundError, lookup_user, user_profile
from actorflow.operators import FixedDelay, JobFailedError, SchemaError
from actorflow.spark_bridge import enrich, from_spark

pytestmark = [pytest.mark.spark, pytest.mark.ray]


@pytest.fixture(scope="module")
def service():
    with EnrichmentService(latency_ms_median=5, latency_sigma=0.3, failure_rate=0.0, hang_rate=0.0) as svc:
        yield svc


def _clicks(spark, n, *, unknown_every=0):
    from pyspark.sql import functions as F

    df = spark.range(n).withColumnRenamed("id", "click_id").withColumn("user_id", F.col("click_id") % 500)
    if unknown_every:
        df = df.withColumn("user_id", F.when(F.col("click_id") % unknown_every == 0, -1 - F.col("click_id")).otherwise(F.col("user_id")))
    return df.repartitionByRange(3, "click_id")


def _lookup(url):
    async def segment(row):
        async with aiohttp.ClientSession() as session:
            user = await lookup_user(session, url, row["user_id"])
        return {"segment": user["segment"]}

    return segment


def test_enrich_calls_the_real_service_and_keeps_input_order(spark, service):
    df = _clicks(spark, 2_000)
    expected_order = [r.click_id for r in df.select("click_id").collect()]
    out = enrich(df, _lookup(service.url), capacity=50, parallelism=2, timeout_ms=10_000, progress=False)
    rows = out.collect()
    assert out.columns == ["click_id", "user_id", "segment"]
    assert [r.click_id for r in rows] == expected_order
    assert all(r.segment == user_profile(r.user_id)["segment"] for r in rows)
    assert service.stats()["requests"] >= 2_000


def test_dead_letters_come_back_as_a_second_dataframe_and_nothing_is_lost(spark, service):
    df = _clicks(spark, 1_000, unknown_every=100)
    out, dead = enrich(
        df, _lookup(service.url), capacity=20, parallelism=2, on_error="dead_letter",
        retry=FixedDelay(2, 5), timeout_ms=10_000, progress=False,
    )
    good = {r.click_id for r in out.select("click_id").collect()}
    bad = dead.collect()
    assert {r.click_id for r in bad} == set(range(0, 1_000, 100))
    assert good | {r.click_id for r in bad} == set(range(1_000)) and not good & {r.click_id for r in bad}
    assert {r.error_type for r in bad} == {"NotFoundError"} and {r.attempts for r in bad} == {2}
    assert dead.columns == ["click_id", "user_id", "error_type", "error", "attempts", "operator", "request_key"]


def test_a_failing_row_fails_the_job_with_operator_row_and_cause(spark, service):
    df = _clicks(spark, 600, unknown_every=250)
    with pytest.raises(JobFailedError) as info:
        enrich(df, _lookup(service.url), capacity=10, parallelism=1, job_name="fails", progress=False)
    message = str(info.value)
    assert "fails/enrich[0/1]" in message and "NotFoundError" in message and "'click_id': 0" in message
    assert isinstance(info.value.__cause__, NotFoundError) or "404" in message


def test_a_result_that_is_not_a_dict_is_a_clear_error(spark):
    async def wrong(row):
        return ["segment", "gold"]

    with pytest.raises(JobFailedError, match=r"must return a dict of columns, got list: \['segment', 'gold'\]"):
        enrich(_clicks(spark, 50), wrong, parallelism=1, progress=False)


def test_results_that_do_not_match_the_output_schema_are_named(spark):
    async def score(row):
        return {"score": "high" if row["click_id"] == 7 else 1.5}

    schema = "click_id long, user_id long, score double"
    with pytest.raises(JobFailedError) as info:
        enrich(_clicks(spark, 50), score, output_schema=schema, parallelism=1, progress=False)
    assert "'score': 'high'" in str(info.value) and "does not fit the output schema" in str(info.value)


def test_hanging_requests_hit_the_timeout_and_get_the_fallback(spark):
    async def hangs_for_some(row):
        if row["click_id"] % 40 == 0:
            await asyncio.sleep(3_600)
        return {"segment": "known"}

    out = enrich(
        _clicks(spark, 400), hangs_for_some, capacity=50, timeout_ms=300, fallback={"segment": "unknown"},
        parallelism=2, progress=False,
    )
    unknown = {r.click_id for r in out.filter("segment = 'unknown'").collect()}
    assert unknown == set(range(0, 400, 40)) and out.count() == 400


def test_blocking_function_enrich_runs_on_ray_tasks(spark):
    def slow_square(row):
        time.sleep(0.005)
        return {"square": row["click_id"] ** 2}

    out = enrich(_clicks(spark, 1_000), slow_square, capacity=100, parallelism=2, progress=False)
    assert sorted((r.click_id, r.square) for r in out.collect()) == [(i, i * i) for i in range(1_000)]


def test_pipeline_from_spark_with_event_time_map_filter_and_async_map(spark):
    from pyspark.sql import functions as F

    df = _clicks(spark, 3_000).withColumn("ts", F.timestamp_millis(F.col("click_id") * 10))

    async def tag(row):
        return [{**row, "tag": f"user-{row['user_id']}"}]

    stream = (
        from_spark(df, timestamp_column="ts", parallelism=2, job_name="pipeline")
        .filter(lambda row: row["click_id"] % 3 == 0)
        .map(lambda row: {**row, "double": row["click_id"] * 2})
        .async_map(tag, ordered=False, capacity=30, parallelism=1)
    )
    out = stream.to_spark(progress=False)
    rows = out.collect()
    assert sorted(r.click_id for r in rows) == list(range(0, 3_000, 3))
    assert all(r.double == 2 * r.click_id and r.tag == f"user-{r.user_id}" for r in rows)


def test_null_event_times_fail_the_run_with_the_column_and_the_count_over_the_whole_dataframe(spark):
    from pyspark.sql import functions as F

    # Nulls at both ends, in different splits and blocks: the count is the DataFrame's, not a block's.
    df = _clicks(spark, 5_000).withColumn(
        "ts", F.when(F.col("click_id").isin(0, 1, 4_999), F.lit(None)).otherwise(F.timestamp_millis(F.col("click_id")))
    )
    stream = from_spark(df, timestamp_column="ts", parallelism=2, batch_size=500)  # lazy, like a Spark transformation
    with pytest.raises(SchemaError, match=r"column 'ts' holds nulls in 3 rows; event time needs a timestamp on every record") as caught:
        stream.map(lambda row: row).to_spark(progress=False)
    assert isinstance(caught.value.__cause__, JobFailedError)  # the job's own failure stays visible


def test_an_empty_dataframe_gives_an_empty_result_with_the_input_columns(spark):
    async def never(row):
        raise AssertionError("no rows, no calls")

    out = enrich(_clicks(spark, 10).filter("click_id < 0"), never, parallelism=1, progress=False)
    assert out.count() == 0 and out.columns == ["click_id", "user_id"]
