"""Batched calls: actorflow's ``enrich(batch_size=...)`` against Ray Data's ``map_batches``, and
against actorflow's per-record path, DataFrame to DataFrame, in one run and one Spark session.

The simulated model service costs 20 ms per call plus 0.05 ms per record of the call
(``asyncio.sleep``; every system here calls it from an event loop). Batches hold 256 records.

- ``batch_actorflow``: ``enrich(df, fn, batch_size=256, capacity=4, parallelism=2)``: 2
  operator actors, each with 4 batches in flight; ``fn`` gets a list of row dicts and returns a
  dict of new columns per row. Ordered output (``enrich()``'s default), which Ray Data does not
  give.
- ``batch_ray_data``: ``ray.data.from_spark`` -> ``map_batches`` of an async callable class,
  ``batch_size=256``, ``concurrency=2`` actors -> ``to_spark``. Ray Data runs up to 4 batches of
  an async UDF at once per task (``RAY_DATA_DEFAULT_ASYNC_BATCH_UDF_MAX_CONCURRENCY``), and with
  one block and one task per actor, that is 4 batches in flight per actor: the same 2 x 4 as
  actorflow, on the same number of processes. A callable class with ``concurrency=8`` actors,
  one blocking batch each, would hold as many batches but start 8 processes on 2 cores; the
  async class is the like-for-like choice. Its UDF gets an Arrow table and computes the result
  column vectorised, as a Ray Data user would write it.
- ``per_record_actorflow``: ``enrich(df, fn, capacity=100, parallelism=2)`` without batches: one
  call per record, charged 20 ms + 0.05 ms, 100 in flight per instance (``enrich()``'s default).

Each figure runs from the input DataFrame to a materialised output DataFrame, after an untimed
warm-up on 2,000 rows, and is checked row for row (each id once, with the value only a real
call returns) by the checks of :mod:`benchmarks.baselines`. The bound for the batch systems is
Little's law: 2 x 4 x 256 records per (20 + 256 x 0.05) ms.

    python -m benchmarks.batch            # N = 200,000
    python -m benchmarks.batch --quick    # N = 50,000
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import click
import pyarrow as pa
import pyarrow.compute as pc

from benchmarks.baselines import (
    _check_and_measure,
    _materialize,
    _output_schema,
    _quiet_ray_in_spark_workers,
    _summarize_input,
    make_events,
)
from benchmarks.report import emit

P = 2
BATCH_SIZE = 256
#: Batches in flight per instance (Ray Data's default for an async batch UDF).
BATCHES_IN_FLIGHT = 4
#: Requests in flight per instance on the per-record path (enrich()'s default).
PER_RECORD_CAPACITY = 100
CALL_MS = 20.0
PER_RECORD_MS = 0.05
WARMUP_ROWS = 2_000


def service_seconds(records: int) -> float:
    """What one call of ``records`` records costs the simulated model service."""
    return (CALL_MS + PER_RECORD_MS * records) / 1000.0


def bound_rps() -> float:
    """Little's law for the batch systems: batches in flight x records per batch / call time."""
    return P * BATCHES_IN_FLIGHT * BATCH_SIZE / service_seconds(BATCH_SIZE)


