"""Windows through RayDP against Spark's own: the same rows, equal results, row for row.

Tumbling and sliding windows are compared with ``groupBy(window(...))``, sessions with
``session_window(...)``, on input in time order and shuffled within the out-of-orderness bound,
keyed by a string and by an integer, at parallelism 2.
"""

from __future__ import annotations

import datetime as dt
import random

import pytest

from actorflow.operators import ConfigurationError, JobFailedError, SchemaError
from actorflow.operators.windows import EventTimeSessionWindows, SlidingEventTimeWindows, TumblingEventTimeWindows
from actorflow.spark_bridge import from_spark

pytestmark = [pytest.mark.spark, pytest.mark.ray]

BASE_S = 1_760_000_000
OUT_OF_ORDERNESS_MS = 5_000
COUNTRIES = ["DE", "FR", "US", "BR", "JP"]


def _events(n: int, seed: int, *, session_gap_ms: int | None = None) -> list[tuple]:
    """``n`` clicks over 40 minutes; with ``session_gap_ms``, no two clicks of one user (or one
    country) are exactly a gap apart, where Spark and Flink could disagree about touching."""
    rng = random.Random(seed)
    while True:
        rows = []
        for i in range(n):
            ms = rng.randrange(0, 40 * 60_000)
            rows.append((i, COUNTRIES[rng.randrange(len(COUNTRIES))], rng.randrange(50), rng.randrange(1, 100), ms))
        if session_gap_ms is None or not _touching(rows, session_gap_ms):
            return rows
        seed += 1_000


def _touching(rows: list[tuple], gap_ms: int) -> bool:
    for position in (1, 2):
        by_key: dict = {}
        for row in rows:
            by_key.setdefault(row[position], []).append(row[4])
        for times in by_key.values():
            times.sort()
            if any(b - a == gap_ms for a, b in zip(times, times[1:])):
                return True
    return False


def _dataframe(spark, rows: list[tuple], *, shuffled: bool, seed: int = 7):
    """A DataFrame in time order, or shuffled so that no row comes after one more than the
    out-of-orderness bound later than it (ordered by time plus a jitter below the bound)."""

    rng = random.Random(seed)
    data = [
        (click_id, country, user_id, amount, dt.datetime.fromtimestamp(BASE_S + ms / 1000, dt.timezone.utc),
         ms + (rng.randrange(OUT_OF_ORDERNESS_MS) if shuffled else 0))
        for click_id, country, user_id, amount, ms in rows
    ]
    df = spark.createDataFrame(data, "click_id long, country string, user_id long, amount long, ts timestamp, o long")
    return df.repartitionByRange(4, "o").sortWithinPartitions("o").drop("o")


def _actorflow(df, key: str, window, *, aggregate: str = "count_and_sum"):
    stream = (
        from_spark(df, timestamp_column="ts", out_of_orderness_ms=OUT_OF_ORDERNESS_MS, parallelism=2)
        .key_by(key)
        .window(window)
    )
    from actorflow.operators.windows import Aggregations, Count, Sum

    out = stream.aggregate(Aggregations(n=Count(), total=Sum("amount"))).to_spark(progress=False)
    return sorted(tuple(r) for r in out.select(key, "window_start", "window_end", "n", "total").collect())


def _spark_windows(df, key: str, window_column):
    from pyspark.sql import functions as F

    out = df.groupBy(key, window_column.alias("w")).agg(F.count("*").alias("n"), F.sum("amount").alias("total"))
    return sorted(tuple(r) for r in out.select(key, "w.start", "w.end", "n", "total").collect())


@pytest.mark.parametrize("shuffled", [False, True], ids=["in_order", "shuffled"])
@pytest.mark.parametrize("key", ["country", "user_id"])  # a string key and an integer key
def test_tumbling_windows_equal_spark_group_by_window(spark, key, shuffled):
    from pyspark.sql import functions as F

    df = _dataframe(spark, _events(3_000, seed=1), shuffled=shuffled).cache()
    ours = _actorflow(df, key, TumblingEventTimeWindows.of(size_ms=60_000))
    theirs = _spark_windows(df, key, F.window("ts", "1 minute"))
    assert len(ours) > 40
    assert ours == theirs


def test_a_window_of_null_amounts_sums_to_null_as_in_spark(spark):
    from pyspark.sql import functions as F

    # Every amount of the users divisible by 5 is null, and one in four of the others': their
    # windows sum to null, and to the sum of the rest, as Spark's sum() does.
    rows = [(i, c, u, None if u % 5 == 0 or i % 4 == 0 else a, ms) for i, c, u, a, ms in _events(2_000, seed=6)]
    df = _dataframe(spark, rows, shuffled=True).cache()
    ours = _actorflow(df, "user_id", TumblingEventTimeWindows.of(size_ms=60_000))
    theirs = _spark_windows(df, "user_id", F.window("ts", "1 minute"))
    assert any(r[-1] is None for r in theirs) and any(r[-1] is not None for r in theirs)
    assert ours == theirs


