"""A streaming query's driver killed with SIGKILL at each moment that matters, and the same script
run again on the same checkpoint location each time: the final Parquet output is exact (nothing
lost, nothing twice, every dead letter and fallback where it belongs), and a micro-batch Spark
runs again after a kill is recognised and skipped."""

from __future__ import annotations

import collections
import datetime as dt
import json
import os
import signal
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from actorflow.cluster.stream_sinks import FileSink
from tests.spark_bridge.test_streaming_spark import BASE_US, HANGS, STEP_US, write_event_files

pytestmark = [pytest.mark.spark, pytest.mark.ray, pytest.mark.processes]

EVENTS, FILES = 20_000, 10
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _driver(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tests.spark_bridge.stream_driver", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def _expected(late: list[int]) -> list[tuple]:
    """The windows' rows computed here from the events: no dead letter (every 1,009th), no late
    click, a fallback for every HANGS-th (see ``Enrich``)."""
    late_set = set(late)
    windows: dict[tuple, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    for i in range(EVENTS):
        if i % 1_009 == 0 or i in late_set:
            continue
        ms = (BASE_US + i * STEP_US) // 1000
        start = ms // 60_000 * 60_000
        row = windows[(i % 61, start)]
        row[0], row[1], row[2] = row[0] + 1, row[1] + i % 100, row[2] + (1 if i % HANGS == 0 else 0)
    return sorted((user, start, start + 60_000, *values) for (user, start), values in windows.items())


def _published(out: str) -> list[tuple]:
    rows = []
    for name in FileSink(out).files:
        for r in pq.read_table(os.path.join(out, name)).to_pylist():
            rows.append((r["user"], _ms(r["window_start"]), _ms(r["window_end"]), r["n"], r["total"], r["fallbacks"]))
    return sorted(rows)


def _ms(value: dt.datetime) -> int:
    return int(value.timestamp() * 1000)


@pytest.mark.timeout(900)  # six drivers, each starting Ray and Spark
def test_driver_kills_at_each_moment_then_a_restart_give_the_exact_output(tmp_path, ray_session):
    # ray_session keeps this test in the shared tier, one test at a time: its six drivers, each
    # starting Ray and Spark, would otherwise run beside that tier's tests and upset their timing
    # (a restart's standby workers) and their view of the local Ray clusters.
    source, out, checkpoints = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "chk")
    late = write_event_files(source, EVENTS, FILES)
    # During a micro-batch, between its checkpoint and its publish, during the publish, during a
    # restore, and between its output published and Spark's commit.
    kills = [("fed", 1), ("checkpointed", 3), ("publishing", 5), ("restoring", 0), ("published", 7)]
    for moment, epoch in kills:
        run = _driver(source, out, checkpoints, moment, str(epoch))
        assert run.returncode == -signal.SIGKILL, (moment, run.returncode, run.stdout[-2000:], run.stderr[-3000:])
        assert f"dying at {moment}" in run.stdout
    final = _driver(source, out, checkpoints)
    assert final.returncode == 0, final.stderr[-3000:]
    report = json.loads(final.stdout.strip().splitlines()[-1])
    # Killed after it published epoch 7 and before Spark committed it: Spark runs it again, and
    # the restored job knows it has it.
    assert report["skipped"] == [7] and report["epochs"] == [7, 8, 9] and report["resumed_from"] is not None
    assert report["dead_letters"] == list(range(0, EVENTS, 1_009))
    ours, expected = _published(out), _expected(late)
    duplicated = sum((collections.Counter(ours) - collections.Counter(expected)).values())
    lost = sum((collections.Counter(expected) - collections.Counter(ours)).values())
    assert (lost, duplicated) == (0, 0) and ours == expected
