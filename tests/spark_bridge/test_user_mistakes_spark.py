"""What a new user gets wrong at the Spark edge: each mistake is one clear error, as early as the
pipeline can know it, naming the argument, the column or the row; or a documented way to go on."""

from __future__ import annotations

import datetime as dt
import warnings

import pytest

from actorflow.operators import ConfigurationError, JobFailedError, SchemaError
from actorflow.operators.windows import Aggregations, Count, Max, Mean, Sum, TumblingEventTimeWindows
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
        ({"batch_size": "8"}, "batch_size must be an int > 0, got '8' (a str)"),
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


# --------------------------------------------------------------------------- 2. column names


def test_a_column_name_that_is_not_a_str_names_the_key_its_type_and_the_row(spark):
    def numbered(row):
        return {1: "x"} if row["id"] == 3 else {"x": "y"}

    out, dead = enrich(_rows(spark), numbered, parallelism=1, on_error="dead_letter", progress=False)
    assert sorted(r.id for r in out.collect()) == [0, 1, 2, 4, 5]
    (letter,) = dead.collect()
    assert letter.id == 3 and letter.error_type == "ResultTypeError"
    assert "column name that is not a str: 1 (int) in {1: 'x'} for row {'id': 3, 'name': 'u1', 'amount': 30}" in letter.error

    with pytest.raises(JobFailedError, match=r"column name that is not a str: 1 \(int\) in \{1: 'x'\} for row \{'id': 3"):
        enrich(_rows(spark), numbered, parallelism=1, progress=False)


def test_a_batch_function_or_a_fallback_with_a_column_name_that_is_not_a_str_is_named(spark):
    def numbered(rows):
        return [{("a", "b"): 1} for _ in rows]

    with pytest.raises(JobFailedError, match=r"column name that is not a str: \('a', 'b'\) \(tuple\)"):
        enrich(_rows(spark), numbered, batch_size=4, parallelism=1, progress=False)
    with pytest.raises(ConfigurationError, match=r"the fallback's column names must be str, got 7 \(int\) in \{7: 'x'\}"):
        enrich(_rows(spark), lambda row: {}, fallback={7: "x"}, progress=False)


def test_a_pipeline_record_with_a_column_name_that_is_not_a_str_fails_naming_it_and_the_row(spark):
    stream = from_spark(_rows(spark), parallelism=1).map(lambda row: {**row, 2.5: "x"})
    with pytest.raises(JobFailedError, match=r"column name 2.5 \(float\) is not a str, in row \{'id': 0"):
        stream.to_spark(progress=False)


def test_a_new_column_that_differs_from_another_only_in_case_is_refused_naming_both(spark):
    def shout(row):
        return {"ID": row["id"] + 1}

    with pytest.raises(SchemaError, match=r"the result has columns 'id' and 'ID', which Spark takes for one column"):
        enrich(_rows(spark), shout, parallelism=1, progress=False)
    # Declared up front, it is refused before the job.
    with pytest.raises(SchemaError, match=r"columns 'name' and 'NAME'"):
        enrich(_rows(spark), shout, output_schema="NAME string", parallelism=1, progress=False)

    spark.conf.set("spark.sql.caseSensitive", "true")
    try:
        out = enrich(_rows(spark), shout, parallelism=1, progress=False)
        assert out.columns == ["id", "name", "amount", "ID"]
        assert sorted((r["id"], r["ID"]) for r in out.collect()) == [(i, i + 1) for i in range(6)]
    finally:
        spark.conf.unset("spark.sql.caseSensitive")


# --------------------------------------------------------------------------- 4, 5. window input


def _events(spark):
    rows = [(i, f"u{i % 2}", i * 10, dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=i),
             {"a": i % 2, "b": "x"}, [i % 2]) for i in range(6)]
    return spark.createDataFrame(rows, "id bigint, name string, amount bigint, ts timestamp, "
                                       "st struct<a:int,b:string>, tags array<int>")


