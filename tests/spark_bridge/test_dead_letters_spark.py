"""rerun_dead_letters(): the dead letters of an earlier enrich() run again through the same
function, each once, with the idempotency keys their requests had, against a real service."""

from __future__ import annotations

import pytest

from actorflow.operators import ConfigurationError
from actorflow.operators.request_keys import current_request_key
from actorflow.spark_bridge import enrich, rerun_dead_letters
from examples.enrich_service import EnrichmentService, http_session, lookup_user, user_profile


def _clicks(spark, n):
    from pyspark.sql import functions as F

    return spark.range(n).withColumnRenamed("id", "click_id").withColumn("user_id", F.col("click_id") % 20)


def _segment(url):
    async def segment(row):
        user = await lookup_user(http_session(), url, row["user_id"], idempotency_key=current_request_key())
        return {"segment": user["segment"]}

    return segment


def test_dead_letters_run_again_once_each_with_the_keys_of_their_requests(spark):
    with EnrichmentService(latency_ms_median=2, latency_sigma=0.2, failure_rate=0.0, hang_rate=0.0) as svc:
        svc.set_failing_users([3, 7])  # their shard is down: 503 at once
        out, dead = enrich(_clicks(spark, 200), _segment(svc.url), on_error="dead_letter", parallelism=2,
                           progress=False)
        good, letters = out.collect(), dead.collect()
        assert sorted(r.user_id for r in letters) == [3] * 10 + [7] * 10
        keys = {r.request_key for r in letters}
        assert len(keys) == 20 and all(k.count("/") >= 2 for k in keys)
        first_calls = svc.calls_by_key()
        assert all(first_calls[k] == 1 for k in keys)  # one attempt each: no retry strategy

        svc.set_failing_users([])  # the shard is back
        # The same dead letters twice over (read twice, say): each runs once.
        again = rerun_dead_letters(dead.unionByName(dead), _segment(svc.url), parallelism=2, progress=False)
        rows = again.collect()
        calls, answered = svc.calls_by_key(), svc.answered_by_key()

    assert again.columns == ["click_id", "user_id", "segment"]  # the columns of the first run's output
    assert sorted(r.click_id for r in rows) == sorted(r.click_id for r in letters)
    assert all(r.segment == user_profile(r.user_id)["segment"] for r in rows)
    # Each dead letter's key reached the service once more, and was answered once in all: the
    # work a de-duplicating service does for each key is done exactly once over both runs.
    assert all(calls[k] == 2 for k in keys)
    assert {k for k, n in answered.items() if n} == keys | {k for k in first_calls if k not in keys}
    assert all(n == 1 for n in answered.values())
    assert len(good) + len(rows) == 200


def test_dead_letters_that_fail_again_come_back_with_the_same_keys(spark):
    with EnrichmentService(latency_ms_median=2, latency_sigma=0.2, failure_rate=0.0, hang_rate=0.0) as svc:
        svc.set_failing_users([5])
        _, dead = enrich(_clicks(spark, 40), _segment(svc.url), on_error="dead_letter", progress=False)
        keys = sorted(r.request_key for r in dead.collect())
        out, still_dead = rerun_dead_letters(dead, _segment(svc.url), on_error="dead_letter", progress=False)
        assert out.count() == 0
        assert still_dead.columns == dead.columns
        assert sorted(r.request_key for r in still_dead.collect()) == keys


def test_what_is_not_a_dead_letter_dataframe_is_refused_before_any_job(spark):
    with pytest.raises(ConfigurationError, match=r"takes the dead letters of enrich\(on_error='dead_letter'\)"):
        rerun_dead_letters(_clicks(spark, 3), _segment("http://127.0.0.1:9"), progress=False)
    from pyspark.sql import functions as F

    keyless = _clicks(spark, 3).select(
        "*", F.lit("SchemaError").alias("error_type"), F.lit("no time").alias("error"), F.lit(0).cast("bigint").alias("attempts"),
        F.lit("from_spark").alias("operator"), F.lit(None).cast("string").alias("request_key"))
    with pytest.raises(ConfigurationError, match=r"3 dead letter\(s\) have no 'request_key'"):
        rerun_dead_letters(keyless, _segment("http://127.0.0.1:9"), progress=False)
