"""A user's script in a project with its own ``operators`` and ``cluster`` packages.

It enriches a Spark DataFrame with a function that uses the user's ``operators``, runs a keyed
window pipeline, and prints one line, RESULT and a JSON object: the results, and whose ``operators`` and ``cluster`` the
driver and the actors imported.
"""

import importlib
import json
import sys

import actorflow as af

#: The user's own packages, named as actorflow's rings are: importing them by these names is the point.
USERS_PACKAGES = ("operators", "cluster")


def users_packages():
    """The user's ``operators`` and ``cluster``, as this process finds them."""
    return tuple(importlib.import_module(name) for name in USERS_PACKAGES)


def enrich_row(row):
    users_operators, users_cluster = users_packages()
    return {"doubled": users_operators.double(row["id"]), "where": f"{users_operators.WHOSE}/{users_cluster.WHOSE}"}


def main() -> None:
    spark = af.spark_session()
    enriched = af.enrich(spark.range(200), enrich_row, capacity=8, progress=False)
    rows = enriched.orderBy("id").collect()
    clicks = spark.createDataFrame(
        [(f"u{i % 3}", i, i * 1000) for i in range(60)], "user string, amount long, ts_ms long"
    ).selectExpr("user", "amount", "timestamp_millis(ts_ms) AS ts")
    windows = (
        af.from_spark(clicks, timestamp_column="ts", parallelism=2)
        .key_by("user")
        .window(af.windows.TumblingEventTimeWindows.of(size_ms=10_000))
        .aggregate(af.windows.Aggregations(n=af.windows.Count(), total=af.windows.Sum("amount")))
        .to_spark()
    )
    counted = sorted((r["user"], r["n"], r["total"]) for r in windows.collect())
    print("RESULT " + json.dumps({
        "doubled_ok": all(r["doubled"] == 2 * r["id"] for r in rows) and len(rows) == 200,
        "actor_imports": sorted({r["where"] for r in rows}),
        "driver_imports": [package.WHOSE for package in users_packages()],
        "actorflow_from": af.__file__,
        "windows": counted,
        "python": sys.executable,
    }))
    af.stop_spark()


if __name__ == "__main__":
    main()
