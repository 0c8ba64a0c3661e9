"""Recovery: a long job under random kills gives exactly the output of a run without failures.

The job: N clicks (1,000,000; ``--quick``: 300,000) of 2,000 users in event-time order, each
enriched by an async call (1 ms), then counted per user in 1-minute tumbling windows; parallelism
2 throughout (two enrichment instances reading the input, two window instances behind a hash
channel). Three runs of the same job, in one process:

- without checkpoints: the reference output, and ``throughput_no_checkpoints_rps``;
- with a checkpoint every 5 s and no failures: ``throughput_with_checkpoints_rps`` (the target
  is a cost of at most 10 %) and ``checkpoint_s_p50`` (trigger to the last acknowledgement);
  these two run twice each, interleaved, and the faster run of each counts;
- under chaos: a random operator instance killed every ``--every`` seconds, ``--kills`` times
  (at least 10), checkpoints every ``--interval-ms``; its output is compared with the reference
  by (user, window): ``lost``, ``duplicated``, ``unexpected`` must all be 0. ``recovery_s_*``: from
  the failure seen to the new attempt's actors running.

The last line printed is one JSON object.

    python -m benchmarks.recovery            # N = 1,000,000
    python -m benchmarks.recovery --quick    # N = 300,000
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from typing import Any

import click
import pyarrow as pa
from benchmarks.report import emit

P = 2
USERS = 2_000
BASE_MS = 1_760_000_000_000
SPAN_MS = 2 * 3600 * 1000
PART_ROWS = 50_000


def _clicks(n: int) -> list[pa.Table]:
    import numpy as np

    ids = np.arange(n, dtype=np.int64)
    table = pa.table({"click_id": ids, "user": (ids * 7919) % USERS, "ts": BASE_MS + ids * SPAN_MS // n})
    return [table.slice(i, PART_ROWS) for i in range(0, n, PART_ROWS)]


async def _enrich(row: dict[str, Any]) -> list[dict[str, Any]]:
    await asyncio.sleep(0.001)
    return [{**row, "tier": row["user"] % 3}]


def _job(tables: list[pa.Table], job: str) -> Any:
    from actorflow.cluster import from_arrow
    from actorflow.operators.windows import TumblingEventTimeWindows

    return (from_arrow(tables, parallelism=P, batch_size=1_000, timestamp_column="ts", job_name=job)
            .async_map(_enrich, capacity=200, ordered=False, name="enrich")
            .key_by("user", parallelism=P).window(TumblingEventTimeWindows.of(60_000)).count())


@click.command()
@click.option("--quick", is_flag=True, help="300,000 records instead of 1,000,000")
@click.option("--kills", default=10, show_default=True)
@click.option("--every", "every_s", default=None, type=float, help="seconds between kills (default: a tenth of a clean run)")
@click.option("--interval-ms", default=1_000, show_default=True, help="checkpoint interval of the chaos run")
@click.option("--seed", default=0, show_default=True)
def main(quick: bool, kills: int, every_s: float | None, interval_ms: int, seed: int) -> None:
    import ray

    from actorflow.cluster.chaos import ChaosMonkey, compare_outputs
    from actorflow.spark_bridge.session import ensure_ray

    n = 300_000 if quick else 1_000_000
    ensure_ray()
    tables = _clicks(n)
    _job([t.slice(0, 1_000) for t in tables[:2]], "recovery-warmup").execute(progress=False)  # worker processes, imports

    def timed(**settings: Any) -> tuple[Any, float]:
        started = time.perf_counter()
        result = _job(tables, "recovery").execute(progress=False, **settings)
        return result, time.perf_counter() - started

    with tempfile.TemporaryDirectory(prefix="actorflow-recovery-") as directory:
        # Two runs of each, interleaved, the faster counts: this machine's noise is of the order
        # of the cost measured.
        plain_times, checkpointed_times = [], []
        for _ in range(2):
            reference, seconds = timed()
            plain_times.append(seconds)
            checkpointed, seconds = timed(checkpoint_interval_ms=5_000, checkpoint_dir=directory)
            checkpointed_times.append(seconds)
        plain_s, checkpointed_s = min(plain_times), min(checkpointed_times)
        expected = reference.to_arrow()
        print(f"without checkpoints: {n:,} records in {plain_times} s, best {n / plain_s:,.0f}/s, {expected.num_rows:,} windows")
        assert checkpointed.checkpoints is not None
        clean = compare_outputs(expected, checkpointed.to_arrow(), key=["user", "window_start"])
        print(f"checkpoints every 5 s: {checkpointed_times} s, best {n / checkpointed_s:,.0f}/s, "
              f"{len(checkpointed.checkpoints['completed'])} checkpoints, exact={clean.exact}")
        every = every_s if every_s is not None else max(0.5, plain_s / (kills + 2))
        started = time.perf_counter()
        with ChaosMonkey("recovery", every_s=every, max_kills=kills, seed=seed) as monkey:
            chaotic = _job(tables, "recovery").execute(progress=False, checkpoint_interval_ms=interval_ms,
                                                        checkpoint_dir=directory, max_restarts=2 * kills + 5)
        chaos_s = time.perf_counter() - started
        report = compare_outputs(expected, chaotic.to_arrow(), key=["user", "window_start"])
        report.kills, report.restarts, report.recoveries_s = monkey.kills, chaotic.restarts, chaotic.recoveries_s
        print(f"under chaos ({every:.1f} s between kills, checkpoints every {interval_ms} ms): {chaos_s:.1f} s")
        for line in report.lines():
            print("  " + line)
    durations = [d for d in (checkpointed.checkpoints["duration_s_p50"], (chaotic.checkpoints or {}).get("duration_s_p50"))
                 if d is not None]
    recoveries = chaotic.recoveries_s or [0.0]
    summary = {
        "records": n,
        "kills": len(monkey.kills),
        "restarts": chaotic.restarts,
        "lost": report.lost,
        "duplicated": report.duplicated,
        "unexpected": report.unexpected,
        "recovery_s_p50": round(statistics.median(recoveries), 3),
        "recovery_s_max": round(max(recoveries), 3),
        "checkpoint_s_p50": round(checkpointed.checkpoints["duration_s_p50"] or 0.0, 4),
        "checkpoint_s_p50_under_chaos": round(durations[-1], 4) if durations else None,
        "checkpoints_completed": len(checkpointed.checkpoints["completed"]),
        "throughput_no_checkpoints_rps": round(n / plain_s),
        "throughput_with_checkpoints_rps": round(n / checkpointed_s),
        "checkpoint_cost": round(1 - plain_s / checkpointed_s, 3),
        "chaos_run_s": round(chaos_s, 1),
        "clean_checkpointed_run_exact": clean.exact,
    }
    ray.shutdown()
    emit("recovery", summary)


if __name__ == "__main__":
    main()
