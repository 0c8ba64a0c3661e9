"""The README's windows and pipeline examples run as written, on DataFrames from Spark: the windows give
Spark's own counts, and the pipeline every row it should, enriched."""

from __future__ import annotations

import datetime as dt
import random

import pytest

from tests.readme import readme_example

pytestmark = [pytest.mark.spark, pytest.mark.ray]

BASE_S = 1_760_000_000


async def profile(row):
    # The README's first example asks a service; here the answer comes from the row.
    return {"segment": "gold" if row["user_id"] % 3 == 0 else "silver"}


def test_the_readme_windows_example_counts_per_country_and_minute_as_spark_does(spark):
    from pyspark.sql import functions as F

    rng = random.Random(11)
    rows = sorted(
        ((rng.randrange(100), rng.choice(["DE", "FR", "US"]), rng.randrange(1, 500), rng.randrange(0, 20 * 60_000))
         for _ in range(2_000)),
        key=lambda row: row[3],  # in time order
    )
    clicks = spark.createDataFrame(
        [(user, country, value, dt.datetime.fromtimestamp(BASE_S + ms / 1000, dt.timezone.utc))
         for user, country, value, ms in rows],
        "user_id long, country string, lifetime_value long, ts timestamp",
    ).coalesce(2)
    namespace = {"clicks": clicks, "profile": profile}
    exec(compile(readme_example("late = windowed.get_side_output(\"late\")"), "README", "exec"), namespace)  # noqa: S102

    counts, late = namespace["counts"], namespace["late"]
    theirs = sorted(tuple(r) for r in clicks.groupBy("country", F.window("ts", "1 minute").alias("w"))
                    .agg(F.count("*"), F.sum("lifetime_value")).select("country", "w.start", "w.end", "count(1)",
                                                                       "sum(lifetime_value)").collect())
    ours = sorted(tuple(r) for r in counts.select("country", "window_start", "window_end", "clicks", "value").collect())
    assert ours == theirs
    # In time order nothing is late: an empty DataFrame with the input's columns and types, then why.
    assert late.count() == 0
    assert late.schema.fields[:len(clicks.schema)] == clicks.schema.fields
    assert late.columns[len(clicks.schema):] == ["late_reason", "late_windows", "late_watermark_ms"]


def test_the_readme_pipeline_example_filters_maps_and_enriches_rows_from_spark(spark):
    events = spark.createDataFrame(
        [(i, ["DE", "FR"][i % 2], dt.datetime.fromtimestamp(BASE_S + i * 600, dt.timezone.utc)) for i in range(40)],
        "id long, country string, ts timestamp",
    )

    async def lookup(row):
        return [{**row, "looked_up": row["id"] * 10}]

    namespace = {"events": events, "lookup": lookup}
    exec(compile(readme_example(".filter(lambda row: row[\"country\"] == \"DE\")"), "README", "exec"), namespace)  # noqa: S102

    out = namespace["out"]
    expected = sorted((i, dt.datetime.fromtimestamp(BASE_S + i * 600, dt.timezone.utc).hour, i * 10)
                      for i in range(0, 40, 2))
    assert sorted((r.id, r.hour, r.looked_up) for r in out.collect()) == expected


def _click_files(directory, files: int, per_file: int) -> None:
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(directory, exist_ok=True)
    for k in range(files):
        ids = range(k * per_file, (k + 1) * per_file)
        pq.write_table(pa.table({
            "click_id": pa.array(ids, pa.int64()), "user_id": pa.array([i % 7 for i in ids], pa.int64()),
            "ts": pa.array([(BASE_S + i) * 1_000_000 for i in ids], pa.timestamp("us", tz="UTC"))}),
            os.path.join(directory, f"clicks-{k}.parquet"))
        os.utime(os.path.join(directory, f"clicks-{k}.parquet"), (BASE_S + k, BASE_S + k))


def _in(tmp_path, code: str) -> str:
    for name in ("/data/clicks", "/data/enriched", "/data/counts", "/data/counts-failed", "/data/counts-late",
                 "/chk/enriched", "/chk/counts"):
        code = code.replace(f'"{name}"', repr(str(tmp_path) + name))
    return code


def test_the_readme_stream_examples_enrich_a_stream_and_count_its_windows(spark, tmp_path):
    import actorflow as af

    _click_files(str(tmp_path / "data" / "clicks"), 3, 300)
    # The one-liner, waiting for the input there is instead of for ever, then draining.
    code = _in(tmp_path, readme_example("af.enrich_stream(")).replace(
        "query.await_termination()", "query.process_all_available(); query.stop(drain=True)")
    namespace = {"af": af, "spark": spark, "profile": profile}
    exec(compile(code, "README", "exec"), namespace)  # noqa: S102
    enriched = spark.read.parquet(str(tmp_path / "data" / "enriched"))
    assert sorted((r.click_id, r.segment) for r in enriched.collect()) == [
        (i, "gold" if i % 7 % 3 == 0 else "silver") for i in range(900)]

    async def lookup(row):
        return [row]

    namespace = {"af": af, "spark": spark, "lookup": lookup, "clicks": namespace["clicks"]}
    exec(compile(_in(tmp_path, readme_example(".write_stream(\"/data/counts\"")), "README", "exec"), namespace)  # noqa: S102
    counts = namespace["counts"]
    assert not counts.is_active and counts.last_progress["epoch"] == 0
    # Its dead letters and late clicks are streams of their own, with Spark's file-sink log (none failed).
    assert all((tmp_path / "data" / name / "_spark_metadata").is_dir() for name in ("counts-failed", "counts-late"))
    assert counts.dead_letters().count() == 0
    # Stopped with a final checkpoint: the minutes the watermark closed are out, each exact.
    published = spark.read.parquet(str(tmp_path / "data" / "counts")).collect()
    assert published
    per_user_minute: dict = {}
    for i in range(900):
        minute = (BASE_S + i) // 60 * 60
        per_user_minute[(i % 7, minute)] = per_user_minute.get((i % 7, minute), 0) + 1
    assert {(r.user_id, int(r.window_start.timestamp())): r.n for r in published}.items() <= per_user_minute.items()
