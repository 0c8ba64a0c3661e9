"""A driver of its own: Spark on Ray over a cluster of one node or of three (a head and two
workers, ``ray.cluster_utils.Cluster``), running enrichment and keyed windows from a DataFrame
and a Structured Streaming query through the job; on three nodes also the loss of a node that
holds input blocks and the death of a node mid-job.

Run by test_nodes.py as ``python -m tests.cluster.nodes_spark_job NODES WORKDIR``; prints one
JSON line with what it saw. A process holds one SparkContext, and the tests' own is RayDP's on
the session's Ray, hence a process for each cluster.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import time
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import ray
from ray.cluster_utils import Cluster

ROWS = 40_000
USERS = 50
BASE_US = 1_760_000_000_000_000


def _digest(rows: list[tuple]) -> str:
    return hashlib.sha256(repr(sorted(rows)).encode()).hexdigest()


async def _score(row: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(0.001)
    return {"score": row["id"] * 3 + 1, "node": ray.get_runtime_context().get_node_id()}


async def _tag(row: dict[str, Any]) -> list[dict[str, Any]]:
    await asyncio.sleep(0)
    return [{**row, "node": ray.get_runtime_context().get_node_id()}]


def _clicks(spark: Any) -> Any:
    # Rows of 120 bytes and more: blocks big enough to live in the object stores, not inline.
    return spark.range(0, ROWS, 1, 8).selectExpr(
        "id", f"id % {USERS} AS user", f"timestamp_micros({BASE_US} + id * 100000) AS ts", "repeat('x', 100) AS pad")


def _write_files(directory: str, files: int) -> None:
    os.makedirs(directory)
    per_file = ROWS // files
    for k in range(files):
        ids = range(k * per_file, (k + 1) * per_file)
        path = os.path.join(directory, f"events-{k:03d}.parquet")
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "user": pa.array([i % USERS for i in ids], pa.int64()),
                                 "ts": pa.array([BASE_US + i * 100_000 for i in ids], pa.timestamp("us", tz="UTC"))}),
                       path)
        os.utime(path, (1_700_000_000 + k, 1_700_000_000 + k))  # the file source reads them in this order


def _window_rows(df: Any) -> list[tuple]:
    return [(r["user"], str(r["window_start"]), r["count"]) for r in df.collect()]


def _lost_blocks_come_back(spark: Any, cluster: Cluster) -> dict[str, Any]:
    """Snapshot a DataFrame into blocks spread over the nodes, kill a worker node that holds
    some (its raylet, with its object store), and read every block: Ray rebuilds the lost ones
    from Spark's cache by running their fetch again."""
    from actorflow.spark_bridge.arrow_io import dataframe_to_blocks, release_dataframe

    df = _clicks(spark)
    blocks = dataframe_to_blocks(df)
    refs = [ref for ref, _ in blocks]
    ray.wait(refs, num_returns=len(refs), fetch_local=False)
    spared = {ray.get_runtime_context().get_node_id()} | {
        n["NodeID"] for n in ray.nodes() if "node:__internal_head__" in n["Resources"]}
    where = ray.experimental.get_object_locations(refs)
    on_node: Counter = Counter(node for ref in refs for node in where[ref]["node_ids"] if node not in spared)
    victim = on_node.most_common(1)[0][0]
    (node,) = [n for n in cluster.worker_nodes if n.node_id == victim]
    cluster.remove_node(node, allow_graceful=False)
    tables = ray.get(refs, timeout=120)
    rows = [(r["id"], r["user"]) for t in tables for r in t.select(["id", "user"]).to_pylist()]
    release_dataframe(df)
    # The dead node's place taken by a new one, for the chaos run.
    cluster.add_node(num_cpus=2, resources={"slot": 2}, object_store_memory=300 << 20)
    cluster.wait_for_nodes()
    return {"blocks": len(refs), "blocks_on_killed_node": on_node[victim],
            "rows_read_after_the_kill": rows == [(i, i % USERS) for i in range(ROWS)]}


