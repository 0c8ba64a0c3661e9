"""Where a streaming job's output goes once a checkpoint has committed it (``cluster.streaming``).

``FileSink`` writes Parquet files under a directory, with the metadata log of Spark's own file
sink beside them (``_spark_metadata``): ``spark.read.parquet(path)`` and
``spark.readStream.parquet(path)`` then list only the files of published epochs, never a file
that a crash left half published. ``CallbackSink`` hands each committed epoch to the user's
function, as Spark's ``foreachBatch`` does.

Both are idempotent: an epoch's output leaves the job's two-phase output (``TwoPhaseOutput``)
only after it was published, so a driver that dies in between publishes it again, under the same
names, when it starts over (``FileSink`` then finds the names in its log and writes nothing), or
calls the function again with the same epoch and rows (``CallbackSink``: at least once, so the
function must write idempotently per epoch, as for ``foreachBatch``).

Spark's log (``FileStreamSinkLog``): one file per log batch, ``_spark_metadata/<n>``, holding
``v1`` and then one JSON line per file written (path URI, size, ``isDir``, modification time,
block replication and size, ``action`` ``add``). Every tenth batch (``n + 1`` a multiple of the
compact interval, 10) is ``<n>.compact`` and lists every file so far, which readers rely on: they
read the latest compact batch and the batches after it.
"""

from __future__ import annotations

import json
import os
import re
import uuid
import warnings
from typing import Any, Callable

import pyarrow as pa
import pyarrow.fs as pafs

from actorflow.actors.arrow_rows import conform_table, has_null_type, string_for_null
from actorflow.operators.errors import SchemaError

from .checkpoints.sink import TwoPhaseOutput, write_parquet

__all__ = ["CallbackSink", "FileSink", "SPARK_METADATA", "side_file_sink"]

SPARK_METADATA = "_spark_metadata"
#: Spark's default ``spark.sql.streaming.fileSink.log.compactInterval``.
COMPACT_INTERVAL = 10
_LOG_BATCH = re.compile(r"^(\d+)(\.compact)?$")


