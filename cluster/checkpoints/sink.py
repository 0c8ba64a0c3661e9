"""The two-phase sink: a job's output becomes final only with the checkpoint that covers it.

The last stage's instances cut their output into *epochs* at each checkpoint barrier: the rows an
instance emitted between barrier ``k-1`` and barrier ``k`` are epoch ``k``. Before it
acknowledges checkpoint ``k``, an instance *stages* epoch ``k`` in durable storage (phase one).
When checkpoint ``k`` completes, the coordinator *commits* the staged files of epoch ``k`` (phase
two). A restore throws away every staged epoch that was never committed: those rows are produced
again by the replay. At the end of a bounded input, what follows the last barrier is the epoch
``FINAL_EPOCH``, committed once every instance has finished.

So committed output survives the death of the actor that produced it, and the job's output never
holds a row of an aborted epoch.

Layout, next to the checkpoints (``<root>/<job>/``)::

    output/<instance>/<epoch>.a<attempt>.arrow.staged    phase one: written, not yet output
    output/<instance>/<epoch>.arrow                      committed
    output/side/<tag>/<instance>/...                     a streaming job's side output ``tag``,
                                                         by instance of the whole job, the same way

A checkpoint that completes commits every epoch its attempt staged up to it: an epoch whose own
checkpoint was aborted (it timed out) is still output, as nothing was rolled back. A staged file
names its attempt, so that a file an actor of an attempt that failed writes late (``ray.kill`` is
asynchronous) is never committed.

Files are Arrow IPC streams, written under a temporary name and moved into place; a commit is a
move, so it can be repeated after a crash (a restore commits the latest checkpoint again).

Threading model: ``stage`` runs in the writing actor (from a worker thread); ``commit``,
``discard_staged`` and ``read`` in the coordinator or the driver. Each file has one writer.
"""

from __future__ import annotations

import os
import re
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from .storage import CheckpointStorage

__all__ = ["FINAL_EPOCH", "TwoPhaseOutput", "export_tables", "write_parquet"]

#: The epoch after the last barrier of a bounded input; larger than any checkpoint id.
FINAL_EPOCH = 2**62

_COMMITTED = ".arrow"
_FILE = re.compile(r"^(\d+)(?:\.a(\d+)\.arrow\.staged|\.arrow)$")


