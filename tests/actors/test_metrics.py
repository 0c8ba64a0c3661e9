"""The metrics a user finds in Prometheus: Ray's metrics agent, read over HTTP while a job runs."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
import urllib.request

import pyarrow as pa
import pytest
import ray

from actorflow.cluster import from_arrow

pytestmark = pytest.mark.ray

COUNTERS = ["records_in", "records_out", "retries", "timeouts", "dead_letters", "batches_in", "late_records_dropped",
            "backpressured_ms"]
GAUGES = ["in_flight_requests", "async_queue_depth", "input_queue_depth", "mailbox_depth", "outbox_depth",
          "suspended_backpressure", "suspended_async_queue_full", "suspended_barrier_alignment", "suspended_finishing"]


def _scrape() -> str:
    port = ray.nodes()[0]["MetricsExportPort"]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            return response.read().decode()
    except OSError:  # the agent starts a few seconds after Ray does
        return ""


def test_every_series_is_published_under_the_documented_name_with_real_values(ray_session, tmp_path):
    release = tmp_path / "release"  # the actor runs in another process: a file is the signal

    async def waits_for_the_test(row):
        while not os.path.exists(release):
            await asyncio.sleep(0.05)
        return [row]

    stream = from_arrow([pa.table({"user": list(range(300))})], parallelism=1, job_name="metrics").async_map(
        waits_for_the_test, capacity=50, name="enrich")
    thread = threading.Thread(target=lambda: stream.execute(progress=False), daemon=True)
    thread.start()
    try:
        # Ray's agent exports every few seconds; the job holds 50 requests until we have seen them.
        series = {}
        deadline = time.time() + 90
        while time.time() < deadline:
            text = _scrape()
            series = {
                m.group(1): float(m.group(2))
                for m in re.finditer(r'^ray_actorflow_(\w+)\{[^}]*job="metrics"[^}]*\} (\S+)$', text, re.M)
            }
            if series.get("in_flight_requests") == 50 and series.get("suspended_async_queue_full") == 1 \
                    and all(f"{c}_total" in series for c in COUNTERS):
                break
            time.sleep(1.0)
        # Counters exist from the start, at zero where nothing happened yet.
        ours = sorted({line.split("{")[0] for line in text.splitlines() if "actorflow" in line})
        assert {f"{c}_total" for c in COUNTERS} <= set(series), (sorted(series), ours, len(text))
        assert series["retries_total"] == 0 and series["dead_letters_total"] == 0
        assert series["records_in_total"] >= 50 and set(GAUGES) <= set(series)
        assert series["in_flight_requests"] == 50
        # The input waits for room in the async queue, not for downstream, and says so.
        assert series["suspended_async_queue_full"] == 1 and series["suspended_backpressure"] == 0
        from tests.waiting import find_actor

        figures = ray.get(find_actor("metrics/enrich[0/1]").stats.remote())
        assert figures["suspended"] == "async_queue_full", figures
        assert isinstance(figures["mailbox_depth_by_priority"], dict)
    finally:
        release.touch()
        thread.join(60)


def test_checkpoint_and_restart_series_carry_real_values(ray_session, tmp_path):
    from tests.waiting import find_actor, poll

    release = tmp_path / "release"

    async def slow_until_released(row):
        while not os.path.exists(release):
            await asyncio.sleep(0.05)
        return [row]

    # Small batches: the reader stays behind the held requests (a reader that has read all its
    # input takes no more checkpoints).
    stream = from_arrow([pa.table({"user": list(range(300))})], parallelism=1, batch_size=10,
                        job_name="ckpt-metrics").async_map(slow_until_released, capacity=50, name="enrich")
    thread = threading.Thread(target=lambda: stream.execute(
        progress=False, checkpoint_interval_ms=200, checkpoint_dir=str(tmp_path / "chk")), daemon=True)
    thread.start()

    def series() -> dict[str, list[float]]:
        found: dict[str, list[float]] = {}
        for m in re.finditer(r'^ray_actorflow_(\w+)\{[^}]*job="ckpt-metrics"[^}]*\} (\S+)$', _scrape(), re.M):
            found.setdefault(m.group(1), []).append(float(m.group(2)))
        return found

    try:
        # The coordinator's and the instance's processes export on their own schedules: wait for both.
        seen = poll(lambda: (s := series()).get("last_completed_checkpoint", [0])[0] >= 2 and "restarts" in s and s,
                    timeout_s=90)
        assert seen["checkpoint_duration_ms"][0] > 0 and seen["checkpoint_size_bytes"][0] > 0
        assert seen["restarts"] == [0.0]
        ray.kill(poll(lambda: find_actor("ckpt-metrics/enrich[0/1]")), no_restart=True)
        poll(lambda: find_actor("ckpt-metrics/enrich[0/1]@1"))
        seen = poll(lambda: (s := series()).get("restarts") and max(s["restarts"]) == 1.0 and s, timeout_s=90)
        assert 1.0 in seen["restarts"]
    finally:
        release.touch()
        thread.join(60)


def test_state_api_and_prometheus_agree_with_the_input(ray_session, tmp_path):
    """Every row but the last passes at once; the last is held, so the actor lives on while
    Prometheus shows the whole input taken in and all but one record out."""
    from ray.util.state import list_actors

    from tests.waiting import poll

    release = tmp_path / "release"
    rows = 1_234

    async def holds_the_last_row(row):
        while row["user"] == rows - 1 and not os.path.exists(release):
            await asyncio.sleep(0.05)
        return [row]

    stream = from_arrow([pa.table({"user": list(range(rows))})], parallelism=2, job_name="agree").async_map(
        holds_the_last_row, capacity=20, name="enrich")
    thread = threading.Thread(target=lambda: stream.execute(progress=False), daemon=True)
    thread.start()

    def totals() -> dict[str, float]:
        found: dict[str, float] = {}
        for m in re.finditer(r'^ray_actorflow_(\w+)\{[^}]*job="agree"[^}]*\} (\S+)$', _scrape(), re.M):
            found[m.group(1)] = found.get(m.group(1), 0.0) + float(m.group(2))  # summed over the instances
        return found

    try:
        gcs = ray.get_runtime_context().gcs_address
        # The dashboard's actor list: each instance by name, and its repr (Ray's "repr_name") the same.
        actors = poll(lambda: (found := [x for x in list_actors(
            address=gcs, filters=[("state", "=", "ALIVE")], limit=10_000, detail=True, raise_on_missing_output=False)
            if x.name.startswith("agree/")]) and len(found) == 2 and all(x.repr_name for x in found) and found)
        assert sorted((x.name, x.repr_name, x.class_name, x.ray_namespace) for x in actors) == [
            (f"agree/enrich[{i}/2]", f"agree/enrich[{i}/2]", "OperatorActor", "actorflow") for i in range(2)]
        seen = poll(lambda: (t := totals()).get("records_in_total") == rows and t.get("records_out_total") == rows - 1
                    and t, timeout_s=90)
        assert seen["in_flight_requests"] == 1
        assert seen["dead_letters_total"] == seen["retries_total"] == seen["timeouts_total"] == 0
    finally:
        release.touch()
        thread.join(60)
