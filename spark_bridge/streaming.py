"""A Structured Streaming query through an actorflow pipeline: one job for the query's whole life.

>>> events = spark.readStream.schema(schema).parquet("/data/clicks")                    # doctest: +SKIP
>>> query = (from_spark(events, timestamp_column="ts", out_of_orderness_ms=5_000)       # doctest: +SKIP
...          .async_map(lookup).key_by("user").window(w).aggregate(a)
...          .write_stream("/data/counts", checkpoint_location="/chk/counts"))
>>> query.await_termination()                                                          # doctest: +SKIP

Spark runs the query with a ``foreachBatch`` sink of its own: micro-batch ``N`` goes into the
running job as epoch ``N`` (``cluster.streaming``), and ``foreachBatch`` returns once the
checkpoint that follows it is complete and the output it committed is published, so Spark
commits batch ``N`` after its output is out. Spark keeps its offsets and commits under
``<checkpoint_location>/spark``, actorflow its checkpoints under ``<checkpoint_location>/actorflow``:
the same script run again with the same ``checkpoint_location`` goes on where the last run
stopped, and a micro-batch that Spark runs again after a crash is not applied twice.
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa

from actorflow.cluster.job_graph import JobGraph, SourceNode
from actorflow.cluster.stream_sinks import CallbackSink, FileSink, side_file_sink
from actorflow.cluster.streaming import EpochFigures, StreamingJob
from actorflow.operators.async_wait_operator import DEAD_LETTER
from actorflow.operators.errors import ConfigurationError, JobFailedError, SchemaError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["StreamingRun", "check_replayable", "streaming_source", "write_stream"]

#: Spark's sources that cannot give a micro-batch again after a crash, by the name their plans show, and why.
NOT_REPLAYABLE = {
    "TextSocketSourceProvider": "a socket source keeps no offsets: a micro-batch lost in a crash cannot be read again",
    "socket": "a socket source keeps no offsets: a micro-batch lost in a crash cannot be read again",
}


def check_replayable(df: "DataFrame") -> None:
    """Refuse a streaming DataFrame whose source cannot replay a micro-batch: exactly once needs
    Spark to read batch ``N`` again after a crash, as it was."""
    plan = df._jdf.queryExecution().logical().toString()
    for name, why in NOT_REPLAYABLE.items():
        if re.search(rf"\b{re.escape(name)}\b", plan):
            raise ConfigurationError(
                f"from_spark() needs a replayable streaming source (files, rate, Kafka), and this query reads a "
                f"{name} source: {why}. Write the stream to files first and read those")


def streaming_source(df: "DataFrame", *, parallelism: int, timestamp_column: str | None, out_of_orderness_ms: int,
                     batch_size: int, idleness_ms: int | None, schema: pa.Schema) -> SourceNode:
    check_replayable(df)
    return SourceNode(None, None, parallelism, timestamp_column, out_of_orderness_ms, batch_size, name="source",
                      schema=schema, idleness_ms=idleness_ms, unbounded=True)


class StreamingRun:
    """The running query, as Spark's ``StreamingQuery`` is: ``await_termination``, ``stop``,
    ``exception``, ``is_active``, ``last_progress`` and ``recent_progress``.

    Each progress entry is one micro-batch: its ``epoch`` (Spark's batch id) and
    ``checkpoint_id``, ``rows_in`` and ``rows_out`` (published with it), the ``watermark_ms``
    after it, the time to hand it to the actors (``feed_ms``), to checkpoint (``checkpoint_ms``)
    and to publish (``publish_ms``), and ``latency_ms`` from the micro-batch's start to its output
    published; ``skipped`` marks a micro-batch that Spark ran again and that was already in the
    state restored. A checkpoint between micro-batches that published rows (``between_epochs``)
    has an entry too, with the last micro-batch's epoch.
    """

    def __init__(self, query: Any, job: StreamingJob, spark: Any, input_schema: pa.Schema,
                 side_paths: dict[str, str] | None = None, read_failures: list[BaseException] | None = None) -> None:
        self.query, self.job = query, job
        self._read_failures = read_failures if read_failures is not None else []
        self._spark, self._input_schema = spark, input_schema
        self._side_paths = dict(side_paths or {})
        job.on_stop_request = self.stop  # actorflow stop JOB, from another shell
        self._stopping = threading.Lock()

    def __repr__(self) -> str:
        state = "active" if self.is_active else "stopped"
        return f"StreamingRun({self.job.job!r}, {state}, epoch={self.job.epoch})"

    @property
    def name(self) -> str:
        return self.job.job

    @property
    def is_active(self) -> bool:
        return bool(self.query.isActive) and self.job.running

    @property
    def last_progress(self) -> dict[str, Any] | None:
        return self.job.figures[-1].as_dict() if self.job.figures else None

    @property
    def recent_progress(self) -> list[dict[str, Any]]:
        return [figures.as_dict() for figures in self.job.figures]

    def await_termination(self, timeout: float | None = None) -> bool:
        """Wait for the query to end (``stop``, or a failure, which this raises); with
        ``timeout`` (seconds), False if it still runs then."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.query.isActive:
            if self.job.failure is not None:
                break
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            try:
                self.query.awaitTermination(min(0.5, left) if left is not None else 0.5)
            except Exception:  # noqa: BLE001 - Spark's wrapping of the failure; exception() says it plainly
                break
        error = self.exception()
        if error is not None:
            raise error
        return True

    def exception(self) -> BaseException | None:
        """Why the query failed, or None: the job's error first (what Spark reports wraps it)."""
        if self.job.failure is not None:
            return self.job.failure
        if self._read_failures:
            return self._read_failures[0]
        error = self.query.exception()
        if error is None:
            return None
        failure = JobFailedError(f"streaming query {self.name!r} failed in Spark: {spark_cause(error)}")
        failure.__cause__ = error
        return failure

    def process_all_available(self) -> None:
        """Wait until Spark has handed every input available now to the job (tests, notebooks)."""
        self.query.processAllAvailable()

    def checkpoint(self) -> EpochFigures:
        """Take a checkpoint now, between micro-batches, and publish what the job produced since
        the last one (windows that fired during a pause, requests that completed)."""
        return self.job.checkpoint()

    def dead_letters(self) -> "DataFrame":
        """The records that failed, with their own columns and why (as ``to_spark(dead_letters=True)``
        gives them): those published so far from the ``dead_letters`` directory, or, without one,
        all of them after ``stop(drain=True)``."""
        from .streams import dead_letters_to_dataframe

        if DEAD_LETTER in self._side_paths and self._published(DEAD_LETTER):
            return self._spark.read.parquet(self._side_paths[DEAD_LETTER])
        letters = [] if DEAD_LETTER in self._side_paths else self._side(DEAD_LETTER)
        return dead_letters_to_dataframe(self._spark, letters, self._input_schema)

    def side_output(self, tag: str) -> "DataFrame":
        """The records of side output ``tag`` (a window's late data), as
        ``SparkDataStream.get_side_output`` gives them: those published so far from its
        directory, or, without one, all of them after ``stop(drain=True)``."""
        from .diagnostics import late_records_to_dataframe

        if tag in self._side_paths and self._published(tag):
            return self._spark.read.parquet(self._side_paths[tag])
        records = [] if tag in self._side_paths else self._side(tag)  # none published yet: no schema to read
        return late_records_to_dataframe(self._spark, records, self._input_schema)

    def _published(self, tag: str) -> bool:
        return bool(getattr(self.job.side_sinks.get(tag), "files", None))

    def _side(self, tag: str) -> list[Any]:
        if self.is_active or tag not in self.job.side_outputs:
            known = sorted(self.job.side_outputs)
            raise ConfigurationError(
                f"side output {tag!r} is handed over by stop(drain=True), or streamed to files with "
                "write_stream(dead_letters=..., side_outputs={tag: path})" + (f"; this run has {known}" if known else ""))
        return self.job.side_outputs[tag]

    def stop(self, drain: bool = False) -> None:
        """Stop the query and the job: with a final checkpoint that the next run on the same
        ``checkpoint_location`` resumes from; or, with ``drain``, ending the input so that every
        window fires and all output is published (nothing then remains to resume)."""
        with self._stopping:
            self.query.stop()
            self.job.stop(drain=drain)


def write_stream(
    stream: Any, source_df: "DataFrame", path: str | None, *, checkpoint_location: str,
    foreach_batch: Callable[[Any, int], Any] | None = None, output_schema: pa.Schema | None = None,
    processing_time: str | None = None, max_restarts: int = 20, restart_window_s: float = 60.0,
    checkpoint_timeout_ms: int = 60_000, actor_resources: dict[str, float] | None = None,
    checkpoint_interval_ms: int | None = 1_000, dead_letters: str | None = None,
    side_outputs: dict[str, str] | None = None,
) -> StreamingRun:
    """Start the query: see ``SparkDataStream.write_stream``."""
    from .arrow_io import tables_to_dataframe

    if (path is None) == (foreach_batch is None):
        raise ConfigurationError("write_stream() takes a path (Parquet files) or foreach_batch=, one of them")
    if not isinstance(checkpoint_location, str) or not checkpoint_location:
        raise ConfigurationError(f"write_stream() needs checkpoint_location=, a directory, got {checkpoint_location!r}")
    graph: JobGraph = stream.graph
    spark = source_df.sparkSession
    location = checkpoint_location.rstrip("/")
    job_name = stream.job_name or _job_name(location)
    if foreach_batch is not None:
        def call(table: pa.Table, epoch: int) -> None:
            df = tables_to_dataframe(spark, [table], table.schema)
            try:
                foreach_batch(df, epoch)
            finally:
                df.unpersist()

        sink: Any = CallbackSink(call)
    else:
        assert path is not None
        sink = FileSink(path, schema=output_schema)
    input_schema = graph.source.schema
    side_paths = _side_paths(graph, path, dead_letters, side_outputs)
    job = StreamingJob(graph, sink, job_name=job_name, directory=f"{location}/actorflow", output_schema=output_schema,
                       max_restarts=max_restarts, restart_window_s=restart_window_s,
                       checkpoint_timeout_ms=checkpoint_timeout_ms, actor_resources=actor_resources,
                       checkpoint_interval_ms=checkpoint_interval_ms,
                       side_sinks={tag: side_file_sink(p, input_schema) for tag, p in side_paths.items()}).start()

    read_failures: list[BaseException] = []

    def each(batch: "DataFrame", batch_id: int) -> None:
        try:
            table = _collect(batch, input_schema)
        except Exception as error:
            # Nothing of the micro-batch went in: the job stops with a final checkpoint, and Spark,
            # which did not commit the batch, gives it again to the next run on this location.
            failure = JobFailedError(
                f"micro-batch {batch_id} of query {job_name!r} could not be read: {spark_cause(error)}. Nothing of it "
                "went into the job, which stopped with a final checkpoint; run the same query again with the same "
                "checkpoint_location to read it again")
            failure.__cause__ = error
            read_failures.append(failure)
            job.stop()
            raise
        job.offer(batch_id, table)

    writer = source_df.writeStream.foreachBatch(each).option("checkpointLocation", f"{location}/spark").queryName(job_name)
    if processing_time is not None:
        writer = writer.trigger(processingTime=processing_time)
    try:
        query = writer.start()
    except Exception:
        job.stop()
        raise
    return StreamingRun(query, job, spark, input_schema, side_paths, read_failures)


def spark_cause(error: BaseException) -> str:
    """The cause that Spark's error for a failed micro-batch names first, in one line: its
    text is a Python traceback around a Java one, some 250 lines.

    >>> spark_cause(RuntimeError("Traceback...\\nCaused by: org.apache.spark.SparkException: Job aborted: "
    ...     "org.apache.spark.SparkException: Parquet column cannot be converted. Column: [amount]\\n\\tat x"))
    'Parquet column cannot be converted. Column: [amount]'
    """
    lines = [line.strip() for line in str(error).replace("\\n", "\n").splitlines() if line.strip()]
    causes = [line[len("Caused by: "):] for line in lines if line.startswith("Caused by: ")]
    first = causes[0] if causes else (lines[0] if lines else type(error).__name__)
    return re.split(r"\b[\w.$]+(?:Exception|Error): ", first)[-1].strip()


def _side_paths(graph: JobGraph, path: str | None, dead_letters: str | None,
                side_outputs: dict[str, str] | None) -> dict[str, str]:
    """Each side output's Parquet directory, by tag: checked, and none of them another's or the output's."""
    paths = dict(side_outputs or {})
    if not isinstance(paths, dict) or not all(isinstance(t, str) and isinstance(p, str) and p for t, p in paths.items()):
        raise ConfigurationError(f"side_outputs= maps a side output's tag to a directory, got {side_outputs!r}")
    if dead_letters is not None:
        if not isinstance(dead_letters, str) or not dead_letters:
            raise ConfigurationError(f"dead_letters= is a directory, got {dead_letters!r}")
        paths[DEAD_LETTER] = dead_letters
    known = (DEAD_LETTER, *graph.side_tags)
    unknown = sorted(set(paths) - set(known))
    if unknown:
        raise ConfigurationError(f"side_outputs= names {unknown}, and this pipeline's side outputs are {list(known)}")
    taken = {} if path is None else {_normal(path): "the output"}
    for tag, where in paths.items():
        other = taken.setdefault(_normal(where), f"side output {tag!r}")
        if other != f"side output {tag!r}":
            raise ConfigurationError(f"side output {tag!r} and {other} would share the directory {where!r}; "
                                     "each stream needs a directory of its own")
    return paths


def _normal(path: str) -> str:
    return path.rstrip("/") if "://" in path else os.path.abspath(path)


def _collect(batch: "DataFrame", schema: pa.Schema | None) -> pa.Table:
    """A micro-batch as one Arrow table, in the source's schema (the columns ``from_spark`` saw)."""
    batches = batch._collect_as_arrow()
    if not batches:
        return schema.empty_table() if schema is not None else pa.table({})
    table = pa.Table.from_batches(batches).replace_schema_metadata()
    if schema is not None and table.schema != schema:
        if table.schema.names != schema.names:
            raise SchemaError(f"a micro-batch has columns {table.schema.names}; the stream started with {schema.names}")
        table = table.cast(schema)
    return table


def _job_name(location: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", location.rstrip("/").rsplit("/", 1)[-1])[:64].strip("-.")
    return name or "stream"
