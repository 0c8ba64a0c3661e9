"""``enrich(batch_size=...)``: a Spark DataFrame in, rows enriched a batch at a time, a DataFrame
out, checked row for row."""

from __future__ import annotations

import asyncio
import time

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from actorflow.operators import ConfigurationError, arrow_batch
from actorflow.spark_bridge import enrich

pytestmark = [pytest.mark.spark, pytest.mark.ray]


def _clicks(spark, n):
    from pyspark.sql import functions as F

    df = spark.range(n).withColumnRenamed("id", "click_id").withColumn("user_id", F.col("click_id") % 500)
    return df.repartitionByRange(3, "click_id")


def test_enrich_in_batches_returns_every_row_enriched_in_input_order(spark):
    async def segments(rows):
        await asyncio.sleep(0.001 * (rows[0]["click_id"] % 7))  # batches complete out of order
        return [{"segment": f"s{r['user_id'] % 7}", "batch_rows": len(rows)} for r in rows]

    df = _clicks(spark, 3_000)
    out = enrich(df, segments, batch_size=64, batch_timeout_ms=20, capacity=4, parallelism=2, progress=False)
    rows = out.collect()
    assert out.columns == ["click_id", "user_id", "segment", "batch_rows"]
    expected = [(r.click_id, r.user_id, f"s{r.user_id % 7}") for r in df.collect()]
    assert [(r.click_id, r.user_id, r.segment) for r in rows] == expected
    assert max(r.batch_rows for r in rows) == 64


def test_enrich_in_blocking_batches_gives_fallbacks_and_dead_letters_per_row(spark):
    def segments(rows):
        ids = {r["click_id"] for r in rows}
        if 1_000 in ids:
            time.sleep(60)  # this batch hangs past its deadline
        if 2_000 in ids:
            raise LookupError("the batch with click 2000 failed")
        return [{"segment": "service"} for _ in rows]

    df = _clicks(spark, 3_000)
    out, dead = enrich(
        # The deadline leaves room for Ray to start the task workers on a loaded machine.
        df, segments, batch_size=50, capacity=3, parallelism=1, timeout_ms=15_000,
        fallback={"segment": "fallback"}, on_error="dead_letter", progress=False,
    )
    rows = out.collect()
    hung = set(range(1_000, 1_050))
    failed = set(range(2_000, 2_050))
    # One outcome per row: each row of the hung batch its fallback, of the failed batch its dead letter.
    assert [r.click_id for r in rows] == [i for i in range(3_000) if i not in failed]
    assert {r.click_id for r in rows if r.segment == "fallback"} == hung
    assert all(r.segment == "service" for r in rows if r.click_id not in hung)
    letters = dead.collect()
    assert sorted(r.click_id for r in letters) == sorted(failed)
    assert {r.error_type for r in letters} == {"LookupError"} and {r.attempts for r in letters} == {1}


def test_enrich_with_an_arrow_batch_function(spark):
    def segments(table: pa.Table) -> pa.Table:
        return pa.table({"bucket": pc.multiply(table["user_id"], 10)})

    df = _clicks(spark, 1_000)
    rows = enrich(df, arrow_batch(segments), batch_size=128, capacity=2, parallelism=1, progress=False).collect()
    assert [(r.click_id, r.bucket) for r in rows] == [(i, (i % 500) * 10) for i in range(1_000)]


@pytest.mark.parametrize(
    "result, message",
    [
        # a dict of columns for the whole batch, not one per row
        ({"segment": "gold"}, "must return a list of one dict per row; got dict for a batch of 10 rows"),
        # one dict short
        ([{"segment": "gold"}] * 9, "must return a list of one dict per row; got 9 items for a batch of 10 rows"),
        # a row's item is not a dict
        (["gold"] * 10, "the enrich function must return a dict of columns, got str"),
    ],
)
def test_a_batch_result_of_the_wrong_shape_is_a_dead_letter_for_each_row(spark, result, message):
    async def segments(rows):
        return result

    out, dead = enrich(_clicks(spark, 10), segments, batch_size=10, parallelism=1, on_error="dead_letter",
                       progress=False)
    letters = dead.collect()
    assert out.count() == 0 and sorted(r.click_id for r in letters) == list(range(10))
    assert all(r.error_type == "ResultTypeError" and message in r.error for r in letters)

@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"batch_timeout_ms": 10}, "batch_timeout_ms needs batch_size, got batch_timeout_ms=10 without it"),
        ({"batch_size": 0}, "batch_size must be an int > 0, got 0"),
    ],
)
def test_bad_batch_arguments_are_clear_errors(spark, kwargs, message):
    async def segments(rows):
        return [{} for _ in rows]

    with pytest.raises(ConfigurationError) as info:
        enrich(_clicks(spark, 10), segments, progress=False, **kwargs)
    assert message in str(info.value)
