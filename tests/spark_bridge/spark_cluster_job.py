"""A driver of its own: enrich() on a standalone Spark cluster through on_spark_cluster().

Run by test_spark_cluster.py as ``python -m tests.spark_bridge.spark_cluster_job MASTER RAY_TEMP``;
prints one JSON line with what it saw.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import ray
from pyspark.sql import SparkSession

from actorflow.spark_bridge import enrich, on_spark_cluster
from actorflow.spark_bridge.spark_cluster import WORKER_RESOURCE
from actorflow.spark_bridge.session import JVM_OPTIONS

ROWS = 3_000

COLUMNS = [
    "id",
    "IF(id % 7 = 0, NULL, concat('user-', id, ' ☃')) AS `odd name`",
    "CAST(id * 1.5 AS DECIMAL(12,3)) AS amount",
    "timestamp_seconds(1700000000 + id) AS ts",
    "CAST(timestamp_seconds(1700000000 + id) AS TIMESTAMP_NTZ) AS ts_ntz",
    "date_add(DATE'2024-01-01', CAST(id % 400 AS INT)) AS day",
    "IF(id % 11 = 0, NULL, array(CAST(id AS STRING), 'x')) AS tags",
    "map('k', CAST(id AS INT)) AS attrs",
    "named_struct('x', id * 0.5, 'y', IF(id % 5 = 0, NULL, -id * 1.0)) AS point",
    "unhex(hex(id)) AS raw",
]


async def score(row: dict) -> dict:
    await asyncio.sleep(0)
    name = row["odd name"]
    return {"score": row["id"] * 2 + (len(name) if name is not None else -1),
            "ray_node": ray.get_runtime_context().get_node_id()}


def main(master: str, ray_temp: str) -> None:
    spark = (
        SparkSession.builder.master(master).appName("actorflow-on-spark-cluster")
        .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.executor.memory", "1g").config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", JVM_OPTIONS).config("spark.executor.extraJavaOptions", JVM_OPTIONS)
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    df = spark.range(0, ROWS, 1, 4).selectExpr(*COLUMNS)
    expected = [row.asDict() for row in df.collect()]
    with on_spark_cluster(spark, max_worker_nodes=1, ray_temp_root_dir=ray_temp,
                          object_store_memory_worker_node=256 << 20, object_store_memory_head_node=256 << 20) as cluster:
        nodes = [n for n in ray.nodes() if n["Alive"]]
        # The driver may attach to any raylet on its IP, so nodes are told apart by what they offer.
        head = [n["NodeID"] for n in nodes if "node:__internal_head__" in n["Resources"]]
        spark_workers = [n["NodeID"] for n in nodes if WORKER_RESOURCE in n["Resources"]]
        out = enrich(df, score, parallelism=2, progress=False)
        got = [row.asDict() for row in out.collect()]
        types = {f.name: f.dataType.simpleString() for f in out.schema.fields}
        staging = cluster.staging_dir
    mismatches = [i for i, (e, g) in enumerate(zip(expected, got))
                  if {**e, "score": e["id"] * 2 + (len(e["odd name"]) if e["odd name"] is not None else -1)}
                  != {k: v for k, v in g.items() if k != "ray_node"}]
    print(json.dumps({
        "rows_in": len(expected),
        "rows_out": len(got),
        "mismatches": mismatches[:10],
        "input_types": {f.name: f.dataType.simpleString() for f in df.schema.fields},
        "output_types": types,
        "ray_nodes": len(nodes),
        "head_nodes": head,
        "spark_worker_nodes": spark_workers,
        "row_nodes": sorted({g["ray_node"] for g in got}),
        "ray_after_shutdown": ray.is_initialized(),
        "staging_left": os.path.exists(staging),
        "spark_still_runs": spark.range(5).count() == 5,
    }), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:3])
