"""The guides "Enrich a DataFrame", "Pipelines" and "Windows" run as written, and give what an
independent computation gives: the profile service's own answers, a plain Python loop, Spark's
own ``groupBy(window(...))``."""

from __future__ import annotations

import datetime as dt
import re

import pyarrow.parquet as pq

from actorflow.operators import DeadLetter, Watermark
from examples.enrich_service import EnrichmentService, user_profile
from tests.docs import doc_example, run_page

UTC = dt.timezone.utc


def _parquet_rows(folder) -> list[dict]:
    # Spark writes one file per partition, named in partition order: read in that order.
    return [row for path in sorted(folder.glob("part-*.parquet")) for row in pq.read_table(path).to_pylist()]


def test_the_enrich_guide_enriches_every_click_from_a_real_service(spark, tmp_path):
    # 503s on 2 % of requests, as a real service; the page's retries take them.
    with EnrichmentService(latency_ms_median=5, failure_rate=0.02, hang_rate=0.0) as service:
        ns = run_page("docs/guides/enrich.md", {"spark": spark}, folder=tmp_path, replace={
            "af.spark_session()": "spark", '"http://profiles.internal:8080"': repr(service.url)})

    clicks = {r.click_id: r.user_id for r in ns["clicks"].collect()}
    unknown = {c for c, u in clicks.items() if u < 0}
    assert len(clicks) == 300 and len(unknown) == 6
    assert (ns["job"].input_rows, ns["job"].output_rows) == (300, 294)

    # The page wrote the result before unpersist(): every known user's click, in input order, with
    # the segment the service gives that user (or the fallback, should a row miss its deadline on
    # a loaded machine).
    rows = _parquet_rows(tmp_path / "data" / "enriched")
    assert [r["click_id"] for r in rows] == sorted(set(clicks) - unknown)
    assert all(r["segment"] in (user_profile(r["user_id"])["segment"], "unknown") for r in rows)
    assert sum(r["segment"] != "unknown" for r in rows) >= 290
    # The unknown users' clicks are the dead letters: their columns, then why.
    letters = _parquet_rows(tmp_path / "data" / "enriched-failed")
    assert list(letters[0]) == ["click_id", "user_id", "ts", "error_type", "error", "attempts", "operator", "request_key"]
    assert {r["click_id"] for r in letters} == unknown
    assert {(r["error_type"], r["attempts"]) for r in letters} == {("ClientResponseError", 1)}
    assert all(re.fullmatch(r".+/enrich\[\d/\d\]", r["operator"]) for r in letters)
    assert all("404" in r["error"] for r in letters)

    # Batched: every known click with its user's profile, typed as output_schema says.
    scored = ns["scored"]
    assert dict(scored.dtypes)["lifetime_value"] == "double"
    assert sorted((r.click_id, r.segment, r.lifetime_value) for r in scored.collect()) == sorted(
        (c, user_profile(u)["segment"], user_profile(u)["lifetime_value"]) for c, u in clicks.items() if u >= 0)

    # Order per key: each user's clicks in input order, and the slow user's overtaken by others.
    visits = ns["visits"]
    assert sorted(v for _, v in visits) == list(range(300))
    for user in {u for u, _ in visits}:
        assert [v for u, v in visits if u == user] == sorted(v for u, v in visits if u == user), user
    assert [v for _, v in visits] != list(range(300)), "no user overtook the slow one"

    # Idempotency keys: one per row, made of the job, the operator and the row's origin.
    keys = [r.request_key for r in ns["keyed"].collect()]
    assert len(keys) == 5 and len(set(keys)) == 5
    assert all(re.fullmatch(r"clicks/enrich/\d+\.\d+\.\d+", k) for k in keys)


def test_the_pipelines_guide_filters_maps_enriches_and_batches(spark, capsys):
    ns = run_page("docs/guides/pipelines.md", {"spark": spark}, replace={"af.spark_session()": "spark"})

    # A plain loop over the same events: the German ones, with their hour and tier.
    start = dt.datetime(2026, 1, 1, 9, 0)
    tiers = {0: "gold", 1: "silver"}
    expected = sorted((i, (start + dt.timedelta(minutes=i)).hour, tiers.get(i % 7 % 3, "bronze"))
                      for i in range(120) if i % 3 == 0)
    assert sorted((r.id, r.hour, r.tier) for r in ns["out"].collect()) == expected
    assert set(ns["out"].columns) == {"id", "country", "user_id", "ts", "hour", "tier"}

    scored = ns["scored"]
    assert ns["result"].output_rows == scored.num_rows == 1_000
    assert sorted(zip(scored["id"].to_pylist(), scored["score"].to_pylist())) == [(i, i % 50 * 2) for i in range(1_000)]

    assert "capacity must be an int > 0, got '10' (a str)" in capsys.readouterr().out
    assert sorted((r.id, r.seen) for r in ns["kept"].collect()) == [(1, True), (3, True)]
    assert [(r.id, r.error_type, r.attempts, r.operator) for r in ns["no_time"].collect()] == [
        (2, "SchemaError", 0, "from_spark")]
    _check_harness(ns)


