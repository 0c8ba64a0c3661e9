"""A streaming pipeline for ``actorflow run``: the Parquet files in ``$ACTORFLOW_TEST_STREAM_INPUT``,
each click tagged, as they arrive; every 500th click (from the 7th) fails, a dead letter."""

from __future__ import annotations

import os

import actorflow as af


FAILS = 500


async def tag(row):
    if row["id"] % FAILS == 7:
        raise LookupError(f"no click {row['id']}")
    return [{"id": row["id"], "ts": row["ts"], "tag": f"t{row['id']}"}]


def pipeline():
    spark = af.spark_session()
    events = spark.readStream.schema("id long, user long, amount long, ts timestamp").parquet(
        os.environ["ACTORFLOW_TEST_STREAM_INPUT"])
    stream = af.from_spark(events, timestamp_column="ts", parallelism=1, job_name="cli-stream")
    return stream.async_map(tag, on_error="dead_letter")