class TwoPhaseOutput:
    """The output of the job that ``storage`` belongs to, by last-stage instance and epoch."""

    def __init__(self, storage: CheckpointStorage, side: str | None = None) -> None:
        self.storage = storage
        self.filesystem = storage.filesystem
        self.side = side
        # A side output's epochs lie under the output's directory, so that a commit or a discard
        # of the output covers them too.
        self.directory = f"{storage.directory}/output" + ("" if side is None else f"/side/{_side_dir(side)}")

    def __repr__(self) -> str:
        return f"TwoPhaseOutput({self.filesystem.type_name}:{self.directory})"

    def stage(self, instance: int, epoch: int, table: pa.Table | None, attempt: int = 0) -> int:
        """Phase one: write ``instance``'s rows of ``epoch``; returns the bytes written.

        An epoch without rows is staged too (as no file): nothing to commit.
        """
        if table is None or table.num_rows == 0:
            return 0
        directory = self._instance_dir(instance)
        self.filesystem.create_dir(directory, recursive=True)
        path = f"{directory}/{epoch:020d}.a{attempt}.arrow.staged"
        temporary = f"{path}.{uuid.uuid4().hex}.tmp"
        with self.filesystem.open_output_stream(temporary) as stream:
            with ipc.new_stream(stream, table.schema) as writer:
                writer.write_table(table)
            size = stream.tell()
        self.filesystem.move(temporary, path)
        return size

    def commit(self, epoch: int, attempt: int) -> int:
        """Phase two: make the rows ``attempt`` staged in epochs up to ``epoch`` part of the
        output; returns how many files were committed. Repeating it does nothing more."""
        committed = 0
        for info in self._files():
            match = _FILE.match(info.base_name)
            if match and match.group(2) is not None and int(match.group(2)) == attempt and int(match.group(1)) <= epoch:
                self.filesystem.move(info.path, f"{info.path.rsplit('/', 1)[0]}/{int(match.group(1)):020d}{_COMMITTED}")
                committed += 1
        return committed

    def discard_staged(self) -> int:
        """Remove every staged epoch that was not committed (a restore replays their rows)."""
        removed = 0
        for info in self._files():
            if info.base_name.endswith(".staged") or info.base_name.endswith(".tmp"):
                self.filesystem.delete_file(info.path)
                removed += 1
        return removed

    def committed_epochs(self, instance: int) -> list[int]:
        epochs = []
        for info in self._files(instance):
            match = _FILE.match(info.base_name)
            if match and match.group(2) is None:
                epochs.append(int(match.group(1)))
        return sorted(epochs)

    def read_epoch(self, instance: int, epoch: int) -> pa.Table:
        """``instance``'s committed rows of ``epoch``."""
        with self.filesystem.open_input_stream(f"{self._instance_dir(instance)}/{epoch:020d}{_COMMITTED}") as stream:
            return ipc.open_stream(stream).read_all()

    def remove_epoch(self, instance: int, epoch: int) -> None:
        """Drop ``instance``'s committed ``epoch``, once it is out of the job (a stream's, published)."""
        self.filesystem.delete_file(f"{self._instance_dir(instance)}/{epoch:020d}{_COMMITTED}")

    def read(self, instance: int) -> pa.Table | None:
        """``instance``'s committed output, epoch by epoch; None if it has none."""
        tables = []
        for epoch in self.committed_epochs(instance):
            with self.filesystem.open_input_stream(f"{self._instance_dir(instance)}/{epoch:020d}{_COMMITTED}") as stream:
                tables.append(ipc.open_stream(stream).read_all())
        if not tables:
            return None
        return pa.concat_tables(tables, promote_options="permissive")

    def export_parquet(self, path: str, instances: int) -> tuple[int, int]:
        """Write the committed output of ``instances`` last-stage instances as Parquet under
        ``path`` (a directory; a path or ``pyarrow.fs`` URI); returns (rows, files).

        One file per committed epoch and instance, ``part-<instance>-<epoch>.parquet``, each
        written under a temporary name and moved into place, and ``_SUCCESS`` last, as the sink
        commits: a reader that finds ``_SUCCESS`` finds the whole output, and never a row of an
        epoch that was not committed. An export repeated after a crash writes the same files.
        """
        filesystem, root = _filesystem(path)
        filesystem.create_dir(root, recursive=True)
        rows = files = 0
        for instance in range(instances):
            for epoch in self.committed_epochs(instance):
                with self.filesystem.open_input_stream(f"{self._instance_dir(instance)}/{epoch:020d}{_COMMITTED}") as stream:
                    table = ipc.open_stream(stream).read_all()
                write_parquet(filesystem, f"{root}/part-{instance:05d}-{epoch:020d}.parquet", table)
                rows, files = rows + table.num_rows, files + 1
        with filesystem.open_output_stream(f"{root}/_SUCCESS"):
            pass
        return rows, files

    def clear(self) -> None:
        """Remove all output (a run that starts afresh)."""
        if self.filesystem.get_file_info(self.directory).type == pafs.FileType.Directory:
            self.filesystem.delete_dir(self.directory)

    def side_output(self, tag: str) -> "TwoPhaseOutput":
        """The epochs of side output ``tag`` (a streaming job's), by instance of the whole job."""
        return TwoPhaseOutput(self.storage, tag)

    def instances(self, at_least: int = 0) -> int:
        """How many last-stage instances the output is kept for: ``at_least``, or more where an
        earlier run of the job, at a larger parallelism, committed output of its own."""
        selector = pafs.FileSelector(self.directory, allow_not_found=True)
        numbers = [int(i.base_name) for i in self.filesystem.get_file_info(selector)
                   if i.type == pafs.FileType.Directory and i.base_name.isdigit()]
        return max([at_least, *(n + 1 for n in numbers)])

    def _instance_dir(self, instance: int) -> str:
        return f"{self.directory}/{instance:05d}"

    def _files(self, instance: int | None = None) -> list[Any]:
        directory = self.directory if instance is None else self._instance_dir(instance)
        selector = pafs.FileSelector(directory, recursive=instance is None, allow_not_found=True)
        return [i for i in self.filesystem.get_file_info(selector) if i.type == pafs.FileType.File]


def _side_dir(tag: str) -> str:
    """A side output's directory name: its tag, with what a path cannot hold escaped.

    >>> _side_dir("late data/1")
    'late%20data%2F1'
    """
    from urllib.parse import quote

    return quote(tag, safe="")


def _filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    try:
        filesystem, root = pafs.FileSystem.from_uri(path)
    except (ValueError, OSError):
        filesystem, root = pafs.LocalFileSystem(), os.path.abspath(path)
    return filesystem, root.rstrip("/")


def write_parquet(filesystem: pafs.FileSystem, path: str, table: pa.Table) -> None:
    """Write ``table`` as one Parquet file at ``path``, under a temporary name moved into place."""
    temporary = f"{path}.{uuid.uuid4().hex}.tmp"
    pq.write_table(table, temporary, filesystem=filesystem)
    filesystem.move(temporary, path)


def export_tables(path: str, tables: list[pa.Table | None]) -> tuple[int, int]:
    """Write a job's output without checkpoints, one table per last-stage instance, as
    ``export_parquet`` does (``part-<instance>.parquet``, then ``_SUCCESS``); returns (rows, files)."""
    filesystem, root = _filesystem(path)
    filesystem.create_dir(root, recursive=True)
    rows = files = 0
    for instance, table in enumerate(tables):
        if table is not None and table.num_rows:
            write_parquet(filesystem, f"{root}/part-{instance:05d}.parquet", table)
            rows, files = rows + table.num_rows, files + 1
    with filesystem.open_output_stream(f"{root}/_SUCCESS"):
        pass
    return rows, files
