"""Every row exactly right at the edges, DataFrame to DataFrame through RayDP: types, names, nulls."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from actorflow.operators import ConfigurationError, JobFailedError
from actorflow.spark_bridge import enrich, enrich_stream, from_spark

pytestmark = [pytest.mark.spark, pytest.mark.ray]

ALL_TYPES = (
    "id bigint, t tinyint, s smallint, i int, f float, d double, dec decimal(38,18), money decimal(10,2), "
    "str string, bin binary, flag boolean, day date, at timestamp, local timestamp_ntz, ints array<int>, "
    "m map<string,int>, st struct<a:int,b:array<float>>, deep struct<name:string,tags:map<string,smallint>>"
)


def _all_types(spark):
    rows = [
        (
            1, 7, -300, 2**31 - 1, 1.5, 2.25, Decimal("12.345678901234567890"), Decimal("-0.05"), "é", b"\x00\xff",
            True, dt.date(2024, 2, 29), dt.datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=dt.timezone.utc),
            dt.datetime(2024, 1, 2, 3, 4, 5, 678901), [1, None, 3], {"k": 1, "j": None},
            {"a": 1, "b": [0.5, None]}, {"name": "x", "tags": {"t": 2}},
        ),
        tuple([2] + [None] * 17),  # every column null but the key
    ]
    return spark.createDataFrame(rows, ALL_TYPES).repartition(1)


@pytest.mark.parametrize("kind", ["async", "blocking"])
def test_every_spark_type_comes_back_exactly_with_its_type_and_value(spark, kind):
    df = _all_types(spark)

    async def add_async(row):
        return {"new": row["id"] * 10}

    def add_blocking(row):
        return {"new": row["id"] * 10}

    out = enrich(df, add_async if kind == "async" else add_blocking, parallelism=1, progress=False)
    assert out.schema.simpleString() == df.schema.simpleString()[:-1] + ",new:bigint>"
    expected = sorted(df.collect())
    got = sorted(out.collect())
    assert [r[:-1] for r in got] == [tuple(r) for r in expected]
    assert [r.new for r in got] == [10, 20]


def test_odd_and_internal_looking_column_names_are_plain_columns(spark):
    names = ["__ts", "value", "error", "attempts", "operator", "error_type", "with space", "ÿ"]
    df = spark.createDataFrame([(i, *[f"{n}-{i}" for n in names]) for i in range(20)], ["id", *names])

    async def echo(row):
        if row["id"] == 3:
            raise KeyError("not for three")
        return {"__ts": row["__ts"] + "!", "new": 1}

    out, dead = enrich(df, echo, on_error="dead_letter", parallelism=2, progress=False)
    assert out.columns == ["id", *names, "new"]
    good = {r["id"]: r for r in out.collect()}
    assert sorted(good) == [i for i in range(20) if i != 3]
    assert good[5]["__ts"] == "__ts-5!" and good[5]["with space"] == "with space-5"
    assert dead.columns == ["id", *names, "dead_letter_error_type", "dead_letter_error", "dead_letter_attempts",
                            "dead_letter_operator", "request_key"]
    (letter,) = dead.collect()
    assert letter["id"] == 3 and letter["error"] == "error-3" and letter["dead_letter_error_type"] == "KeyError"
    assert letter["attempts"] == "attempts-3" and letter["dead_letter_attempts"] == 1


def test_a_dataframe_with_a_column_name_twice_is_refused_before_any_job_naming_it(spark):
    from pyspark.sql import functions as F

    from actorflow.operators import SchemaError

    df = spark.range(3).select(F.col("id"), F.col("id"), F.lit("a").alias("s"))
    for build in (lambda: enrich(df, lambda row: {"x": 1}, progress=False),
                  lambda: from_spark(df).map(lambda row: row).to_spark(progress=False)):
        with pytest.raises(SchemaError, match=r"has column 'id' 2 times; .* rename"):
            build()


def test_an_async_generator_or_a_plain_function_returning_a_coroutine_is_named(spark):
    import asyncio

    async def streaming(row):
        yield {"x": 1}

    with pytest.raises(ConfigurationError, match=r"streaming at 0x\w+> is an async generator"):
        enrich(spark.range(3), streaming, progress=False)
    with pytest.raises(JobFailedError, match="got coroutine.*declare it async def and await the call"):
        enrich(spark.range(3), lambda row: asyncio.sleep(0, {"x": 1}), parallelism=1, progress=False)


def test_a_column_with_mixed_types_fails_naming_the_column_both_types_and_a_row(spark):
    async def mixed(row):
        return {"x": "s1" if row["id"] % 7 == 3 else row["id"]}

    with pytest.raises(JobFailedError) as info:
        enrich(spark.range(50), mixed, parallelism=1, progress=False)
    message = str(info.value)
    assert "column 'x' holds" in message and "int" in message and "str" in message and "'x': 's1'" in message


def test_ints_and_floats_in_one_new_column_widen_to_double(spark):
    async def half(row):
        return {"x": row["id"] / 2 if row["id"] % 2 else row["id"] // 2}

    out = enrich(spark.range(10).repartition(1), half, parallelism=1, progress=False)
    assert dict(out.dtypes)["x"] == "double"
    assert sorted((r.id, r.x) for r in out.collect()) == [(i, i / 2) for i in range(10)]


def test_an_empty_dataframe_keeps_input_types_and_the_new_columns_of_the_output_schema(spark):
    df = _all_types(spark).filter("id < 0")

    async def never(row):
        raise AssertionError("no rows, no calls")

    out = enrich(df, never, output_schema="score double, label string", parallelism=1, progress=False)
    assert out.count() == 0
    assert out.schema.simpleString() == df.schema.simpleString()[:-1] + ",score:double,label:string>"


def test_event_times_with_microseconds_are_truncated_to_milliseconds(spark):
    from pyspark.sql import functions as F

    df = spark.range(100).withColumn("ts", F.timestamp_micros(F.col("id") * 1_000 + 999))
    async def keep(row):
        return [row]

    out = from_spark(df, timestamp_column="ts", parallelism=1).async_map(keep).to_spark(progress=False)
    seen = sorted((r.id, r.ts) for r in out.collect())
    # The rows keep their microseconds; only the event time the runtime uses is in milliseconds.
    assert len(seen) == 100 and seen[5] == (5, dt.datetime(1970, 1, 1, 0, 0, 0, 5_999))


def test_parallelism_zero_is_named(spark):
    with pytest.raises(ConfigurationError, match=r"parallelism must be an int >= 1 .*got 0"):
        enrich(spark.range(3), lambda row: {}, parallelism=0)


def test_a_failing_fallback_says_it_was_the_fallback(spark):
    import asyncio

    async def hangs(row):
        await asyncio.sleep(3_600)

    with pytest.raises(JobFailedError, match=r"the timeout fallback raised KeyError: 'missing'"):
        enrich(spark.range(3), hangs, timeout_ms=100, fallback=lambda row: {"x": row["missing"]},
               parallelism=1, progress=False)


@pytest.mark.parametrize("nested", [False, True], ids=["scalar-columns", "nested-columns"])
def test_a_function_that_changes_its_row_does_not_change_what_its_retry_sees(spark, nested):
    from actorflow.operators import FixedDelay

    schema = "id bigint, name string, tags array<string>" if nested else "id bigint, name string"
    df = spark.createDataFrame([(i, f"n{i}", ["a"]) if nested else (i, f"n{i}") for i in range(6)], schema)
    attempts: dict[int, int] = {}  # in the actor: parallelism 1 makes it one dict for all rows

    async def careless(row):
        attempts[row["id"]] = attempts.get(row["id"], 0) + 1
        seen = {"seen_name": row["name"], "seen_tags": list(row["tags"]) if nested else None}
        row["name"] = "changed"  # changes its argument, at the top level and inside
        if nested:
            row["tags"].append("changed")
        if attempts[row["id"]] == 1:
            raise ConnectionError("503")  # each row's first attempt fails after the change
        return {**seen, "attempt": attempts[row["id"]]}

    out = enrich(df, careless, retry=FixedDelay(2, 1), parallelism=1, progress=False, timeout_ms=10_000)
    got = sorted((r.id, r.seen_name, r.seen_tags, r.attempt) for r in out.collect())
    assert got == [(i, f"n{i}", ["a"] if nested else None, 2) for i in range(6)]


def test_a_streaming_dataframe_is_refused_by_enrich_and_enrich_stream_enriches_each_micro_batch(spark, tmp_path):
    source = str(tmp_path / "in")
    spark.range(30).repartition(2).write.parquet(source)
    stream = spark.readStream.schema("id long").parquet(source)
    with pytest.raises(ConfigurationError, match=r"got a streaming one \(readStream\); start a streaming query instead: "
                                                 r"enrich_stream\(df, fn, path, checkpoint_location=...\)"):
        enrich(stream, lambda row: {"x": 1}, progress=False)
    with pytest.raises(ConfigurationError, match=r"enrich_stream\(\) reads a streaming DataFrame .* call enrich\(\)"):
        enrich_stream(spark.range(3), lambda row: {"x": 1}, str(tmp_path / "o"), checkpoint_location=str(tmp_path / "c"))

    async def plus_one(row):
        return {"x": row["id"] + 1}

    sink = str(tmp_path / "out")
    query = enrich_stream(stream, plus_one, sink, checkpoint_location=str(tmp_path / "checkpoint"), output_schema="x long")
    query.process_all_available()
    query.stop(drain=True)
    assert query.exception() is None
    assert sorted(tuple(r) for r in spark.read.parquet(sink).collect()) == [(i, i + 1) for i in range(30)]
