"""The console command, run as a user runs it: a subprocess, its output and its exit code."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import threading

import pyarrow as pa
import pytest
import ray

from examples.pipelines import slow_users, steady_users
from actorflow.cluster.checkpoints import CheckpointStorage
from actorflow.operators import JobFailedError
from tests.waiting import Background, find_actor, poll

pytestmark = [pytest.mark.ray, pytest.mark.processes]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _actorflow(*args: str, timeout: float = 180, cwd: str = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "actorflow", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _unfinished_run(root, job: str, ids=(1, 2)) -> CheckpointStorage:
    """What a run that died after these checkpoints leaves in ``root``: complete checkpoints, no finished mark."""
    storage = CheckpointStorage(str(root), job=job)
    for i in ids:
        storage.begin(i).complete()
    return storage


def test_the_console_script_is_installed():
    script = shutil.which("actorflow", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    assert script is not None
    done = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and all(c in done.stdout for c in ("run", "status", "demo"))


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "nosuch.module:x"], "cannot import 'nosuch.module': No module named 'nosuch'"),
        (["run", "examples.pipelines:nothing"], "module 'examples.pipelines' has no 'nothing'; it has ['slow_users', 'steady_users', 'tagged_users']"),
        (["run", "examples.pipelines"], "expected MODULE:PIPELINE"),
        (["run", "examples.pipelines:__doc__"], "is a str, expected a DataStream"),
        (["status", "--address", "127.0.0.1:1"], "cannot reach Ray at '127.0.0.1:1'"),
        (["run", "examples.pipelines:tagged_users", "--resume-from", "/nonexistent/job"],
         "no checkpoint directory at '/nonexistent/job'"),
    ],
    ids=["no-module", "no-attribute", "no-colon", "not-a-stream", "ray-unreachable", "no-checkpoint-dir"],
)
def test_the_usual_mistakes_get_one_line_and_exit_code_2(args, message):
    done = _actorflow(*args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]


def test_run_runs_a_pipeline_to_its_end():
    done = _actorflow("run", "examples.pipelines:tagged_users", "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "job 'tagged-users', 2,000 records in, 2,000 records out" in done.stdout


def test_status_shows_every_instance_of_a_running_job(ray_session):
    job = Background(lambda: slow_users().execute(progress=False))
    actor = poll(lambda: find_actor("slow-users/slow[0/1]"))
    poll(lambda: ray.get(actor.stats.remote())["records_in"] > 0)
    done = _actorflow("status", "--address", ray.get_runtime_context().gcs_address)
    ray.kill(actor)  # the job fails and cleans up; the test has seen what it needed
    assert job.failed_with(JobFailedError, "an actor died"), job.error
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].split()[:4] == ["operator", "instance", "state", "in"]
    (row,) = [line for line in lines if line.startswith("slow-users/slow[0/1]")]
    fields = row.split()
    assert fields[1] == "ALIVE" and int(fields[2]) > 0 and int(fields[4]) <= 2  # records in; in flight <= capacity


def test_chaos_kills_a_pipelines_actors_and_reports_an_exact_output(ray_session):
    import json

    import ray

    done = _actorflow("chaos", "--kills", "2", "--every", "1s", "--checkpoint-interval", "300ms",
                      "--address", ray.get_runtime_context().gcs_address, "examples.pipelines:steady_users", timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "lost 0, duplicated 0, unexpected 0  (exact)" in done.stdout
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["expected_rows"] == summary["actual_rows"] == 40_000
    assert summary["kills"] >= 1 and summary["restarts"] == summary["kills"], summary
    assert summary["key"] == ["user"]


def test_chaos_refuses_a_duration_it_cannot_read():
    done = _actorflow("chaos", "--every", "soon", "examples.pipelines:steady_users")
    assert done.returncode == 2 and "expected a duration such as 2s, 500ms or 1m, got 'soon'" in done.stderr


def test_status_shows_the_last_checkpoint_and_the_restarts_of_a_recovered_job(ray_session, tmp_path):
    stream = steady_users(200_000)
    job = Background(lambda: stream.execute(progress=False, checkpoint_interval_ms=200, checkpoint_dir=str(tmp_path)))
    first = poll(lambda: find_actor("steady-users/tag[0/2]"))
    poll(lambda: ray.get(first.checkpoints_done.remote()) >= 1)
    ray.kill(first, no_restart=True)
    restarted = poll(lambda: find_actor("steady-users/tag[0/2]@1"))
    poll(lambda: ray.get(restarted.checkpoints_done.remote()) >= 1)
    # The restarted instance has written its part of a checkpoint; the job's checkpoint is
    # complete once every instance has. Ids go on from the first attempt's, so this one is >= 2.
    coordinator = find_actor("steady-users/checkpoint_coordinator[0/1]")
    poll(lambda: (ray.get(coordinator.figures.remote())["last_completed"] or 0) >= 2)
    done = _actorflow("status", "--address", ray.get_runtime_context().gcs_address)
    # The test has seen what it needed: end the job now. Without its coordinator it cannot
    # restart, so killing an instance after it fails the job instead of replaying it.
    for name in ("steady-users/checkpoint_coordinator[0/1]", "steady-users/tag[0/2]@1", "steady-users/tag[1/2]@1"):
        actor = find_actor(name)
        if actor is not None:
            ray.kill(actor, no_restart=True)
    assert job.join(120).failed_with(JobFailedError), job.error
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].split()[-2:] == ["checkpoint", "restarts"]
    (row,) = [line for line in lines if line.startswith("steady-users/tag[0/2]@1")]
    fields = row.split()
    assert fields[1] == "ALIVE" and int(fields[-2]) >= 2 and fields[-1] == "1"  # a checkpoint id; one restart


def test_run_with_a_checkpoint_directory_runs_the_job_to_its_end_on_a_running_ray(ray_session, tmp_path):
    import ray

    done = _actorflow("run", "examples.pipelines:tagged_users", "--no-progress", "--checkpoint-dir", str(tmp_path),
                      "--checkpoint-interval", "100ms", "--address", ray.get_runtime_context().gcs_address)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "job 'tagged-users', 2,000 records in, 2,000 records out" in done.stdout


def test_a_pipeline_function_that_needs_arguments_is_refused_before_ray_starts(tmp_path):
    (tmp_path / "needs_args.py").write_text("def pipeline(rows, *, name='x'):\n    raise AssertionError('called')\n")
    done = _actorflow("run", "needs_args:pipeline", cwd=str(tmp_path), timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        "Error: needs_args:pipeline needs the argument(s) rows, and `actorflow run` calls it with none; give them "
        "defaults, or point at a function that takes none"], done.stderr[-2000:]
    assert "Ray" not in done.stdout + done.stderr  # refused before Ray started


def test_checkpoints_of_an_id_that_does_not_exist_names_those_that_do(tmp_path):
    _unfinished_run(tmp_path, "clicks", ids=(3, 4))
    done = _actorflow("checkpoints", str(tmp_path), "--id", "999", timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip() == f"Error: no complete checkpoint 999 in {str(tmp_path)!r}; the complete ones: job clicks: [3, 4]"
    assert done.stdout == ""


def test_resume_from_the_checkpoint_root_names_the_job_directory(tmp_path):
    _unfinished_run(tmp_path, "steady-users")
    done = _actorflow("run", "examples.pipelines:steady_users", "--resume-from", str(tmp_path), timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip() == (f"Error: {str(tmp_path)!r} is a checkpoint directory, not a job's; pass "
                                   f"--resume-from {tmp_path}/steady-users")


def test_a_fresh_run_refuses_the_checkpoints_of_a_run_that_did_not_finish_unless_told_to_overwrite(ray_session, tmp_path):
    _unfinished_run(tmp_path, "tagged-users")
    address = ray.get_runtime_context().gcs_address
    args = ["run", "examples.pipelines:tagged_users", "--no-progress", "--checkpoint-dir", str(tmp_path),
            "--checkpoint-interval", "100ms", "--address", address]
    refused = _actorflow(*args)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    where = f"{tmp_path}/tagged-users"
    assert refused.stderr.strip().splitlines()[-1] == (
        f"Error: job 'tagged-users' has the checkpoints of an earlier run that did not finish in {where!r} (the latest "
        f"complete one: chk-2); go on from it with --resume-from {where}, or delete them and start afresh with --overwrite")
    assert sorted(p.parent.name for p in (tmp_path / "tagged-users").glob("chk-*/_metadata")) == ["chk-1", "chk-2"]

    done = _actorflow(*args, "--overwrite")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "job 'tagged-users', 2,000 records in, 2,000 records out" in done.stdout


def test_ctrl_c_in_run_names_the_last_checkpoint_and_the_command_that_resumes(ray_session, tmp_path):
    # steady_users long enough to be interrupted; its functions come from examples, which Ray's workers import.
    (tmp_path / "long_users.py").write_text(
        "from examples.pipelines import steady_users\n\ndef pipeline():\n    return steady_users(400_000)\n")
    address = ray.get_runtime_context().gcs_address
    checkpoints = tmp_path / "chk"
    run = subprocess.Popen(
        [sys.executable, "-m", "actorflow", "run", "long_users:pipeline", "--no-progress", "--checkpoint-dir",
         str(checkpoints), "--checkpoint-interval", "200ms", "--address", address],
        cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        poll(lambda: list(checkpoints.glob("steady-users/chk-*/_metadata")) or run.poll() is not None, timeout_s=180)
        assert run.poll() is None, run.communicate()
        run.send_signal(signal.SIGINT)
        _, stderr = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 130, stderr[-3000:]
    where = f"{checkpoints}/steady-users"
    latest = max(int(p.parent.name[4:]) for p in checkpoints.glob("steady-users/chk-*/_metadata"))
    lines = stderr.strip().splitlines()
    assert lines[-2].startswith(f"interrupted: job 'steady-users' stopped; its last complete checkpoint is chk-{latest} ("), lines
    assert lines[-2].endswith(f" UTC) in {where}"), lines
    assert lines[-1] == (f"resume with: actorflow run long_users:pipeline --resume-from {where} "
                         f"--checkpoint-interval 200ms --address {address}"), lines
    assert "Traceback" not in stderr, stderr[-3000:]


async def _slowly(row: dict) -> list[dict]:
    await asyncio.sleep(0.05)
    return [row]


def test_status_watch_shows_that_a_job_died_and_its_watermark_as_a_time(ray_session):
    from ray.util.state import list_actors

    from actorflow.cluster import from_arrow

    start_ms = 1_700_000_000_000  # 2023-11-14T22:13:20.000Z
    table = pa.table({"user": list(range(2_400)), "ts": [start_ms + i * 1_000 for i in range(2_400)]})
    stream = from_arrow([table.slice(i, 100) for i in range(0, 2_400, 100)], parallelism=1, batch_size=10,
                        timestamp_column="ts", job_name="watched-users").async_map(_slowly, capacity=2, name="slow")
    job = Background(lambda: stream.execute(progress=False))
    actor = poll(lambda: find_actor("watched-users/slow[0/1]"))
    poll(lambda: ray.get(actor.stats.remote()).get("watermark_ms") is not None)
    address = ray.get_runtime_context().gcs_address

    raw = _actorflow("status", "--address", address, "--epoch-ms")
    (row,) = [line for line in raw.stdout.splitlines() if line.startswith("watched-users/slow[0/1]")]
    assert int(row.split()[5]) >= start_ms, row

    watch = subprocess.Popen([sys.executable, "-m", "actorflow", "status", "--address", address, "--watch", "0.5"],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []

    def read() -> None:
        for line in watch.stdout:
            lines.append(line.rstrip("\n"))

    threading.Thread(target=read, daemon=True).start()
    try:
        row = poll(lambda: next((line for line in lines if line.startswith("watched-users/slow[0/1]")), None), timeout_s=120)
        fields = row.split()
        assert fields[1] == "ALIVE", row
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", fields[5]) and fields[5] >= "2023-11-14T22:13:20.000Z", row
        # A crash, not the job's own stop: the process ends without a word.
        (state,) = list_actors(address=address, filters=[("name", "=", "watched-users/slow[0/1]"), ("state", "=", "ALIVE")],
                               detail=True)
        os.kill(state.pid, signal.SIGKILL)
        assert job.failed_with(JobFailedError, "an actor died"), job.error
        shown = poll(lambda: next((line for line in lines if line.startswith("job watched-users: ")), None), timeout_s=60)
        assert shown.startswith("job watched-users: DIED: watched-users/slow[0/1] died (WORKER_DIED): "), lines[-20:]
    finally:
        watch.send_signal(signal.SIGINT)
        watch.wait(30)
    assert watch.returncode == 130, watch.stderr.read()[-3000:]


def test_a_chaos_kill_at_a_moment_is_said_to_be_the_chaos_tools_not_the_oom_killers(ray_session):
    done = _actorflow("chaos", "--kills", "1", "--every", "1s", "--checkpoint-interval", "300ms", "--moment", "snapshot",
                      "--address", ray.get_runtime_context().gcs_address, "examples.pipelines:steady_users", timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    output = done.stdout + done.stderr
    # Ray's notice of the death, if it came, is said in the chaos tool's words.
    assert "OOM killer" not in output.replace("not by the OOM killer", ""), output[-3000:]
    assert "A worker died or was killed" not in output, output[-3000:]
    (killed,) = re.findall(r"  killed (steady-users/tag\[\d/2\]) at (\d+\.\d) s", done.stdout)
    assert f"  restart 1: {killed[0]}: killed by the chaos tool at {killed[1]} s, at the moment 'snapshot'" in done.stdout


@pytest.mark.parametrize("checkpoints", [False, True], ids=["plain", "checkpointed"])
def test_run_writes_the_output_as_parquet_and_says_where(ray_session, tmp_path, checkpoints):
    import pyarrow.parquet as pq

    out = tmp_path / "out"
    args = ["run", "examples.pipelines:tagged_users", "--no-progress", "--output", str(out),
            "--address", ray.get_runtime_context().gcs_address]
    if checkpoints:
        args += ["--checkpoint-dir", str(tmp_path / "chk"), "--checkpoint-interval", "100ms"]
    done = _actorflow(*args)
    assert done.returncode == 0, done.stderr[-3000:]
    table = pq.read_table(str(out))
    assert sorted(table.column("user").to_pylist()) == list(range(2_000))
    assert sorted(table.column("tag").to_pylist()) == sorted(f"user-{i}" for i in range(2_000))
    assert (out / "_SUCCESS").exists()
    files = len(list(out.glob("part-*.parquet")))
    assert f"output: 2,000 rows in {files} Parquet file{'s' if files != 1 else ''} in {out}" in done.stdout

    again = _actorflow(*args)
    assert again.returncode == 2 and f"--output {out} exists" in again.stderr, again.stderr[-2000:]


async def _held(row: dict) -> list[dict]:
    await asyncio.Event().wait()  # never set: every request stays in flight, and the queue fills
    return [row]


def test_status_says_why_an_instance_waits_and_what_its_mailbox_holds(ray_session):
    from actorflow.cluster import from_arrow

    stream = from_arrow([pa.table({"user": list(range(1_000))})], parallelism=1, batch_size=10,
                        job_name="held-users").async_map(_held, capacity=4, name="held")
    job = Background(lambda: stream.execute(progress=False))
    actor = poll(lambda: find_actor("held-users/held[0/1]"))
    poll(lambda: ray.get(actor.stats.remote())["suspended"] == "async_queue_full")
    done = _actorflow("status", "--address", ray.get_runtime_context().gcs_address)
    ray.kill(actor)  # the job fails and cleans up; the test has seen what it needed
    assert job.failed_with(JobFailedError, "an actor died"), job.error
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.startswith("held-users/held[0/1]")]
    assert int(lines[at].split()[4]) == 4  # every request of its capacity in flight
    # The line under it: the wait and the mailbox (nothing completes, so no result waits in it).
    assert re.fullmatch(r"    suspended: async_queue_full, \d+ mails?(, oldest \d+ ms|, oldest \d+\.\d s)?", lines[at + 1]), lines
