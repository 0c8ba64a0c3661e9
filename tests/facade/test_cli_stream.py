"""``actorflow run`` of a streaming pipeline runs until SIGTERM or ``actorflow stop JOB`` from
another shell, stops with a final checkpoint each time, and the same command resumes: every
click is in the output once."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from actorflow.cluster.stream_sinks import FileSink
from tests.facade.stream_pipeline import FAILS
from tests.spark_bridge.test_streaming_spark import write_event_files

pytestmark = [pytest.mark.spark, pytest.mark.ray, pytest.mark.processes]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _start(source: str, out: str, checkpoints: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "actorflow", "run", "tests.facade.stream_pipeline:pipeline", "--output", out,
         "--checkpoint-dir", checkpoints, "--checkpoint-interval", "500ms", "--side-outputs", f"{out}-sides"],
        cwd=ROOT, env={**os.environ, "ACTORFLOW_TEST_STREAM_INPUT": source}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)


def _ids(out: str) -> list[int]:
    return sorted(i for name in FileSink(out).files for i in pq.read_table(os.path.join(out, name)).column("id").to_pylist())


def _wait_for(out: str, count: int, run: subprocess.Popen, timeout_s: float = 150) -> None:
    deadline = time.monotonic() + timeout_s
    while not (os.path.isdir(os.path.join(out, "_spark_metadata")) and len(_ids(out)) >= count):
        assert run.poll() is None, run.communicate()
        assert time.monotonic() < deadline, f"{len(_ids(out)) if os.path.isdir(out) else 0} of {count} rows out"
        time.sleep(0.5)


@pytest.fixture
def runs():
    """The runs a test starts: killed at its end, should it fail while one still runs."""
    started: list[subprocess.Popen] = []
    yield started
    for run in started:
        if run.poll() is None:
            run.kill()
            run.communicate(timeout=30)


def test_run_streams_until_sigterm_or_actorflow_stop_and_the_same_command_resumes(tmp_path, runs):
    source, out, checkpoints = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "chk")
    all_files = str(tmp_path / "all")
    write_event_files(all_files, 3_000, 3)
    names = sorted(os.listdir(all_files))
    os.makedirs(source)
    os.link(os.path.join(all_files, names[0]), os.path.join(source, names[0]))

    first = _start(source, out, checkpoints)
    runs.append(first)
    _wait_for(out, 998, first)  # the first file's 1,000 clicks, but 7 and 507
    first.send_signal(signal.SIGTERM)
    stdout, stderr = first.communicate(timeout=120)
    assert first.returncode == 0, stderr[-3000:]
    assert re.search(r"stopped: job 'cli-stream' stopped after epoch 0 with a final checkpoint in .*chk; output in "
                     r".*out, dead letters and side outputs in .*out-sides\. Run the same command to resume\.", stdout), stdout

    for name in names[1:]:
        os.link(os.path.join(all_files, name), os.path.join(source, name))
    second = _start(source, out, checkpoints)
    runs.append(second)
    _wait_for(out, 2_994, second)
    address = None
    while address is None:  # said on the first line of the run's standard error
        line = second.stderr.readline()
        assert line, "the run ended without saying where it runs"
        found = re.search(r"runs on the Ray cluster at (\S+);", line)
        address = found.group(1) if found else None
    status = subprocess.run([sys.executable, "-m", "actorflow", "status", "--address", address], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    # The second run is the job's attempt 1: a killed run's actors, had it been killed, would be attempt 0's.
    assert re.search(r"cli-stream/async_map\[0/1\]@1\s+ALIVE\s+\d+\s+\d+", status.stdout), status.stdout
    assert re.search(r"job cli-stream: streaming, epoch 1 \(checkpoint \d+\), 2,000 rows in, \d[\d,]* out, published "
                     r"[\d.]+ s ago; latency \d+ ms, checkpoint \d+ ms", status.stdout), status.stdout
    stop = subprocess.run([sys.executable, "-m", "actorflow", "stop", "cli-stream", "--address", address], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert stop.returncode == 0, stop.stderr[-2000:]
    assert "asked job 'cli-stream' to stop" in stop.stdout
    stdout, stderr = second.communicate(timeout=120)
    assert second.returncode == 0, stderr[-3000:]
    # The two files that came while it was stopped are one micro-batch: epoch 1.
    assert "stopped: job 'cli-stream' stopped after epoch 1 with a final checkpoint" in stdout, stdout
    failed = [i for i in range(3_000) if i % FAILS == 7]
    assert _ids(out) == [i for i in range(3_000) if i not in failed]
    # The dead letters are a stream of their own, published with the output: each once, with why.
    letters = f"{out}-sides/dead_letter"
    assert _ids(letters) == failed
    assert {r["error_type"] for name in FileSink(letters).files
            for r in pq.read_table(os.path.join(letters, name)).to_pylist()} == {"LookupError"}
