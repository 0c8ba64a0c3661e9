"""How a DataFrame of an existing Spark cluster reaches the job's actors and comes back.

``python -m benchmarks.spark_handoff`` (``--quick``: 200,000 rows instead of 1,000,000) starts a
standalone Spark master and worker on 127.0.0.1, starts Ray on it with ``on_spark_cluster``, and
moves the same cached DataFrame of six columns through an actor on the Ray worker node and back
into Spark, two ways, materialising each result with Spark's ``noop`` writer:

- ``parquet``: what ``enrich()`` does on a Spark cluster. Spark writes the input to the staging
  directory, Ray tasks read one Arrow block per partition, the actor returns each block, Ray tasks
  write the blocks back as Parquet, and Spark reads them in order.
- ``map_in_arrow``: ``df.mapInArrow``; each Spark task joins the Ray cluster from its Python worker,
  sends its Arrow batches to the actor (4 in flight) and yields what comes back.

The baseline is Spark materialising the cached input alone, in the same run. The last line is one
JSON object with rows/s, the hand-off's seconds beyond that baseline, and the ratio of the two ways.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator

import pyarrow as pa
import ray

from actorflow.actors.arrow_rows import ipc_bytes
from benchmarks.report import emit

NAMESPACE = "actorflow-benchmarks"
ECHO = "spark-handoff-echo"

COLUMNS = [
    "id",
    "id % 1000 AS user_id",
    "CAST(id * 0.25 AS DOUBLE) AS amount",
    "concat('click-', id) AS click",
    "timestamp_seconds(1700000000 + id) AS ts",
    "id % 2 = 0 AS even",
]


class Echo:
    """Gives back what it gets: the work of the pipeline in between is left out on purpose."""

    def table_as_ipc(self, table: pa.Table) -> bytes:
        return ipc_bytes([table])  # what a job's output blocks are

    def batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch


def _echo_through_ray(address: str) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def handoff(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import logging

        import ray as ray_in_task

        if not ray_in_task.is_initialized():  # Spark reuses its Python workers: once per process
            ray_in_task.init(address=address, namespace=NAMESPACE, logging_level=logging.WARNING, log_to_driver=False)
        echo = ray_in_task.get_actor(ECHO, namespace=NAMESPACE)
        pending: deque = deque()
        for batch in batches:
            pending.append(echo.batch.remote(batch))
            if len(pending) >= 4:
                yield ray_in_task.get(pending.popleft())
        while pending:
            yield ray_in_task.get(pending.popleft())

    return handoff


def _timed(action: Callable[[], None]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200,000 rows instead of 1,000,000")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each way; the fastest counts")
    args = parser.parse_args(argv)
    rows = args.rows or (200_000 if args.quick else 1_000_000)

    from pyspark.sql import SparkSession

    from actorflow.spark_bridge import on_spark_cluster
    from actorflow.spark_bridge.session import JVM_OPTIONS
    from actorflow.spark_bridge.spark_cluster import WORKER_RESOURCE, read_output, write_input
    from actorflow.spark_bridge.standalone import standalone_spark_cluster
    from actorflow.spark_bridge.streams import to_arrow_schema

    with standalone_spark_cluster(cores=4, memory="4g") as standalone:
        spark = (
            SparkSession.builder.master(standalone.url).appName("actorflow-spark-handoff")
            .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.executor.memory", "2g").config("spark.sql.session.timeZone", "UTC")
            .config("spark.driver.extraJavaOptions", JVM_OPTIONS).config("spark.executor.extraJavaOptions", JVM_OPTIONS)
            .config("spark.sql.execution.arrow.maxRecordsPerBatch", "10000")
            .config("spark.ui.enabled", "false")
            .getOrCreate()
        )
        df = spark.range(0, rows, 1, args.partitions).selectExpr(*COLUMNS).cache()
        df.count()
        schema = to_arrow_schema(df.schema)
        with on_spark_cluster(spark, max_worker_nodes=1, ray_temp_root_dir=str(standalone.work / "ray"),
                              object_store_memory_worker_node=1 << 30, object_store_memory_head_node=256 << 20) as cluster:
            echo = ray.remote(Echo).options(name=ECHO, namespace=NAMESPACE, resources={WORKER_RESOURCE: 1},
                                            num_cpus=0, max_concurrency=4).remote()
            ray.get(echo.__ray_ready__.remote())

            def spark_alone() -> None:
                df.write.format("noop").mode("overwrite").save()

            parquet_stages: list[dict[str, float]] = []

            def parquet() -> None:
                t0 = time.perf_counter()
                blocks, _ = write_input(cluster, df, schema)
                t1 = time.perf_counter()
                echoed = [echo.table_as_ipc.remote(block) for block in blocks]
                ray.wait(echoed, num_returns=len(echoed))
                t2 = time.perf_counter()
                out = read_output(spark, df.schema, echoed)
                t3 = time.perf_counter()
                out.write.format("noop").mode("overwrite").save()
                t4 = time.perf_counter()
                parquet_stages.append({"spark_writes_ray_reads": t1 - t0, "actor": t2 - t1,
                                       "ray_writes": t3 - t2, "spark_reads": t4 - t3})

            handoff = _echo_through_ray(cluster.address)

            def map_in_arrow() -> None:
                df.mapInArrow(handoff, df.schema).write.format("noop").mode("overwrite").save()

            ways = {"spark_alone": spark_alone, "parquet": parquet, "map_in_arrow": map_in_arrow}
            seconds: dict[str, list[float]] = {name: [] for name in ways}
            map_in_arrow()  # the Python workers join Ray once; that is start-up, not hand-off
            for _ in range(args.repeats):
                for name, way in ways.items():  # interleaved, so that drift hits each alike
                    seconds[name].append(_timed(way))
                    print(f"{name:>13}: {seconds[name][-1]:.2f} s", file=sys.stderr, flush=True)
        spark.stop()

    best = {name: min(times) for name, times in seconds.items()}
    extra = {name: max(best[name] - best["spark_alone"], 1e-9) for name in ("parquet", "map_in_arrow")}
    emit("spark_handoff", {
        "rows": rows,
        "partitions": args.partitions,
        "spark_alone_rps": round(rows / best["spark_alone"]),
        "parquet_rps": round(rows / best["parquet"]),
        "map_in_arrow_rps": round(rows / best["map_in_arrow"]),
        "parquet_handoff_s": round(extra["parquet"], 3),
        "map_in_arrow_handoff_s": round(extra["map_in_arrow"], 3),
        "map_in_arrow_vs_parquet": round(best["parquet"] / best["map_in_arrow"], 3),
        "seconds": {name: [round(t, 3) for t in times] for name, times in seconds.items()},
        "parquet_stage_s": {k: round(v, 3) for k, v in min(parquet_stages, key=lambda d: sum(d.values())).items()},
    })


if __name__ == "__main__":
    main()
