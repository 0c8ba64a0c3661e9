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
    exec(compile(readme_example(".side_output_late_data(\"late\")"), "README", "exec"), namespace)  # noqa: S102

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
