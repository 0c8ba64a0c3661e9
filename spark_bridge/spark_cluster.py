"""Run actorflow on an existing Spark cluster: Ray on Spark's workers, data handed off as Parquet.

``on_spark_cluster(spark)`` starts a Ray cluster inside the Spark application with
``ray.util.spark.setup_ray_cluster`` (a Ray head beside the driver, Ray worker nodes as
long-running Spark tasks on the executors) and connects this process to it. ``from_spark``,
``enrich`` and ``to_spark`` then take DataFrames of that session as they are.

Data moves through Parquet files in a staging directory that Spark's executors and Ray's nodes
both see: Spark writes the input there and Ray tasks read it, one Arrow block per Spark
partition, in partition order; the job's output blocks are written there by Ray tasks and read
back by Spark, one file at a time so that the row order holds. RayDP's object-store path is not
used here: it needs Spark's executors to be Ray actors, which on a Spark cluster they are not,
and Arrow blocks put into Ray from Spark's Python workers would die with those workers.

>>> with on_spark_cluster(spark) as cluster:                       # doctest: +SKIP
...     enriched = enrich(df, lookup)
...     enriched.write.parquet("/data/enriched")
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from actorflow.actors.arrow_rows import conform_table
from actorflow.actors.upstream.ray import quiet_arrow_fallback

from .session import SparkSessionError

if TYPE_CHECKING:
    import ray
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["SparkCluster", "active_cluster", "on_spark_cluster"]

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_active: "SparkCluster | None" = None

#: A custom resource that only the Ray worker nodes on Spark's executors offer; a job's actors
#: ask for one unit each, so they run there and not beside the driver.
WORKER_RESOURCE = "actorflow_spark_worker"
_WORKER_RESOURCE_UNITS = 100_000


@dataclass
class SparkCluster:
    """A Ray cluster running inside a Spark application, and the staging directory of its data.

    ``address`` is the Ray address (``ray.init(address=...)`` from another process joins it),
    ``client_address`` its Ray Client address, ``dashboard_url`` the Ray dashboard.
    """

    spark: "SparkSession"
    address: str
    client_address: str
    staging_dir: str
    dashboard_url: str | None = None
    _owns_staging: bool = field(default=False, repr=False)
    _closed: bool = field(default=False, repr=False)
    _made: list[str] = field(default_factory=list, repr=False)

    def __enter__(self) -> "SparkCluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        """Disconnect from Ray, stop the Ray cluster on Spark and delete the staging directory.

        DataFrames that ``to_spark`` or ``enrich`` returned read their rows from the staging
        directory: write or cache what must outlive the cluster before this. Calling it again
        does nothing. The Spark session keeps running.
        """
        global _active
        import ray
        from ray.util.spark import shutdown_ray_cluster

        with _lock:
            if self._closed:
                return
            self._closed = True
            if _active is self:
                _active = None
        ray.shutdown()
        try:
            shutdown_ray_cluster()
        except Exception as error:  # noqa: BLE001 - the cluster may already be gone with Spark
            logger.warning("the Ray cluster on Spark did not stop cleanly: %r", error)
        for path in [self.staging_dir] if self._owns_staging else self._made:
            shutil.rmtree(path, ignore_errors=True)

    @property
    def actor_resources(self) -> dict[str, float]:
        """What each of a job's actors asks Ray for, to run on a worker node."""
        return {WORKER_RESOURCE: 1}

    def new_directory(self, kind: str) -> str:
        """A fresh directory under the staging directory, for one hand-off."""
        path = os.path.join(self.staging_dir, f"{kind}-{uuid.uuid4().hex[:12]}")
        os.makedirs(path)
        self._made.append(path)
        return path


