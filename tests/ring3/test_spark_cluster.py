"""Launch mode "an existing Spark cluster": a standalone master and worker on 127.0.0.1.

The driver runs in a process of its own (a process holds one SparkContext, and this one holds
RayDP's): it starts Ray on the Spark cluster with on_spark_cluster(), enriches a DataFrame of
every common Spark type there, and reports what it saw as one JSON line.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import pyspark

pytestmark = pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs java on PATH, and there is none")

ROOT = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_line(log: Path, text: str, process: subprocess.Popen, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        if process.poll() is not None:
            break
        time.sleep(0.3)
    raise AssertionError(f"{log.name} never said {text!r}:\n{log.read_text(errors='replace')[-3000:] if log.exists() else ''}")


def _stop(process: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _processes_mentioning(text: str) -> list[str]:
    found = subprocess.run(["pgrep", "-af", text], capture_output=True, text=True).stdout.splitlines()
    return [line for line in found if "pgrep" not in line]


@pytest.fixture(scope="module")
def standalone_spark():
    """A Spark standalone master and one worker of 4 cores, on 127.0.0.1, stopped afterwards."""
    work = Path(tempfile.mkdtemp(prefix="afsc-"))  # short: Ray's socket paths live under it
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        # The worker's executors run Spark's Python workers, which start Ray's worker nodes.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(work / "logs"),
        "SPARK_WORKER_DIR": str(work / "work"),
    }
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port = _free_port()
    master_log, worker_log = work / "master.log", work / "worker.log"
    started: list[subprocess.Popen] = []
    try:
        with master_log.open("w") as out:
            master = subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", str(port), "--webui-port", str(_free_port())],
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        started.append(master)
        _wait_for_line(master_log, "I have been elected leader", master)
        url = f"spark://127.0.0.1:{port}"
        with worker_log.open("w") as out:
            worker = subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                 "--cores", "4", "--memory", "3g", "--webui-port", str(_free_port()), "--work-dir", str(work / "work")],
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        started.append(worker)
        _wait_for_line(worker_log, "Successfully registered with master", worker)
        yield url, work, env
    finally:
        for process in reversed(started):
            _stop(process)
        shutil.rmtree(work, ignore_errors=True)


def test_enrich_on_a_standalone_spark_cluster_row_for_row(standalone_spark):
    url, work, env = standalone_spark
    ray_temp = work / "ray"
    run = subprocess.run(
        [sys.executable, "-m", "tests.ring3.spark_cluster_job", url, str(ray_temp)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=420)
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    assert run.returncode == 0 and lines, f"driver failed ({run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-5000:]}"
    seen = json.loads(lines[-1])

    assert seen["rows_in"] == seen["rows_out"] == 3000
    assert seen["mismatches"] == [], f"rows differ at {seen['mismatches']}"
    # Every input column keeps its Spark type; the new column is inferred as Spark would.
    assert {k: v for k, v in seen["output_types"].items() if k in seen["input_types"]} == seen["input_types"]
    assert seen["output_types"]["score"] == "bigint"
    assert seen["input_types"]["ts_ntz"] == "timestamp_ntz" and seen["input_types"]["attrs"] == "map<string,int>"
    # Ray ran on the Spark cluster: a head beside the driver and a worker node in an executor,
    # and the job's actors ran on that worker node, never on the head.
    assert seen["ray_nodes"] == 2
    assert len(seen["head_nodes"]) == 1 and len(seen["spark_worker_nodes"]) == 1
    assert seen["head_nodes"] != seen["spark_worker_nodes"]
    assert seen["row_nodes"] == seen["spark_worker_nodes"]
    # shutdown() disconnected, deleted the staging files and left Spark running.
    assert seen["ray_after_shutdown"] is False
    assert seen["staging_left"] is False
    assert seen["spark_still_runs"] is True

    # Nothing of the Ray cluster on Spark outlives the driver.
    deadline = time.monotonic() + 30
    while _processes_mentioning(str(ray_temp)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _processes_mentioning(str(ray_temp)) == []