def _check_harness(ns: dict) -> None:
    assert ns["tagged"] == [{"id": 0, "country": "DE", "user_id": 4, "ts": dt.datetime(2026, 1, 1, 9),
                             "hour": 9, "tier": "silver"}]
    assert ns["waiting"] == []
    assert ns["after"] == [Watermark(5)]
    (dead,) = ns["dead"]
    assert isinstance(dead, DeadLetter)
    assert (dead.value, dead.attempts, dead.error_type) == ("a", 1, "AsyncTimeoutError")
    assert ns["fired"] == [{"country": "DE", "window_start": 0, "window_end": 60_000, "n": 2}]


def test_the_pipelines_guide_harness_examples_run_without_ray():
    # The pipeline's functions, then the three harness examples, in one namespace as on the page.
    ns: dict = {}
    for code in (doc_example("docs/guides/pipelines.md", "def is_german"),
                 doc_example("docs/guides/pipelines.md", "chain = [FilterOperator"),
                 doc_example("docs/guides/pipelines.md", "async def slow_lookup"),
                 doc_example("docs/guides/pipelines.md", "def counter()")):
        exec(compile(code, "docs/guides/pipelines.md", "exec"), ns)  # noqa: S102
    _check_harness(ns)


def test_the_windows_guide_gives_what_spark_window_gives(spark):
    from pyspark.sql import functions as F

    ns = run_page("docs/guides/windows.md", {"spark": spark}, replace={"af.spark_session()": "spark"})
    clicks = ns["clicks"]

    def rows(df, *columns):
        return sorted(tuple(r) for r in df.select(*columns).collect())

    # Tumbling: Spark's own count and sum per country and minute.
    theirs = clicks.groupBy("country", F.window("ts", "1 minute").alias("w")).agg(
        F.count("*").alias("n"), F.sum("value").alias("v"))
    assert rows(ns["per_minute"], "country", "window_start", "window_end", "clicks", "value") == rows(
        theirs, "country", "w.start", "w.end", "n", "v")

    # Sliding, through a process function: Spark's sliding windows, count and max.
    theirs = clicks.groupBy("country", F.window("ts", "5 minutes", "1 minute").alias("w")).agg(
        F.count("*").alias("n"), F.max("value").alias("top"))
    assert rows(ns["sliding"], "country", "window_start", "clicks", "top_value") == rows(
        theirs, "country", "w.start", "n", "top")

    # Sessions: Spark's session_window, two per user.
    visits = ns["visits"]
    theirs = visits.groupBy("user_id", F.session_window("ts", "10 minutes").alias("s")).agg(
        F.count("*").alias("n"), F.max("ts").alias("last"))
    ours = rows(ns["sessions"], "user_id", "window_start", "window_end", "visits", "last")
    assert ours == rows(theirs, "user_id", "s.start", "s.end", "n", "last")
    assert len(ours) == 8

    # Count windows: four of 25 per country, summing every click's value, with null bounds.
    fired = ns["every_25"].collect()
    assert sorted(r.country for r in fired) == sorted(["DE", "FR", "US"] * 4)
    assert all(r.window_start is None and r.window_end is None for r in fired)
    totals = {r.country: r["sum(value)"] for r in clicks.groupBy("country").agg(F.sum("value")).collect()}
    assert {c: sum(r.value for r in fired if r.country == c) for c in totals} == totals

    # Late data: the window fires, fires again for a record within the lateness, and the record
    # past it goes aside; the last firing of each window is Spark's count of the on-time rows.
    start = dt.datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    counts = [(r.window_start.replace(tzinfo=UTC) if r.window_start.tzinfo is None else r.window_start, r["count"])
              for r in ns["counts"].collect()]
    minute = dt.timedelta(minutes=1)
    assert sorted(counts) == [(start, 2), (start, 3), (start + minute, 2)]
    on_time = ns["late_clicks"].where("click_id != 6").groupBy(F.window("ts", "1 minute").alias("w")).count()
    assert sorted(r["count"] for r in on_time.collect()) == [2, 3]
    late = ns["late"].collect()
    assert [(r.click_id, r.late_reason) for r in late] == [(6, "past_allowed_lateness")]
    start_ms = int(start.timestamp() * 1000)
    assert [(w.start_ms, w.end_ms) for w in late[0].late_windows] == [(start_ms, start_ms + 60_000)]

    assert ns["sane"].count() == 300
    from actorflow import DataStream

    assert isinstance(ns["early"], DataStream)
