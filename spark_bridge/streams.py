"""``from_spark`` and ``to_spark``: Spark DataFrames in and out of an actorflow pipeline.

>>> stream = from_spark(df, timestamp_column="ts", parallelism=2)     # doctest: +SKIP
>>> out = stream.async_map(lookup, capacity=100).to_spark()             # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Callable, Literal

import pyarrow as pa
import ray

from actorflow.actors.source_actor import event_time_ms
from actorflow.cluster.datastream import DataStream, check_event_time_settings, check_int
from actorflow.cluster.job import CheckpointConfig, JobResult, run_job
from actorflow.cluster.job_graph import JobGraph, SourceNode
from actorflow.cluster.job_report import late_reasons, watermark_cause
from actorflow.cluster.progress import current_progress, reports_progress
from actorflow.cluster.warm_workers import prestart_task_workers, prestart_workers
from actorflow.operators.async_wait_operator import DEAD_LETTER, DeadLetter
from actorflow.actors.arrow_rows import has_null_type, string_for_null, unify_output_schemas
from actorflow.cluster.side_records import DEAD_LETTER_FIELDS, dead_letters_table
from actorflow.operators.errors import ConfigurationError, JobFailedError, SchemaError, describe_value

from .arrow_io import dataframe_to_blocks, release_dataframe, tables_to_dataframe
from .diagnostics import diagnostic_names, late_records_to_dataframe
from .interrupts import interruptible
from .session import check_dataframe, ensure_ray
from .spark_cluster import active_cluster, write_input
from .streaming import StreamingRun, streaming_source, write_stream

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["SparkDataStream", "from_spark", "last_job", "to_arrow_schema"]

# The result of the job that finished last in this process, for last_job().
_last_job: JobResult | None = None



def to_arrow_schema(schema: Any) -> pa.Schema:
    """Accept a ``pyarrow.Schema``, a Spark ``StructType`` or a Spark DDL string."""
    if schema is None or isinstance(schema, pa.Schema):
        return schema
    from pyspark.sql.pandas.types import to_arrow_schema as spark_to_arrow
    from pyspark.sql.types import StructType, _parse_datatype_string

    if isinstance(schema, str):
        schema = _parse_datatype_string(schema)
    if isinstance(schema, StructType):
        return spark_to_arrow(schema)
    raise ConfigurationError(f"output_schema must be a pyarrow.Schema, a Spark StructType or a DDL string, got {type(schema).__name__}")


class SparkDataStream(DataStream):
    """A ``DataStream`` read from a Spark DataFrame, which can be written back to one."""

    _spark: "SparkSession"
    _input_schema: pa.Schema
    # The event-time column and a Spark job counting its nulls, when the stream has one.
    _null_event_times: "tuple[str, Callable[[], int], Callable[[], Any]] | None" = None
    # With from_spark(null_timestamps="dead_letter"): the rows without an event time, and why.
    _null_rows: "tuple[DataFrame, str] | None" = None
    # A streaming DataFrame's stream: the query it runs on (write_stream).
    _streaming_df: "DataFrame | None" = None

    def _with(self, node: Any) -> "SparkDataStream":
        stream = super()._with(node)
        stream._spark, stream._input_schema = self._spark, self._input_schema
        stream._null_event_times, stream._null_rows = self._null_event_times, self._null_rows
        stream._streaming_df = self._streaming_df
        return stream

    def write_stream(
        self, path: str | None = None, *, checkpoint_location: str, foreach_batch: Callable[[Any, int], Any] | None = None,
        output_schema: Any = None, processing_time: str | None = None, max_restarts: int = 20,
        restart_window_s: float = 60.0, checkpoint_timeout_ms: int = 60_000, checkpoint_interval_ms: int | None = 1_000,
        dead_letters: str | None = None, side_outputs: dict[str, str] | None = None,
    ) -> StreamingRun:
        """Start the pipeline on a streaming DataFrame (``from_spark(spark.readStream...)``): one job
        for the query's whole life, returning a ``StreamingRun`` (Spark's ``StreamingQuery``).

        The output goes to Parquet files under ``path``, with Spark's file-sink log, so that
        ``spark.read`` and ``spark.readStream`` see only the micro-batches whose output was
        published; or to ``foreach_batch(df, epoch)``, called with each published epoch's rows
        once its checkpoint is complete (again after a crash, with the same epoch and rows:
        write idempotently per epoch, as with Spark's ``foreachBatch``).

        ``checkpoint_location`` holds Spark's offsets and actorflow's checkpoints: run the same
        script again with it to resume. ``processing_time`` is Spark's trigger (``"2 seconds"``);
        by default a micro-batch starts as soon as the last one ended. Between micro-batches the
        job goes on (timers, idleness, requests in flight), and a checkpoint every
        ``checkpoint_interval_ms`` publishes what it produced: a window that closes while no
        micro-batch comes reaches the output within ``idleness_ms`` (when an idle input is what
        closes it) plus ``checkpoint_interval_ms`` plus the checkpoint's own time. An actor that dies
        restarts the job from its latest checkpoint within ``max_restarts`` per ``restart_window_s``.

        Dead letters and side outputs (a window's late data) are streams too: ``dead_letters``
        and ``side_outputs`` (``{tag: path}``) write them as Parquet files in the same way,
        published with each micro-batch's output, each record with its own columns and what
        happened to it. One without a path is kept under ``checkpoint_location`` until
        ``stop(drain=True)``. ``StreamingRun.dead_letters()`` and ``side_output(tag)`` read them.
        """
        if self._streaming_df is None:
            raise ConfigurationError("write_stream() runs a stream of a streaming DataFrame (spark.readStream); "
                                     "this one reads a bounded DataFrame: call to_spark()")
        self._check_ray()
        cluster = active_cluster(self._spark)
        return write_stream(self, self._streaming_df, path, checkpoint_location=checkpoint_location,
                            foreach_batch=foreach_batch, output_schema=to_arrow_schema(output_schema),
                            processing_time=processing_time, max_restarts=max_restarts,
                            restart_window_s=restart_window_s, checkpoint_timeout_ms=checkpoint_timeout_ms,
                            actor_resources=cluster.actor_resources if cluster is not None else None,
                            checkpoint_interval_ms=checkpoint_interval_ms, dead_letters=dead_letters,
                            side_outputs=side_outputs)

    def _run(self, **options: Any) -> JobResult:
        try:
            return run_job(self._graph, **options)
        except JobFailedError as error:
            # A null event time fails the source reader that meets it, naming the nulls of its
            # block; the user needs those of the whole DataFrame. Spark counts them only now,
            # so that a job that succeeds pays no Spark job for the check.
            if self._null_event_times is not None:
                column, count_nulls, first_null = self._null_event_times
                nulls = count_nulls()
                if nulls:
                    raise SchemaError(
                        f"column {column!r} holds nulls in {nulls} rows; event time needs a timestamp on every "
                        f"record. The first: {describe_value(first_null())}; from_spark(null_timestamps='dead_letter') "
                        "sends such rows to the dead letters instead"
                    ) from error
            raise

    # A warning of to_spark() names its caller's line with stacklevel=3, past the bar's wrapper.
    @reports_progress
    def to_spark(
        self, output_schema: Any = None, *, dead_letters: bool = False, progress: bool = True,
        checkpoint_interval_ms: int | None = None, checkpoint_dir: str | None = None, resume_from: str | None = None,
        max_restarts: int = 20, restart_window_s: float = 60.0, checkpoint_timeout_ms: int = 60_000,
        checkpoint_filesystem: Any = None, overwrite: bool = False,
    ) -> "DataFrame | tuple[DataFrame, DataFrame]":
        """Run the pipeline; return its output as a DataFrame (and the dead letters, if asked).

        The checkpoint settings (``overwrite`` too) are those of ``DataStream.execute``: with them,
        the output is what the job's completed checkpoints committed, exactly once whatever actors
        died. ``progress`` shows a bar, with the phases of the call (see ``DataStream.execute``)
        and, last, ``output``: the output becomes a DataFrame.
        """
        if self._streaming_df is not None:
            raise ConfigurationError("to_spark() returns a bounded DataFrame, and this stream reads a streaming one "
                                     "(spark.readStream): start it with write_stream(path, checkpoint_location=...)")
        with interruptible():  # Ctrl-C cancels the Spark jobs, without py4j tracebacks
            schema = to_arrow_schema(output_schema)
            input_schema = self._input_schema

            def target_schema(schemas: list[pa.Schema | None], samples: Callable[[], list[Any]]) -> pa.Schema:
                present = [s for s in schemas if s is not None]
                if schema is not None:
                    return schema
                if present:
                    return unify_output_schemas(present, samples())
                return input_schema  # no output at all: the input's columns and types

            def output_blocks(actors: list[Any], schemas: list[pa.Schema | None],
                              blocks: list[list[Any]]) -> tuple[pa.Schema, list[Any]]:
                # The blocks left the actors while the job ran; Ray tasks conform them for Spark.
                target = target_schema(schemas, lambda: ray.get(
                    [a.output_sample.remote() for a, s in zip(actors, schemas) if s is not None]))
                return target, [ref for refs in blocks for ref in refs]

            self._check_ray()
            if schema is not None:
                check_output_names(self._spark, schema)  # before the job, when the schema is the user's
            checkpoint = CheckpointConfig(
                checkpoint_interval_ms, checkpoint_dir, checkpoint_filesystem, timeout_ms=checkpoint_timeout_ms,
                resume_from=resume_from, max_restarts=max_restarts, restart_window_s=restart_window_s, overwrite=overwrite)
            cluster = active_cluster(self._spark)
            result = self._run(job_name=self.job_name, output_schema=schema, progress=progress,
                               actor_resources=cluster.actor_resources if cluster is not None else None,
                               on_finish=output_blocks, side_tags=(DEAD_LETTER, *self._graph.side_tags), checkpoint=checkpoint)
            global _last_job
            self.last_result = _last_job = result
            if result.finished is not None:
                target, refs = result.finished
            else:  # a checkpointed job: its committed output, read back from storage
                refs = result.tables
                tables = [t for t in ray.get(refs) if t is not None]
                target = target_schema([t.schema for t in tables], lambda: [t.slice(0, 1).to_pylist()[0] for t in tables])
                del tables
            # Spark reads the output into its cache at the first action; then every block goes. Only
            # then do the processes for the next job's actors, and for the next snapshot's tasks,
            # start: the action would share the CPU.
            result.finished, result.tables = None, []
            actors, tasks = result.actor_processes, self._graph.worker_processes

            def prestart() -> None:
                prestart_workers(actors, tasks)
                prestart_task_workers()

            current_progress().phase("output")
            check_output_names(self._spark, target)
            target = typed_columns(target, input_schema)
            out = tables_to_dataframe(self._spark, refs, target, fill_missing=True, on_read=prestart)
            del refs
            dropped = sum(f.get("late_records_dropped", 0) for f in result.figures)
            if dropped:
                # Why, too: the reasons, and the record that moved the watermark that far (one absurd
                # timestamp makes every later record late).
                reasons = ", ".join(f"{r} {n:,}" for r, n in late_reasons(result.figures).items())
                cause = watermark_cause(result.figures)
                warnings.warn(
                    f"{dropped:,} late records were dropped by windows without a late-data side output"
                    + (f" (late records by reason: {reasons})" if reasons else "") + (f"; {cause}" if cause else "")
                    + "; call side_output_late_data(tag) on the window to keep them", stacklevel=3,
                )
            letters = result.side_outputs.get(DEAD_LETTER, [])
            if not dead_letters and (letters or self._null_rows is not None):
                # Rows without an event time count only now, in a Spark job of their own, and only
                # when they could be lost: with dead_letters=True they are returned, uncounted.
                count = len(letters) + (self._null_rows[0].count() if self._null_rows is not None else 0)
                if count:
                    out.unpersist()  # the result goes unreturned: its blocks and cache go too
                    raise ConfigurationError(
                        f"{count} records went to dead letters; call to_spark(dead_letters=True) to get them"
                    )
            letters_df = dead_letters_to_dataframe(self._spark, letters, self._input_schema) if dead_letters else None
            if letters_df is not None and self._null_rows is not None:
                letters_df = _with_null_rows(letters_df, *self._null_rows)
            return out if letters_df is None else (out, letters_df)

    async def to_spark_async(self, output_schema: Any = None, **options: Any) -> "DataFrame | tuple[DataFrame, DataFrame]":
        """``to_spark()`` for code that already runs an event loop (a notebook's).

        Takes the arguments of ``to_spark()``. The job runs in a worker thread, so the caller's
        loop goes on with its other tasks meanwhile. Cancelling the await does not stop the
        job: it runs to its end in that thread.

        >>> out = await stream.async_map(lookup).to_spark_async()   # doctest: +SKIP
        """
        return await asyncio.to_thread(self.to_spark, output_schema, **options)

    def get_side_output(self, tag: str) -> "DataFrame":
        """The records of side output ``tag`` (a window's late data) from the last ``to_spark()``,
        with the columns and types of the input, and those that operators before the window added
        (inferred from the records: an empty side output has the input's columns alone), then why
        each was late: ``late_reason``, ``late_windows`` (start and end ms) and ``late_watermark_ms``.

        >>> counts = stream.key_by("country").window(w).side_output_late_data("late").count()  # doctest: +SKIP
        >>> df = counts.to_spark(); late = counts.get_side_output("late")                       # doctest: +SKIP
        """
        result = getattr(self, "last_result", None)
        if result is None:
            raise ConfigurationError(f"get_side_output({tag!r}) needs a finished run; call to_spark() first")
        if tag not in result.side_outputs:
            raise ConfigurationError(
                f"no side output {tag!r}; this stream has {sorted(t for t in result.side_outputs if t != DEAD_LETTER)}"
            )
        return late_records_to_dataframe(self._spark, result.side_outputs[tag], self._input_schema)


def check_output_names(spark: "SparkSession", schema: pa.Schema) -> None:
    """Refuse a result with two columns that Spark takes for one: its names are case-insensitive
    unless ``spark.sql.caseSensitive`` is true, and a DataFrame with ``id`` and ``ID`` then fails
    at its first use with AMBIGUOUS_REFERENCE, far from the function that added one of them.

    >>> check_output_names(spark, pa.schema([("id", pa.int64()), ("ID", pa.int64())]))   # doctest: +SKIP
    Traceback (most recent call last):
    SchemaError: the result has columns 'id' and 'ID', ...
    """
    if str(spark.conf.get("spark.sql.caseSensitive", "false")).lower() == "true":
        return
    seen: dict[str, str] = {}
    for name in schema.names:
        other = seen.setdefault(name.lower(), name)
        if other != name:
            raise SchemaError(
                f"the result has columns {other!r} and {name!r}, which Spark takes for one column (its names are "
                "case-insensitive unless spark.sql.caseSensitive is true), so the DataFrame would fail at its "
                "first use with AMBIGUOUS_REFERENCE; a name must be unique, whatever its case: rename one"
            )


def typed_columns(schema: pa.Schema, input_schema: pa.Schema) -> pa.Schema:
    """``schema`` with a string type for each new column that has none, with a warning.

    A column that was None (or empty) in every row has Arrow's type null, Spark's void, which
    fails where the DataFrame is written (Parquet has no void). String holds those values
    exactly and is written anywhere; refusing instead would throw away the result of a job that
    may have run for hours, over a type the warning tells how to declare. A column the input had
    keeps its type, void or not.

    >>> with warnings.catch_warnings(record=True):
    ...     typed_columns(pa.schema([("x", pa.list_(pa.null()))]), pa.schema([])).field("x").type
    ListType(list<item: string>)
    """
    untyped = [f for f in schema if has_null_type(f.type) and f not in input_schema]
    if not untyped:
        return schema
    names = [f.name for f in untyped]
    warnings.warn(
        f"columns {names} were None (or empty) in every row, so they have no type; they become string, as "
        f"Spark's void cannot be written (to Parquet, for one). Declare their types, for example "
        f"output_schema=\"{untyped[0].name} string\" (enrich() takes the new columns alone)", stacklevel=4,
    )
    return pa.schema([f.with_type(string_for_null(f.type)) if f in untyped else f for f in schema])


def last_job() -> JobResult:
    """The result of the ``to_spark()`` or ``enrich()`` that finished last in this process.

    ``enrich()`` returns DataFrames; this is where its job's figures are. In a notebook the
    result shows as a table of the job and its operators.

    >>> enriched = enrich(clicks, lookup)     # doctest: +SKIP
    >>> last_job()                            # doctest: +SKIP
    """
    if _last_job is None:
        raise ConfigurationError("last_job() needs a finished job; no to_spark() or enrich() has finished in this process")
    return _last_job


def dead_letter_names(record_columns: list[str]) -> dict[str, str]:
    """The dead-letter column for each diagnostic field, never one of the record's own columns.

    >>> dead_letter_names(["id", "error"])["error"]
    'dead_letter_error'
    """
    return diagnostic_names(record_columns, DEAD_LETTER_FIELDS, prefix="dead_letter_", always=False)


def _with_null_rows(letters: "DataFrame", rows: "DataFrame", column: str) -> "DataFrame":
    """The dead letters, then the rows that had no event time, with why (as ``SchemaError``)."""
    from pyspark.sql import functions as F

    names = dead_letter_names(rows.columns)
    reason = f"column {column!r} is null; event time needs a timestamp on every record"
    why = rows.select(
        "*", F.lit("SchemaError").alias(names["error_type"]), F.lit(reason).alias(names["error"]),
        F.lit(0).cast("bigint").alias(names["attempts"]), F.lit("from_spark").alias(names["operator"]))
    return letters.unionByName(why, allowMissingColumns=True)


def dead_letters_to_dataframe(spark: "SparkSession", letters: list[DeadLetter], input_schema: pa.Schema) -> "DataFrame":
    """The failed records with their own columns and types, then why each failed."""
    table = dead_letters_table(letters, input_schema)
    return tables_to_dataframe(spark, [table], table.schema)


def from_spark(
    df: "DataFrame",
    *,
    timestamp_column: str | None = None,
    out_of_orderness_ms: int = 0,
    parallelism: int | None = None,
    batch_size: int = 2048,
    job_name: str | None = None,
    idleness_ms: int | None = None,
    null_timestamps: Literal["fail", "dead_letter"] = "fail",
) -> SparkDataStream:
    """A stream over the rows of ``df``, in order, split over ``parallelism`` source readers.

    With ``timestamp_column``, each record carries its event time (a timestamp, date or integer
    milliseconds column; a null fails the run with ``SchemaError``, naming the column and how many
    rows hold one), and the
    sources emit watermarks that trail the largest time seen by ``out_of_orderness_ms``; a split
    that waits ``idleness_ms`` for its data goes idle and holds back no watermark.

    Like a Spark transformation, this reads nothing yet: the first run of the stream snapshots
    ``df`` into Ray's object store while it starts its actors, and later runs of the same stream
    read that snapshot. The snapshot is freed with the last stream built on it.

    ``null_timestamps="dead_letter"`` keeps a job with a few rows without an event time going:
    Spark filters them out before the job, and ``to_spark(dead_letters=True)`` returns them
    among the dead letters, with ``error_type`` ``SchemaError``, the reason, ``attempts`` 0 and
    ``operator`` ``from_spark`` (as a Flink ``ProcessFunction`` would send them to a side
    output). By default (``"fail"``) the first such row fails the run, named.
    """
    check_int("parallelism", parallelism, 1, optional=True, expected="an int >= 1 (or None for one per core, up to 4)")
    check_int("batch_size", batch_size, 1)
    check_event_time_settings(out_of_orderness_ms, idleness_ms)
    if null_timestamps not in ("fail", "dead_letter"):
        raise ConfigurationError(f"null_timestamps must be 'fail' or 'dead_letter', got {null_timestamps!r}")
    if null_timestamps == "dead_letter" and timestamp_column is None:
        raise ConfigurationError("null_timestamps='dead_letter' needs timestamp_column=, got none")
    ensure_ray()
    check_dataframe(df, streaming=True)
    if parallelism is None:
        parallelism = default_parallelism()
    if timestamp_column is not None:
        if timestamp_column not in df.columns:
            raise SchemaError(f"event-time column {timestamp_column!r} not found; the DataFrame has {df.columns}")
    input_schema = _input_schema(df)
    if timestamp_column is not None:
        event_time_ms(input_schema.empty_table(), timestamp_column)  # the type check
    if df.isStreaming:
        if null_timestamps != "fail":
            raise ConfigurationError("null_timestamps='dead_letter' reads a bounded DataFrame; a stream's null event "
                                     "time fails the job, named (filter such rows in Spark first)")
        source = streaming_source(df, parallelism=parallelism, timestamp_column=timestamp_column,
                                  out_of_orderness_ms=out_of_orderness_ms, batch_size=batch_size,
                                  idleness_ms=idleness_ms, schema=input_schema)
        stream = SparkDataStream(JobGraph(source), job_name=job_name)
        stream._spark, stream._input_schema, stream._streaming_df = df.sparkSession, input_schema, df
        return stream
    stream = SparkDataStream(JobGraph(SourceNode(None, None, parallelism, timestamp_column, out_of_orderness_ms,
                                                 batch_size, schema=input_schema, idleness_ms=idleness_ms)),
                             job_name=job_name)
    stream._spark, stream._input_schema = df.sparkSession, input_schema
    if timestamp_column is not None:
        nulls = df.filter(df[timestamp_column].isNull())
        if null_timestamps == "dead_letter":
            stream._null_rows = (nulls, timestamp_column)
            df = df.filter(df[timestamp_column].isNotNull())
        else:
            stream._null_event_times = (timestamp_column, nulls.count, lambda: _as_dict(nulls.first()))
    snapshot: list[Any] = []
    owner = object()  # this stream's snapshot, apart from those of other streams over df

    cluster = active_cluster(df.sparkSession)

    def load() -> tuple[list[Any], list[int]]:
        # Called once, when the first job starts: its actors start while Spark converts. The
        # snapshot is then kept with the source, so every later run reads the same rows.
        if not snapshot:
            if cluster is not None:
                snapshot.append(write_input(cluster, df, input_schema))
            else:
                blocks = dataframe_to_blocks(df, owner=owner)
                snapshot.append(([b for b, _ in blocks], [n for _, n in blocks]))
        return snapshot[0]

    stream.graph.source.loader = load
    if cluster is None:
        # The snapshot's blocks go with the last stream over this source; so must Spark's cached
        # copy of them (a no-op if the stream never ran).
        # At exit there is nothing to do: Spark stops and frees it.
        weakref.finalize(stream.graph.source, release_dataframe, df, owner).atexit = False
    return stream


def _as_dict(row: Any) -> Any:
    return None if row is None else row.asDict()  # None: the nulls were counted, then gone (a changing source)


def default_parallelism() -> int:
    return max(1, min(4, int(ray.cluster_resources().get("CPU", 1))))


def _input_schema(df: "DataFrame") -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema as spark_to_arrow

    return spark_to_arrow(df.schema)
