"""The main job: enrich 100,000 click events from a real HTTP service, Spark → Ray → Spark.

Run it with ``make demo``. It starts, on 127.0.0.1, a user-profile service with realistic
latency, transient 503s and rare hangs; builds a Spark DataFrame of click events; enriches each
click with the user's profile through ``enrich()`` (async HTTP, retries with backoff, a timeout
fallback, dead letters for unknown users); and prints a sample, the outcome counts and the
throughput. Then it counts the enriched clicks per country in 1-minute tumbling windows and per
user in sessions (gap 30 minutes), with late clicks in their own DataFrame.
"""

from __future__ import annotations

import time
from typing import Any

import click

from actorflow.operators import ExponentialBackoff, exception_of_type
from actorflow.operators.windows import Aggregations, Count, EventTimeSessionWindows, Max, Sum, TumblingEventTimeWindows
from actorflow.spark_bridge import enrich, from_spark, spark_session, stop_spark
from actorflow.spark_bridge.session import ensure_ray

from .enrich_service import TransientServiceError, http_session, lookup_user
from .service_process import ServiceProcess


def make_profile_lookup(base_url: str) -> Any:
    async def profile(click_row: dict[str, Any]) -> dict[str, Any]:
        user = await lookup_user(http_session(), base_url, click_row["user_id"])
        return {
            "segment": user["segment"],
            "country": user["country"],
            "lifetime_value": float(user["lifetime_value"]),
            "enrichment": "ok",
        }

    return profile


FALLBACK = {"segment": "unknown", "country": None, "lifetime_value": None, "enrichment": "timeout_fallback"}


def click_events(spark: Any, n: int, users: int) -> Any:
    """``n`` clicks by ``users`` users over an hour; one user id in 2,000 is unknown (negative)."""
    from pyspark.sql import functions as F

    return (
        spark.range(n)
        .withColumnRenamed("id", "click_id")
        .withColumn("user_id", F.when(F.col("click_id") % 2000 == 7, -F.col("click_id")).otherwise(F.abs(F.hash("click_id")) % users))
        .withColumn("page", F.concat(F.lit("/product/"), (F.col("click_id") % 97).cast("string")))
        .withColumn("ts", F.timestamp_seconds(F.lit(1_760_000_000) + (F.col("click_id") * 3600 / n).cast("long")))
    )


def windows(enriched: Any, parallelism: int) -> None:
    """Per-country clicks in 1-minute tumbling windows, and per-user sessions (gap 30 minutes)."""
    from pyspark.sql import functions as F

    started = time.perf_counter()
    counts_stream = (
        from_spark(enriched, timestamp_column="ts", out_of_orderness_ms=5_000, idleness_ms=10_000,
                   parallelism=parallelism, job_name="clicks-per-country")
        .key_by("country")
        .window(TumblingEventTimeWindows.of(size_ms=60_000))
        .allowed_lateness(30_000)
        .side_output_late_data("late")
        .aggregate(Aggregations(clicks=Count(), lifetime_value=Sum("lifetime_value")))
    )
    counts = counts_stream.to_spark()  # persisted in Spark, like every to_spark() result
    late = counts_stream.get_side_output("late")
    sessions = (
        from_spark(enriched, timestamp_column="ts", out_of_orderness_ms=5_000, parallelism=parallelism,
                   job_name="sessions-per-user")
        .key_by("user_id")
        .window(EventTimeSessionWindows.with_gap(30 * 60_000))
        .aggregate(Aggregations(clicks=Count(), pages=Max("page")))
        .to_spark()
    )
    n_windows, n_sessions, n_late = counts.count(), sessions.count(), late.count()
    elapsed = time.perf_counter() - started
    print("\nclicks per country, 1-minute tumbling windows (first 8):")
    counts.orderBy("window_start", "country").select(
        "country", "window_start", "window_end", "clicks", F.round("lifetime_value", 2).alias("lifetime_value"),
    ).show(8, truncate=False)
    print("sessions per user, gap 30 minutes (the 5 longest):")
    sessions.orderBy(sessions["clicks"].desc(), "user_id").select(
        "user_id", "window_start", "window_end", "clicks").show(5, truncate=False)
    total = counts.agg({"clicks": "sum"}).collect()[0][0] or 0
    print(f"{n_windows:,} country windows holding {total:,} clicks, {n_sessions:,} sessions; "
          f"late clicks: {n_late:,} (in their own DataFrame); {elapsed:.1f} s for both")


