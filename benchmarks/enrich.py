"""actorflow's async I/O against Spark and Ray Data, on the same input, cores and service.

Every system calls the simulated service of :mod:`benchmarks.profiles` once per record, with C
requests in flight per instance and P = 2 instances, for three latency profiles (constant 20 ms;
lognormal, median 20 ms, p99 200 ms; skewed, 20 ms with a slow shard of users at 100 ms and one
record in 2,000 at 1.5 s) and two concurrency levels (C = 100 and C = 1000; C = 64 for skewed).
Threads sleep a call's latency with ``time.sleep``, event loops with ``fd_sleep`` (a kernel
timer on a file descriptor, as a socket's answer wakes a loop; ``async_service_sleep`` in the
JSON says which one ran). Measured in one run:

- actorflow, the async stage alone (input already in Ray's object store, so only the stage is
  timed): unordered and ordered with an ``async def``, ordered with a queue of 10 x C
  (``ordered_queued``: still C requests in flight, but finished results wait behind a slow one
  while new requests start), key-ordered (``key_ordered``: each user's records, ``id // 7``, in
  input order, others overtaking, with the same queue of 10 x C), and a blocking function on Ray
  tasks;
- actorflow, DataFrame -> DataFrame through ``enrich()`` with its defaults, unordered
  (``actorflow_end_to_end``, like Ray Data, which does not keep order) and ordered
  (``actorflow_end_to_end_ordered``; Spark's thread pool keeps order too, and buffers finished
  results without bound);
- Spark ``mapInPandas`` with a thread pool of C threads per partition, P partitions;
- Ray Data ``map_batches`` with an async callable class, P actors, C calls in flight each;
- the bound: min(P * C / mean latency, P * the requests/s of a bare asyncio loop on one core);
- the schedule: the same, with the records/s of a runtime that costs nothing on exactly these
  records in place of Little's law (``profiles.schedule_rps``): a finite run waits for its last C
  calls, and under a spread of latencies their slowest sets its end. ``unordered_vs_schedule``
  is then what the unordered stage's own costs leave of what these records allow;
- for the constant profile, the ceiling of Ray tasks themselves on this machine
  (``ray_tasks_ceiling``): P async actors that do nothing but send tasks of C blocking calls, run
  by the same thread pool as actorflow's, one task in flight each. The tasks stage cannot beat it.

Stage figures run from the first call's issue to the last call's completion; DataFrame figures
from the input DataFrame to a materialised output DataFrame, checked row by row. Before each
timed DataFrame run, the benchmark collects the driver's garbage and waits (``settled_s``) until
the CPUs have been idle for 1.5 s, so that what the run before left in motion slows no one.
Before the first, it takes the whole input through actorflow's and Spark's JVM paths five times
each, untimed (``_warm_jvm``): a new session's JVMs compile their hot code over its first jobs,
and no timed run should pay for its place in the order. A DataFrame run's fixed cost is its
``seconds`` less its ``call_phase_s``. The last line printed is one JSON object.

    python -m benchmarks.enrich            # N = 200,000
    python -m benchmarks.enrich --quick    # N = 50,000
    python -m benchmarks.enrich --profile lognormal --capacity 100    # one row of the table
"""

from __future__ import annotations

import os
import time
from typing import Any

import click
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray

from benchmarks import profiles
from benchmarks.fd_sleep import FD_SLEEP
from benchmarks.baselines import (
    _materialize,
    _measure,
    _output_schema,
    _RssSampler,
    _wait_for_idle_cpus,
    make_events,
    ray_data_async,
    spark_threadpool,
)
from benchmarks.profiles import LatencyProfile, get_profile
from benchmarks.report import emit

P = 2
#: In the ordered_queued runs: queue slots per request slot (requests in flight stay at C).
QUEUE_FACTOR = 10
# The skewed profile is measured where ordered output hurts most: few requests in flight.
DEFAULT_CAPACITIES = {"skewed": (64,)}


def _async_call(profile: LatencyProfile) -> Any:
    async def call(row: dict[str, Any]) -> list[dict[str, Any]]:
        issued_at = time.time()
        started = time.perf_counter()
        result = await profile.async_call(row["id"])
        return [{"id": row["id"], "result": result,
                 "latency_ms": (time.perf_counter() - started) * 1000.0, "issued_at": issued_at}]

    return call