def on_spark_cluster(
    spark: "SparkSession",
    *,
    max_worker_nodes: int = 1,
    num_cpus_head_node: int = 0,
    staging_dir: str | None = None,
    object_store_memory_worker_node: int | None = None,
    object_store_memory_head_node: int | None = None,
    ray_temp_root_dir: str | None = None,
    **ray_on_spark_options: Any,
) -> SparkCluster:
    """Start Ray on the workers of ``spark``'s cluster and run actorflow's jobs there.

    ``max_worker_nodes`` Ray worker nodes start as Spark tasks, each holding the cores of one
    Spark task (``spark.task.cpus``) for as long as the cluster runs; leave Spark task slots
    free for Spark's own jobs (writing the input, reading the output). The job's actors run on
    those worker nodes, not beside the driver (``num_cpus_head_node`` is for other Ray work).
    Other keyword arguments go to ``ray.util.spark.setup_ray_cluster`` as they are.

    ``staging_dir`` must be a directory that the driver, every Spark executor and every Ray node
    see at the same path (on one machine any local directory; on a cluster a shared mount). By
    default a new directory under the system's temporary directory is made, and deleted by
    ``shutdown()``; a given one is left in place, with the files of each hand-off removed.

    Use it as a context manager, or call ``shutdown()``::

        with on_spark_cluster(spark, max_worker_nodes=2) as cluster:
            enrich(df, lookup).write.parquet("/data/out")
    """
    global _active
    import ray
    from ray.util.spark import setup_ray_cluster

    master = spark.sparkContext.master or ""
    if master.startswith("ray://"):
        raise SparkSessionError(
            "on_spark_cluster() is for a Spark cluster outside Ray; this session already runs on Ray "
            "(spark_session()), so from_spark() and enrich() take its DataFrames as they are"
        )
    with _lock:
        if _active is not None:
            raise SparkSessionError(
                f"a Ray cluster already runs on Spark in this process ({_active.address}); "
                "shut it down first (cluster.shutdown())"
            )
        if ray.is_initialized():
            raise SparkSessionError(
                "this process is already connected to a Ray cluster; on_spark_cluster() starts its own, "
                "so call it before anything else starts Ray, or call ray.shutdown() first"
            )
        owns_staging = staging_dir is None
        staging = tempfile.mkdtemp(prefix="actorflow-staging-") if owns_staging else str(staging_dir)
        os.makedirs(staging, exist_ok=True)
        # The head node and the worker nodes run `ray start` from this interpreter's
        # environment; Spark's Python workers must run it too, or they lack ray and actorflow.
        from .session import _prepare_process_environment

        _prepare_process_environment()
        worker_options = dict(ray_on_spark_options.pop("worker_node_options", None) or {})
        worker_options["resources"] = {**worker_options.get("resources", {}), WORKER_RESOURCE: _WORKER_RESOURCE_UNITS}
        try:
            address, client_address = setup_ray_cluster(
                max_worker_nodes=max_worker_nodes,
                num_cpus_head_node=num_cpus_head_node,
                object_store_memory_worker_node=object_store_memory_worker_node,
                object_store_memory_head_node=object_store_memory_head_node,
                ray_temp_root_dir=ray_temp_root_dir,
                worker_node_options=worker_options,
                **ray_on_spark_options,
            )
        except Exception as error:
            if owns_staging:
                shutil.rmtree(staging, ignore_errors=True)
            raise SparkSessionError(
                f"Ray did not start on the Spark cluster at {master!r}: {error}; does every executor have "
                "ray and actorflow in the Python that spark.pyspark.python names, and a free task slot?"
            ) from error
        try:
            context = ray.init(address=address, logging_level=logging.WARNING, log_to_driver=True)
        except Exception as error:
            from ray.util.spark import shutdown_ray_cluster

            shutdown_ray_cluster()
            if owns_staging:
                shutil.rmtree(staging, ignore_errors=True)
            raise SparkSessionError(f"the Ray cluster on Spark started at {address}, but this process could not join it: {error}") from error
        dashboard = getattr(context, "dashboard_url", None)
        _active = SparkCluster(spark, address, client_address, staging,
                               f"http://{dashboard}" if dashboard else None, owns_staging)
        return _active


def active_cluster(spark: "SparkSession | None" = None) -> SparkCluster | None:
    """The running ``on_spark_cluster`` cluster (of ``spark``'s session, if given), or None."""
    cluster = _active
    if cluster is None or (spark is not None and cluster.spark._jsparkSession != spark._jsparkSession):
        return None
    return cluster


def write_input(cluster: SparkCluster, df: "DataFrame", schema: pa.Schema) -> tuple[list["ray.ObjectRef"], list[int]]:
    """Hand ``df`` to Ray: one Arrow block per non-empty Spark partition, in partition order.

    Spark writes Parquet with microsecond timestamps (not its default INT96, which Arrow would
    read as naive nanoseconds); Ray tasks read each file and give it exactly ``schema``.
    """
    import ray

    directory = cluster.new_directory("input")
    spark = df.sparkSession
    key = "spark.sql.parquet.outputTimestampType"
    before = spark.conf.get(key, None)
    spark.conf.set(key, "TIMESTAMP_MICROS")
    try:
        df.write.mode("overwrite").parquet(directory)
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)
    # part-00000-..., part-00001-...: the partition index leads each name.
    parts = sorted(name for name in os.listdir(directory) if name.startswith("part-"))
    pairs = [_remote_read_part().remote(os.path.join(directory, name), schema) for name in parts]
    counts = ray.get([count for _, count in pairs])
    blocks = [(block, n) for (block, _), n in zip(pairs, counts) if n > 0]
    return [b for b, _ in blocks], [n for _, n in blocks]


def read_output(spark: "SparkSession", struct: Any, blocks: list["ray.ObjectRef"]) -> "DataFrame":
    """A DataFrame over blocks of Arrow IPC bytes, through Parquet files in the staging directory.

    One file per block, read back one by one and unioned, so the rows keep the blocks' order
    (a single read of the directory would pack the files by size).
    """
    import ray

    cluster = active_cluster(spark)
    if cluster is None:
        raise SparkSessionError(
            f"a DataFrame of the Spark session on {spark.sparkContext.master!r} cannot be written back without "
            "Ray on that cluster; run the job inside on_spark_cluster(spark)"
        )
    directory = cluster.new_directory("output")
    paths = [os.path.join(directory, f"part-{index:05d}.parquet") for index in range(len(blocks))]
    ray.get([_remote_write_part().remote(block, path) for block, path in zip(blocks, paths)])
    frames = [spark.read.schema(struct).parquet(path) for path in paths]
    return functools.reduce(lambda left, right: left.union(right), frames)


def _read_part(path: str, schema: pa.Schema) -> tuple[pa.Table, int]:
    quiet_arrow_fallback()  # the table goes back through Ray's serializer
    table = conform_table(pq.read_table(path), schema)
    return table, table.num_rows


def _write_part(block: bytes, path: str) -> None:
    with pa.ipc.open_stream(pa.py_buffer(block)) as reader:
        pq.write_table(reader.read_all(), path)


# The hand-off tasks run on the worker nodes too: the head gives Ray no CPUs
# (``num_cpus_head_node=0``), so it keeps no idle worker processes, and a task there would wait
# for a new process each time (about 0.9 s here, against 0.08 s on a worker node).
@functools.cache
def _remote_read_part() -> Any:
    import ray

    return ray.remote(num_cpus=0, num_returns=2, resources={WORKER_RESOURCE: 1})(_read_part)


@functools.cache
def _remote_write_part() -> Any:
    import ray

    return ray.remote(num_cpus=0, resources={WORKER_RESOURCE: 1})(_write_part)
