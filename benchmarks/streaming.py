"""Streams: actorflow's long-running job against Spark Structured Streaming, on the same files, in one run.

Every system reads the same Parquet files with Spark's file source, one file a micro-batch
(``maxFilesPerTrigger=1``), and writes Parquet:

(a) keyed event-time windows (tumbling 10 s, count and sum per user, 5 s out-of-orderness):
    actorflow's ``from_spark(...).key_by().window().aggregate().write_stream()`` against Spark's
    ``withWatermark().groupBy(window(), user).agg()`` in append mode, with
    ``spark.sql.shuffle.partitions`` = P (Spark's default, 200, is about 30 times slower here);
(b) enrichment on the skewed latency profile of ``benchmarks.enrich`` (20 ms, a slow shard of
    users at 100 ms, one record in 2,000 at 1.5 s), C = 64 requests in flight per instance, P = 2:
    actorflow's ``enrich_stream()`` against ``foreachBatch`` + ``enrich()`` per micro-batch (one job
    per micro-batch) and against ``foreachBatch`` + Spark's ``mapInPandas`` with a thread pool.

Figures:

- ``rps``: input rows over the time to process every file, all present at the start (a backlog:
  the rate a system sustains, with a lag that stays bounded, when the input comes at least that
  fast);
- latency p50/p99, windows only: files written one every 0.5 s while the query runs;
  a file's latency runs from its write to the end of the micro-batch that read it (one file a
  micro-batch, in order; Spark's progress: trigger start plus its duration), when that batch's
  output is committed: by actorflow's checkpoint and publish, by Spark's file sink;
- ``checkpoint_ms`` p50: actorflow's checkpoint after each micro-batch;
- the job's actors' peak RSS, sampled over the backlog run;
- chaos: the windows backlog again while actors are killed every 2 s; then again in drivers of
  their own (``benchmarks.stream_driver``), each killed with SIGKILL at a moment and micro-batch
  drawn at random (``DRIVER_MOMENTS``: during a micro-batch, between its checkpoint and its
  publish, during the publish, before Spark's commit, during a restore), each followed by the
  same command on the same checkpoint location, until one runs to the end. Each output is
  compared with the calm run's (``lost``, ``duplicated``, ``unexpected``).

Targets: windows ``rps`` >= 1.5 x Spark's and p99 latency <= Spark's; enrichment >= 2 x
``foreachBatch`` + ``enrich()``; exact under actor and driver kills.

    python -m benchmarks.streaming --quick      # a few minutes
    python -m benchmarks.streaming             # larger backlogs and a longer live run
    python -m benchmarks.streaming --soak      # then 30 minutes of files, an actor killed every minute
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import threading
import time
from typing import Any, Callable

import click
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.profiles import get_profile
from benchmarks.report import emit

P, C = 2, 64
BASE_US = 1_760_000_000_000_000
WINDOW_MS, OUT_OF_ORDERNESS_MS = 10_000, 5_000
SCHEMA = "id long, user long, amount long, ts timestamp"
TARGETS = {"windows_rps_vs_spark_min": 1.5, "windows_p99_latency_vs_spark_max": 1.0, "enrich_skewed_vs_foreach_batch_min": 2.0}


def write_files(directory: str, files: int, rows: int, *, first_file: int = 0, every_s: float = 0.0,
                written: list[float] | None = None) -> None:
    """``files`` Parquet files of ``rows`` events each, 10 ms of event time apart, shuffled within
    runs of 50 (half a second, inside the out-of-orderness bound); one every ``every_s``, their
    write times in ``written``."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(7)
    for k in range(first_file, first_file + files):
        ids = np.arange(k * rows, (k + 1) * rows)
        for start in range(0, rows, 50):
            rng.shuffle(ids[start:start + 50])
        table = pa.table({"id": ids, "user": ids % 997, "amount": ids % 100,
                          "ts": pa.array(BASE_US + ids * 10_000, pa.timestamp("us", tz="UTC"))})
        temporary = os.path.join(directory, f".events-{k:05d}.tmp")
        pq.write_table(table, temporary)
        os.replace(temporary, os.path.join(directory, f"events-{k:05d}.parquet"))
        if written is not None:
            written.append(time.time())
        if every_s:
            time.sleep(every_s)


