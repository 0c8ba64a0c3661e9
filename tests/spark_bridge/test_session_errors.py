"""Sessions that cannot serve a job fail in one clear line: plain Spark, a dead executor, a stopped session.

Each case runs in its own process, with its own Ray and Spark, so that the shared session of the
other tests stays as it is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.ray, pytest.mark.processes]


class _Done:
    """What a driver process printed, and why it failed if it did."""

    def __init__(self, completed: subprocess.CompletedProcess[str], ray_logs: str) -> None:
        self.stdout, self.stderr, self.returncode = completed.stdout, completed.stderr, completed.returncode
        self.why = f"exit {self.returncode}\n--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-3000:]}{ray_logs}"


def _run(script: str) -> _Done:
    # Unbuffered, so that what the driver printed survives a process that Ray ends; Ray's files
    # in a directory of its own, so that a failure can show why Ray's own processes stopped.
    ray_tmp = tempfile.mkdtemp(prefix="af-ray-")
    try:
        completed = subprocess.run(
            [sys.executable, "-u", "-c", textwrap.dedent(script)],
            env={**os.environ, "RAY_TMPDIR": ray_tmp},
            capture_output=True, text=True, timeout=240, check=False,
        )
        logs = ""
        if completed.returncode != 0:
            for log in sorted(Path(ray_tmp).glob("ray/session_*/logs/*")):
                if log.name.startswith(("gcs_server", "raylet")) and log.stat().st_size:
                    logs += f"\n--- {log.name}\n" + log.read_text(errors="replace")[-2000:]
        return _Done(completed, logs)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_a_plain_spark_session_is_refused_with_what_to_do():
    done = _run("""
        from pyspark.sql import SparkSession
        from actorflow.spark_bridge import enrich, spark_session
        from actorflow.spark_bridge.session import SparkSessionError

        plain = SparkSession.builder.master("local[1]").appName("plain").getOrCreate()
        df = plain.range(5)
        def joined_ray_first():
            import ray
            from actorflow.spark_bridge import on_spark_cluster

            ray.init(address="local", num_cpus=1)
            on_spark_cluster(plain)

        for call in (lambda: enrich(df, lambda row: {"x": 1}), lambda: spark_session(), joined_ray_first):
            try:
                call()
            except SparkSessionError as error:
                print("REFUSED:", error)
        plain.stop()
    """)
    lines = [line for line in done.stdout.splitlines() if line.startswith("REFUSED:")]
    assert len(lines) == 3, done.why
    assert "enrich() reads DataFrames of Spark on Ray" in lines[0] and "'local[1]'" in lines[0]
    assert "on_spark_cluster(spark)" in lines[0]
    assert "already runs in this process" in lines[1] and "spark.stop()" in lines[1]
    assert "already connected to a Ray cluster" in lines[2] and "ray.shutdown()" in lines[2]
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.why


def test_greedy_executors_are_refused_and_a_dead_executor_or_a_stopped_session_fails_fast():
    # Ctrl-C in enrich() cancels its Spark jobs without py4j's tracebacks; a killed executor fails a
    # running read of enrich()'s output, and any later call, in seconds.
    # One process for the three cases (each driver process costs a Ray and a JVM start): the
    # refused session must leave nothing behind that stops the next one from starting.
    done = _run("""
        import time
        import ray
        from actorflow.spark_bridge import enrich, ensure_ray, spark_session, stop_spark
        from actorflow.spark_bridge.session import SparkSessionError

        ensure_ray(num_cpus=2)
        try:
            spark_session("greedy", num_executors=1, executor_cores=2)
        except SparkSessionError as error:
            print("REFUSED:", error)
        spark = spark_session("dead-executor", num_executors=1, executor_cores=1, executor_memory="512m")
        df = spark.range(20)
        print("BEFORE:", df.count())
        import os, signal, threading

        def sleepy(batches):
            for batch in batches:
                time.sleep(2)
                yield batch

        slow = spark.range(0, 16, 1, 16).mapInPandas(sleepy, "id long")  # 32 s on the one core
        threading.Timer(4, os.kill, (os.getpid(), signal.SIGINT)).start()  # Ctrl-C
        started = time.monotonic()
        try:
            enrich(slow, lambda row: {"x": 1}, progress=False)
        except KeyboardInterrupt as error:
            print("INTERRUPTED:", error, f"after {time.monotonic() - started:.1f} s")
        print("AFTER:", spark.range(5).count())
        out = enrich(df, lambda row: {"x": 1}, progress=False)
        ray.kill(ray.get_actor("raydp-executor-0"))
        # The output was not read yet: Spark would wait for an executor for ever.
        started = time.monotonic()
        try:
            out.count()
        except Exception as error:
            why = next((line for line in str(error).splitlines() if "cancelled" in line), str(error))
            print("CANCELLED:", why, f"after {time.monotonic() - started:.1f} s")
        time.sleep(2)
        started = time.monotonic()
        try:
            enrich(df, lambda row: {"x": 1}, progress=False)
        except SparkSessionError as error:
            print("DEAD:", error, f"after {time.monotonic() - started:.1f} s")
        stop_spark()
        try:
            enrich(df, lambda row: {"x": 1}, progress=False)
        except SparkSessionError as error:
            print("STOPPED:", error)
    """)
    out = done.stdout
    refused = next((line for line in out.splitlines() if line.startswith("REFUSED:")), "")
    assert "would hold every CPU of the Ray cluster (2 executor core(s) of 2)" in refused, done.why
    assert "BEFORE: 20" in out, done.why
    interrupted = next((line for line in out.splitlines() if line.startswith("INTERRUPTED:")), "")
    assert "this call's Spark jobs were cancelled" in interrupted, done.why
    assert float(interrupted.rsplit("after ", 1)[1].split()[0]) < 20, done.why
    assert "AFTER: 5" in out, done.why  # the session goes on
    assert "Exception while sending command" not in done.stdout + done.stderr, done.why
    cancelled = next((line for line in out.splitlines() if line.startswith("CANCELLED:")), "")
    assert "lost its last executor (raydp-executor-0 is DEAD)" in cancelled and "stop_spark()" in cancelled, done.why
    assert float(cancelled.rsplit("after ", 1)[1].split()[0]) < 30, done.why
    dead = next((line for line in out.splitlines() if line.startswith("DEAD:")), "")
    assert "no live executor (raydp-executor-0 is DEAD)" in dead and "stop_spark()" in dead, done.why
    stopped = next((line for line in out.splitlines() if line.startswith("STOPPED:")), "")
    assert "a Spark session that was stopped" in stopped, done.why
    assert done.returncode == 0, done.why
    # Spark's driver, RayDP's master and the executor each connected to Ray, and the console shows
    # none of the native client's "no Cluster ID" lines, though it shows the lost executor.
    assert "Cluster ID" not in done.stdout + done.stderr, done.why
    assert "Lost executor 0" in done.stdout + done.stderr, done.why


def test_a_child_forked_by_ray_leaves_the_parents_connections_to_the_jvm_open():
    # ray.init() and on_spark_cluster() start Ray's processes with a preexec_fn, so the child runs
    # Python's after-fork handling, and py4j's finalizers of other threads' connections with it.
    # The same process checks the fork without the guard first, so the check can fail.
    done = _run("""
        import logging
        import subprocess
        import threading
        from concurrent.futures import ThreadPoolExecutor
        from pyspark.sql import SparkSession

        resends = []
        class Resends(logging.Handler):
            def emit(self, record):
                if "Exception while sending command" in record.getMessage():
                    resends.append(record)
        logging.getLogger().addHandler(Resends())
        logging.getLogger().setLevel(logging.INFO)

        spark = SparkSession.builder.master("local[1]").appName("fork").getOrCreate()
        context = spark.sparkContext

        def calls_around_a_fork():
            # The resends of this thread's connection only: a connection of another thread (py4j's
            # releases of Java objects) that the unguarded fork shut may resend at any time after.
            before = len(resends)
            with ThreadPoolExecutor(max_workers=1) as thread:  # one thread, one connection
                ident = thread.submit(threading.get_ident).result()
                thread.submit(context.getLocalProperty, "a").result()
                subprocess.run(["true"], preexec_fn=lambda: None, check=True)
                value = thread.submit(lambda: context.defaultParallelism).result()
            return value, sum(1 for record in resends[before:] if record.thread == ident)

        print("UNGUARDED:", *calls_around_a_fork())
        from actorflow.actors import upstream  # importing installs nothing: ensure_ray starts it
        print("INSTALLED:", "py4j_fork" in upstream.start("driver"))
        print("GUARDED:", *calls_around_a_fork())
        spark.stop()
    """)
    lines = {line.split(":")[0]: line.split(":", 1)[1].split() for line in done.stdout.splitlines() if ":" in line}
    assert lines.get("UNGUARDED") == ["1", "1"], done.why  # py4j found its socket shut and sent again
    assert lines.get("INSTALLED") == ["True"], done.why
    assert lines.get("GUARDED") == ["1", "0"], done.why
    assert done.returncode == 0, done.why
