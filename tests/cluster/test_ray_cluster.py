"""An existing Ray cluster: `ray start --head` in its own process, a pipeline run from a separate
driver process with `--address`, and everything stopped afterwards."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.processes]  # a Ray cluster of its own

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """A one-node Ray cluster of its own, beside the test session's, shared by this module's tests; its address."""
    tmp_path = tmp_path_factory.mktemp("ray-head")
    bin_dir = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    env.pop("RAY_ADDRESS", None)
    # Its own temporary directory (short: Ray's socket paths must fit in 107 characters), so that
    # its notes never point the test session's Ray at it.
    temp_dir = tempfile.mkdtemp(prefix="afray-", dir="/tmp")
    head = subprocess.Popen(
        [os.path.join(bin_dir, "ray"), "start", "--head", "--port=0", "--node-ip-address=127.0.0.1",
         "--num-cpus=2", "--include-dashboard=false", "--object-store-memory=300000000", "--block",
         "--disable-usage-stats", f"--temp-dir={temp_dir}"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    address, seen = None, []
    deadline = time.time() + 120
    while time.time() < deadline and address is None:
        line = head.stdout.readline()
        if not line and head.poll() is not None:
            break
        seen.append(line)
        match = re.search(r"--address='([\d.]+:\d+)'", line)
        if match:
            address = match.group(1)
    assert address is not None, "".join(seen[-40:])
    try:
        yield address
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # `ray start --block` stops the node's processes with it
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(30)
        # `ray start` notes its address for later `ray.init()` calls; that cluster is gone now.
        note = Path("/tmp/ray/ray_current_cluster")
        if note.exists() and note.read_text().strip() == address:
            note.unlink()
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_a_pipeline_runs_on_an_existing_ray_cluster_from_a_separate_driver(ray_head):
    done = subprocess.run(
        [sys.executable, "-m", "actorflow", "run", "examples.pipelines:tagged_users", "--address", ray_head,
         "--no-progress"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "job 'tagged-users', 2,000 records in, 2,000 records out" in done.stdout
    # It ran there, not on a local Ray of its own: the driver joined that cluster.
    assert f"on the Ray cluster at {ray_head}\n" in done.stdout, done.stdout


def test_status_shows_a_running_job_of_a_cluster_without_a_dashboard(ray_head):
    # The State API lives in the dashboard, which this cluster lacks: status asks the GCS instead.
    job = subprocess.Popen(
        [sys.executable, "-m", "actorflow", "run", "examples.pipelines:slow_users", "--address", ray_head,
         "--no-progress"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        rows: dict[str, list[str]] = {}
        deadline = time.time() + 120
        # Until the instance is listed with its counts (at first it may be listed without them).
        while time.time() < deadline and not (rows and all(len(fields) >= 3 for fields in rows.values())):
            shown = subprocess.run([sys.executable, "-m", "actorflow", "status", "--address", ray_head],
                                   cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
            assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr[-3000:]
            rows = {line.split()[0]: line.split()[1:] for line in shown.stdout.splitlines()
                    if line.startswith("slow-users/")}
        # About a minute long, so that a status call on a loaded machine still sees it running.
        assert sorted(rows) == ["slow-users/slow[0/1]"], shown.stdout
        for state, records_in, records_out, *rest in rows.values():
            assert state == "ALIVE" and int(records_in) >= int(records_out) >= 0
    finally:
        # A job run to its end from a separate driver is the test above; this one has seen what it
        # needed. The driver's exit takes its actors with it.
        job.kill()
        job.wait(60)
