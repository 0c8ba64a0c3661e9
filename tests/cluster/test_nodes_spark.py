"""Spark on a cluster of three Ray nodes: input blocks from Spark and output blocks to it cross
the nodes, and enrichment, keyed windows and a Structured Streaming query give row for row what
they give on one node. A node that holds input blocks dies, and the blocks are fetched again from
Spark's cache; a node that holds instances dies mid-job, and the output is exact.

Each cluster runs with its driver in a process of its own (nodes_spark_job.py): a process holds
one SparkContext, and the tests' shared one is RayDP's on the session's Ray.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.nodes_spark_job import ROWS

pytestmark = [pytest.mark.spark, pytest.mark.ray, pytest.mark.processes]

ROOT = Path(__file__).resolve().parents[2]


def _run(nodes: int, workdir: Path) -> dict:
    workdir.mkdir()
    run = subprocess.run([sys.executable, "-m", "tests.cluster.nodes_spark_job", str(nodes), str(workdir)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    assert run.returncode == 0 and lines, f"driver failed ({run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    return json.loads(lines[-1])


# Two clusters, each with Spark, one after the other: on a loaded 2-core machine, minutes.
@pytest.mark.timeout(1200)
def test_spark_jobs_and_a_stream_on_three_nodes_equal_a_single_node_run_through_node_deaths(tmp_path):
    three = _run(3, tmp_path / "three")
    one = _run(1, tmp_path / "one")
    assert (three["nodes"], one["nodes"]) == (3, 1)

    # Enrichment from a DataFrame: its instances on several nodes, its rows those of one node.
    assert three["enrich_nodes"] == 3 and one["enrich_nodes"] == 1
    assert three["enrich_exact"] and one["enrich_exact"]
    assert three["enrich"] == one["enrich"]
    # Keyed windows from a DataFrame, and the same windows over the DataFrame's rows as a stream
    # of files: each window counted once, whole, as on one node.
    assert three["windows_counted"] == one["windows_counted"] == ROWS
    assert three["windows"] == one["windows"]
    assert three["stream"] == one["stream"] == one["windows"]

    # A node that held input blocks died: every block was read again, rebuilt from Spark's cache.
    lineage = three["lineage"]
    assert lineage["blocks_on_killed_node"] >= 1 and lineage["rows_read_after_the_kill"], lineage
    # A node that held instances died mid-job: every row once, with its answer.
    chaos = three["chaos"]
    assert chaos["node_kills"] == 1, chaos
    assert chaos["rows"] == chaos["distinct"] == ROWS and chaos["exact"], chaos
