"""Durable checkpoint storage on pyarrow.fs: atomic files, completion, abort, retention (no Ray needed)."""

from __future__ import annotations

import pyarrow.fs as pafs
import pytest

from actorflow.cluster.checkpoints import CheckpointStorage
from actorflow.cluster.checkpoints.storage import CheckpointError
from actorflow.operators import ConfigurationError


def _local(tmp_path, job="clicks"):
    return CheckpointStorage(str(tmp_path), job=job)


def _subtree(tmp_path, job="clicks"):
    # Not the local default: a filesystem object whose paths are relative to a base directory.
    (tmp_path / "base").mkdir()
    return CheckpointStorage("checkpoints", job=job,
                             filesystem=pafs.SubTreeFileSystem(str(tmp_path / "base"), pafs.LocalFileSystem()))


def _memory(tmp_path, job="clicks"):
    # An in-memory filesystem: nothing of it is a local path at all.
    return CheckpointStorage("bucket/checkpoints", job=job, filesystem=pafs._MockFileSystem())


@pytest.fixture(params=[_local, _subtree, _memory], ids=["local-dir", "subtree-fs", "in-memory-fs"])
def storage(request, tmp_path):
    return request.param(tmp_path)


def test_a_completed_checkpoint_holds_each_tasks_state_and_its_metadata(storage):
    pending = storage.begin(1)
    assert pending.write("enrich[0/2]", b"alpha") == 5
    pending.write("enrich[1/2]", b"")
    done = pending.complete({"sources": {"source[0/1]": [3, 1024]}})
    latest = storage.latest()
    assert latest is not None and latest.checkpoint_id == 1 == done.checkpoint_id
    assert latest.tasks == ["enrich[0/2]", "enrich[1/2]"] and latest.size_bytes == 5
    assert latest.read("enrich[0/2]") == b"alpha" and latest.read("enrich[1/2]") == b""
    assert latest.metadata["extra"] == {"sources": {"source[0/1]": [3, 1024]}}


def test_an_incomplete_checkpoint_is_never_the_latest_and_is_discarded_at_start(storage):
    storage.begin(1).complete()
    crashed = storage.begin(2)
    crashed.write("enrich[0/1]", b"half")  # the writer dies before complete()
    assert storage.latest().checkpoint_id == 1
    assert storage.checkpoint_ids() == [1] and storage.checkpoint_ids(complete_only=False) == [1, 2]
    with pytest.raises(CheckpointError, match=r"checkpoint 2 of job 'clicks' is not complete"):
        storage.get(2)
    assert storage.discard_incomplete() == [2]
    assert storage.checkpoint_ids(complete_only=False) == [1]


class _Straggling:
    """A filesystem whose ``delete_dir`` fails ``failures`` times as if a late writer had just
    added a file (errno 39), then deletes."""

    def __init__(self, filesystem, failures):
        self._filesystem, self.failures = filesystem, failures

    def __getattr__(self, name):
        return getattr(self._filesystem, name)

    def delete_dir(self, path):
        if self.failures:
            self.failures -= 1
            raise OSError(f"Cannot delete directory '{path}': Directory not empty")
        self._filesystem.delete_dir(path)


def test_an_incomplete_checkpoint_that_a_late_writer_refills_is_removed_on_a_later_try(storage):
    # A task of a failed attempt may still write into an incomplete checkpoint while the
    # restart removes it: that must not fail the restart.
    storage.begin(1).complete()
    storage.begin(2).write("enrich[0/1]", b"half")
    storage.filesystem = _Straggling(storage.filesystem, failures=2)
    assert storage.discard_incomplete() == [2]
    assert storage.checkpoint_ids(complete_only=False) == [1]

    pending = storage.begin(3)
    pending.write("enrich[0/1]", b"half")
    storage.filesystem.failures = 100  # a writer that never stops: the checkpoint stays for now
    pending.abort()
    assert storage.discard_incomplete() == []
    assert storage.checkpoint_ids(complete_only=False) == [1, 3] and storage.latest().checkpoint_id == 1
    storage.filesystem.failures = 0
    assert storage.discard_incomplete() == [3]
    assert storage.checkpoint_ids(complete_only=False) == [1]


def test_an_aborted_checkpoint_leaves_no_files_and_takes_no_more_writes(storage):
    pending = storage.begin(1)
    pending.write("window[0/2]", b"x" * 100)
    pending.abort()
    assert storage.checkpoint_ids(complete_only=False) == [] and storage.latest() is None
    listing = storage.filesystem.get_file_info(pafs.FileSelector(storage.directory, recursive=True))
    assert listing == []
    with pytest.raises(CheckpointError, match="was aborted"):
        pending.write("window[0/2]", b"late")


def test_a_complete_checkpoint_cannot_be_aborted_or_written_again(storage):
    pending = storage.begin(1)
    pending.complete()
    with pytest.raises(CheckpointError, match="is complete; it cannot be aborted"):
        pending.abort()
    with pytest.raises(CheckpointError, match="is already complete"):
        pending.write("late", b"x")


