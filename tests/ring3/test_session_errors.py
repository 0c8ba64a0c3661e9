"""Sessions that cannot serve a job fail in one clear line: plain Spark, a dead executor, a stopped session.

Each case runs in its own process, with its own Ray and Spark, so that the shared session of the
other tests stays as it is.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.ray]


def _run(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=240, check=False
    )


def test_a_plain_spark_session_is_refused_with_what_to_do():
    done = _run("""
        from pyspark.sql import SparkSession
        from spark_bridge import enrich, spark_session
        from spark_bridge.session import SparkSessionError

        plain = SparkSession.builder.master("local[1]").appName("plain").getOrCreate()
        df = plain.range(5)
        def joined_ray_first():
            import ray
            from spark_bridge import on_spark_cluster

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
    assert len(lines) == 3, done.stdout + done.stderr
    assert "enrich() reads DataFrames of Spark on Ray" in lines[0] and "'local[1]'" in lines[0]
    assert "on_spark_cluster(spark)" in lines[0]
    assert "already runs in this process" in lines[1] and "spark.stop()" in lines[1]
    assert "already connected to a Ray cluster" in lines[2] and "ray.shutdown()" in lines[2]
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]


def test_a_dead_executor_and_a_stopped_session_fail_fast_instead_of_hanging():
    done = _run("""
        import time
        import ray
        from spark_bridge import enrich, spark_session, stop_spark
        from spark_bridge.session import SparkSessionError

        spark = spark_session("dead-executor", num_executors=1, executor_cores=1, executor_memory="512m")
        df = spark.range(20)
        print("BEFORE:", sorted(r.x for r in enrich(df, lambda row: {"x": row["id"]}, progress=False).collect())[-1])
        ray.kill(ray.get_actor("raydp-executor-0"))
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
    assert "BEFORE: 19" in out, out + done.stderr[-3000:]
    dead = next(line for line in out.splitlines() if line.startswith("DEAD:"))
    assert "no live executor (raydp-executor-0 is DEAD)" in dead and "stop_spark()" in dead
    stopped = next(line for line in out.splitlines() if line.startswith("STOPPED:"))
    assert "a Spark session that was stopped" in stopped
    assert done.returncode == 0, done.stderr[-3000:]


def test_executors_that_would_hold_every_cpu_are_refused_instead_of_hanging():
    done = _run("""
        from spark_bridge import ensure_ray, spark_session
        from spark_bridge.session import SparkSessionError

        ensure_ray(num_cpus=2)
        try:
            spark_session("greedy", num_executors=1, executor_cores=2)
        except SparkSessionError as error:
            print("REFUSED:", error)
    """)
    line = next((l for l in done.stdout.splitlines() if l.startswith("REFUSED:")), "")
    assert "would hold every CPU of the Ray cluster (2 executor core(s) of 2)" in line, done.stdout + done.stderr[-2000:]
    assert done.returncode == 0
