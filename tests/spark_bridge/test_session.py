"""Spark on Ray through RayDP: the session's configuration and the Arrow conversions both ways."""

from __future__ import annotations

import sys

import pyarrow as pa
import pytest
import ray

from actorflow.operators.errors import SchemaError
from actorflow.spark_bridge import arrow_io
from actorflow.spark_bridge.arrow_io import (
    dataframe_to_blocks,
    release_dataframe,
    spark_schema,
    tables_to_dataframe,
)
from actorflow.spark_bridge.session import (
    JVM_OPTIONS,
    SparkSessionError,
    _check_java,
    spark_session,
)

NUM_ROWS = 10_000
NUM_PARTITIONS = 4

# Keys are a permutation of 0..N-1, so row order is not the natural order of any column and a
# sort anywhere along the way would show. Every 97th string and every 89th double is null.
_SOURCE_SQL = f"""
    SELECT
        CAST((id * 7919) % {NUM_ROWS} AS INT)                      AS k,
        CASE WHEN id % 97 = 0 THEN NULL ELSE CONCAT('row-', id) END AS s,
        CASE WHEN id % 89 = 0 THEN NULL ELSE id * 0.25 END          AS d,
        timestamp_millis(1700000000000 + id * 1001)                 AS ts
    FROM range(0, {NUM_ROWS}, 1, {NUM_PARTITIONS})
"""

_RESULT_SCHEMA = pa.schema(
    [
        ("k", pa.int32()),
        ("s", pa.string()),
        ("d", pa.float64()),
        ("ts", pa.timestamp("us", tz="UTC")),
    ]
)


@pytest.fixture(scope="module")
def source_df(spark):
    return spark.sql(_SOURCE_SQL)


@pytest.fixture(scope="module")
def source_blocks(source_df):
    yield dataframe_to_blocks(source_df)
    release_dataframe(source_df)


@pytest.mark.spark
def test_jvm_options_reach_driver_executors_and_app_master(spark):
    conf = spark.sparkContext.getConf()
    for key in (
        "spark.driver.extraJavaOptions",
        "spark.executor.extraJavaOptions",
        "spark.ray.raydp_app_master.extraJavaOptions",
    ):
        given = (conf.get(key) or "").split()
        missing = [option for option in JVM_OPTIONS.split() if option not in given]
        assert not missing, f"{key} lacks {missing}"


@pytest.mark.spark
def test_driver_and_executor_python_is_this_interpreter(spark):
    assert spark.sparkContext.pythonExec == sys.executable
    executables = (
        spark.sparkContext.parallelize([0], 1)
        .map(lambda _: __import__("sys").executable)
        .collect()
    )
    assert executables == [sys.executable]


@pytest.mark.spark
def test_spark_session_is_reused(spark):
    assert spark_session() is spark


