"""Launch mode "an existing Spark cluster": a standalone master and worker on 127.0.0.1.

The driver runs in a process of its own (a process holds one SparkContext, and this one holds
RayDP's): it starts Ray on the Spark cluster with on_spark_cluster(), enriches a DataFrame of
every common Spark type there, and reports what it saw as one JSON line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from actorflow.spark_bridge.standalone import standalone_spark_cluster

pytestmark = [
    pytest.mark.spark,  # a Spark cluster and a Ray of its own
    pytest.mark.ray,
    pytest.mark.processes,
]

ROOT = Path(__file__).resolve().parents[2]


def _processes_mentioning(text: str) -> list[str]:
    found = subprocess.run(["pgrep", "-af", text], capture_output=True, text=True).stdout.splitlines()
    return [line for line in found if "pgrep" not in line]


@pytest.fixture(scope="module")
def standalone_spark():
    """A Spark standalone master and one worker of 4 cores, on 127.0.0.1, stopped afterwards."""
    with standalone_spark_cluster(cores=4, memory="3g") as cluster:
        yield cluster.url, cluster.work, cluster.env


def test_enrich_on_a_standalone_spark_cluster_row_for_row(standalone_spark):
    url, work, env = standalone_spark
    ray_temp = work / "ray"
    run = subprocess.run(
        [sys.executable, "-m", "tests.spark_bridge.spark_cluster_job", url, str(ray_temp)],
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
