"""Move data between Spark DataFrames and Arrow blocks in Ray's object store, keeping row order.

Source direction: ``dataframe_to_blocks`` snapshots a DataFrame into Arrow blocks in Ray's
object store, one per Spark partition, with their row counts, which is what a replayable source
needs for its (block, row) positions.

Sink direction: ``tables_to_dataframe`` turns Arrow tables (or references to them) back into a
DataFrame that Spark's executors read straight from the object store, in the JVM, without
Python workers.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Union

import pyarrow as pa

from actorflow.actors.arrow_rows import conform_table, ipc_bytes
from actorflow.actors.store_pages import process_pages
from actorflow.actors.upstream.ray import owner_addresses, quiet_arrow_fallback
from actorflow.cluster.job import live_nodes
from actorflow.operators.errors import SchemaError

if TYPE_CHECKING:
    import ray
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "dataframe_to_blocks",
    "ipc_blocks_to_dataframe",
    "release_dataframe",
    "release_outputs",
    "spark_arrow_schema",
    "spark_schema",
    "tables_to_dataframe",
]

_log = logging.getLogger(__name__)

# A sink partition holds contiguous inputs up to about this size, so that thousands of small
# batches do not become thousands of Spark tasks, and a huge result does not become one task
# that a 1g executor cannot hold.
_TARGET_PARTITION_BYTES = 64 * 1024 * 1024
# Output blocks up to this much in all are conformed in the driver: scheduling Ray tasks for them
# (and perhaps starting their workers) would take longer than the work.
_LOCAL_CONFORM_BYTES = 16 * 1024 * 1024

TablesOrRefs = Union[Sequence[pa.Table], Sequence["ray.ObjectRef"]]

# An input partition above this (by Spark's estimate) is split before it goes to Ray.
_MAX_INPUT_PARTITION_BYTES = 64 * 1024 * 1024
# The Spark RDDs that cache the snapshots of each user's DataFrame, for release_dataframe(): the
# owner of each snapshot (or None) and its RDD. Threads that read one DataFrame at once share it.
_snapshots: dict[Any, list[tuple[object | None, int]]] = {}
_snapshots_lock = threading.Lock()


def dataframe_to_blocks(df: DataFrame, *, owner: object | None = None) -> list[tuple[ray.ObjectRef, int]]:
    """Snapshot a Spark DataFrame into Arrow blocks in Ray's object store: ``(block, rows)`` each.

    Block ``i`` holds Spark partition ``i``, rows in partition order, so reading the blocks in
    order gives the rows in the order ``df.collect()`` would; a partition above about 64 MiB is
    split into ranges of consecutive rows first. The snapshot is cached in Spark (memory and
    disk, as Arrow) until ``release_dataframe(df)`` or the end of the Spark session; a lost block
    is rebuilt from that cache by Ray's lineage, so replays see the same rows even if ``df`` is
    not deterministic. ``owner`` names this snapshot for ``release_dataframe(df, owner)``, which
    then frees it alone, and no other snapshot of ``df`` that another reader still fetches from.

    Spark caches the partitions through RayDP's JVM side; a few Ray tasks (``_fetch_groups``) then
    fetch them from the executors, each a contiguous run of partitions, one block a partition.
    One task a partition, as RayDP does, starts a Python worker for each on a small machine, and
    that start costs far more than the fetch.

    Example::

        spark = spark_session()
        blocks = dataframe_to_blocks(spark.range(1000).repartition(2))
        [n for _, n in blocks]       # [500, 500]
    """
    import ray
    from pyspark import StorageLevel

    source = _bounded_partitions(df)
    context = df.sparkSession.sparkContext
    writer = _object_store_writer(context)
    info = writer.prepareRecoverableRDD(source._jdf, context._getJavaStorageLevel(StorageLevel.MEMORY_AND_DISK))
    with _snapshots_lock:
        _snapshots.setdefault(df, []).append((owner, info.rddId()))
    partitions = info.numPartitions()
    if partitions == 0:
        return []
    executors = [f"raydp-executor-{location}" for location in info.locations()]
    blocks: list[ray.ObjectRef] = []
    counts: list[ray.ObjectRef] = []
    # On a cluster of several nodes the fetches spread over them, one or more a node, and so do
    # the blocks: a node's death takes a few, which Ray rebuilds from Spark's cache when a reader
    # needs them.
    nodes = live_nodes()
    spread = {"scheduling_strategy": "SPREAD"} if nodes > 1 else {}
    for group in _fetch_groups(partitions, max(2, nodes)):
        refs = _fetch_task().options(num_returns=2 * len(group), **spread).remote(
            [executors[i] for i in group], info.rddId(), group, info.schemaJson(), info.driverAgentUrl())
        blocks.extend(refs[: len(group)])
        counts.extend(refs[len(group):])
    return list(zip(blocks, ray.get(counts)))


#: Partitions that one fetch task reads at most, so that a task holds at most a few hundred MiB at once.
_MAX_PARTITIONS_PER_FETCH = 8


def _fetch_groups(partitions: int, tasks: int = 2) -> list[list[int]]:
    """Contiguous runs of partitions, one a fetch task: a share of them for each of ``tasks``
    (two on one node: two Python workers, usually idle ones kept by Ray; one a node on a
    cluster), each at most ``_MAX_PARTITIONS_PER_FETCH``.

    >>> _fetch_groups(5), len(_fetch_groups(40)), _fetch_groups(8, 3)
    ([[0, 1, 2], [3, 4]], 5, [[0, 1, 2], [3, 4, 5], [6, 7]])
    """
    size = min(_MAX_PARTITIONS_PER_FETCH, -(-partitions // tasks))
    return [list(range(start, min(start + size, partitions))) for start in range(0, partitions, size)]


def _fetch_partitions(
    executors: list[str], rdd_id: int, partitions: list[int], schema_json: str, driver_agent_url: str
) -> tuple[Any, ...]:
    # A Ray task: the cached Arrow bytes of each partition, from the JVM executor that holds it
    # (a cross-language actor call), as tables; then their row counts. All calls leave at once.
    import ray
    from raydp.spark.dataset import _enable_load_code_from_local

    _enable_load_code_from_local()
    quiet_arrow_fallback()  # the tables go back through Ray's serializer
    pending = [ray.get_actor(name).getRDDPartition.remote(rdd_id, partition, schema_json, driver_agent_url)
               for name, partition in zip(executors, partitions)]
    tables = []
    for ref in pending:
        # Spark's writer attaches schema metadata that the blocks must not carry.
        tables.append(pa.ipc.open_stream(pa.BufferReader(ray.get(ref))).read_all().replace_schema_metadata())
    # This worker outlives the task: the store's pages it reads and writes must not pile up in
    # its RSS (see actors.store_pages).
    process_pages.passed(2 * sum(table.nbytes for table in tables))
    return (*tables, *[table.num_rows for table in tables])


@functools.cache
def _fetch_task() -> Any:
    import ray

    # No CPU reserved: Spark's executors may hold every CPU. Retried, so that Ray can rebuild a
    # lost block from Spark's cache.
    return ray.remote(num_cpus=0, max_retries=5)(_fetch_partitions)


def _bounded_partitions(df: DataFrame) -> DataFrame:
    """``df`` with partitions of at most about ``_MAX_INPUT_PARTITION_BYTES``, rows in order.

    RayDP's executors hand a partition to Ray as one byte array on their heap: a partition of a
    few hundred MiB fails a 1g executor with an OutOfMemoryError. Larger partitions (by Spark's
    size estimate) are split into ranges of consecutive rows, which keeps the order.
    """
    from pyspark.sql import functions as F

    try:
        size = int(str(df._jdf.queryExecution().optimizedPlan().stats().sizeInBytes()))
    except Exception:  # noqa: BLE001 - no estimate: leave the partitions as they are
        return df
    partitions = df.rdd.getNumPartitions()
    wanted = -(-size // _MAX_INPUT_PARTITION_BYTES)
    if size >= 2**62 or wanted <= partitions:  # Long.MaxValue: Spark does not know
        return df
    row = "__actorflow_row__"
    return (df.withColumn(row, F.monotonically_increasing_id())
            .repartitionByRange(wanted, row).sortWithinPartitions(row).drop(row))


def release_dataframe(df: DataFrame, owner: object | None = None) -> None:
    """Free the Spark-side snapshots that ``dataframe_to_blocks(df)`` cached: all of them, or
    with ``owner`` only those made for it.

    Call it once no reader needs to rebuild the blocks; afterwards a lost block cannot be
    recovered. Unknown DataFrames are ignored. Two jobs that read one DataFrame at once each
    free their own snapshot: freeing the other's while its blocks are still being fetched made
    RayDP fail that job ("Still cannot get the block after recache!").

    Example::

        blocks = dataframe_to_blocks(df)
        rows = sum(n for _, n in blocks)
        release_dataframe(df)
    """
    with _snapshots_lock:
        taken = _snapshots.pop(df, [])
        kept = [entry for entry in taken if owner is not None and entry[0] is not owner]
        if kept:
            _snapshots[df] = kept
    rdd_ids = [rdd_id for entry_owner, rdd_id in taken if owner is None or entry_owner is owner]
    context = df.sparkSession.sparkContext
    if getattr(context, "_jsc", None) is None:
        return  # the session stopped, and freed everything with it
    for rdd_id in rdd_ids:
        _object_store_writer(context).releaseRecoverableRDD(rdd_id)


def _object_store_writer(context: Any) -> Any:
    # RayDP's JVM side: it caches a DataFrame's partitions as Arrow and serves them to Ray.
    return context._jvm.org.apache.spark.sql.raydp.ObjectStoreWriter


def spark_schema(schema: pa.Schema) -> Any:
    """The Spark ``StructType`` that ``tables_to_dataframe`` gives a result of this schema.

    Example::

        spark_schema(pa.schema([("id", pa.int64())]))
        # StructType([StructField('id', LongType(), True)])
    """
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StructField, StructType

    normalized = spark_arrow_schema(schema)
    return StructType(
        [
            # A naive timestamp is Spark's timestamp_ntz; one with a time zone is its timestamp.
            StructField(field.name, from_arrow_type(field.type, prefer_timestamp_ntz=True), nullable=field.nullable)
            for field in normalized
        ]
    )


def tables_to_dataframe(
    spark: SparkSession, tables: TablesOrRefs, schema: pa.Schema, *, fill_missing: bool = False,
    on_read: Callable[[], Any] | None = None,
) -> DataFrame:
    """Build a Spark DataFrame from Arrow tables, or Ray references to Arrow tables.

    Rows keep their order: the tables' order, then each table's row order. Every table is cast
    to ``schema`` (columns picked by name); timestamps become microseconds (Spark's unit, finer
    digits are dropped), naive ones ``timestamp_ntz`` and those with a time zone ``timestamp``. No tables, or only empty ones,
    give an empty DataFrame with the schema. A table that lacks a column of ``schema`` is an
    error, or with ``fill_missing`` gets it as nulls (one instance of a job may never have seen a
    key that another's rows had).

    The DataFrame comes back persisted in Spark; its first action reads the blocks into Spark's
    cache, and then nothing of it stays in Ray's object store (see ``ipc_blocks_to_dataframe``,
    which calls ``on_read``).

    Example::

        t = pa.table({"id": [1, 2, 3]})
        tables_to_dataframe(spark, [t], t.schema).collect()    # [Row(id=1), Row(id=2), Row(id=3)]
    """
    import ray

    target = spark_arrow_schema(schema)
    struct = spark_schema(schema)
    if not tables:
        return spark.createDataFrame([], struct)

    if all(isinstance(table, pa.Table) for table in tables):
        local = [conform_table(table, target, fill_missing=fill_missing) for table in tables]  # type: ignore[arg-type]
        groups = _contiguous_groups([table.nbytes for table in local])
        blobs = [ipc_bytes([local[i] for i in group]) for group in groups]
        counts = [sum(local[i].num_rows for i in group) for group in groups]
        block_refs = [ray.put(blob) for blob in blobs]
    elif all(isinstance(table, ray.ObjectRef) for table in tables):
        refs: list[ray.ObjectRef] = list(tables)  # type: ignore[arg-type]
        sizes = _object_sizes(refs)
        if sum(sizes) <= _LOCAL_CONFORM_BYTES:
            return tables_to_dataframe(spark, ray.get(refs), schema, fill_missing=fill_missing, on_read=on_read)
        groups = _contiguous_groups(sizes)
        convert = _remote_conform_to_ipc()
        pending = [convert.remote(target, fill_missing, *[refs[i] for i in group]) for group in groups]
        block_refs = [blob_ref for blob_ref, _ in pending]
        # Waiting for the counts here surfaces a bad table now, not at Spark's first action.
        try:
            counts = ray.get([count_ref for _, count_ref in pending])
        except ray.exceptions.RayTaskError as error:
            if isinstance(error.cause, SchemaError):
                raise error.cause from None
            raise
    else:
        kinds = sorted({type(table).__name__ for table in tables})
        raise SchemaError(
            "tables must all be pyarrow.Table or all ray.ObjectRef, got a mix of "
            + ", ".join(kinds)
        )

    return ipc_blocks_to_dataframe(spark, schema, [ref for ref, count in zip(block_refs, counts) if count > 0],
                                   on_read=on_read)


def ipc_blocks_to_dataframe(
    spark: SparkSession, schema: pa.Schema, block_refs: list[ray.ObjectRef], *, on_read: Callable[[], Any] | None = None,
) -> DataFrame:
    """A DataFrame over blocks of Arrow IPC bytes in Ray's object store, one partition each.

    Every block must already hold ``spark_arrow_schema(schema)``: ``tables_to_dataframe``
    makes such blocks. The DataFrame is persisted in Spark (memory, then disk), and its first
    action reads the blocks into that cache, as part of the job the user runs anyway; reading
    them here would cost a Spark job of its own. The blocks stay in Ray until every partition is
    in the cache, or until the DataFrame is unpersisted, and at the latest until
    ``release_outputs()`` (``stop_spark()`` calls it). After that it cannot be computed again,
    since the blocks were freed. A session outside Ray (``on_spark_cluster``) reads the blocks
    through Parquet files in the cluster's staging directory instead.

    ``on_read`` is called once Spark has read the blocks (or they were freed unread by an
    ``unpersist()``) and has then run no job for ``SPARK_QUIET_S`` (waiting ``SPARK_IDLE_WAIT_S``
    at most), from a thread of its own; at once when there is nothing to read. The cache holds the blocks
    before the action that read them has ended: what ``on_read`` starts would share the CPU
    with the rest of that action.
    """
    from pyspark import StorageLevel
    from raydp.spark.dataset import _convert_by_rdd

    struct = spark_schema(schema)
    if not block_refs or not (spark.sparkContext.master or "").startswith("ray://"):
        if on_read is not None:
            on_read()
        if not block_refs:
            return spark.createDataFrame([], struct)
        from .spark_cluster import read_output

        return read_output(spark, struct, block_refs)
    # Blocks of Arrow IPC bytes take RayDP's JVM path: executors decode them natively. Its
    # public entry (ray_dataset_to_spark_dataframe) would map naive timestamps to timestamp, not
    # timestamp_ntz, and fetch the first block into this process to look at it; its inner
    # function takes the Spark schema as given.
    locations = owner_addresses(block_refs)
    # The executors read the blocks once, into Spark's cache; from then on the DataFrame needs
    # nothing of Ray. Handing the blocks to RayDP's master instead would pin them until Spark
    # stops.
    df = _convert_by_rdd(spark, block_refs, locations, struct).persist(StorageLevel.MEMORY_AND_DISK)
    _held_outputs.hold(df, block_refs, on_read)
    return df


#: How long ``on_read`` waits for Spark's running jobs to end, at most: the action that read the
#: blocks may go on for long after (on a busy machine, its Python workers alone take seconds to
#: start).
SPARK_IDLE_WAIT_S = 60.0
#: How long Spark must have run no job for ``on_read``: one action may run several jobs, with an
#: instant between two of them when none runs (on a busy driver, more than 0.3 s).
SPARK_QUIET_S = 1.0


def wait_for_spark_jobs(
    spark: SparkSession, timeout_s: float = SPARK_IDLE_WAIT_S, poll_s: float = 0.02, quiet_s: float = SPARK_QUIET_S,
) -> bool:
    """Wait until ``spark`` has run no job for ``quiet_s``, at most ``timeout_s``; True if so.

    Spark's status tracker learns of a job from its listener bus, which runs behind the
    scheduler: on a busy driver, a job whose tasks had already read a cache could still be
    unknown to it for a while. The scheduler's own set of active jobs has the job from its
    submission, before any of its tasks runs, to its end. Between two jobs of one action
    neither knows of any, for as long as the driver takes to plan the next one (seconds on a
    busy machine): the action's SQL execution, which spans all its jobs, covers that gap. Spark
    counts as busy while any of the three is, and while py4j fails to read them from a session
    that has not stopped.
    """
    tracker = spark.sparkContext.statusTracker()
    scheduler = _reachable(lambda: spark.sparkContext._jsc.sc().dagScheduler(), lambda d: d.activeJobs().isEmpty())
    store = _reachable(lambda: spark._jsparkSession.sharedState().statusStore(), lambda s: s.executionsCount())
    now = time.monotonic()
    deadline = now + timeout_s
    idle_since: float | None = None
    while True:
        try:
            busy = bool(tracker.getActiveJobsIds())
            if not busy and scheduler is not None:
                busy = not scheduler.activeJobs().isEmpty()
            if not busy and store is not None:
                busy = _sql_execution_running(store)
        except Exception:  # noqa: BLE001 - py4j failed: a stopped session runs no job; else unknown
            if _stopped(spark):
                return True
            busy = True  # what cannot be read must not count as idle
        now = time.monotonic()
        if busy:
            idle_since = None
        elif idle_since is None:
            idle_since = now
        if idle_since is not None and now - idle_since >= quiet_s:
            return True
        if now >= deadline:
            return False
        time.sleep(poll_s)


def _stopped(spark: SparkSession) -> bool:
    try:
        return bool(spark.sparkContext._jsc.sc().isStopped())
    except Exception:  # noqa: BLE001 - no JVM to ask: nothing runs there
        return True


def _reachable(get: Callable[[], Any], probe: Callable[[Any], Any]) -> Any:
    """``get()``, a JVM object, if py4j reaches it and ``probe`` of it answers; else None."""
    try:
        found = get()
        probe(found)
        return found
    except Exception:  # noqa: BLE001 - the other signals alone then
        return None


#: How many of the latest SQL executions ``wait_for_spark_jobs`` looks at: actions that threads
#: of the driver run at the same time.
_RECENT_EXECUTIONS = 4


def _sql_execution_running(store: Any) -> bool:
    count = store.executionsCount()
    recent = store.executionsList(max(0, count - _RECENT_EXECUTIONS), min(count, _RECENT_EXECUTIONS))
    return any(recent.apply(i).completionTime().isEmpty() for i in range(recent.size()))


class _Held(NamedTuple):
    spark: SparkSession
    manager: Any  # Spark's CacheManager (JVM)
    jdf: Any  # the result's Dataset (JVM)
    builder: Any  # its cache's CachedRDDBuilder (JVM)
    refs: list[Any]  # the blocks it reads
    on_read: Callable[[], Any] | None


class _HeldOutputs:
    """The blocks of result DataFrames whose cache Spark has not filled yet.

    A watcher thread, which runs while any are held, checks every ``POLL_S`` whether each
    DataFrame's cache holds all its partitions, or whether it is no longer cached at all (an
    ``unpersist()`` of it, or ``spark.catalog.clearCache()``); either way, its blocks go.
    """

    POLL_S = 0.2

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, _Held] = {}
        self._next_key = 0
        self._watcher: threading.Thread | None = None

    def hold(self, df: DataFrame, refs: list[Any], on_read: Callable[[], Any] | None = None) -> None:
        manager = df.sparkSession._jsparkSession.sharedState().cacheManager()
        builder = manager.lookupCachedData(df._jdf).get().cachedRepresentation().cacheBuilder()
        with self._lock:
            key = self._next_key
            self._next_key += 1
            self._held[key] = _Held(df.sparkSession, manager, df._jdf, builder, refs, on_read)
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="actorflow output blocks", daemon=True)
                self._watcher.start()

    def release(self, key: int) -> None:
        with self._lock:
            entry = self._held.pop(key, None)
        if entry is None or entry.on_read is None:
            return
        spark, on_read = entry.spark, entry.on_read
        del entry  # its blocks go now, whatever the hook waits for
        # In a thread of its own: the wait may last as long as the user's action, and the
        # watcher goes on freeing the blocks of other results meanwhile.
        threading.Thread(target=_when_spark_is_idle, args=(spark, on_read), name="actorflow on_read", daemon=True).start()

    def release_all(self) -> None:
        with self._lock:
            self._held.clear()

    def _watch(self) -> None:
        warned: set[str] = set()
        while True:
            time.sleep(self.POLL_S)
            with self._lock:
                if not self._held:
                    self._watcher = None
                    return
                entries = list(self._held.items())
            try:
                read = [key for key, held in entries if self._read(held)]
                entries.clear()  # a release frees its blocks: nothing here may hold them
                for key in read:
                    self.release(key)
            except Exception as error:  # noqa: BLE001 - the watcher must outlive one bad round
                # Were the thread to end, no result's blocks would ever be freed again.
                cause = f"{type(error).__name__}: {error}"
                if cause not in warned:
                    warned.add(cause)
                    _log.warning("freeing the Ray blocks of results that Spark has read failed (%s); "
                                 "they stay held, and the watcher tries again every %s s", cause, self.POLL_S)
            finally:
                entries.clear()

    @staticmethod
    def _read(held: _Held) -> bool:
        """True once the cache holds every partition, or holds none of them any more."""
        try:
            return bool(held.builder.isCachedColumnBuffersLoaded() or held.manager.lookupCachedData(held.jdf).isEmpty())
        except Exception:  # noqa: BLE001 - the Spark session stopped: nothing can read them now
            return True


def _when_spark_is_idle(spark: SparkSession, on_read: Callable[[], Any]) -> None:
    try:
        wait_for_spark_jobs(spark)
        on_read()
    except Exception:  # noqa: BLE001 - a hook's failure is logged, not raised in a daemon thread
        _log.exception("a hook on a result read by Spark failed")


_held_outputs = _HeldOutputs()


def release_outputs() -> None:
    """Free the Ray blocks of every result DataFrame whose cache is not filled yet; such a
    DataFrame cannot be computed afterwards. ``stop_spark()`` calls it."""
    _held_outputs.release_all()


def spark_arrow_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` as Spark's Arrow reader takes it: microsecond timestamps, 32-bit offsets."""
    fields = []
    for field in schema:
        data_type = field.type
        if pa.types.is_timestamp(data_type):
            # Spark's Arrow reader knows only microsecond timestamps; a naive one stays naive
            # (timestamp_ntz), and one with a time zone is an instant (Spark's timestamp).
            data_type = pa.timestamp("us", tz=data_type.tz and "UTC")
        elif pa.types.is_large_string(data_type):
            data_type = pa.string()
        elif pa.types.is_large_binary(data_type):
            data_type = pa.binary()
        fields.append(field.with_type(data_type))
    return pa.schema(fields)


