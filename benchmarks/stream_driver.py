"""A driver of its own for ``benchmarks.streaming``'s driver kills: the windows query of the
benchmark over the files in SOURCE, to Parquet under OUT, checkpointed under CHECKPOINTS.

    python -m benchmarks.stream_driver SOURCE OUT CHECKPOINTS [MOMENT EPOCH]

With a moment (one of ``cluster.streaming.DRIVER_MOMENTS``), the driver ends itself with SIGKILL
the first time it reaches that moment at or after ``EPOCH``, as a crash would: no clean-up at all.
Without, or if it never gets there, it processes every file, stops with a final checkpoint, and
prints one JSON line: the epochs it ran and those it found already done.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    import actorflow as af
    from actorflow.cluster.chaos import kill_driver_at
    from benchmarks.streaming import _windows_actorflow

    source, out, checkpoints = sys.argv[1:4]
    if len(sys.argv) > 4:
        kill_driver_at(sys.argv[4], int(sys.argv[5]))
    spark = af.spark_session()
    query = _windows_actorflow(spark, source, out, checkpoints, "af-driver-kills")
    query.process_all_available()
    query.stop()
    progress = [p for p in query.recent_progress if not p["between_epochs"]]
    print(json.dumps({"resumed_from": query.job.resumed_from, "epochs": [p["epoch"] for p in progress],
                      "skipped": [p["epoch"] for p in progress if p["skipped"]]}), flush=True)


if __name__ == "__main__":
    main()