@pytest.mark.spark
def test_blocks_follow_spark_partitions_with_exact_row_counts(source_blocks):
    assert [count for _, count in source_blocks] == [NUM_ROWS // NUM_PARTITIONS] * NUM_PARTITIONS
    tables = ray.get([ref for ref, _ in source_blocks])
    assert [table.num_rows for table in tables] == [count for _, count in source_blocks]
    assert tables[0].column_names == ["k", "s", "d", "ts"]


@pytest.mark.spark
@pytest.mark.parametrize(
    "target_partition_bytes, expected_partitions",
    [
        (arrow_io._TARGET_PARTITION_BYTES, 1),  # all four small blocks share one partition
        (1, NUM_PARTITIONS),  # one partition per block: order must hold across partitions
    ],
)
@pytest.mark.parametrize("as_refs", [True, False], ids=["object-refs", "tables"])
def test_round_trip_keeps_content_and_order(
    spark,
    source_df,
    source_blocks,
    monkeypatch,
    target_partition_bytes,
    expected_partitions,
    as_refs,
):
    monkeypatch.setattr(arrow_io, "_TARGET_PARTITION_BYTES", target_partition_bytes)
    refs = [ref for ref, _ in source_blocks]
    tables = refs if as_refs else ray.get(refs)
    schema = ray.get(refs[0]).schema

    result = tables_to_dataframe(spark, tables, schema)

    assert result.rdd.getNumPartitions() == expected_partitions
    assert result.schema == spark_schema(schema)
    expected = source_df.collect()
    got = result.collect()
    assert len(got) == NUM_ROWS
    assert got == expected


@pytest.mark.spark
def test_timestamp_units_and_large_strings_are_converted_for_spark(spark):
    table = pa.table(
        {
            "ts_ms": pa.array([0, 1_500, 86_400_000], type=pa.timestamp("ms")),
            "ts_ns": pa.array([1_000, 2_000_999, 3_000], type=pa.timestamp("ns", tz="UTC")),
            "name": pa.array(["a", None, "c"], type=pa.large_string()),
        }
    )
    out = tables_to_dataframe(spark, [table], table.schema)
    # A naive timestamp is Spark's timestamp_ntz; one with a time zone its timestamp.
    assert dict(out.dtypes) == {"ts_ms": "timestamp_ntz", "ts_ns": "timestamp", "name": "string"}
    rows = out.selectExpr(
        "unix_micros(CAST(ts_ms AS TIMESTAMP)) AS ms", "unix_micros(ts_ns) AS ns", "name"
    ).collect()
    assert [tuple(row) for row in rows] == [
        (0, 1, "a"),
        (1_500_000, 2_000, None),  # nanoseconds below a microsecond are dropped
        (86_400_000_000, 3, "c"),
    ]


@pytest.mark.spark
@pytest.mark.parametrize(
    "make_input",
    [
        lambda schema: [],  # no tables at all
        lambda schema: [schema.empty_table(), schema.empty_table()],  # only empty tables
        lambda schema: [ray.put(schema.empty_table())],  # a reference to an empty table
    ],
    ids=["no-tables", "empty-tables", "empty-ref"],
)
def test_empty_result_has_the_given_schema(spark, make_input):
    schema = _RESULT_SCHEMA
    result = tables_to_dataframe(spark, make_input(schema), schema)
    assert result.collect() == []
    assert result.schema == spark_schema(schema)
    assert result.columns == ["k", "s", "d", "ts"]


@pytest.mark.spark
def test_empty_dataframe_round_trips_to_an_empty_dataframe(spark, source_df):
    empty = source_df.where("k < 0")
    blocks = dataframe_to_blocks(empty)
    assert sum(count for _, count in blocks) == 0
    schema = _RESULT_SCHEMA
    result = tables_to_dataframe(spark, [ref for ref, _ in blocks], schema)
    assert result.count() == 0
    assert result.columns == ["k", "s", "d", "ts"]
    release_dataframe(empty)


@pytest.mark.spark
def test_tables_missing_a_column_are_rejected_before_spark_runs(spark):
    schema = pa.schema([("k", pa.int64()), ("v", pa.string())])
    with pytest.raises(SchemaError, match=r"missing \['v'\]"):
        tables_to_dataframe(spark, [pa.table({"k": [1]})], schema)


@pytest.mark.spark
def test_referenced_tables_that_cannot_be_cast_fail_at_conversion(spark):
    schema = pa.schema([("k", pa.int64())])
    ref = ray.put(pa.table({"k": ["not a number"]}))
    with pytest.raises(SchemaError, match="column 'k' must be castable to int64"):
        tables_to_dataframe(spark, [ref], schema)


@pytest.mark.spark
def test_a_mix_of_tables_and_refs_is_rejected(spark):
    table = pa.table({"k": [1]})
    with pytest.raises(SchemaError, match=r"pyarrow\.Table or all ray\.ObjectRef, got a mix"):
        tables_to_dataframe(spark, [table, ray.put(table)], table.schema)


def test_missing_java_is_reported_with_what_was_expected(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SparkSessionError, match=r"needs a JDK 17 'java' on PATH.*got no 'java'"):
        _check_java()


def test_on_spark_cluster_refuses_a_session_that_already_runs_on_ray(spark):
    from actorflow.spark_bridge import on_spark_cluster
    from actorflow.spark_bridge.session import SparkSessionError

    with pytest.raises(SparkSessionError, match=r"already runs on Ray \(spark_session\(\)\)"):
        on_spark_cluster(spark)
    assert ray.is_initialized()  # the shared Ray was left as it was


def test_a_partition_too_large_for_one_block_is_split_into_ordered_ranges(spark, monkeypatch):
    from actorflow.spark_bridge import enrich

    # 64 KiB instead of 64 MiB: the same split, on a DataFrame a test can afford.
    monkeypatch.setattr(arrow_io, "_MAX_INPUT_PARTITION_BYTES", 64 * 1024)
    df = spark.range(0, 20_000, 1, 1).selectExpr("id", "repeat('p', 50) AS payload")
    blocks = dataframe_to_blocks(df)
    arrow_io.release_dataframe(df)
    assert len(blocks) > 5 and sum(n for _, n in blocks) == 20_000
    ids = [i for ref, _ in blocks for i in ray.get(ref).column("id").to_pylist()]
    assert ids == list(range(20_000))  # consecutive ranges, in order

    async def plus_one(row):
        return {"x": row["id"] + 1}

    out = enrich(df, plus_one, parallelism=2, progress=False, checkpoint_interval_ms=None)
    assert [(r.id, r.x) for r in out.collect()] == [(i, i + 1) for i in range(20_000)]
