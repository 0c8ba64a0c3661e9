"""What a new user gets wrong at the Spark edge: each mistake is one clear error, as early as the
pipeline can know it, naming the argument, the column or the row; or a documented way to go on."""

from __future__ import annotations

import datetime as dt

import pytest

from actorflow.operators import ConfigurationError
from actorflow.spark_bridge import enrich, from_spark

pytestmark = [pytest.mark.spark, pytest.mark.ray]


def _rows(spark, n: int = 6):
    return spark.createDataFrame([(i, f"u{i % 2}", i * 10) for i in range(n)], "id bigint, name string, amount bigint")


# --------------------------------------------------------------------------- 1. numeric arguments


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"capacity": "10"}, "capacity must be an int > 0, got '10' (a str)"),  # the default queue's TypeError before
        ({"capacity": None}, "capacity must be an int > 0, got None (a NoneType)"),
        ({"capacity": True}, "capacity must be an int > 0, got True (a bool)"),
        ({"capacity": 2.5}, "capacity must be an int > 0, got 2.5 (a float)"),
        ({"timeout_ms": "1000"}, "timeout_ms must be an int > 0 or None, got '1000' (a str)"),
        ({"parallelism": "2"}, "parallelism must be an int >= 1 (or None for one per core, up to 4), got '2' (a str)"),
        ({"capacity": 10, "queue_capacity": 5}, "queue_capacity must be an int >= capacity (10), got 5"),
        ({"queue_capacity": "500"}, "queue_capacity must be an int >= capacity (100), got '500' (a str)"),
        ({"batch_size": "8"}, "batch_size must be an int > 0 or None, got '8' (a str)"),
        ({"batch_size": 8, "batch_timeout_ms": 0.5}, "batch_timeout_ms must be an int > 0 or None, got 0.5 (a float)"),
        ({"batch_size": 8, "capacity": "4"}, "capacity (batches in flight) must be > 0, got '4' (a str)"),
        ({"checkpoint_interval_ms": "10s"}, "checkpoint_interval_ms must be an int >= 10, None or 'auto', got '10s'"),
    ],
)
def test_a_numeric_argument_of_enrich_of_the_wrong_type_is_refused_by_name(spark, kwargs, message):
    def add(row):
        return {"x": 1}

    with pytest.raises(ConfigurationError) as caught:
        enrich(_rows(spark), add, progress=False, **kwargs)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda s: s.async_map(_echo, capacity="10"), "capacity must be an int > 0, got '10' (a str)"),
        (lambda s: s.async_map(_echo, max_tasks=None), "max_tasks must be an int > 0, got None"),
        (lambda s: s.async_map(_echo, timeout_ms="5"), "timeout_ms must be an int > 0 or None, got '5' (a str)"),
        (lambda s: s.async_map_batch(_echo, batch_size="8"), "batch_size must be an int > 0, got '8' (a str)"),
        (lambda s: s.map(_echo, parallelism="2"), "parallelism must be an int >= 1, got '2' (a str)"),
    ],
)
def test_a_numeric_argument_of_a_pipeline_of_the_wrong_type_is_refused_by_name(spark, build, message):
    with pytest.raises(ConfigurationError) as caught:
        build(from_spark(_rows(spark), parallelism=1))
    assert message in str(caught.value)


def _echo(value):
    return [value]


# --------------------------------------------------------------------------- 4, 5. window input


def _events(spark):
    rows = [(i, f"u{i % 2}", i * 10, dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=i),
             {"a": i % 2, "b": "x"}, [i % 2]) for i in range(6)]
    return spark.createDataFrame(rows, "id bigint, name string, amount bigint, ts timestamp, "
                                       "st struct<a:int,b:string>, tags array<int>")


# --------------------------------------------------------------------------- 7. null event time


def _with_null_times(spark):
    from pyspark.sql import functions as F

    return _events(spark).withColumn("ts", F.when(F.col("id").isin(2, 4), F.lit(None)).otherwise(F.col("ts")))