@click.command()
@click.option("--rows", default=100_000, show_default=True, help="click events to enrich")
@click.option("--users", default=20_000, show_default=True)
@click.option("--capacity", default=200, show_default=True, help="requests in flight per instance")
@click.option("--parallelism", default=2, show_default=True)
@click.option("--timeout-ms", default=1_000, show_default=True)
@click.option("--ordered/--unordered", default=True, show_default=True)
def main(rows: int, users: int, capacity: int, parallelism: int, timeout_ms: int, ordered: bool) -> None:
    ensure_ray()
    spark = spark_session("actorflow-demo")
    service = ServiceProcess(latency_ms_median=20, latency_sigma=0.6, failure_rate=0.02, hang_rate=0.0005).start()
    try:
        clicks = click_events(spark, rows, users).cache()
        clicks.count()
        print(f"enrichment service on {service.url}; {rows:,} click events in Spark")
        retry = ExponentialBackoff(
            max_attempts=4, initial_delay_ms=20, multiplier=2.0, max_delay_ms=200,
            retry_on_exception=exception_of_type(TransientServiceError),
        )
        started = time.perf_counter()
        enriched, dead = enrich(
            clicks,
            make_profile_lookup(service.url),
            ordered=ordered,
            capacity=capacity,
            timeout_ms=timeout_ms,
            retry=retry,
            fallback=FALLBACK,
            parallelism=parallelism,
            on_error="dead_letter",
            job_name="enrich-clicks",
        )
        n_enriched = enriched.count()
        n_dead = dead.count()
        elapsed = time.perf_counter() - started

        print("\nsample of the enriched clicks:")
        enriched.select("click_id", "user_id", "page", "ts", "segment", "country", "lifetime_value", "enrichment").show(5, truncate=False)
        print("outcomes:")
        for row in enriched.groupBy("enrichment").count().orderBy("enrichment").collect():
            print(f"  {row['enrichment']:<18}{row['count']:>9,}")
        print(f"  {'dead_letter':<18}{n_dead:>9,}")
        if n_dead:
            unknown = clicks.filter("user_id < 0").count()
            print(f"\ndead letters by cause ({unknown:,} clicks are by unknown users, whom the service answers 404):")
            for row in dead.groupBy("error_type", "attempts").count().orderBy("error_type").collect():
                print(f"  {row['error_type']:<24} after {row['attempts']} attempt(s) {row['count']:>7,}")
            dead.select("click_id", "user_id", "error_type", "attempts", "error").show(3, truncate=80)
        total = n_enriched + n_dead
        print(f"\n{total:,} of {rows:,} clicks accounted for; none lost: {total == rows}")
        stats = service.stats()
        print(f"service answered {stats['requests']:,} requests: {dict(sorted(stats['by_status'].items()))}")
        print(f"throughput: {rows / elapsed:,.0f} clicks/s DataFrame -> DataFrame ({elapsed:.1f} s, "
              f"capacity {capacity} x {parallelism} instances, {'ordered' if ordered else 'unordered'})")
        if total != rows:
            raise SystemExit(f"lost {rows - total} clicks")
        if ordered:
            ids = [r["click_id"] for r in enriched.select("click_id").collect()]
            if ids != sorted(ids):
                raise SystemExit("ordered output is out of order")
        windows(enriched, parallelism)
    finally:
        service.stop()
        stop_spark()


if __name__ == "__main__":
    main()


_chaos_service: ServiceProcess | None = None


def _steady_service() -> str:
    # One service per process for the pipelines below, without failures or hangs: a run under
    # chaos must get the same answers as the failure-free run it is compared with.
    global _chaos_service
    if _chaos_service is None:
        import atexit

        _chaos_service = ServiceProcess(latency_ms_median=2, latency_sigma=0.3, failure_rate=0.0, hang_rate=0.0).start()
        atexit.register(_chaos_service.stop)
    return _chaos_service.url


def _click_table(n: int, users: int) -> Any:
    import pyarrow as pa

    return pa.table({
        "click_id": list(range(n)),
        "user_id": [(i * 7919) % users for i in range(n)],
        "ts": [1_760_000_000_000 + i * 3_600_000 // n for i in range(n)],
    })


def pipeline(n: int = 200_000, users: int = 5_000, parallelism: int = 2) -> Any:
    """Clicks enriched from the profile service over HTTP, one row out per click (key
    ``click_id``): ``actorflow chaos --kills 10 --every 2s examples.enrich_clicks:pipeline``."""
    from actorflow.cluster import from_arrow

    lookup = make_profile_lookup(_steady_service())

    async def enrich_click(row: dict[str, Any]) -> list[dict[str, Any]]:
        return [{**row, **await lookup(row)}]

    table = _click_table(n, users)
    parts = [table.slice(i, 10_000) for i in range(0, n, 10_000)]
    return from_arrow(parts, parallelism=parallelism, batch_size=500, timestamp_column="ts",
                      job_name="enrich-clicks").async_map(enrich_click, capacity=100, timeout_ms=10_000, name="enrich")


def windowed_pipeline(n: int = 200_000, users: int = 5_000, parallelism: int = 2) -> Any:
    """``pipeline``, then clicks per country in 1-minute tumbling windows (key ``country``)."""
    return (pipeline(n, users, parallelism).key_by("country", parallelism=parallelism)
            .window(TumblingEventTimeWindows.of(60_000)).count())