def _windows_actorflow(spark: Any, source: str, out: str, checkpoints: str, job: str) -> Any:
    from actorflow.operators.windows import Aggregations, Count, Sum, TumblingEventTimeWindows
    from actorflow.spark_bridge import from_spark

    events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(source)
    return (from_spark(events, timestamp_column="ts", out_of_orderness_ms=OUT_OF_ORDERNESS_MS, parallelism=P,
                       job_name=job)
            .key_by("user").window(TumblingEventTimeWindows.of(WINDOW_MS))
            .aggregate(Aggregations(n=Count(), total=Sum("amount")))
            .write_stream(out, checkpoint_location=checkpoints))


def _windows_spark(spark: Any, source: str, out: str, checkpoints: str, job: str) -> Any:
    from pyspark.sql import functions as F

    # One state partition per core of the job, as actorflow's P instances: Spark's default of 200
    # runs 200 state-store tasks a micro-batch, which no one tuning a stream keeps.
    spark.conf.set("spark.sql.shuffle.partitions", str(P))
    events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(source)
    counts = (events.withWatermark("ts", f"{OUT_OF_ORDERNESS_MS // 1000} seconds")
              .groupBy(F.window("ts", f"{WINDOW_MS // 1000} seconds").alias("w"), "user")
              .agg(F.count("*").alias("n"), F.sum("amount").alias("total"))
              .select("user", F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"), "n", "total"))
    return (counts.writeStream.format("parquet").outputMode("append").option("checkpointLocation", checkpoints)
            .queryName(job).start(out))


class _Query:
    """What a benchmark needs of either system's query: wait, stop, and Spark's progress."""

    def __init__(self, query: Any) -> None:
        self.handle = query
        self.spark_query = getattr(query, "query", query)

    def wait(self) -> None:
        if hasattr(self.handle, "process_all_available"):
            self.handle.process_all_available()
        else:
            self.handle.processAllAvailable()

    def stop(self) -> None:
        self.handle.stop()

    def batches(self) -> list[tuple[float, float, int]]:
        """(start, end, input rows) of each micro-batch, in epoch seconds."""
        spans = []
        for progress in self.spark_query.recentProgress:
            start = _iso_seconds(progress["timestamp"])
            spans.append((start, start + progress["durationMs"].get("triggerExecution", 0) / 1000,
                          progress["numInputRows"]))
        return spans


def _iso_seconds(text: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def backlog(spark: Any, start: Callable[..., Any], source: str, work: str, name: str, rows: int,
            sampler_job: str | None = None, drain: bool = False) -> dict[str, Any]:
    """Process every file already in ``source``; rows per second from the start to the last commit.
    With ``drain`` (actorflow's enrichment), until the job has drained too: every row's output is
    out, the requests still in flight after the last micro-batch included."""
    out, checkpoints = os.path.join(work, f"{name}-out"), os.path.join(work, f"{name}-chk")
    sampler = _actor_sampler(sampler_job) if sampler_job else None
    started = time.perf_counter()
    query = _Query(start(spark, source, out, checkpoints, name))
    if sampler is not None:
        sampler.__enter__()
    try:
        query.wait()
        if drain:
            query.handle.stop(drain=True)
        seconds = time.perf_counter() - started
    finally:
        if sampler is not None:
            sampler.__exit__(None, None, None)
        progress = getattr(query.handle, "recent_progress", None)
        query.stop()
    taken = sum(r for _, _, r in query.batches())
    result = {"rps": round(rows / seconds, 1), "seconds": round(seconds, 2), "rows_seen": taken, "out": out}
    if progress is not None:
        result["checkpoint_ms_p50"] = round(statistics.median(p["checkpoint_ms"] for p in progress), 1)
        result["publish_ms_p50"] = round(statistics.median(p["publish_ms"] for p in progress), 1)
    if sampler is not None:
        result["actor_peak_rss_mib"] = round(sampler.actor_peak_mb, 1)
        result["actor_start_rss_mib"] = round(sampler.actor_start_mb, 1)
    return result


def live(spark: Any, start: Callable[..., Any], work: str, name: str, files: int, rows: int, every_s: float) -> dict[str, Any]:
    """Files written one every ``every_s`` while the query runs; each file's latency."""
    source, out, checkpoints = (os.path.join(work, f"{name}-{part}") for part in ("in", "out", "chk"))
    os.makedirs(source)
    query = _Query(start(spark, source, out, checkpoints, name))
    written: list[float] = []
    writer = threading.Thread(target=write_files, args=(source, files, rows), kwargs={"every_s": every_s, "written": written})
    time.sleep(2.0)  # the query is up before the first file
    writer.start()
    writer.join()
    time.sleep(1.0)
    query.wait()
    batches = query.batches()
    query.stop()
    # One file a micro-batch (maxFilesPerTrigger=1), in the order written: the k-th micro-batch
    # with rows is the k-th file's, and its end is when that file's output was committed.
    ends = sorted(end for _, end, rows_in in batches if rows_in)
    if len(ends) != len(written):
        raise RuntimeError(f"{name}: {len(written)} files written, and {len(ends)} micro-batches with rows")
    latencies = [(end - at) * 1000 for at, end in zip(written, ends)]
    return {"p50_ms": round(float(np.percentile(latencies, 50)), 1), "p99_ms": round(float(np.percentile(latencies, 99)), 1),
            "files": len(latencies)}


def _actor_sampler(job: str) -> Any:
    from benchmarks.scale import _JobSampler

    sampler = _JobSampler(job)
    sampler._prefix = f"{job}/"
    return sampler


# -- enrichment --------------------------------------------------------------------------------------


def _skewed_call() -> Any:
    profile = get_profile("skewed")

    async def call(row: dict[str, Any]) -> dict[str, Any]:
        return {"result": await profile.async_call(row["id"])}

    return call


def _enrich_actorflow(spark: Any, source: str, out: str, checkpoints: str, job: str) -> Any:
    from actorflow.spark_bridge import enrich_stream

    events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(source)
    return enrich_stream(events, _skewed_call(), out, checkpoint_location=checkpoints, ordered=False, capacity=C,
                         parallelism=P, timeout_ms=10_000, job_name=job, output_schema="result long")


def _enrich_foreach_batch(spark: Any, source: str, out: str, checkpoints: str, job: str) -> Any:
    from actorflow.spark_bridge import enrich

    call = _skewed_call()

    def each(batch: Any, epoch: int) -> None:
        enrich(batch, call, ordered=False, capacity=C, parallelism=P, timeout_ms=10_000, progress=False,
               checkpoint_interval_ms=None, output_schema="result long").write.mode("append").parquet(f"{out}/{epoch}")

    events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(source)
    return events.writeStream.foreachBatch(each).option("checkpointLocation", checkpoints).queryName(job).start()


def _enrich_threadpool(spark: Any, source: str, out: str, checkpoints: str, job: str) -> Any:
    from benchmarks.baselines import _output_schema, _threadpool_partition_fn

    partition_fn: Any = _threadpool_partition_fn(get_profile("skewed"), C)

    def each(batch: Any, epoch: int) -> None:
        batch.repartition(P).mapInPandas(partition_fn, _output_schema(batch)).write.mode("append").parquet(f"{out}/{epoch}")

    events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(source)
    return events.writeStream.foreachBatch(each).option("checkpointLocation", checkpoints).queryName(job).start()


# -- checks ------------------------------------------------------------------------------------------


def soak_run(spark: Any, work: str, minutes: float, rows: int, every_s: float, kill_every_s: float = 60.0) -> dict[str, Any]:
    """The windows query for ``minutes`` while a file of ``rows`` events comes every ``every_s``
    and an actor is killed every ``kill_every_s``. Every 5 s: the actors' summed RSS, the object
    store's use and the size of actorflow's checkpoint directory (and of Spark's, beside it: its
    file source logs every file it has seen). Ends with a drain, and every window of the input
    against the output."""
    import re

    import psutil
    import ray
    from ray._private.internal_api import memory_summary

    from actorflow.cluster.chaos import ChaosMonkey

    source, out, checkpoints = (os.path.join(work, f"soak-{part}") for part in ("in", "out", "chk"))
    os.makedirs(source)
    address = ray.get_runtime_context().gcs_address
    files = int(minutes * 60 / every_s)
    stop = threading.Event()
    writer = threading.Thread(target=_write_until, args=(source, files, rows, every_s, stop), daemon=True)
    samples: list[dict[str, float]] = []
    print(f"soak: {minutes:g} min, a file of {rows:,} events every {every_s} s, an actor killed every "
          f"{kill_every_s:g} s", flush=True)
    query = _windows_actorflow(spark, source, out, checkpoints, "af-soak")
    started = time.monotonic()
    with ChaosMonkey("af-soak", every_s=kill_every_s, max_kills=10_000, first_after_s=kill_every_s, seed=17) as monkey:
        writer.start()
        while time.monotonic() - started < minutes * 60:
            time.sleep(5.0)
            rss = sum(_rss(p) for p in psutil.process_iter(["cmdline"])
                      if (p.info["cmdline"] or [""])[0].startswith(("ray::OperatorActor", "ray::CheckpointCoordinator")))
            plasma = re.search(r"Plasma memory usage (\d+) MiB, (\d+) objects", memory_summary(address=address, stats_only=True))
            samples.append({"t_s": round(time.monotonic() - started, 1), "actor_rss_mib": round(rss / 2**20, 1),
                            "object_store_mib": float(plasma.group(1)) if plasma else -1.0,
                            "object_store_objects": float(plasma.group(2)) if plasma else -1.0,
                            "checkpoint_dir_mib": round(_tree_bytes(os.path.join(checkpoints, "actorflow")) / 2**20, 2),
                            "spark_checkpoint_dir_mib": round(_tree_bytes(os.path.join(checkpoints, "spark")) / 2**20, 2)})
            if len(samples) % 12 == 0:
                print(f"  {samples[-1]}", flush=True)
        stop.set()
        writer.join()
        query.process_all_available()
    query.stop(drain=True)  # every window fires: each one of the input must be out, exact
    written = len([n for n in os.listdir(source) if n.endswith(".parquet")])
    found, duplicated = _window_rows(spark, out)
    fired = {(user, round(start.timestamp() * 1000)): value for (user, start), value in found.items()}
    expected = _windows_of(written, rows)
    lost = sum(1 for key in expected if key not in fired)
    unexpected = sum(1 for key, value in fired.items() if expected.get(key) != value)
    print(f"  soak: {len(monkey.kills)} kills, {len(fired):,} windows out: lost {lost}, duplicated {duplicated}, "
          f"unexpected {unexpected}", flush=True)
    first = [s["actor_rss_mib"] for s in samples if s["t_s"] <= 300] or [samples[0]["actor_rss_mib"]]
    peak = max(s["actor_rss_mib"] for s in samples)
    return {"minutes": minutes, "files": written, "actor_kills": len(monkey.kills), "samples": samples,
            "soak_rss_ratio": round(peak / max(first), 3), "actor_peak_rss_mib": peak,
            "first_5_min_peak_rss_mib": max(first),
            "checkpoint_dir_mib_max": max(s["checkpoint_dir_mib"] for s in samples),
            "checkpoint_dir_mib_last": samples[-1]["checkpoint_dir_mib"],
            "spark_checkpoint_dir_mib_last": samples[-1]["spark_checkpoint_dir_mib"],
            "object_store_mib_max": max(s["object_store_mib"] for s in samples),
            "object_store_mib_last": samples[-1]["object_store_mib"],
            "lost": lost, "duplicated": duplicated, "unexpected": unexpected, "windows_out": len(fired)}


def _windows_of(files: int, rows: int) -> dict[tuple, tuple]:
    """(user, window start in ms) -> (count, sum of amount) of the events of ``files`` files."""
    ids = np.arange(files * rows)
    starts = (BASE_US // 1000 + ids * 10) // WINDOW_MS * WINDOW_MS
    windows: dict[tuple, list[int]] = {}
    for i, user, start in zip(ids.tolist(), (ids % 997).tolist(), starts.tolist()):
        entry = windows.setdefault((user, start), [0, 0])
        entry[0] += 1
        entry[1] += i % 100
    return {key: tuple(v) for key, v in windows.items()}


def _write_until(source: str, files: int, rows: int, every_s: float, stop: threading.Event) -> None:
    for k in range(files):
        if stop.is_set():
            return
        write_files(source, 1, rows, first_file=k)
        stop.wait(every_s)


def _rss(process: Any) -> int:
    try:
        return int(process.memory_info().rss)
    except Exception:  # noqa: BLE001 - a process that ended between listing and reading
        return 0


def _tree_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, names in os.walk(path) for f in names
               if os.path.exists(os.path.join(d, f)))


def driver_kills(spark: Any, source: str, work: str, calm: dict[tuple, tuple], *, kills: int, epochs: int,
                 seed: int) -> dict[str, Any]:
    """The windows backlog in drivers of their own, ``kills`` of them killed with SIGKILL at a
    moment and epoch drawn at random, then one run to the end; its output against ``calm``."""
    import random
    import signal
    import subprocess
    import sys

    from actorflow.cluster.streaming import DRIVER_MOMENTS

    rng = random.Random(seed)
    out, checkpoints = os.path.join(work, "driver-kills-out"), os.path.join(work, "driver-kills-chk")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done: list[str] = []
    runs_s: list[float] = []
    print(f"driver kills: {kills} drivers killed with SIGKILL at random moments (--seed {seed}), then one to the end",
          flush=True)
    while True:
        args = [source, out, checkpoints]
        if len(done) < kills:
            moment = rng.choice(DRIVER_MOMENTS)
            args += [moment, str(0 if moment == "restoring" else rng.randrange(epochs))]
        started = time.perf_counter()
        run = subprocess.run([sys.executable, "-m", "benchmarks.stream_driver", *args], cwd=root,
                             capture_output=True, text=True, timeout=600)
        runs_s.append(round(time.perf_counter() - started, 1))
        if run.returncode == -signal.SIGKILL:
            done.append(f"{args[3]}@{args[4]}")
            print(f"  killed at {args[3]} of epoch >= {args[4]} after {runs_s[-1]} s", flush=True)
            continue
        if run.returncode != 0:
            raise RuntimeError(f"a driver failed: exit {run.returncode}\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}")
        if len(args) > 3:  # every file was done before that moment came: this run was the last
            print(f"  reached the end before {args[3]} of epoch {args[4]}", flush=True)
        break
    survived, duplicated = _window_rows(spark, out)
    lost = sum(1 for key in calm if key not in survived)
    unexpected = sum(1 for key, value in survived.items() if calm.get(key) != value)
    print(f"  driver kills {len(done)}: lost {lost}, duplicated {duplicated}, unexpected {unexpected}; "
          f"last run {run.stdout.strip().splitlines()[-1]}", flush=True)
    return {"kills": done, "runs_s": runs_s, "lost": lost, "duplicated": duplicated, "unexpected": unexpected,
            "seed": seed}


def _window_rows(spark: Any, out: str) -> tuple[dict[tuple, tuple], int]:
    """(user, window start) -> (count, sum) of each window the output holds, and how many rows
    repeat a window already there."""
    rows = spark.read.parquet(out).select("user", "window_start", "n", "total").collect()
    windows = {(r.user, r.window_start): (r.n, r.total) for r in rows}
    return windows, len(rows) - len(windows)


def _expected_windows(files: int, rows: int) -> int:
    """How many (user, window) rows the whole input has: every window fires once."""
    ids = np.arange(files * rows)
    window = (ids * 10) // WINDOW_MS
    return len(np.unique(np.stack([ids % 997, window]), axis=1).T)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if not a or not b else round(a / b, 3)


@click.command()
@click.option("--quick", is_flag=True, help="a few minutes: smaller backlogs and a short live run")
@click.option("--soak", is_flag=True, help="then the windows query for --soak-minutes with an actor killed every minute")
@click.option("--soak-minutes", default=30.0, show_default=True, help="how long --soak runs")
@click.option("--seed", type=int, default=None, help="the draw of the driver kills (by default, a new one each run)")
def main(quick: bool, soak: bool, soak_minutes: float, seed: int | None) -> None:
    import ray

    import actorflow as af
    from actorflow.cluster.chaos import ChaosMonkey

    files, rows = (20, 5_000) if quick else (60, 10_000)
    enrich_files, enrich_rows = (10, 2_000) if quick else (30, 4_000)
    live_files, every_s = (16, 0.5) if quick else (60, 0.5)
    spark = af.spark_session()
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "1000")  # every micro-batch of a live run
    work = tempfile.mkdtemp(prefix="actorflow-streaming-bench-")
    try:
        source = os.path.join(work, "events")
        write_files(source, files, rows)
        n = files * rows
        print(f"windows: {files} files of {rows:,} events; the backlog, then files every {every_s} s", flush=True)
        windows: dict[str, Any] = {}
        # Spark first, so that neither system's run pays for the other's warm-up alone.
        windows["spark"] = backlog(spark, _windows_spark, source, work, "spark-windows", n)
        windows["actorflow"] = backlog(spark, _windows_actorflow, source, work, "af-windows", n, sampler_job="af-windows")
        for system, result in windows.items():
            print(f"  backlog {system}: {result['rps']:,.0f} rows/s ({result['seconds']} s)", flush=True)
        (ours, twice), (theirs, _) = _window_rows(spark, windows["actorflow"]["out"]), _window_rows(spark, windows["spark"]["out"])
        if twice:
            raise RuntimeError(f"actorflow wrote {twice} windows twice")
        # Spark's append mode holds back the windows its watermark has not passed; actorflow's stop()
        # too (a final checkpoint, no drain). The windows both emitted must agree.
        disagreeing = sum(1 for key in set(ours) & set(theirs) if ours[key] != theirs[key])
        print(f"  windows: actorflow {len(ours):,}, Spark {len(theirs):,} of {_expected_windows(files, rows):,}; "
              f"disagreeing {disagreeing}", flush=True)
        if disagreeing:
            raise RuntimeError(f"{disagreeing} windows differ between actorflow and Spark")
        windows["spark_live"] = live(spark, _windows_spark, work, "spark-live", live_files, rows, every_s)
        windows["actorflow_live"] = live(spark, _windows_actorflow, work, "af-live", live_files, rows, every_s)
        print(f"  live: actorflow p50 {windows['actorflow_live']['p50_ms']} ms p99 {windows['actorflow_live']['p99_ms']} ms; "
              f"Spark p50 {windows['spark_live']['p50_ms']} ms p99 {windows['spark_live']['p99_ms']} ms", flush=True)

        print("chaos: the windows backlog again, an actor killed every 2 s", flush=True)
        with ChaosMonkey("af-chaos", every_s=2.0, max_kills=4, first_after_s=2.0, seed=5) as monkey:
            chaos = backlog(spark, _windows_actorflow, source, work, "af-chaos", n)
        survived, duplicated = _window_rows(spark, chaos["out"])
        lost = sum(1 for key in ours if key not in survived)
        unexpected = sum(1 for key, value in survived.items() if ours.get(key) != value)
        print(f"  kills {len(monkey.kills)}: lost {lost}, duplicated {duplicated}, unexpected {unexpected}", flush=True)
        drivers = driver_kills(spark, source, work, ours, kills=3 if quick else 6, epochs=files,
                               seed=seed if seed is not None else int(time.time()))
        lost, duplicated, unexpected = (lost + drivers["lost"], duplicated + drivers["duplicated"],
                                        unexpected + drivers["unexpected"])

        enrich_source = os.path.join(work, "enrich-events")
        write_files(enrich_source, enrich_files, enrich_rows)
        m = enrich_files * enrich_rows
        print(f"enrichment, skewed profile, C={C}, P={P}: {enrich_files} files of {enrich_rows:,} rows", flush=True)
        enrichment = {
            "foreach_batch_enrich": backlog(spark, _enrich_foreach_batch, enrich_source, work, "fb-enrich", m),
            "foreach_batch_threadpool": backlog(spark, _enrich_threadpool, enrich_source, work, "fb-threads", m),
            "actorflow": backlog(spark, _enrich_actorflow, enrich_source, work, "af-enrich", m, sampler_job="af-enrich",
                                 drain=True),
        }
        for system, result in enrichment.items():
            print(f"  {system}: {result['rps']:,.0f} rows/s ({result['seconds']} s)", flush=True)
        enriched = spark.read.parquet(enrichment["actorflow"]["out"]).select("id", "result").collect()
        if len(enriched) != m or any(r.result != r.id * 31 + 7 for r in enriched):
            raise RuntimeError(f"actorflow's enriched output is wrong: {len(enriched)} rows of {m}")
        soaked = soak_run(spark, work, soak_minutes, rows=2_000, every_s=1.0) if soak else None
        if soaked is not None:
            lost, duplicated, unexpected = (lost + soaked["lost"], duplicated + soaked["duplicated"],
                                            unexpected + soaked["unexpected"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
        af.stop_spark()  # before Ray goes: RayDP's own stop at exit would find no Ray, and start one
        ray.shutdown()

    summary = {
        "quick": quick,
        "windows_rps": {k: v["rps"] for k, v in windows.items() if "rps" in v},
        "windows_latency_ms": {k: {"p50": v["p50_ms"], "p99": v["p99_ms"]} for k, v in windows.items() if "p50_ms" in v},
        "checkpoint_ms_p50": windows["actorflow"].get("checkpoint_ms_p50"),
        "publish_ms_p50": windows["actorflow"].get("publish_ms_p50"),
        "actor_peak_rss_mib": windows["actorflow"].get("actor_peak_rss_mib"),
        "actor_start_rss_mib": windows["actorflow"].get("actor_start_rss_mib"),
        "enrich_rps": {k: v["rps"] for k, v in enrichment.items()},
        "windows_rps_vs_spark": _ratio(windows["actorflow"]["rps"], windows["spark"]["rps"]),
        "windows_p99_latency_vs_spark": _ratio(windows["actorflow_live"]["p99_ms"], windows["spark_live"]["p99_ms"]),
        "enrich_skewed_vs_foreach_batch": _ratio(enrichment["actorflow"]["rps"], enrichment["foreach_batch_enrich"]["rps"]),
        "enrich_skewed_vs_threadpool": _ratio(enrichment["actorflow"]["rps"], enrichment["foreach_batch_threadpool"]["rps"]),
        "lost": lost, "duplicated": duplicated, "unexpected": unexpected,
        "actor_kills": len(monkey.kills) + (soaked["actor_kills"] if soaked else 0), "driver_kills": len(drivers["kills"]), "driver_kill_moments": drivers["kills"],
        "driver_kill_runs_s": drivers["runs_s"], "driver_kill_seed": drivers["seed"],
        "soak_rss_ratio": None if soaked is None else soaked["soak_rss_ratio"],
        "soak": None if soaked is None else {k: v for k, v in soaked.items() if k != "samples"},
        "soak_samples": None if soaked is None else soaked["samples"][::6],  # one a half-minute
        "targets": TARGETS,
    }
    emit("streaming", summary)


if __name__ == "__main__":
    main()