def _node_kill_mid_job(spark: Any, workdir: str) -> dict[str, Any]:
    from actorflow.cluster.chaos import ChaosMonkey
    from actorflow.spark_bridge import enrich

    job = "spark-node-kill"
    with ChaosMonkey(job, every_s=2.0, max_kills=1, first_after_s=2.0, nodes=True, seed=3) as monkey:
        out = enrich(_clicks(spark).drop("pad"), _score, parallelism=4, capacity=10, progress=False, job_name=job,
                     checkpoint_interval_ms=300, checkpoint_dir=os.path.join(workdir, "chaos-checkpoints"))
        rows = [(r["id"], r["score"]) for r in out.collect()]
    return {"node_kills": len(monkey.node_kills), "failed_strikes": [str(f) for f in monkey.failed_strikes],
            "rows": len(rows), "distinct": len(set(rows)),
            "exact": sorted(rows) == [(i, i * 3 + 1) for i in range(ROWS)]}


def main(nodes: int, workdir: str) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {"slot": 2, "head": 1}, "object_store_memory": 300 << 20,
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
                           "health_check_initial_delay_ms": 0},
    })
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=2, resources={"slot": 2}, object_store_memory=300 << 20)
    cluster.wait_for_nodes()

    from actorflow.operators.windows import TumblingEventTimeWindows
    from actorflow.spark_bridge import enrich, from_spark, spark_session, stop_spark
    from actorflow.spark_bridge.session import ensure_ray

    ensure_ray(cluster.address)
    # Spark's master and executor on the head node, which outlives the others.
    spark = spark_session(num_executors=1, executor_cores=1, executor_memory="1g", configs={
        "spark.ray.raydp_spark_master.actor.resource.head": "0.01",
        "spark.ray.raydp_spark_executor.actor.resource.head": "0.01"})
    seen: dict[str, Any] = {"nodes": sum(1 for n in ray.nodes() if n["Alive"]), "phases_s": {}}
    started = time.monotonic()

    def done(phase: str) -> None:  # on stderr as each part ends: where a slow run spent its time
        seen["phases_s"][phase] = round(time.monotonic() - started, 1)
        print(f"{phase} done at {seen['phases_s'][phase]} s", file=sys.stderr, flush=True)

    done("spark")
    try:
        enriched = enrich(_clicks(spark), _score, parallelism=4, progress=False).collect()
        seen["enrich"] = _digest([(r["id"], r["user"], r["score"]) for r in enriched])
        seen["enrich_exact"] = sorted((r["id"], r["score"]) for r in enriched) == [(i, i * 3 + 1) for i in range(ROWS)]
        seen["enrich_nodes"] = len({r["node"] for r in enriched})
        done("enrich")

        window = TumblingEventTimeWindows.of(60_000)
        windows = (from_spark(_clicks(spark), timestamp_column="ts", parallelism=2).async_map(_tag, capacity=20)
                   .key_by("user", parallelism=3).window(window).count().to_spark(progress=False))
        seen["windows"] = _digest(_window_rows(windows))
        seen["windows_counted"] = sum(r[2] for r in _window_rows(windows))
        done("windows")

        source = os.path.join(workdir, "in")
        _write_files(source, 4)
        events = spark.readStream.schema("id long, user long, ts timestamp").option("maxFilesPerTrigger", 1).parquet(source)
        query = (from_spark(events, timestamp_column="ts", parallelism=2).async_map(_tag, capacity=20)
                 .key_by("user", parallelism=3).window(window).count()
                 .write_stream(os.path.join(workdir, "out"), checkpoint_location=os.path.join(workdir, "chk")))
        query.process_all_available()
        query.stop(drain=True)
        streamed = spark.read.parquet(os.path.join(workdir, "out"))
        seen["stream"] = _digest(_window_rows(streamed))
        done("stream")

        if nodes > 1:
            seen["lineage"] = _lost_blocks_come_back(spark, cluster)
            done("lineage")
            seen["chaos"] = _node_kill_mid_job(spark, workdir)
            done("chaos")
    finally:
        stop_spark()
        ray.shutdown()
        cluster.shutdown()
    print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