def _blocking_call(profile: LatencyProfile) -> Any:
    def call(row: dict[str, Any]) -> list[dict[str, Any]]:
        issued_at = time.time()
        started = time.perf_counter()
        result = profile.blocking_call(row["id"])
        return [{"id": row["id"], "result": result,
                 "latency_ms": (time.perf_counter() - started) * 1000.0, "issued_at": issued_at}]

    return call


def _user(row: dict[str, Any]) -> int:
    """The user of a record, as the profiles' slow shard counts them (``id // 7``): the order key."""
    return int(row["id"]) // 7


def actorflow_stage(tables: list[pa.Table], profile: LatencyProfile, capacity: int, *, kind: str) -> dict[str, Any]:
    """The async stage alone: its input is already in the object store."""
    from actorflow.cluster import from_arrow

    n = sum(t.num_rows for t in tables)
    fn = _blocking_call(profile) if kind == "tasks" else _async_call(profile)
    ordered = kind.startswith("ordered")
    order: Any = "key" if kind == "key_ordered" else ordered
    stream = from_arrow(tables, parallelism=P, job_name=f"bench-{kind.replace('_', '-')}").async_map(
        fn, ordered=order, order_key=_user if kind == "key_ordered" else None, capacity=capacity, parallelism=P,
        queue_capacity=QUEUE_FACTOR * capacity if kind in ("ordered_queued", "key_ordered") else None,
    )
    with _RssSampler() as rss:
        started = time.perf_counter()
        result = stream.execute(progress=False)
        seconds = time.perf_counter() - started
    out = result.to_arrow()
    ids = out.column("id").to_numpy()
    if len(ids) != n or len(np.unique(ids)) != n or not pc.all(pc.equal(out["result"], pc.add(pc.multiply(out["id"], 31), 7))).as_py():
        raise AssertionError(f"actorflow {kind}: expected each of {n} ids once, called; got {len(ids)} rows")
    if ordered and not bool(np.all(np.diff(ids) > 0)):
        raise AssertionError(f"actorflow {kind}: output is not in input order")
    if kind == "key_ordered":
        users = ids // 7
        for user in np.unique(users):
            if not bool(np.all(np.diff(ids[users == user]) > 0)):
                raise AssertionError(f"actorflow key_ordered: user {user}'s records are out of input order")
    first = pc.min(out["issued_at"]).as_py()
    last = pc.max(pc.add(out["issued_at"], pc.divide(out["latency_ms"], 1000.0))).as_py()
    latencies = out.column("latency_ms").to_numpy()
    return {
        "system": f"actorflow_{kind}",
        "n": n,
        "stage_records_per_s": round(n / (last - first), 1),
        "job_seconds": round(seconds, 3),
        "job_records_per_s": round(n / seconds, 1),
        "p50_ms": round(float(np.percentile(latencies, 50)), 2),
        "p99_ms": round(float(np.percentile(latencies, 99)), 2),
        "peak_rss_mb": round(rss.peak_mb, 1),
    }


@ray.remote(num_cpus=0)
class _TaskSender:
    """One of the P senders of the Ray-task ceiling: no pipeline, only tasks of blocking calls."""

    async def run(self, fn: Any, ids: list[int], batch: int) -> list[dict[str, Any]]:
        from actorflow.actors.task_function import run_calls

        task = ray.remote(run_calls).options(num_cpus=0, num_returns="streaming")
        fn_ref = ray.put(fn)
        async for _ in task.remote(fn_ref, []):  # the worker process starts before the first call
            pass
        out: list[dict[str, Any]] = []
        for start in range(0, len(ids), batch):
            async for ref in task.remote(fn_ref, [{"id": i} for i in ids[start:start + batch]]):
                for _, ok, rows in await ref:
                    if not ok:
                        raise rows
                    out.extend(rows)
        return out