def _conform_to_ipc(target: pa.Schema, fill_missing: bool, *tables: pa.Table | None) -> tuple[bytes, int]:
    # Runs as a Ray task next to the blocks. Python bytes are stored in Ray's cross-language
    # format, which the JVM executors can read.
    conformed = [conform_table(table, target, fill_missing=fill_missing) for table in tables if table is not None]
    if not conformed:
        return b"", 0
    blob = ipc_bytes(conformed)
    process_pages.passed(2 * len(blob))  # the blocks read, the blob written (see _fetch_partitions)
    return blob, sum(table.num_rows for table in conformed)


@functools.cache
def _remote_conform_to_ipc() -> Any:
    import ray

    # No CPU reserved: Spark's executors may hold every CPU, and the conversion must still run.
    return ray.remote(num_cpus=0, num_returns=2)(_conform_to_ipc)


def _object_sizes(refs: list[ray.ObjectRef]) -> list[int]:
    from ray.experimental import get_object_locations

    locations = get_object_locations(refs)
    sizes = []
    for ref in refs:
        size = locations.get(ref, {}).get("object_size")
        # Unknown sizes (a task still running) count as a full partition: safe, if coarse.
        sizes.append(size if size is not None else _TARGET_PARTITION_BYTES)
    return sizes


def _contiguous_groups(sizes: list[int]) -> list[list[int]]:
    groups: list[list[int]] = []
    current: list[int] = []
    current_bytes = 0
    for index, size in enumerate(sizes):
        if current and current_bytes + size > _TARGET_PARTITION_BYTES:
            groups.append(current)
            current, current_bytes = [], 0
        current.append(index)
        current_bytes += size
    if current:
        groups.append(current)
    return groups
