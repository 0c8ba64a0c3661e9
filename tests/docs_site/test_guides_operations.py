"""The operations guides run as written: checkpoints and chaos, streams, deployment, observability.

Each test runs every runnable block of its page in order (``run_page``), then checks what the page
computed against an independent computation: a plain Python loop over the same input, or Spark's
own reading of the files a stream wrote.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter

import pyarrow as pa

from tests.docs import ROOT, run_page

BASE_S = 1_760_000_000  # 2025-10-09 08:53:20 UTC


# ---------------------------------------------------------------------------------------------
# docs/guides/checkpoints.md


def test_the_checkpoints_page_recovers_resumes_and_survives_chaos_exactly_once(ray_session, tmp_path):
    import ray

    gcs = ray.get_runtime_context().gcs_address
    ns = run_page(
        "docs/guides/checkpoints.md", folder=tmp_path,
        # The chaos command joins this test's Ray instead of starting one of its own, and finds the
        # repository's examples from the test's folder.
        replace={"examples.pipelines:steady_users": f"--address {gcs} examples.pipelines:steady_users"},
        env={"PYTHONPATH": str(ROOT)})

    def unit_price(quantity):
        return 600 // quantity if quantity else None

    quantities = [1 + i % 5 for i in range(20_000)]
    expected = sorted((i, q, unit_price(q)) for i, q in enumerate(quantities))

    def rows(table: pa.Table) -> list[tuple]:
        return sorted(zip(*(table.column(c).to_pylist() for c in ("order_id", "quantity", "unit_price"))))

    # A run with checkpoints: every order once, priced; the newest three checkpoints kept, marked finished.
    result = ns["result"]
    assert rows(result.to_arrow()) == expected
    assert result.restarts == 0 and len(result.checkpoints["completed"]) >= 1
    job_dir = tmp_path / "chk" / "priced"
    assert (job_dir / "_finished").is_file()
    # A failed run keeps its checkpoints; a fresh run refuses them, naming the resume_from.
    assert isinstance(ns["failure"], ns["af"].errors.JobFailedError) and "ZeroDivisionError" in str(ns["failure"])
    assert f"resume_from={str(tmp_path / 'chk' / 'invoices')!r}" in str(ns["refusal"])
    # Resumed with the fixed function: every order exactly once, as an uninterrupted run of it gives.
    broken = quantities[:-1] + [0]
    assert rows(ns["invoices"]) == sorted((i, q, unit_price(q)) for i, q in enumerate(broken))
    assert ns["resumed"].job == "invoices"
    # Resumed at another parallelism: every user's window counted once, its count whole.
    counts = ns["counts"]
    want = Counter((i % 50, (i * 10) // 5_000 * 5_000) for i in range(24_000))
    assert Counter({(r["user"], r["window_start"]): r["count"] for r in counts.to_pylist()}) == want
    assert counts.num_rows == len(want)
    # Under chaos: actors were killed, each kill cost one restart, and the output is still exact.
    report, monkey, chaotic = ns["report"], ns["monkey"], ns["chaotic"]
    assert len(monkey.kills) >= 1 and chaotic.restarts == len(monkey.kills)
    assert report.exact and rows(chaotic.to_arrow()) == expected
    assert all("killed by the chaos tool" in f for f in monkey.explain(chaotic.failures))
    # At most three complete checkpoints are kept of a job.
    assert 1 <= len([p for p in job_dir.glob("chk-*") if (p / "_metadata").is_file()]) <= 3


# ---------------------------------------------------------------------------------------------
# docs/guides/streams.md


def _segment(user_id: int) -> str:
    return "gold" if user_id % 3 == 0 else "silver"


def test_the_streams_page_enriches_counts_resumes_and_calls_foreach_batch_exactly_once(spark, tmp_path):
    import actorflow as af

    ns = run_page(
        "docs/guides/streams.md", {"af": af, "spark": spark}, folder=tmp_path,
        # A test cannot wait for ever: it waits for the files there are, then drains the query.
        replace={"af.spark_session()": "spark",
                 "query.await_termination()": "query.process_all_available(); query.stop(drain=True)"})

    # The one-liner: each of the 600 clicks there were then, once, with its user's segment.
    enriched = spark.read.parquet(str(tmp_path / "data" / "enriched")).collect()
    assert sorted((r.click_id, r.segment) for r in enriched) == [(i, _segment(i % 7)) for i in range(600)]

    # The windowed pipeline, stopped after two files and resumed for the third: every click counted
    # once in its user's minute, as a plain loop over the 900 clicks counts them.
    minute_of = {i: dt.datetime.fromtimestamp((BASE_S + i) // 60 * 60, dt.timezone.utc) for i in range(900)}
    expected = Counter((i % 7, minute_of[i]) for i in range(900))
    published = spark.read.parquet(str(tmp_path / "data" / "counts")).collect()
    assert Counter({(r.user_id, r.window_start.astimezone(dt.timezone.utc)): r.n for r in published}) == expected
    assert len(published) == len(expected)
    counts = ns["counts"]
    assert counts.job.resumed_from is not None and not counts.is_active
    assert [p["epoch"] for p in counts.recent_progress if not p["between_epochs"]] == [2]
    # Its dead letters and late clicks are streams of their own, with Spark's file-sink log; none came.
    assert all((tmp_path / "data" / name / "_spark_metadata").is_dir() for name in ("counts-failed", "counts-late"))
    assert counts.dead_letters().count() == 0 and counts.side_output("late").count() == 0

    # foreach_batch: every click once, across the epochs it was called with.
    by_epoch = spark.read.parquet(str(tmp_path / "data" / "by-epoch")).collect()
    assert sorted((r.click_id, r.segment) for r in by_epoch) == [(i, _segment(i % 7)) for i in range(900)]


# ---------------------------------------------------------------------------------------------
# docs/guides/deployment.md


def test_the_deployment_pages_embedded_example_enriches_every_row(spark):
    import actorflow as af

    ns = run_page("docs/guides/deployment.md", {"af": af, "spark": spark}, replace={"af.spark_session()": "spark"})

    assert ns["spark"] is spark  # the embedded session: Spark on the local Ray
    rows = ns["enriched"].collect()
    assert sorted((r.click_id, r.user_id, r.segment) for r in rows) == [
        (i, i % 7, _segment(i % 7)) for i in range(300)]


# ---------------------------------------------------------------------------------------------
# docs/guides/observability.md


def test_the_observability_page_reads_the_last_job_an_instances_stats_and_the_status_table(spark):
    import ray

    import actorflow as af
    from tests.waiting import find_actor, poll

    def wait_for_actor(name, namespace):
        # The page's reader asks a moment after the job started; the test waits until its actor runs.
        assert namespace == "actorflow"

        def running():
            actor = find_actor(name)
            return actor if actor is not None and ray.get(actor.stats.remote())["records_in"] > 0 else None

        return poll(running, timeout_s=60)

    gcs = ray.get_runtime_context().gcs_address
    ns = run_page(
        "docs/guides/observability.md", {"af": af, "spark": spark, "wait_for_actor": wait_for_actor},
        replace={"af.spark_session()": "spark", "instance = ray.get_actor(": "instance = wait_for_actor(",
                 "--address auto": f"--address {gcs}"})

    rows = ns["enriched"].collect()
    assert sorted((r.click_id, r.segment) for r in rows) == [(i, _segment(i % 7)) for i in range(500)]
    # af.last_job() is the enrich() job: its records, its phases, its last progress sample at the end.
    job = ns["job"]
    assert job.job == "enrich-clicks" and job.input_rows == job.output_rows == 500
    assert set(job.phases_s) == {"deploy", "run", "collect"} and all(s >= 0 for s in job.phases_s.values())
    assert job.progress_samples[-1][1:] == (500, 0)
    assert sum(f["records_in"] for f in job.figures) == 500
    assert all(f["name"].startswith("enrich-clicks/") for f in job.figures)
    # An instance's live figures, while the watched job ran: never more in flight than its capacity.
    stats = ns["stats"]
    assert stats["name"] == "watched/lookup[0/1]" and 0 <= stats["in_flight_requests"] <= 2
    assert 0 < stats["records_in"] <= 1_000
    result = ns["result"]
    assert result.output_rows == 1_000
    assert sorted(result.to_arrow().column("user").to_pylist()) == list(range(1_000))