def ray_tasks_ceiling(n: int, profile: LatencyProfile, capacity: int) -> dict[str, Any]:
    """Records/s of bare Ray tasks of ``capacity`` blocking calls, P senders, one task each."""
    senders = [_TaskSender.remote() for _ in range(P)]  # type: ignore[attr-defined]
    try:
        shares = np.array_split(np.arange(n, dtype=np.int64), P)
        rows = [r for part in ray.get([s.run.remote(_blocking_call(profile), share.tolist(), capacity)
                                       for s, share in zip(senders, shares)]) for r in part]
    finally:
        for sender in senders:
            ray.kill(sender)
    ids = np.array([r["id"] for r in rows])
    if len(ids) != n or len(np.unique(ids)) != n or any(r["result"] != profiles.call_result(r["id"]) for r in rows):
        raise AssertionError(f"ray_tasks_ceiling: expected each of {n} ids once, called; got {len(ids)} rows")
    first = min(r["issued_at"] for r in rows)
    last = max(r["issued_at"] + r["latency_ms"] / 1000.0 for r in rows)
    latencies = np.array([r["latency_ms"] for r in rows])
    return {
        "system": "ray_tasks_ceiling",
        "n": n,
        "stage_records_per_s": round(n / (last - first), 1),
        "p50_ms": round(float(np.percentile(latencies, 50)), 2),
        "p99_ms": round(float(np.percentile(latencies, 99)), 2),
    }


def _actorflow_enrich_once(
    df: Any, profile: LatencyProfile, capacity: int, parallelism: int, *, ordered: bool
) -> tuple[Any, float, dict[str, Any]]:
    from actorflow.spark_bridge import enrich

    call = _async_call(profile)

    async def columns(row: dict[str, Any]) -> dict[str, Any]:
        [out] = await call(row)
        return {"result": out["result"], "latency_ms": out["latency_ms"], "issued_at": out["issued_at"]}

    started = time.perf_counter()
    # enrich()'s own defaults (its queue_capacity among them): what a user gets.
    out = enrich(df, columns, ordered=ordered, capacity=capacity, parallelism=parallelism,
                 output_schema=_output_schema(df), progress=False)
    assert not isinstance(out, tuple)  # no dead letters were asked for
    return _materialize(out), time.perf_counter() - started, {}


def actorflow_end_to_end(df: Any, profile: LatencyProfile, capacity: int, *, ordered: bool) -> dict[str, Any]:
    def once(df: Any, profile: LatencyProfile, capacity: int, parallelism: int) -> tuple[Any, float, dict[str, Any]]:
        return _actorflow_enrich_once(df, profile, capacity, parallelism, ordered=ordered)

    name = "actorflow_enrich_ordered" if ordered else "actorflow_enrich_unordered"
    return _measure(name, once, df, profile, capacity, P, True)