@pytest.mark.parametrize(
    "aggregate, message",
    [
        (lambda w: w.aggregate(Aggregations(total=Sum("nope"))),
         r"aggregate total=Sum\('nope'\): column 'nope' not found; the input has columns \['id', 'name', 'amount', 'ts'"),
        (lambda w: w.aggregate(Sum("nope")), r"aggregate Sum\('nope'\): column 'nope' not found"),
        (lambda w: w.sum("name"),
         r"aggregate name=Sum\('name'\): column 'name' is a string, and sum needs numbers \(integer, floating or "
         r"decimal\); the input has columns \['id', 'name'"),
        (lambda w: w.aggregate(Aggregations(n=Count(), avg=Mean("ts"))),
         r"aggregate avg=Mean\('ts'\): column 'ts' is a timestamp\[us, tz=UTC\], and mean needs numbers"),
        (lambda w: w.aggregate(Aggregations(top=Max("nope"))), r"aggregate top=Max\('nope'\): column 'nope' not found"),
    ],
)
def test_an_aggregation_of_a_missing_or_non_numeric_column_is_refused_when_the_pipeline_is_built(spark, aggregate,
                                                                                                  message):
    windowed = from_spark(_events(spark), timestamp_column="ts", parallelism=1).key_by("name").window(
        TumblingEventTimeWindows.of(size_ms=60_000))
    with pytest.raises(SchemaError, match=message):
        aggregate(windowed)


def test_max_of_a_string_column_is_fine_and_runs(spark):
    out = (from_spark(_events(spark), timestamp_column="ts", parallelism=1).key_by("name")
           .window(TumblingEventTimeWindows.of(size_ms=60_000)).aggregate(Aggregations(top=Max("name")))
           .to_spark(progress=False))
    assert sorted((r["name"], r.top) for r in out.collect()) == [("u0", "u0"), ("u1", "u1")]


@pytest.mark.parametrize(
    "key, message",
    [
        ("st", r"key_by: key column 'st' is a struct<a: int32, b: string>, which cannot key a record; select its "
               r"fields as columns \(df.select\('\*', 'st.\*'\)\) and key by a tuple of them, e.g. key_by\(\('a', 'b'\)\)"),
        (("name", "tags"), r"key_by: key column 'tags' is a list<element: int32>, which cannot key a record; key by a "
                           r"tuple of scalar columns"),
    ],
)
def test_a_struct_or_array_key_column_is_refused_when_the_pipeline_is_built_with_a_hint(spark, key, message):
    stream = from_spark(_events(spark), timestamp_column="ts", parallelism=1)
    with pytest.raises(SchemaError, match=message):
        stream.key_by(key)


# --------------------------------------------------------------------------- 6. date event time


def test_windows_over_a_date_column_have_timestamp_bounds_as_spark_window_gives(spark):
    from pyspark.sql import functions as F

    df = spark.createDataFrame([(i, "k", dt.date(2024, 1, 1 + i % 3)) for i in range(9)], "id bigint, k string, day date")
    out = (from_spark(df, timestamp_column="day", parallelism=1).key_by("k")
           .window(TumblingEventTimeWindows.of(size_ms=86_400_000)).count().to_spark(progress=False))
    spark_bounds = df.groupBy(F.window("day", "1 day")).count().select("window.start", "window.end")
    assert dict(out.dtypes)["window_start"] == dict(spark_bounds.dtypes)["start"] == "timestamp"
    assert dict(out.dtypes)["window_end"] == "timestamp"
    assert sorted((r.window_start, r.window_end) for r in out.collect()) == sorted(
        (r.start, r.end) for r in spark_bounds.collect())
    assert sorted(r["count"] for r in out.collect()) == [3, 3, 3]


# --------------------------------------------------------------------------- 7. null event time


def _with_null_times(spark):
    from pyspark.sql import functions as F

    return _events(spark).withColumn("ts", F.when(F.col("id").isin(2, 4), F.lit(None)).otherwise(F.col("ts")))