async def _batch_columns(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """actorflow's batch function: one call for the rows, a dict of new columns per row."""
    issued_at = time.time()
    started = time.perf_counter()
    await asyncio.sleep(service_seconds(len(rows)))
    latency_ms = (time.perf_counter() - started) * 1000.0
    return [{"result": r["id"] * 31 + 7, "latency_ms": latency_ms, "issued_at": issued_at} for r in rows]


async def _record_columns(row: dict[str, Any]) -> dict[str, Any]:
    """actorflow's per-record function: the same service, one call per record."""
    issued_at = time.time()
    started = time.perf_counter()
    await asyncio.sleep(service_seconds(1))
    return {"result": row["id"] * 31 + 7, "latency_ms": (time.perf_counter() - started) * 1000.0,
            "issued_at": issued_at}


class _RayDataBatchService:
    """Ray Data's async callable class: one call of the service per batch, columns vectorised."""

    async def __call__(self, batch: pa.Table) -> pa.Table:
        issued_at = time.time()
        started = time.perf_counter()
        await asyncio.sleep(service_seconds(batch.num_rows))
        latency_ms = (time.perf_counter() - started) * 1000.0
        n = batch.num_rows
        batch = batch.append_column("result", pc.add(pc.multiply(batch["id"], 31), 7))
        batch = batch.append_column("latency_ms", pa.array([latency_ms] * n, pa.float64()))
        batch = batch.append_column("issued_at", pa.array([issued_at] * n, pa.float64()))
        return batch


def _one_chunk(block: pa.Table) -> pa.Table:
    # RayDP's to_spark fails on a block whose string column has several chunks (see
    # benchmarks.baselines); Ray Data concatenates the 256-row outputs into blocks of many.
    return block.combine_chunks()


def actorflow_once(df: Any, *, batch: bool) -> tuple[Any, dict[str, float]]:
    from actorflow.spark_bridge import enrich

    stages: dict[str, float] = {}
    started = time.perf_counter()
    if batch:
        out = enrich(df, _batch_columns, batch_size=BATCH_SIZE, capacity=BATCHES_IN_FLIGHT, parallelism=P,
                     output_schema=_output_schema(df), progress=False)
    else:
        out = enrich(df, _record_columns, capacity=PER_RECORD_CAPACITY, parallelism=P,
                     output_schema=_output_schema(df), progress=False)
    assert not isinstance(out, tuple)  # no dead letters were asked for
    stages["job"] = time.perf_counter() - started  # from_spark, the actors, the output blocks
    out = _materialize(out)
    stages["to_spark"] = time.perf_counter() - started - stages["job"]
    return out, stages


def ray_data_once(df: Any) -> tuple[Any, dict[str, float]]:
    import ray
    from raydp.spark.dataset import release_spark_recoverable

    stages: dict[str, float] = {}
    started = time.perf_counter()
    ds = ray.data.from_spark(df, override_num_blocks=P)  # one block per actor
    stages["from_spark"] = time.perf_counter() - started
    # As in benchmarks.baselines: wait for the whole pool, one task (block) per actor.
    ds.context.wait_for_min_actors_s = 300
    ds.context.max_tasks_in_flight_per_actor = 1
    ds.context.enable_progress_bars = False
    ds = ds.map_batches(_RayDataBatchService, batch_size=BATCH_SIZE, batch_format="pyarrow", concurrency=P)
    # Without num_cpus=0 this step waits for a CPU that Spark's executor and the actors hold.
    ds = ds.map_batches(_one_chunk, batch_size=None, batch_format="pyarrow", num_cpus=0)
    ds = ds.materialize()  # to_spark() would otherwise run the pipeline twice (see baselines)
    stages["map_batches"] = time.perf_counter() - started - stages["from_spark"]
    out = _materialize(ds.to_spark(df.sparkSession))
    stages["to_spark"] = time.perf_counter() - started - stages["from_spark"] - stages["map_batches"]
    release_spark_recoverable(df)
    return out, stages


def measure(system: str, run_once: Any, df: Any) -> dict[str, Any]:
    """Warm up on a few rows, then time one run on ``df``; check both row for row."""
    small = df.limit(WARMUP_ROWS).persist()
    try:
        out, _ = run_once(small)
        _check_and_measure(out, _summarize_input(small))
        out.unpersist()
    finally:
        small.unpersist()
    expected = _summarize_input(df)
    started = time.perf_counter()
    out, stages = run_once(df)
    seconds = time.perf_counter() - started
    try:
        ids, latencies, call_phase_s = _check_and_measure(out, expected)
    finally:
        out.unpersist()
    n = len(ids)
    return {
        "system": system,
        "n": n,
        "seconds": round(seconds, 3),
        "records_per_s": round(n / seconds, 1),
        # First call issued to last call completed: the run without start-up and conversions.
        "call_phase_s": round(call_phase_s, 3),
        "call_phase_records_per_s": round(n / call_phase_s, 1),
        "stage_seconds": {k: round(v, 3) for k, v in stages.items()},
        "p50_call_ms": round(float(sorted(latencies)[len(latencies) // 2]), 2),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


@click.command()
@click.option("--quick", is_flag=True, help="N = 50,000 instead of 200,000")
@click.option("--n", "n_override", type=int, default=None, help="records per run")
def main(quick: bool, n_override: int | None) -> None:
    from actorflow.spark_bridge.session import ensure_ray, spark_session, stop_spark

    n = n_override or (50_000 if quick else 200_000)
    # Logical CPUs: P for RayDP's executor cores, P for Ray Data's actors.
    ensure_ray(num_cpus=2 * P)
    spark = spark_session("actorflow-bench-batch", num_executors=1, executor_cores=P)
    _quiet_ray_in_spark_workers(spark)
    bound = bound_rps()
    print(f"N = {n:,}, P = {P}, {BATCHES_IN_FLIGHT} batches of {BATCH_SIZE} in flight per instance, "
          f"bound {bound:,.0f} records/s, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", flush=True)
    try:
        df = make_events(spark, n)
        results = {}
        for name, run in (
            ("batch_actorflow", lambda d: actorflow_once(d, batch=True)),
            ("batch_ray_data", ray_data_once),
            ("per_record_actorflow", lambda d: actorflow_once(d, batch=False)),
        ):
            results[name] = measure(name, run, df)
            print(f"  {name}: {results[name]}", flush=True)
    finally:
        stop_spark()
    batch, ray_data, per_record = (results[k]["records_per_s"] for k in
                                   ("batch_actorflow", "batch_ray_data", "per_record_actorflow"))
    summary = {
        "n": n,
        "parallelism": P,
        "batch_size": BATCH_SIZE,
        "batches_in_flight_per_instance": BATCHES_IN_FLIGHT,
        "per_record_capacity": PER_RECORD_CAPACITY,
        "bound_rps": round(bound, 1),
        "batch_actorflow_rps": batch,
        "batch_ray_data_rps": ray_data,
        "per_record_actorflow_rps": per_record,
        "batch_actorflow_vs_ray_data": _ratio(batch, ray_data),
        "batch_actorflow_vs_per_record": _ratio(batch, per_record),
        "batch_actorflow_vs_bound": _ratio(batch, bound),
        "batch_ray_data_vs_bound": _ratio(ray_data, bound),
        "call_phase_rps": {k: v["call_phase_records_per_s"] for k, v in results.items()},
        "stage_seconds": {k: v["stage_seconds"] for k, v in results.items()},
    }
    emit("batch", summary)


if __name__ == "__main__":
    main()