def _arrow_input(n: int, parts: int = 16) -> list[pa.Table]:
    ids = pa.array(np.arange(n, dtype=np.int64))
    table = pa.table({"id": ids, "user": pc.divide(ids, 7), "payload": pa.array([f"event-{i}" for i in range(n)])})
    step = -(-n // parts)
    return [table.slice(i, step) for i in range(0, n, step)]


WARM_ROUNDS = 5


async def _no_call(row: dict[str, Any]) -> dict[str, Any]:
    return {"warm": True}


def _warm_jvm(df: Any, rounds: int = WARM_ROUNDS) -> None:
    """Take the whole input through each system's JVM path ``rounds`` times before any is timed.

    The JVMs of a new session compile their hot code as it runs: here the fixed cost of an
    ``enrich()`` of 50,000 rows falls from about 1.9 s to about 1.0 s over its first ten or so
    DataFrame jobs (RayDP's Arrow writer, the persist and first action of its output), and a
    timed run would pay for whatever its place in the order left uncompiled. Spark's JVM compiles
    its own Arrow writer on its first large conversion, about a second. So actorflow's path
    (``enrich()`` of a function that calls nothing) and Spark's ``mapInPandas`` (the identity)
    each run ``rounds`` times, untimed, in turns, each output materialised like the timed runs'.
    Ray Data converts through RayDP's writer, which actorflow's rounds warm.
    """
    from actorflow.spark_bridge import enrich

    for _ in range(rounds):
        out = enrich(df, _no_call, parallelism=P, capacity=1000, progress=False)
        assert not isinstance(out, tuple)  # no dead letters were asked for
        _materialize(out).unpersist()
        _materialize(df.mapInPandas(lambda batches: batches, df.schema)).unpersist()
    _wait_for_idle_cpus()  # the stage runs come next, and take no wait of their own


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


@click.command()
@click.option("--quick", is_flag=True, help="N = 50,000 instead of 200,000")
@click.option("--n", "n_override", type=int, default=None, help="records per run")
@click.option("--profile", "profile_names", type=click.Choice(profiles.PROFILES), multiple=True,
              help="run only this latency profile (repeatable; default: all)")
@click.option("--capacity", "capacities", type=int, multiple=True,
              help="run only this C (repeatable; default: 100 and 1000, and 64 for the skewed profile)")
def main(quick: bool, n_override: int | None, profile_names: tuple[str, ...], capacities: tuple[int, ...]) -> None:
    from actorflow.spark_bridge.session import ensure_ray, spark_session, stop_spark

    n = n_override or (50_000 if quick else 200_000)
    # Logical CPUs: P for RayDP's executor cores (Spark's task slots), P for Ray Data's actors.
    ensure_ray(num_cpus=2 * P)
    spark = spark_session("actorflow-bench", num_executors=1, executor_cores=P)
    bare = profiles.bare_asyncio_rps()
    print(f"bare asyncio loop: {bare:,.0f} requests/s on one core; N = {n:,}, P = {P}, {os.cpu_count()} cores; "
          f"async calls sleep on {FD_SLEEP}", flush=True)
    tables = _arrow_input(n)
    df = make_events(spark, n)
    _warm_jvm(df)
    results: list[dict[str, Any]] = []
    try:
        for profile_name in profile_names or profiles.PROFILES:
            profile = get_profile(profile_name)
            mean_ms = profile.mean_latency_ms(n)
            for capacity in capacities or DEFAULT_CAPACITIES.get(profile_name, (100, 1000)):
                bound = min(P * capacity / mean_ms * 1000.0, P * bare)
                schedule = min(profiles.schedule_rps(profile, n, capacity, P), P * bare)
                row: dict[str, Any] = {"profile": profile_name, "capacity": capacity, "mean_latency_ms": round(mean_ms, 2),
                                       "bound_rps": round(bound, 1), "schedule_rps": round(schedule, 1)}
                for kind in ("unordered", "ordered", "ordered_queued", "key_ordered", "tasks"):
                    stage = actorflow_stage(tables, profile, capacity, kind=kind)
                    row[f"actorflow_{kind}_rps"] = stage["stage_records_per_s"]
                    row[f"actorflow_{kind}"] = stage
                    print(f"  {profile_name} C={capacity} actorflow {kind}: {stage}", flush=True)
                if profile.name == "constant":
                    # Under a spread of latencies a task lasts as long as its slowest call, so the
                    # ceiling is measured where the tasks target is set: constant latency.
                    ceiling = ray_tasks_ceiling(n, profile, capacity)
                    row["ray_tasks_ceiling_rps"] = ceiling["stage_records_per_s"]
                    row["ray_tasks_ceiling"] = ceiling
                    print(f"  {profile_name} C={capacity} ray tasks ceiling: {ceiling}", flush=True)
                for name, run in (("actorflow_end_to_end", lambda: actorflow_end_to_end(df, profile, capacity, ordered=False)),
                                  ("actorflow_end_to_end_ordered",
                                   lambda: actorflow_end_to_end(df, profile, capacity, ordered=True)),
                                  ("spark_threadpool", lambda: spark_threadpool(df, profile, capacity, P)),
                                  ("ray_data", lambda: ray_data_async(df, profile, capacity, P))):
                    figures = run()
                    row[f"{name}_rps"] = figures["records_per_s"]
                    row[f"{name}_stage_rps"] = figures["call_phase_records_per_s"]
                    row[name] = figures
                    print(f"  {profile_name} C={capacity} {name}: {figures}", flush=True)
                row["ratios"] = {
                    "unordered_vs_bound": _ratio(row["actorflow_unordered_rps"], bound),
                    "unordered_vs_schedule": _ratio(row["actorflow_unordered_rps"], schedule),
                    "ordered_vs_bound": _ratio(row["actorflow_ordered_rps"], bound),
                    "ordered_queued_vs_bound": _ratio(row["actorflow_ordered_queued_rps"], bound),
                    "key_ordered_vs_unordered": _ratio(row["actorflow_key_ordered_rps"], row["actorflow_unordered_rps"]),
                    "key_ordered_vs_ordered": _ratio(row["actorflow_key_ordered_rps"], row["actorflow_ordered_rps"]),
                    "tasks_vs_bound": _ratio(row["actorflow_tasks_rps"], bound),
                    "ray_tasks_ceiling_vs_bound": _ratio(row.get("ray_tasks_ceiling_rps"), bound),
                    "tasks_vs_ray_tasks_ceiling": _ratio(row["actorflow_tasks_rps"], row.get("ray_tasks_ceiling_rps")),
                    "end_to_end_vs_spark": _ratio(row["actorflow_end_to_end_rps"], row["spark_threadpool_rps"]),
                    "end_to_end_vs_ray_data": _ratio(row["actorflow_end_to_end_rps"], row["ray_data_rps"]),
                    "end_to_end_ordered_vs_spark": _ratio(row["actorflow_end_to_end_ordered_rps"], row["spark_threadpool_rps"]),
                    "end_to_end_ordered_vs_unordered": _ratio(row["actorflow_end_to_end_ordered_rps"],
                                                              row["actorflow_end_to_end_rps"]),
                }
                results.append(row)
                _print_row(row)
    finally:
        stop_spark()

    def pick(profile_name: str, capacity: int) -> dict[str, Any]:
        # A run limited by --profile/--capacity may not have this row: its figures are then null.
        return next((r for r in results if r["profile"] == profile_name and r["capacity"] == capacity), {})

    constant, lognormal, skewed = pick("constant", 100), pick("lognormal", 100), pick("skewed", 64)
    summary = {
        "n": n,
        "parallelism": P,
        "bare_asyncio_rps": round(bare, 1),
        "async_service_sleep": FD_SLEEP,
        "bound_rps": constant.get("bound_rps"),
        "actorflow_unordered_rps": constant.get("actorflow_unordered_rps"),
        "actorflow_ordered_rps": constant.get("actorflow_ordered_rps"),
        "actorflow_ordered_queued_rps": constant.get("actorflow_ordered_queued_rps"),
        "actorflow_tasks_rps": constant.get("actorflow_tasks_rps"),
        "ray_tasks_ceiling_rps": constant.get("ray_tasks_ceiling_rps"),
        "actorflow_end_to_end_rps": lognormal.get("actorflow_end_to_end_rps"),
        "actorflow_end_to_end_ordered_rps": lognormal.get("actorflow_end_to_end_ordered_rps"),
        "spark_threadpool_rps": lognormal.get("spark_threadpool_rps"),
        "ray_data_rps": lognormal.get("ray_data_rps"),
        "skewed_end_to_end_rps": skewed.get("actorflow_end_to_end_rps"),
        "skewed_end_to_end_ordered_rps": skewed.get("actorflow_end_to_end_ordered_rps"),
        "skewed_spark_threadpool_rps": skewed.get("spark_threadpool_rps"),
        "skewed_key_ordered_vs_unordered": _ratio(skewed.get("actorflow_key_ordered_rps"),
                                                  skewed.get("actorflow_unordered_rps")),
        "skewed_key_ordered_vs_ordered": _ratio(skewed.get("actorflow_key_ordered_rps"), skewed.get("actorflow_ordered_rps")),
        "skewed_ordered_vs_unordered": _ratio(skewed.get("actorflow_end_to_end_ordered_rps"),
                                              skewed.get("actorflow_end_to_end_rps")),
        "profiles": [
            {k: v for k, v in r.items() if not isinstance(v, dict) or k == "ratios"} for r in results
        ],
    }
    emit("enrich", summary)


def _print_row(row: dict[str, Any]) -> None:
    r = row["ratios"]
    ceiling = f"; Ray-task ceiling {r['ray_tasks_ceiling_vs_bound']}x" if r["ray_tasks_ceiling_vs_bound"] else ""
    print(
        f"{row['profile']:>9} C={row['capacity']:<5} bound {row['bound_rps']:>9,.0f}/s | stage: unordered "
        f"{row['actorflow_unordered_rps']:>8,.0f} ({r['unordered_vs_bound']}x; {r['unordered_vs_schedule']}x schedule) ordered {row['actorflow_ordered_rps']:>8,.0f} "
        f"({r['ordered_vs_bound']}x) queued {row['actorflow_ordered_queued_rps']:>8,.0f} "
        f"({r['ordered_queued_vs_bound']}x) tasks {row['actorflow_tasks_rps']:>8,.0f} ({r['tasks_vs_bound']}x{ceiling}) | DataFrame: "
        f"actorflow {row['actorflow_end_to_end_rps']:>8,.0f} spark {row['spark_threadpool_rps']:>8,.0f} "
        f"ray data {row['ray_data_rps']:>8,.0f} ({r['end_to_end_vs_spark']}x spark, {r['end_to_end_vs_ray_data']}x ray data)",
        flush=True,
    )


if __name__ == "__main__":
    main()
