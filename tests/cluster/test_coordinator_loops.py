"""The checkpoint coordinator's background loops: a failure is logged with its cause and the job's
checkpoints go on (the interval loop used to end silently at the first trigger that raised)."""

from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
import ray

from actorflow.cluster.checkpoints import CheckpointStorage
from actorflow.cluster.checkpoints.coordinator import CheckpointConfig, CheckpointCoordinator, JobCheckpoints

pytestmark = pytest.mark.ray


class _Unreachable:
    """A filesystem that refuses the first ``failures`` checkpoint directories and the first look
    at ``lookup_fails`` (once), as a storage that is down for a moment would; else the real local
    filesystem."""

    def __init__(self, failures: int, lookup_fails: str) -> None:
        self._filesystem, self.failures, self.lookup_fails = pafs.LocalFileSystem(), failures, lookup_fails

    def __getattr__(self, name):
        if name.startswith("__") or name == "_filesystem":  # unpickling looks before __dict__ is set
            raise AttributeError(name)
        return getattr(self._filesystem, name)

    def create_dir(self, path, recursive=True):
        if self.failures and "/chk-" in path:
            self.failures -= 1
            raise OSError(f"storage unreachable: cannot create '{path}'")
        self._filesystem.create_dir(path, recursive=recursive)

    def get_file_info(self, what):
        if isinstance(what, str) and self.lookup_fails and what.endswith(self.lookup_fails):
            self.lookup_fails = ""
            raise OSError(f"storage unreachable: cannot look at '{what}'")
        return self._filesystem.get_file_info(what)


@ray.remote
class _Reader:
    """Stands where the job's source actors stand: records the checkpoints it is asked to start."""

    def __init__(self) -> None:
        self.triggered: list[int] = []

    def trigger_checkpoint(self, checkpoint_id: int) -> None:
        self.triggered.append(checkpoint_id)

    def ids(self) -> list[int]:
        return list(self.triggered)


def test_a_trigger_or_a_timeout_that_raises_is_logged_with_its_cause_and_the_loops_go_on(ray_session, tmp_path):
    # Checkpoints 1 and 2 cannot start (their directories fail); 3 starts, times out with no
    # acknowledgement, and its abort fails (its metadata cannot be looked at); 4 starts all the same.
    storage = CheckpointStorage(str(tmp_path), job="loops", filesystem=_Unreachable(2, "chk-3/_metadata"))
    config = CheckpointConfig(interval_ms=50, timeout_ms=200)
    coordinator = ray.remote(CheckpointCoordinator).remote("loops", JobCheckpoints(storage), config, 1)
    reader = _Reader.remote()
    try:
        ray.get(coordinator.configure.remote(1, ["source[0/1]"], [reader], []))
        deadline = time.monotonic() + 30
        while len(ray.get(reader.ids.remote())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ray.get(reader.ids.remote())[:2] == [3, 4]
        failures = ray.get(coordinator.figures.remote())["failures"]
        cause = "failed, the next checkpoint is tried at the next interval: OSError: storage unreachable"
        assert [f.split(": ", 1)[1].split(cause)[0] for f in failures] == [
            "starting a checkpoint ", "starting a checkpoint ", "aborting checkpoint 3 at its timeout ",
        ]
        assert all(f.startswith("loops/checkpoint_coordinator[0/1]: ") and cause in f for f in failures)
    finally:
        ray.get(coordinator.stop.remote())
        ray.kill(coordinator)
        ray.kill(reader)


def test_a_coordinator_of_an_older_attempt_completes_no_checkpoint_once_a_newer_one_took_the_job_over(
        ray_session, tmp_path):
    # A streaming driver killed with SIGKILL leaves its Ray cluster, coordinator and actors running
    # for a while. The driver started again notes a newer attempt before anything else: a
    # checkpoint the old coordinator then sees acknowledged in full is aborted, and the output its
    # attempt staged is never committed.
    storage = CheckpointStorage(str(tmp_path), job="fenced")
    checkpoints = JobCheckpoints(storage)
    storage.note_attempt(4)
    old = ray.remote(CheckpointCoordinator).remote("fenced", checkpoints, CheckpointConfig(None), 1)
    reader = _Reader.remote()
    try:
        ray.get(old.configure.remote(4, ["source[0/1]"], [reader], []))
        for attempt in (4, 5):  # before and after the newer driver takes the job over
            checkpoint_id = ray.get(old.trigger.remote({"epoch": attempt}))
            checkpoints.for_attempt(4).stage(0, checkpoint_id, pa.table({"x": [attempt]}))
            if attempt == 5:
                storage.note_attempt(5)
            ray.get(old.acknowledge.remote(4, checkpoint_id, "source[0/1]", 10))
            outcome = ray.get(old.outcome.remote(checkpoint_id, 5.0))
            assert outcome == ("completed" if attempt == 4 else "aborted"), attempt
        assert storage.checkpoint_ids() == [1] and storage.current_attempt() == 5
        assert checkpoints.output.committed_epochs(0) == [1]  # checkpoint 2's staged output stays out
        aborted = ray.get(old.figures.remote())["aborted"]
        assert [(i, "attempt 5 of the job runs now, from another driver" in why) for i, why in aborted] == [(2, True)]
    finally:
        ray.kill(old)
        ray.kill(reader)
