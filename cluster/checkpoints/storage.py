"""Durable checkpoint storage on any ``pyarrow.fs`` filesystem.

A checkpoint's data must outlive every actor of the job, so it never lives only in Ray's object
store (whose objects die with their owner). It goes to a filesystem: a local directory by
default, or any ``pyarrow.fs`` URI (``s3://…``, ``gs://…``, ``hdfs://…``) or filesystem object.

Layout, under the storage's root::

    <job>/chk-<id>/<task>.state       one file per task (operator instance, source reader); the
                                      task's name percent-encoded ("enrich[0/2]" -> "enrich[0%2F2]")
    <job>/chk-<id>/_metadata          JSON, written last: the checkpoint is complete iff it exists
    <job>/_finished                   JSON: the run that wrote the checkpoints ended well
    <job>/_attempt                    JSON: the newest attempt of a streaming job, which alone may
                                      complete a checkpoint (a driver that died leaves its actors
                                      behind for a while: they are an older attempt)

Every file is written under a temporary name and moved into place, so a reader never sees half a
file, and a checkpoint whose writer died before ``_metadata`` is incomplete: ``latest()`` skips
it, and ``discard_incomplete()`` (called when a job starts from the directory) removes it.
``abort()`` removes an incomplete checkpoint's files at once; ``retain(n)`` keeps the newest ``n``
complete ones. ``mark_finished()`` notes that the run ended well; ``unfinished_run()`` finds the
checkpoints of one that did not, which a fresh run must not throw away unless told to
(``start_afresh(overwrite=True)``). A writer of a failed attempt may still add a file while an incomplete checkpoint
is removed: the removal tries again, and else leaves it for the next ``discard_incomplete()``.

Example::

    storage = CheckpointStorage("/tmp/checkpoints", job="clicks")
    pending = storage.begin(1)
    pending.write("enrich[0/2]", b"...state...")
    pending.complete({"sources": {"source[0/1]": [3, 0]}})
    storage.latest().read("enrich[0/2]")     # b"...state..."

Threading model: one writer per checkpoint id (the coordinator hands each task its own file);
calls may come from any thread.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

import pyarrow.fs as pafs

from actorflow.operators.errors import ActorflowError, ConfigurationError
from actorflow.operators.state import refuse_pre_rename

__all__ = ["CheckpointError", "CheckpointStorage", "CompletedCheckpoint", "PendingCheckpoint", "UnfinishedRunError"]

_METADATA = "_metadata"
_FINISHED = "_finished"
_ATTEMPT = "_attempt"
_CHECKPOINT_DIR = re.compile(r"^chk-(\d+)$")
_DELETE_TRIES = 5  # for an incomplete checkpoint's directory, which a late writer may refill

_log = logging.getLogger(__name__)


def _file_name(task: str) -> str:
    # Instance names hold '/' ("enrich[0/2]"); every filesystem takes the encoded form.
    return quote(task, safe="[]") + ".state"


class CheckpointError(ActorflowError):
    """A checkpoint could not be written, found or read."""


class UnfinishedRunError(CheckpointError):
    """A fresh run of a job found the checkpoints of an earlier run that did not finish.

    ``str()`` says what to do in the words of the Python API (``resume_from=``, ``overwrite=True``);
    ``advice()`` in other words (the console command's).
    """

    def __init__(self, job: str, where: str, latest_id: int) -> None:
        self.job, self.where, self.latest_id = job, where, latest_id
        super().__init__(self.advice(f"resume_from={where!r}", "overwrite=True"))

    def advice(self, resume: str, overwrite: str) -> str:
        return (f"job {self.job!r} has the checkpoints of an earlier run that did not finish in {self.where!r} (the "
                f"latest complete one: chk-{self.latest_id}); go on from it with {resume}, or delete them and start "
                f"afresh with {overwrite}")


class CheckpointStorage:
    """The checkpoints of one job under ``root`` (a path, a ``pyarrow.fs`` URI, or with ``filesystem``)."""

    def __init__(self, root: str, *, job: str, filesystem: pafs.FileSystem | None = None) -> None:
        if not job or "/" in job:
            raise ConfigurationError(f"job must be a non-empty name without '/', got {job!r}")
        if filesystem is None:
            try:
                filesystem, root = pafs.FileSystem.from_uri(root)
            except (ValueError, OSError) as error:
                raise ConfigurationError(f"checkpoint storage must be a path or a pyarrow.fs URI, got {root!r}: {error}") from error
        self.filesystem = filesystem
        self.root = root.rstrip("/")
        self.job = job
        self.directory = f"{self.root}/{job}" if self.root else job
        self.filesystem.create_dir(self.directory, recursive=True)

    def __repr__(self) -> str:
        return f"CheckpointStorage({self.filesystem.type_name}:{self.directory})"

    def begin(self, checkpoint_id: int) -> "PendingCheckpoint":
        """Start writing checkpoint ``checkpoint_id``; it must be newer than every complete one."""
        if not isinstance(checkpoint_id, int) or checkpoint_id < 1:
            raise ConfigurationError(f"checkpoint_id must be an int >= 1, got {checkpoint_id!r}")
        latest = self.latest()
        if latest is not None and checkpoint_id <= latest.checkpoint_id:
            raise CheckpointError(
                f"checkpoint {checkpoint_id} of job {self.job!r} must be newer than the latest complete one, "
                f"{latest.checkpoint_id}"
            )
        path = self._path(checkpoint_id)
        self.filesystem.create_dir(path, recursive=True)
        return PendingCheckpoint(self, checkpoint_id, path)

    def checkpoint_ids(self, *, complete_only: bool = True) -> list[int]:
        """The ids present, oldest first; by default only complete checkpoints."""
        ids = []
        for info in self.filesystem.get_file_info(pafs.FileSelector(self.directory, allow_not_found=True)):
            match = _CHECKPOINT_DIR.match(info.base_name)
            if info.type != pafs.FileType.Directory or match is None:
                continue
            checkpoint_id = int(match.group(1))
            if not complete_only or self._is_complete(checkpoint_id):
                ids.append(checkpoint_id)
        return sorted(ids)

    def latest(self) -> "CompletedCheckpoint | None":
        """The newest complete checkpoint, or None."""
        ids = self.checkpoint_ids()
        return self.get(ids[-1]) if ids else None

    def get(self, checkpoint_id: int) -> "CompletedCheckpoint":
        """A complete checkpoint; an incomplete or missing one is a ``CheckpointError``."""
        if not self._is_complete(checkpoint_id):
            raise CheckpointError(
                f"checkpoint {checkpoint_id} of job {self.job!r} is not complete in {self!r}; "
                f"complete ones: {self.checkpoint_ids()}"
            )
        path = self._path(checkpoint_id)
        with self.filesystem.open_input_stream(f"{path}/{_METADATA}") as stream:
            metadata = json.loads(stream.read().decode())
        return CompletedCheckpoint(self, checkpoint_id, path, metadata)

    def retain(self, keep: int) -> list[int]:
        """Remove all but the newest ``keep`` complete checkpoints; return the removed ids."""
        if not isinstance(keep, int) or keep < 1:
            raise ConfigurationError(f"keep must be an int >= 1, got {keep!r}")
        removed = self.checkpoint_ids()[:-keep]
        for checkpoint_id in removed:
            self.filesystem.delete_dir(self._path(checkpoint_id))
        return removed

    def discard_incomplete(self) -> list[int]:
        """Remove checkpoints whose writer never completed them (a crash mid-checkpoint)."""
        complete = set(self.checkpoint_ids())
        stale = [i for i in self.checkpoint_ids(complete_only=False) if i not in complete]
        return [checkpoint_id for checkpoint_id in stale if self._remove_incomplete(checkpoint_id)]

    def mark_finished(self) -> None:
        """Note that the run writing these checkpoints ended well (its output is delivered)."""
        record = {"finished_at_ms": int(time.time() * 1000), "latest": self.checkpoint_ids()[-1:] or None}
        self._write_atomically(f"{self.directory}/{_FINISHED}", json.dumps(record).encode())

    def note_attempt(self, attempt: int) -> None:
        """From now on only ``attempt`` writes these checkpoints: an older attempt's coordinator
        completes none (``current_attempt``), even one still running in a cluster whose driver died."""
        record = {"attempt": attempt, "at_ms": int(time.time() * 1000)}
        self._write_atomically(f"{self.directory}/{_ATTEMPT}", json.dumps(record).encode())

    def current_attempt(self) -> int | None:
        """The attempt ``note_attempt`` noted last; None where none was (a bounded job's)."""
        try:
            with self.filesystem.open_input_stream(f"{self.directory}/{_ATTEMPT}") as stream:
                return int(json.loads(stream.read())["attempt"])
        except FileNotFoundError:
            return None

    def unmark_finished(self) -> None:
        """A run starts from these checkpoints: until it ends well, they are an unfinished run's."""
        if self._finished():
            self.filesystem.delete_file(f"{self.directory}/{_FINISHED}")

    def unfinished_run(self) -> "CompletedCheckpoint | None":
        """The latest complete checkpoint of a run that did not end well (it failed, was
        interrupted, or still runs), which one can resume from; None if there is none.

        A run that ended well leaves nothing to resume: its checkpoints could only produce again
        the end of an output it delivered.
        """
        return None if self._finished() else self.latest()

    def clear(self) -> None:
        """Remove every checkpoint, the output and the finished mark: a run starts afresh."""
        self.filesystem.delete_dir_contents(self.directory, missing_dir_ok=True)

    def start_afresh(self, where: str, *, overwrite: bool = False) -> None:
        """Empty the directory for a fresh run of the job; ``where`` names it as the user did.

        The checkpoints of an earlier run that did not finish are refused (``UnfinishedRunError``),
        never deleted, unless ``overwrite``: re-running a script that crashed would otherwise
        throw away the state it could go on from.
        """
        earlier = self.unfinished_run()
        if earlier is not None and not overwrite:
            raise UnfinishedRunError(self.job, where, earlier.checkpoint_id)
        self.clear()

    def _finished(self) -> bool:
        return self.filesystem.get_file_info(f"{self.directory}/{_FINISHED}").type == pafs.FileType.File

    def _remove_incomplete(self, checkpoint_id: int) -> bool:
        """Remove an incomplete checkpoint's directory; False if it stays.

        A task of an attempt that failed may still be writing into it: a kill takes effect
        moments after it was asked for. A delete that finds a file that came in between tries
        again; one that keeps failing leaves the directory. Nothing reads an incomplete checkpoint,
        and the next ``discard_incomplete`` removes it.
        """
        path = self._path(checkpoint_id)
        for attempt in range(1, _DELETE_TRIES + 1):
            try:
                if self.filesystem.get_file_info(path).type == pafs.FileType.Directory:
                    self.filesystem.delete_dir(path)
                return True
            except OSError as error:
                failure = error
                if attempt < _DELETE_TRIES:
                    time.sleep(0.05 * attempt)
        _log.debug("incomplete checkpoint %s stays for now: %s", path, failure)
        return False

    def _path(self, checkpoint_id: int) -> str:
        return f"{self.directory}/chk-{checkpoint_id}"

    def _is_complete(self, checkpoint_id: int) -> bool:
        info = self.filesystem.get_file_info(f"{self._path(checkpoint_id)}/{_METADATA}")
        return info.type == pafs.FileType.File

    def _write_atomically(self, path: str, data: bytes) -> None:
        temporary = f"{path}.{uuid.uuid4().hex}.tmp"
        with self.filesystem.open_output_stream(temporary) as stream:
            stream.write(data)
        self.filesystem.move(temporary, path)


@dataclass
class PendingCheckpoint:
    """A checkpoint being written: task states go in, then ``complete()`` or ``abort()``."""

    storage: CheckpointStorage
    checkpoint_id: int
    path: str

    def write(self, task: str, data: bytes) -> int:
        """Store ``task``'s state; returns its size in bytes. Writing a task twice replaces it."""
        if not isinstance(task, str) or not task:
            raise ConfigurationError(f"task must be a non-empty name, got {task!r}")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ConfigurationError(f"task state must be bytes, got {type(data).__name__}")
        self._check_open()
        self.storage._write_atomically(f"{self.path}/{_file_name(task)}", bytes(data))
        return len(data)

    def complete(self, extra: dict[str, Any] | None = None) -> "CompletedCheckpoint":
        """Seal the checkpoint: from now on ``latest()`` may return it."""
        self._check_open()
        infos = self.storage.filesystem.get_file_info(pafs.FileSelector(self.path))
        tasks = {unquote(i.base_name[: -len(".state")]): i.size for i in infos if i.base_name.endswith(".state")}
        metadata = {
            "checkpoint_id": self.checkpoint_id,
            "job": self.storage.job,
            "completed_at_ms": int(time.time() * 1000),
            "tasks": tasks,
            "size_bytes": sum(tasks.values()),
            "extra": extra or {},
        }
        self.storage._write_atomically(f"{self.path}/{_METADATA}", json.dumps(metadata, sort_keys=True).encode())
        return CompletedCheckpoint(self.storage, self.checkpoint_id, self.path, metadata)

    def abort(self) -> None:
        """Remove everything written for this checkpoint; a complete one cannot be aborted."""
        if self.storage._is_complete(self.checkpoint_id):
            raise CheckpointError(f"checkpoint {self.checkpoint_id} of job {self.storage.job!r} is complete; it cannot be aborted")
        self.storage._remove_incomplete(self.checkpoint_id)

    def _check_open(self) -> None:
        if self.storage._is_complete(self.checkpoint_id):
            raise CheckpointError(f"checkpoint {self.checkpoint_id} of job {self.storage.job!r} is already complete")
        if self.storage.filesystem.get_file_info(self.path).type != pafs.FileType.Directory:
            raise CheckpointError(f"checkpoint {self.checkpoint_id} of job {self.storage.job!r} was aborted")


@dataclass
class CompletedCheckpoint:
    """A complete checkpoint: its metadata, and each task's state."""

    storage: CheckpointStorage
    checkpoint_id: int
    path: str
    metadata: dict[str, Any]

    @property
    def tasks(self) -> list[str]:
        return sorted(self.metadata["tasks"])

    @property
    def size_bytes(self) -> int:
        return int(self.metadata["size_bytes"])

    def read(self, task: str) -> bytes:
        """``task``'s state; a task that wrote none is a ``CheckpointError`` naming the ones that did.

        A state written before the package rename (a pickle of top-level ``operators``, ``cluster``,
        ...) is refused here with a one-line ``StateFormatError``, before anything unpickles it and
        imports those names, which may be the user's own packages.
        """
        if task not in self.metadata["tasks"]:
            raise CheckpointError(
                f"checkpoint {self.checkpoint_id} of job {self.storage.job!r} holds no state of task {task!r}; "
                f"it holds {self.tasks}"
            )
        with self.storage.filesystem.open_input_stream(f"{self.path}/{_file_name(task)}") as stream:
            data = bytes(stream.read())
        refuse_pre_rename(data, f"checkpoint {self.checkpoint_id} of job {self.storage.job!r} (task {task!r})")
        return data
