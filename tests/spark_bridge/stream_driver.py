"""A driver of its own for a streaming query that a test kills: the event files of
``test_streaming_spark`` through enrichment and keyed windows, to Parquet.

Run as ``python -m tests.spark_bridge.stream_driver IN OUT CHECKPOINTS [MOMENT EPOCH]``. With a
moment (one of ``cluster.streaming.DRIVER_MOMENTS``), the driver ends itself with SIGKILL the
first time it reaches that moment at or after ``EPOCH``, as a crash would: no clean-up at all.
Without, it processes what the directory holds, drains the job, and prints one JSON line.
"""

from __future__ import annotations

import json
import sys

from actorflow.cluster.chaos import kill_driver_at
from actorflow.spark_bridge import from_spark, spark_session
from tests.spark_bridge.test_streaming_spark import OUT_OF_ORDERNESS_MS, SCHEMA, _pipeline
from actorflow.operators.windows import TumblingEventTimeWindows


def main() -> None:
    source, out, checkpoints = sys.argv[1:4]
    if len(sys.argv) > 4:
        kill_driver_at(sys.argv[4], int(sys.argv[5]))
    spark = spark_session()
    events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(source)
    stream = from_spark(events, timestamp_column="ts", out_of_orderness_ms=OUT_OF_ORDERNESS_MS, parallelism=2,
                        job_name="stream-driver")
    query = _pipeline(stream, TumblingEventTimeWindows.of(60_000)).write_stream(out, checkpoint_location=checkpoints)
    query.process_all_available()
    query.stop(drain=True)
    progress = [p for p in query.recent_progress if not p["between_epochs"]]
    print(json.dumps({
        "resumed_from": query.job.resumed_from,
        "epochs": [p["epoch"] for p in progress],
        "skipped": [p["epoch"] for p in progress if p["skipped"]],
        "dead_letters": sorted(r.id for r in query.dead_letters().collect()),
    }), flush=True)


if __name__ == "__main__":
    main()