class FileSink:
    """Parquet files of committed epochs under ``path`` (a local path or ``pyarrow.fs`` URI),
    one per epoch and last-stage instance (``part-<epoch>-<instance>.parquet``), listed in
    Spark's file-sink log.

    The files share one schema: ``schema``, or else the first published epoch's (a column that
    was None in every row of it becomes string, with a warning). A later epoch with a column the
    schema lacks, or whose columns cannot be cast to it, is a ``SchemaError`` that names them;
    nothing of that epoch is published, and it stays committed in the job's output, for a run
    with a schema that fits (a column the epoch lacks is null). ``convert`` turns each epoch's table
    into what is written (a side output's records, described: ``side_file_sink``).
    """

    def __init__(self, path: str, *, schema: pa.Schema | None = None,
                 convert: Callable[[pa.Table], pa.Table] | None = None) -> None:
        try:
            self.filesystem, root = pafs.FileSystem.from_uri(path)
        except (ValueError, OSError):
            self.filesystem, root = pafs.LocalFileSystem(), os.path.abspath(path)
        self.root = root.rstrip("/")
        self.schema = schema
        self.convert = convert
        self.log = f"{self.root}/{SPARK_METADATA}"
        self.filesystem.create_dir(self.log, recursive=True)
        self._entries = self._read_log()
        self._names = {entry["path"].rsplit("/", 1)[1] for entry in self._entries}
        self._next_batch = self._latest_batch() + 1
        if self.schema is None and self._entries:
            first = sorted(entry["path"] for entry in self._entries)[0]
            import pyarrow.parquet as pq

            self.schema = pq.read_schema(_local(first), filesystem=self.filesystem)

    def __repr__(self) -> str:
        return f"FileSink({self.filesystem.type_name}:{self.root})"

    @property
    def files(self) -> list[str]:
        """The names of the published files, in the order they were published."""
        return [entry["path"].rsplit("/", 1)[1] for entry in self._entries]

    def publish(self, output: TwoPhaseOutput, instances: int, up_to: int,
                before_commit: Callable[[], None] = lambda: None) -> int:
        done: list[tuple[int, int]] = []
        added: list[dict[str, Any]] = []
        rows = 0
        for epoch, instance in _committed(output, instances, up_to):
            name = f"part-{epoch:020d}-{instance:05d}.parquet"
            if name not in self._names:  # else published before a crash that kept it in the output
                table = output.read_epoch(instance, epoch)
                table = self._conform(table if self.convert is None else self.convert(table), epoch)
                path = f"{self.root}/{name}"
                write_parquet(self.filesystem, path, table)
                info = self.filesystem.get_file_info(path)
                added.append({"path": _uri(self.filesystem, path), "size": info.size, "isDir": False,
                              "modificationTime": int(info.mtime_ns // 1_000_000) if info.mtime_ns else 0,
                              "blockReplication": 1, "blockSize": 33554432, "action": "add"})
                rows += table.num_rows
            done.append((instance, epoch))
        before_commit()
        if added:
            self._write_log_batch(added)
        for instance, epoch in done:
            output.remove_epoch(instance, epoch)
        return rows

    def _conform(self, table: pa.Table, epoch: int) -> pa.Table:
        if self.schema is None:
            untyped = [f.name for f in table.schema if has_null_type(f.type)]
            if untyped:
                warnings.warn(f"columns {untyped} were None (or empty) in every row of the first epoch written to "
                              f"{self.root}, so they have no type; they become string. Declare the output's types "
                              "(output_schema=) to choose them", stacklevel=4)
            self.schema = pa.schema([f.with_type(string_for_null(f.type)) for f in table.schema])
        extra = [name for name in table.schema.names if name not in self.schema.names]
        if extra:
            raise SchemaError(
                f"epoch {epoch}'s output has columns {table.schema.names}, and the files in {self.root} have "
                f"{self.schema.names}: {extra} are new. The output of a stream keeps its columns: declare them all "
                "(output_schema=) and start the query again with the same checkpoint location; this epoch's output "
                "is kept until it is published")
        try:
            # A column the schema has and the epoch lacks is null (no row of the epoch set it).
            return conform_table(table, self.schema, fill_missing=True)
        except SchemaError as error:
            raise SchemaError(f"epoch {epoch}'s output does not fit the schema of the files in {self.root}: {error}") from error

    def _write_log_batch(self, added: list[dict[str, Any]]) -> None:
        batch = self._next_batch
        compact = (batch + 1) % COMPACT_INTERVAL == 0
        entries = [*self._entries, *added]
        lines = entries if compact else added
        text = "v1\n" + "\n".join(json.dumps(entry, separators=(",", ":")) for entry in lines)
        path = f"{self.log}/{batch}{'.compact' if compact else ''}"
        temporary = f"{self.log}/.{batch}.{uuid.uuid4().hex}.tmp"
        with self.filesystem.open_output_stream(temporary) as stream:
            stream.write(text.encode())
        self.filesystem.move(temporary, path)  # the commit point: readers see the files from here
        self._entries = entries
        self._names.update(entry["path"].rsplit("/", 1)[1] for entry in added)
        self._next_batch = batch + 1

    def _log_batches(self) -> dict[int, str]:
        infos = self.filesystem.get_file_info(pafs.FileSelector(self.log, allow_not_found=True))
        batches: dict[int, str] = {}
        for info in infos:
            match = _LOG_BATCH.match(info.base_name)
            if match is not None and info.type == pafs.FileType.File:
                batches[int(match.group(1))] = info.path
        return batches

    def _latest_batch(self) -> int:
        return max(self._log_batches(), default=-1)

    def _read_log(self) -> list[dict[str, Any]]:
        # As Spark reads it: the latest compact batch, then those after it.
        batches = self._log_batches()
        if not batches:
            return []
        latest = max(batches)
        first = max(0, (latest + 1) // COMPACT_INTERVAL * COMPACT_INTERVAL - 1)
        entries: list[dict[str, Any]] = []
        for batch in range(first, latest + 1):
            if batch not in batches:
                continue
            with self.filesystem.open_input_stream(batches[batch]) as stream:
                lines = stream.read().decode().splitlines()
            if not lines or lines[0] != "v1":
                raise SchemaError(f"{batches[batch]} is not a file-sink log of version 1 (it starts {lines[:1]})")
            entries.extend(json.loads(line) for line in lines[1:] if line.strip())
        return [entry for entry in entries if entry.get("action") == "add"]


def side_file_sink(path: str, input_schema: pa.Schema | None) -> FileSink:
    """A ``FileSink`` for a side output of a streaming job: each record's own columns (the
    input's types where it has them), then what happened to it (``cluster.side_records``)."""
    from actorflow.actors.instance_checkpoints import unpack_side_records

    from .side_records import side_records_table

    def describe(table: pa.Table) -> pa.Table:
        return side_records_table(unpack_side_records(table), input_schema)

    return FileSink(path, convert=describe)


class CallbackSink:
    """Each committed epoch's output, all instances' rows as one Arrow table, to
    ``function(table, epoch)`` in epoch order; epochs without rows are not passed.

    ``convert`` may turn the table into what the function takes (a Spark DataFrame). The epoch is
    the id of the checkpoint that committed the rows: increasing, never reused. An epoch leaves the
    job's output only once the function has returned; a driver that dies before that calls it
    again with the same epoch and rows when it starts over.
    """

    def __init__(self, function: Callable[[Any, int], Any], *, convert: Callable[[pa.Table], Any] | None = None) -> None:
        self.function, self.convert = function, convert

    def publish(self, output: TwoPhaseOutput, instances: int, up_to: int,
                before_commit: Callable[[], None] = lambda: None) -> int:
        by_epoch: dict[int, list[int]] = {}
        for epoch, instance in _committed(output, instances, up_to):
            by_epoch.setdefault(epoch, []).append(instance)
        rows = 0
        for epoch, owners in sorted(by_epoch.items()):
            tables = [output.read_epoch(instance, epoch) for instance in owners]
            table = pa.concat_tables(tables, promote_options="permissive")
            if table.num_rows:
                before_commit()
                self.function(self.convert(table) if self.convert is not None else table, epoch)
                rows += table.num_rows
            for instance in owners:
                output.remove_epoch(instance, epoch)
        return rows


def _committed(output: TwoPhaseOutput, instances: int, up_to: int) -> list[tuple[int, int]]:
    """``(epoch, instance)`` of each committed epoch up to ``up_to``, epochs in order."""
    return sorted((epoch, instance) for instance in range(instances)
                  for epoch in output.committed_epochs(instance) if epoch <= up_to)


def _uri(filesystem: pafs.FileSystem, path: str) -> str:
    if filesystem.type_name == "local":
        return "file://" + path
    return f"{filesystem.type_name}://{path}"


def _local(uri: str) -> str:
    return uri[len("file://"):] if uri.startswith("file://") else uri.split("://", 1)[-1]