def test_retain_keeps_the_newest_complete_checkpoints(storage):
    for checkpoint_id in (1, 2, 3, 4):
        pending = storage.begin(checkpoint_id)
        pending.write("t", str(checkpoint_id).encode())
        pending.complete()
    assert storage.retain(2) == [1, 2]
    assert storage.checkpoint_ids() == [3, 4] and storage.latest().read("t") == b"4"


def test_a_checkpoint_must_be_newer_than_the_latest_complete_one(storage):
    storage.begin(5).complete()
    with pytest.raises(CheckpointError, match="must be newer than the latest complete one, 5"):
        storage.begin(5)


def test_no_temporary_file_is_left_behind(storage):
    pending = storage.begin(1)
    pending.write("a", b"1")
    pending.complete()
    names = [i.base_name for i in storage.filesystem.get_file_info(pafs.FileSelector(pending.path))]
    assert sorted(names) == ["_metadata", "a.state"]


def test_instance_names_with_slashes_are_stored_and_read_back(storage):
    pending = storage.begin(1)
    pending.write("job/enrich[0/2]", b"zero")
    pending.write("job/enrich[1/2]", b"one")
    latest = pending.complete()
    assert latest.tasks == ["job/enrich[0/2]", "job/enrich[1/2]"]
    assert storage.latest().read("job/enrich[1/2]") == b"one"


def test_reading_a_task_that_wrote_nothing_names_those_that_did(storage):
    pending = storage.begin(1)
    pending.write("enrich[0/1]", b"s")
    pending.complete()
    with pytest.raises(CheckpointError, match=r"holds no state of task 'window\[0/1\]'; it holds \['enrich\[0/1\]'\]"):
        storage.latest().read("window[0/1]")


def test_jobs_keep_their_checkpoints_apart(tmp_path):
    a, b = _local(tmp_path, "a"), _local(tmp_path, "b")
    a.begin(1).complete()
    assert a.checkpoint_ids() == [1] and b.checkpoint_ids() == [] and b.latest() is None


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda tmp: CheckpointStorage(str(tmp), job=""), r"job must be a non-empty name without '/', got ''"),
        (lambda tmp: CheckpointStorage(str(tmp), job="a/b"), r"got 'a/b'"),
        (lambda tmp: CheckpointStorage("nosuchscheme://x", job="j"), r"must be a path or a pyarrow.fs URI"),
        (lambda tmp: CheckpointStorage(str(tmp), job="j").begin(0), r"checkpoint_id must be an int >= 1, got 0"),
        (lambda tmp: CheckpointStorage(str(tmp), job="j").begin(1).write("", b""), r"task must be a non-empty name"),
        (lambda tmp: CheckpointStorage(str(tmp), job="j").begin(1).write("t", "text"), r"task state must be bytes, got str"),
        (lambda tmp: CheckpointStorage(str(tmp), job="j").retain(0), r"keep must be an int >= 1, got 0"),
    ],
    ids=["empty-job", "job-with-slash", "unknown-uri", "id-zero", "empty-task", "state-not-bytes", "keep-zero"],
)
def test_bad_arguments_are_named(tmp_path, make, message):
    with pytest.raises(ConfigurationError, match=message):
        make(tmp_path)


def _cli(*args):
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return subprocess.run([sys.executable, "-m", "actorflow", *args], cwd=root, capture_output=True, text=True,
                          timeout=120, check=False)


def test_the_console_command_lists_and_inspects_retained_checkpoints(tmp_path):
    storage = _local(tmp_path, "clicks")
    for checkpoint_id in (1, 2):
        pending = storage.begin(checkpoint_id)
        pending.write("clicks/enrich[0/2]", b"x" * 10 * checkpoint_id)
        pending.write("clicks/enrich[1/2]", b"y" * 5)
        pending.complete()
    storage.begin(3).write("clicks/enrich[0/2]", b"half")  # a writer that died mid-checkpoint
    listing = _cli("checkpoints", str(tmp_path))
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert lines[0] == "job clicks: 2 complete, incomplete [3]"
    assert lines[1].startswith("  chk-1") and "15 bytes  2 tasks" in lines[1]
    assert lines[2].startswith("  chk-2") and "25 bytes  2 tasks" in lines[2]
    detail = _cli("checkpoints", str(tmp_path), "--id", "2")
    assert "    clicks/enrich[0/2]" in detail.stdout and "20 bytes" in detail.stdout


def test_the_console_command_names_a_missing_checkpoint_directory(tmp_path):
    done = _cli("checkpoints", str(tmp_path / "nowhere"))
    assert done.returncode == 2 and "no checkpoint directory at" in done.stderr and "Traceback" not in done.stderr


def test_a_state_written_before_the_package_rename_is_refused_in_one_line_before_it_is_unpickled(storage):
    import sys

    from actorflow.operators.errors import StateFormatError
    from tests.operators.fixtures.pre_rename import PRE_RENAME, pre_rename_pickle

    pending = storage.begin(4)
    pending.write("window[0/1]", pre_rename_pickle())
    pending.complete()
    with pytest.raises(StateFormatError) as info:
        storage.latest().read("window[0/1]")
    assert str(info.value) == f"checkpoint 4 of job 'clicks' (task 'window[0/1]') {PRE_RENAME}"
    assert "operators" not in sys.modules