@pytest.mark.parametrize("shuffled", [False, True], ids=["in_order", "shuffled"])
@pytest.mark.parametrize("key", ["country", "user_id"])
def test_sliding_windows_equal_spark_group_by_sliding_window(spark, key, shuffled):
    from pyspark.sql import functions as F

    df = _dataframe(spark, _events(2_000, seed=2), shuffled=shuffled).cache()
    ours = _actorflow(df, key, SlidingEventTimeWindows.of(size_ms=120_000, slide_ms=30_000))
    theirs = _spark_windows(df, key, F.window("ts", "2 minutes", "30 seconds"))
    assert ours == theirs


@pytest.mark.parametrize("shuffled", [False, True], ids=["in_order", "shuffled"])
@pytest.mark.parametrize("key", ["country", "user_id"])
def test_session_windows_equal_spark_session_window(spark, key, shuffled):
    from pyspark.sql import functions as F

    gap_ms = 30_000
    df = _dataframe(spark, _events(1_500, seed=3, session_gap_ms=gap_ms), shuffled=shuffled).cache()
    ours = _actorflow(df, key, EventTimeSessionWindows.with_gap(gap_ms))
    theirs = _spark_windows(df, key, F.session_window("ts", "30 seconds"))
    assert len(ours) > 30  # many sessions, not one per key
    assert ours == theirs


def test_window_bounds_are_spark_timestamps_and_keys_keep_their_type(spark):
    df = _dataframe(spark, _events(200, seed=4), shuffled=False)
    out = (
        from_spark(df, timestamp_column="ts", parallelism=2)
        .key_by("user_id").window(TumblingEventTimeWindows.of(60_000)).count().to_spark(progress=False)
    )
    types = dict(out.dtypes)
    assert (types["user_id"], types["window_start"], types["window_end"], types["count"]) == (
        "bigint", "timestamp", "timestamp", "bigint")


def test_late_records_come_back_in_their_own_dataframe_with_the_input_types(spark):
    from pyspark.sql import functions as F

    rows = _events(1_000, seed=5)
    # Three clicks arrive 20 minutes after their time, far beyond the bound and the lateness.
    late_ids = {1_000_001, 1_000_002, 1_000_003}
    late_rows = [(i, "DE", 1, 10, 60_000 * 2 + i % 7) for i in sorted(late_ids)]
    df = _dataframe(spark, rows, shuffled=False)
    late_df = spark.createDataFrame(
        [(i, c, u, a, dt.datetime.fromtimestamp(BASE_S + ms / 1000, dt.timezone.utc)) for i, c, u, a, ms in late_rows],
        df.schema,
    )
    data = df.union(late_df).coalesce(1).cache()  # the late clicks come last, at the end of the input
    counts = (
        # Small batches: a watermark follows each, so the late clicks meet one far past their windows.
        from_spark(data, timestamp_column="ts", out_of_orderness_ms=OUT_OF_ORDERNESS_MS, parallelism=2, batch_size=100)
        .key_by("country")
        .window(TumblingEventTimeWindows.of(60_000))
        .allowed_lateness(30_000)
        .side_output_late_data("late")
        .count()
    )
    out = counts.to_spark(progress=False)
    late = counts.get_side_output("late")
    # Its own columns with their types, then the windows it missed, why, and the watermark it met.
    assert late.schema.fields[:len(data.schema)] == data.schema.fields
    assert [(f.name, f.dataType.simpleString()) for f in late.schema.fields[len(data.schema):]] == [
        ("late_reason", "string"), ("late_windows", "array<struct<start_ms:bigint,end_ms:bigint>>"),
        ("late_watermark_ms", "bigint")]
    collected = late.collect()
    assert sorted(r.click_id for r in collected) == sorted(late_ids)
    for r in collected:
        start = (BASE_S * 1000 + 60_000 * 2 + r.click_id % 7) // 60_000 * 60_000
        assert r.late_reason == "past_allowed_lateness"
        assert [(w.start_ms, w.end_ms) for w in r.late_windows] == [(start, start + 60_000)]
        assert r.late_watermark_ms >= start + 60_000 + 30_000 - 1  # past the window's end and its lateness
    assert "3 late records (past_allowed_lateness 3)" in repr(counts.last_result)
    on_time = data.filter(~F.col("click_id").isin(list(late_ids)))
    theirs = sorted(tuple(r) for r in on_time.groupBy("country", F.window("ts", "1 minute").alias("w"))
                    .count().select("country", "w.start", "w.end", "count").collect())
    ours = sorted(tuple(r) for r in out.select("country", "window_start", "window_end", "count").collect())
    assert ours == theirs


def test_bad_input_fails_with_an_error_naming_the_column(spark):
    df = _dataframe(spark, _events(50, seed=6), shuffled=False)
    with pytest.raises(SchemaError, match="'region'"):
        from_spark(df, timestamp_column="ts", parallelism=2).key_by("region")
    with pytest.raises(ConfigurationError, match="timestamp_column"):
        from_spark(df, parallelism=2).key_by("country").window(TumblingEventTimeWindows.of(60_000))
    with pytest.raises(ConfigurationError, match="size_ms must be > 0, got 0"):
        TumblingEventTimeWindows.of(size_ms=0)

    def explode(key, context, elements):
        raise RuntimeError("boom")

    stream = from_spark(df, timestamp_column="ts", parallelism=2).key_by("country") \
        .window(TumblingEventTimeWindows.of(60_000)).process(explode)
    with pytest.raises(JobFailedError, match=r"window function raised RuntimeError: boom for key '\w\w' in window TimeWindow"):
        stream.to_spark(progress=False)
