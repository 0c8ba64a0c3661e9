"""The README's examples run as written, on DataFrames from Spark: the enrichment asks a real service on
127.0.0.1 for every row, the windows give Spark's own counts, and the stream every row once."""

from __future__ import annotations

import datetime as dt
import random

import pytest

from tests.docs import in_folder, readme_example

pytestmark = [pytest.mark.spark, pytest.mark.ray]

BASE_S = 1_760_000_000


async def profile(row):
    # The README's first example asks a service; here the answer comes from the row.
    return {"segment": "gold" if row["user_id"] % 3 == 0 else "silver"}


def test_the_readme_enrich_example_asks_a_real_service_for_every_row(spark, tmp_path):
    from examples.enrich_service import EnrichmentService, user_profile

    _click_files(str(tmp_path / "data" / "clicks"), 2, 150)
    with EnrichmentService(latency_ms_median=2.0, failure_rate=0.05, hang_rate=0.0) as service:
        code = in_folder(readme_example("enriched, dead = af.enrich("), tmp_path).replace("http://profiles", service.url)
        namespace: dict = {}
        exec(compile(code, "README", "exec"), namespace)  # noqa: S102
        enriched, dead = namespace["enriched"], namespace["dead"]
        rows = enriched.collect()
        answered = service.stats()
    # Every click once, with its user's segment: the 503s were retried, none ran out of attempts here.
    assert sorted((r.click_id, r.segment) for r in rows) == [(i, user_profile(i % 7)["segment"]) for i in range(300)]
    assert dead.count() == 0
    assert answered["by_status"].get(503, 0) > 0


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
    return in_folder(code, tmp_path)


def test_the_readme_stream_example_enriches_a_stream(spark, tmp_path):
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