def test_a_null_event_time_fails_the_job_by_default_naming_a_row_and_the_option(spark):
    stream = from_spark(_with_null_times(spark).drop("st", "tags"), timestamp_column="ts", parallelism=1)
    with pytest.raises(SchemaError) as caught:
        stream.key_by("name").window(TumblingEventTimeWindows.of(size_ms=60_000)).count().to_spark(progress=False)
    message = str(caught.value)
    assert "column 'ts' holds nulls in 2 rows; event time needs a timestamp on every record" in message
    assert "The first: {'id': 2, 'name': 'u0', 'amount': 20, 'ts': None}" in message
    assert "null_timestamps='dead_letter'" in message


def test_rows_without_an_event_time_can_go_to_the_dead_letters_with_the_reason(spark):
    stream = from_spark(_with_null_times(spark).drop("st", "tags"), timestamp_column="ts", parallelism=1,
                        null_timestamps="dead_letter")
    counted = stream.key_by("name").window(TumblingEventTimeWindows.of(size_ms=60_000)).count()
    out, dead = counted.to_spark(progress=False, dead_letters=True)
    assert sorted((r["name"], r["count"]) for r in out.collect()) == [("u0", 1), ("u1", 3)]  # ids 2 and 4 (u0) have none
    assert dead.columns == ["id", "name", "amount", "ts", "error_type", "error", "attempts", "operator", "request_key"]
    letters = sorted(dead.collect())
    assert [(r.id, r.ts, r.error_type, r.attempts, r.operator) for r in letters] == [
        (2, None, "SchemaError", 0, "from_spark"), (4, None, "SchemaError", 0, "from_spark")]
    assert letters[0].error == "column 'ts' is null; event time needs a timestamp on every record"

    with pytest.raises(ConfigurationError, match=r"2 records went to dead letters; call to_spark\(dead_letters=True\)"):
        counted.to_spark(progress=False)
    with pytest.raises(ConfigurationError, match="null_timestamps must be 'fail' or 'dead_letter', got 'skip'"):
        from_spark(_rows(spark), timestamp_column="amount", null_timestamps="skip")


# --------------------------------------------------------------------------- 8. untyped new columns


def test_a_new_column_none_in_every_row_becomes_string_with_a_warning_or_takes_the_declared_type(spark, tmp_path):
    def nothing(row):
        return {"segment": None, "tags": [], "n": row["id"]}

    with pytest.warns(UserWarning, match=r"columns \['segment', 'tags'\] were None \(or empty\) in every row, so they "
                                         r"have no type; they become string.*output_schema=\"segment string\""):
        out = enrich(_rows(spark), nothing, parallelism=1, progress=False)
    assert dict(out.dtypes)["segment"] == "string" and dict(out.dtypes)["tags"] == "array<string>"
    out.write.parquet(str(tmp_path / "guessed"))  # Spark's void could not be written
    assert sorted(r.n for r in spark.read.parquet(str(tmp_path / "guessed")).collect()) == list(range(6))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = enrich(_rows(spark), nothing, output_schema="segment int, tags array<bigint>", parallelism=1,
                     progress=False)
    assert not [w for w in caught if "no type" in str(w.message)]  # declared: nothing to warn of
    assert dict(out.dtypes)["segment"] == "int" and dict(out.dtypes)["tags"] == "array<bigint>"
    out.write.parquet(str(tmp_path / "declared"))
    back = spark.read.parquet(str(tmp_path / "declared"))
    assert back.count() == 6 and {r.segment for r in back.collect()} == {None}


def test_a_void_column_of_the_input_is_passed_through(spark):
    from pyspark.sql import functions as F

    df = _rows(spark).withColumn("nothing", F.lit(None))
    out = enrich(df, lambda row: {"x": 1}, parallelism=1, progress=False)
    assert out.columns == ["id", "name", "amount", "nothing", "x"] and out.count() == 6

