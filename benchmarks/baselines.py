"""The competitors of actorflow's async I/O: what a Spark or Ray Data user writes today.

Each baseline takes a Spark DataFrame of ``N`` rows ``(id: long, ts: timestamp, user: long,
payload: string)`` with distinct ids, calls the simulated service of :mod:`benchmarks.profiles`
once per record with ``capacity`` (C) requests in flight per instance and ``parallelism`` (P)
instances, and materialises the enriched Spark DataFrame: the input plus ``result: long`` (what
the call returned), ``latency_ms: double`` (from issuing that call to its completion, measured
where the call runs) and ``issued_at: double`` (when the call was issued, epoch seconds).

- :func:`spark_threadpool`: ``df.repartition(P).mapInPandas(fn)``, where ``fn`` keeps a
  ``ThreadPoolExecutor`` of ``C`` threads busy with ``blocking_call``.
- :func:`ray_data_async`: ``ray.data.from_spark`` -> ``map_batches`` with an async callable class
  on ``P`` actors, each bounded to ``C`` calls in flight by a semaphore -> ``Dataset.to_spark``.

Both return the same dict (see :func:`_result`). What is timed runs from the input DataFrame to a
materialised output DataFrame (``persist`` + a write to Spark's ``noop`` sink). Before it, an
untimed warm-up runs the same pipeline on a few rows, so that one-off costs (forking Spark's Python
workers, their first ``ray.init``, the JVMs' JIT) are not charged to one run only. After it, checks
run on that same persisted output, so they prove that the timed run itself was complete: ``N``
rows, the input's ids each exactly once, and for every row the value that only a real call
returns. A failed check raises :class:`BaselineCheckError`.

From the repository root::

    python -m benchmarks.baselines                      # N=20,000, constant, C=100, P=2
    python -m benchmarks.baselines --n 50000 --profile constant --profile lognormal \\
        --capacity 100 --capacity 1000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd
import pyarrow as pa

from benchmarks import profiles
from benchmarks.profiles import LatencyProfile, call_result, get_profile

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["BaselineCheckError", "make_events", "spark_threadpool", "ray_data_async"]

_WARMUP_ROWS = 2_000


class BaselineCheckError(RuntimeError):
    """A baseline's output is not one called row per input row: the run does not count."""


# -- input ----------------------------------------------------------------------------------------


def make_events(spark: SparkSession, n: int, *, num_users: int = 10_000) -> DataFrame:
    """A cached DataFrame of ``n`` events ``(id, ts, user, payload)`` with ids ``0 .. n-1``.

    It is cached and counted here, so that no baseline pays for generating its input.

    Example::

        make_events(spark, 3).collect()[0]
        # Row(id=0, ts=datetime(2024, 1, 1, 0, 0), user=0, payload='event-0-xxxx...')
    """
    from pyspark.sql import functions as F

    if n <= 0:
        raise ValueError(f"n must be > 0, got {n}")
    df = spark.range(n).select(
        F.col("id"),
        # One event per millisecond from 2024-01-01 00:00:00 UTC.
        F.timestamp_millis(F.col("id") + F.lit(1_704_067_200_000)).alias("ts"),
        (F.col("id") * 7919 % num_users).alias("user"),
        F.concat(F.lit("event-"), F.col("id").cast("string"), F.lit("-" + "x" * 40)).alias(
            "payload"
        ),
    )
    df = df.persist()
    df.count()
    return df


@dataclass(frozen=True)
class _InputSummary:
    rows: int
    id_sum: int


def _summarize_input(df: DataFrame) -> _InputSummary:
    from pyspark.sql import functions as F

    missing = {"id", "ts", "user", "payload"} - set(df.columns)
    if missing:
        raise ValueError(
            f"input must have columns id, ts, user, payload; got {df.columns} "
            f"(missing {sorted(missing)})"
        )
    row = df.agg(
        F.count(F.lit(1)).alias("rows"),
        F.countDistinct("id").alias("ids"),
        F.sum("id").alias("id_sum"),
    ).collect()[0]
    if row["rows"] == 0:
        raise ValueError("input must have at least one row, got 0")
    if row["ids"] != row["rows"]:
        raise ValueError(
            f"input ids must be distinct, so that each output row names its record; got "
            f"{row['ids']} distinct ids in {row['rows']} rows"
        )
    return _InputSummary(rows=int(row["rows"]), id_sum=int(row["id_sum"]))


# -- measurement ----------------------------------------------------------------------------------


class _RssSampler:
    """Samples the summed RSS of this process and all its descendants every ``interval_s``.

    In the embedded mode those descendants are everything a run uses: Ray's GCS, raylet and
    workers (so Ray Data's actors), RayDP's JVMs and the Spark Python workers they fork. Reading
    the RSS of a few dozen processes costs well under a millisecond, but finding them reads the
    parent of every process of the machine: with Ray and Spark running, a sample took 9.6 ms of
    CPU (24 ms of wall time) here, about 4 % of a core at the default interval, taken from every
    system it samples alike. A sum of RSS counts pages that processes share (the object
    store's shared memory, forked workers) once per process: it overstates the total, in the same
    way for every baseline.
    """

    def __init__(self, interval_s: float = 0.25) -> None:
        import psutil

        self._psutil = psutil
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self.baseline_mb = self._sample_mb()
        self.peak_mb = self.baseline_mb

    def _sample_mb(self) -> float:
        psutil = self._psutil
        me = psutil.Process()
        total = 0
        for proc in [me, *me.children(recursive=True)]:
            try:
                total += proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue  # a worker that exited between listing and reading
        return total / 2**20

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.peak_mb = max(self.peak_mb, self._sample_mb())

    def __enter__(self) -> _RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_mb = max(self.peak_mb, self._sample_mb())


def _materialize(out: DataFrame) -> DataFrame:
    """Run the whole plan once and keep its rows: persist, then write to the ``noop`` sink.

    ``noop`` executes every partition and discards the rows, so nothing goes to disk; the persist
    keeps them for the checks, which then read the cache instead of calling the service again.
    """
    out = out.persist()
    out.write.format("noop").mode("overwrite").save()
    return out


def _check_and_measure(
    out: DataFrame, expected: _InputSummary
) -> tuple[np.ndarray, np.ndarray, float]:
    """The ids and measured latencies of the output rows, and the seconds from the first call's
    issue to the last call's completion; raise if a record is missing, doubled or was never
    really called."""
    from pyspark.sql import functions as F

    assert call_result(5) == 5 * 31 + 7, "call_result changed; update the SQL check below"
    row = out.agg(
        F.count(F.lit(1)).alias("rows"),
        F.countDistinct("id").alias("ids"),
        F.sum("id").alias("id_sum"),
        # call_result(id) = id * 31 + 7: only a real call produces it.
        F.sum(F.when(F.col("result") == F.col("id") * 31 + 7, 0).otherwise(1)).alias("not_called"),
        F.sum(F.when(F.col("latency_ms").isNull(), 1).otherwise(0)).alias("no_latency"),
        F.min("issued_at").alias("first_issue"),
        F.max(F.col("issued_at") + F.col("latency_ms") / 1000.0).alias("last_completion"),
    ).collect()[0]
    got = row.asDict()
    call_phase_s = float(got.pop("last_completion") - got.pop("first_issue"))
    want = {
        "rows": expected.rows,
        "ids": expected.rows,
        "id_sum": expected.id_sum,
        "not_called": 0,
        "no_latency": 0,
    }
    if got != want:
        raise BaselineCheckError(
            f"output must hold each input row once, called: expected {want}, got {got}"
        )
    measured = cast(pd.DataFrame, out.select("id", "latency_ms").toPandas())
    return measured["id"].to_numpy(), measured["latency_ms"].to_numpy(), call_phase_s


def _result(
    system: str,
    profile: LatencyProfile,
    capacity: int,
    parallelism: int,
    ids: np.ndarray,
    seconds: float,
    latencies_ms: np.ndarray,
    call_phase_s: float,
    rss: _RssSampler,
    load_1m: float,
) -> dict[str, Any]:
    n = len(ids)
    # The profile's own latencies of these very records, not of ids 0 .. n-1.
    mean_latency_ms = float(np.mean([profile.latency_ms(int(i)) for i in ids]))
    bound = capacity * parallelism / mean_latency_ms * 1000.0
    rate = n / seconds
    return {
        "system": system,
        "profile": profile.name,
        "capacity": capacity,
        "parallelism": parallelism,
        "n": n,
        "rows_out": n,
        "seconds": round(seconds, 3),
        "records_per_s": round(rate, 1),
        # Little's law: C x P / mean latency; no system can beat it.
        "bound_records_per_s": round(bound, 1),
        "efficiency": round(rate / bound, 3),
        # From the first call's issue to the last call's completion: the run without its fixed
        # costs (start-up, conversions, materialisation), as the rate it implies.
        "call_phase_s": round(call_phase_s, 3),
        "call_phase_records_per_s": round(n / call_phase_s, 1),
        "p50_ms": round(float(np.percentile(latencies_ms, 50)), 2),
        "p99_ms": round(float(np.percentile(latencies_ms, 99)), 2),
        "peak_rss_mb": round(rss.peak_mb, 1),
        "peak_rss_delta_mb": round(rss.peak_mb - rss.baseline_mb, 1),
        "rss_scope": "driver process tree (driver, Ray, RayDP JVMs, Ray and Spark Python workers)",
        # Other work on the machine slows every system; a high figure flags a suspect run.
        "load_avg_1m_before": round(load_1m, 2),
    }


def _output_schema(df: DataFrame) -> Any:
    """The input's columns, then ``result: long``, ``latency_ms: double``, ``issued_at: double``."""
    from pyspark.sql.types import DoubleType, LongType, StructField, StructType

    return StructType(
        [
            *df.schema.fields,
            StructField("result", LongType()),
            StructField("latency_ms", DoubleType()),
            StructField("issued_at", DoubleType()),
        ]
    )


# A run: (input, profile, C, P) -> (materialised output, seconds, extra result fields).
_RunOnce = Callable[
    ["DataFrame", LatencyProfile, int, int], "tuple[DataFrame, float, dict[str, Any]]"
]


def _measure(
    system: str,
    run_once: _RunOnce,
    df: DataFrame,
    profile: LatencyProfile,
    capacity: int,
    parallelism: int,
    warmup: bool,
) -> dict[str, Any]:
    summary = _summarize_input(df)
    if warmup:
        small = df.limit(min(summary.rows, _WARMUP_ROWS)).persist()
        try:
            small_summary = _summarize_input(small)
            out, _, _ = run_once(small, profile, capacity, parallelism)
            try:
                _check_and_measure(out, small_summary)
            finally:
                out.unpersist()
        finally:
            small.unpersist()

    settled_s = _wait_for_idle_cpus()
    load_1m = os.getloadavg()[0]
    with _RssSampler() as rss:
        out, seconds, extra = run_once(df, profile, capacity, parallelism)
    try:
        ids, latencies, call_phase_s = _check_and_measure(out, summary)
    finally:
        out.unpersist()
    result = _result(
        system,
        profile,
        capacity,
        parallelism,
        ids,
        seconds,
        latencies,
        call_phase_s,
        rss,
        load_1m,
    )
    result["settled_s"] = round(settled_s, 1)
    result.update(extra)
    return result


def _wait_for_idle_cpus(busy_below_percent: float = 15.0, timeout_s: float = 20.0, quiet_windows: int = 3) -> float:
    """Wait until the CPUs are less than ``busy_below_percent`` busy over ``quiet_windows``
    half-seconds in a row, for at most ``timeout_s``; return the seconds waited.

    What the run before left in motion (its processes exiting, the Python workers that Ray
    starts for the next job, Ray and Spark cleaning up) would otherwise slow whichever system is
    timed next, and the order of the systems would decide their figures. Some of it starts
    after a quiet moment: actorflow asks for the next job's workers once Spark has read the
    last result and run no job for a while (``arrow_io.SPARK_QUIET_S``), and the raylet then
    starts them. One quiet half-second can fall before that; one and a half cannot. The run
    before also left its garbage in this process (the rows it checked): collected here, or the
    next run would pay for the collection that it triggers.
    """
    import gc

    import psutil

    started = time.perf_counter()
    gc.collect()
    quiet = 0
    while quiet < quiet_windows and time.perf_counter() - started < timeout_s:
        quiet = quiet + 1 if psutil.cpu_percent(interval=0.5) < busy_below_percent else 0
    return time.perf_counter() - started


def _validate_args(capacity: int, parallelism: int) -> None:
    if capacity <= 0:
        raise ValueError(f"capacity must be > 0, got {capacity}")
    if parallelism <= 0:
        raise ValueError(f"parallelism must be > 0, got {parallelism}")


# -- spark_threadpool -----------------------------------------------------------------------------

# One call: (result, latency_ms, issued_at in epoch seconds).
_Called = tuple[int, float, float]


def _called_columns(done: list[_Called]) -> dict[str, np.ndarray]:
    return {
        "result": np.fromiter((c[0] for c in done), dtype=np.int64, count=len(done)),
        "latency_ms": np.fromiter((c[1] for c in done), dtype=np.float64, count=len(done)),
        "issued_at": np.fromiter((c[2] for c in done), dtype=np.float64, count=len(done)),
    }


def _threadpool_partition_fn(
    profile: LatencyProfile, capacity: int
) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    def call(record_id: int) -> _Called:
        issued_at = time.time()
        started = time.perf_counter()
        result = profile.blocking_call(record_id)
        return result, (time.perf_counter() - started) * 1000.0, issued_at

    def finish(pdf: pd.DataFrame, futures: list[Future[_Called]]) -> pd.DataFrame:
        return pdf.assign(**_called_columns([f.result() for f in futures]))

    def enrich_partition(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        with ThreadPoolExecutor(max_workers=capacity, thread_name_prefix="enrich") as pool:
            # Submit batch k+1 before waiting on batch k: the pool's queue then never runs dry at
            # a batch boundary, where a plain pool.map per batch would idle its threads while the
            # slowest calls of the batch finish. This is the strongest form of this baseline.
            pending: deque[tuple[pd.DataFrame, list[Future[_Called]]]] = deque()
            for pdf in batches:
                ids = pdf["id"].tolist()
                pending.append((pdf, [pool.submit(call, i) for i in ids]))
                if len(pending) > 1:
                    yield finish(*pending.popleft())
            while pending:
                yield finish(*pending.popleft())

    return enrich_partition


def _spark_threadpool_once(
    df: DataFrame, profile: LatencyProfile, capacity: int, parallelism: int
) -> tuple[DataFrame, float, dict[str, Any]]:
    started = time.perf_counter()
    # pyspark's stubs type the function with its own DataFrameLike alias, not pandas.DataFrame.
    enrich: Any = _threadpool_partition_fn(profile, capacity)
    out = df.repartition(parallelism).mapInPandas(enrich, _output_schema(df))
    out = _materialize(out)
    return out, time.perf_counter() - started, {}


def spark_threadpool(
    df: DataFrame,
    profile: str | LatencyProfile,
    capacity: int,
    parallelism: int = 2,
    *,
    warmup: bool = True,
) -> dict[str, Any]:
    """Enrich with ``mapInPandas`` and a thread pool of ``capacity`` threads per partition.

    The Spark session needs ``parallelism`` task slots (executors x executor cores), or the
    instances would run one after another.

    Example::

        spark_threadpool(make_events(spark, 20_000), "constant", 100, 2)["records_per_s"]
    """
    from pyspark import cloudpickle as spark_cloudpickle

    _validate_args(capacity, parallelism)
    slots = df.sparkSession.sparkContext.defaultParallelism
    if slots < parallelism:
        raise ValueError(
            f"spark_threadpool needs {parallelism} Spark task slots to run {parallelism} instances "
            f"at once, got {slots} (executors x executor cores)"
        )
    # Spark's Python workers are forked by the executor JVMs, with neither the driver's working
    # directory nor its sys.path, so `import benchmarks` fails there. Ship these two modules
    # inside the pickled function instead of by reference.
    spark_cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark_cloudpickle.register_pickle_by_value(profiles)
    return _measure(
        "spark_threadpool",
        _spark_threadpool_once,
        df,
        get_profile(profile),
        capacity,
        parallelism,
        warmup,
    )


# -- ray_data_async -------------------------------------------------------------------------------


class _AsyncEnricher:
    """Ray Data's async callable class: one instance per actor.

    Ray Data (2.50) runs an ``async def __call__`` on an event loop in a thread of its own in the
    actor, with up to 4 batches of one task in flight at once. The semaphore therefore belongs to
    the instance, not to a batch, so that an actor never has more than ``capacity`` calls in
    flight, however many batches it is working on.
    """

    def __init__(self, profile: LatencyProfile, capacity: int) -> None:
        self._profile = profile
        self._capacity = capacity
        self._semaphore: asyncio.Semaphore | None = None

    async def _call(self, record_id: int) -> _Called:
        assert self._semaphore is not None
        async with self._semaphore:
            issued_at = time.time()
            started = time.perf_counter()
            result = await self._profile.async_call(record_id)
            return result, (time.perf_counter() - started) * 1000.0, issued_at

    async def __call__(self, batch: pa.Table) -> pa.Table:
        if self._semaphore is None:
            # Created on first use, on the loop that runs the calls.
            self._semaphore = asyncio.Semaphore(self._capacity)
        done = await asyncio.gather(*(self._call(i) for i in batch.column("id").to_pylist()))
        for name, values in _called_columns(done).items():
            batch = batch.append_column(name, pa.array(values))
        # One chunk per column, or to_spark() fails: RayDP turns each block into pandas, where
        # pandas 3 keeps a string column as a *chunked* Arrow array, and pyspark 3.5 then gets a
        # ChunkedArray back from pa.Array.from_pandas ("StructArray.from_arrays: Expected Array,
        # got ChunkedArray"). A block from Spark has one chunk per 10,000 rows
        # (spark.sql.execution.arrow.maxRecordsPerBatch), so this bit from 10,001 rows a block.
        return batch.combine_chunks()


def _ray_data_async_once(
    df: DataFrame, profile: LatencyProfile, capacity: int, parallelism: int
) -> tuple[DataFrame, float, dict[str, Any]]:
    import ray
    from raydp.spark.dataset import release_spark_recoverable

    spark = df.sparkSession
    stages: dict[str, float] = {}
    started = time.perf_counter()
    # One block per instance, as repartition(P) gives the Spark baseline one partition each;
    # batch_size=None makes each block one batch, so that an actor keeps `capacity` calls in
    # flight from its first record to its last.
    ds = ray.data.from_spark(df, override_num_blocks=parallelism)
    stages["from_spark"] = time.perf_counter() - started
    # from_spark gives this pipeline a DataContext of its own; these settings stay in it.
    # By default Ray Data dispatches to the first actor that is up and queues 2 tasks per actor:
    # with one block per actor, both blocks went to one actor and ran one after the other while
    # the second actor sat idle. So: wait for the whole pool, and one task per actor.
    ds.context.wait_for_min_actors_s = 300
    ds.context.max_tasks_in_flight_per_actor = 1
    ds.context.enable_progress_bars = False  # they redraw on the driver's CPU, which we measure
    ds = ds.map_batches(
        _AsyncEnricher,
        fn_constructor_args=(profile, capacity),
        # Not "pandas": Ray 2.50's Arrow -> pandas batch conversion reads
        # pd.errors.SettingWithCopyWarning, which pandas 3 removed.
        batch_format="pyarrow",
        batch_size=None,
        concurrency=parallelism,
    )
    # Materialise before to_spark(): to_spark() first asks for the schema, and on a lazy dataset
    # that runs the pipeline with limit(1), which calls the service for a whole block only to
    # throw it away, and then runs the whole pipeline again.
    ds = ds.materialize()
    stages["map_batches"] = time.perf_counter() - started - sum(stages.values())
    out = _materialize(ds.to_spark(spark))
    seconds = time.perf_counter() - started
    stages["to_spark"] = seconds - sum(stages.values())
    # The Arrow copy of the input that from_spark pinned in Spark's cache is no longer needed.
    release_spark_recoverable(df)
    return out, seconds, {"stage_seconds": {k: round(v, 3) for k, v in stages.items()}}


def _quiet_ray_in_spark_workers(spark: SparkSession) -> None:
    """Stop a log feedback loop that ``Dataset.to_spark`` starts.

    RayDP's ``to_spark`` reads Ray blocks in a ``mapInPandas`` whose Python worker calls
    ``ray.init()`` and so becomes a Ray driver with ``log_to_driver`` on. That worker's stderr is
    its executor JVM's, which is a Ray worker whose log Ray streams to the drivers, this worker
    included: each line it prints comes back to it and is printed again, with one more
    ``(pid=...)`` prefix, forever. In a measured run this grew to 350 MB of log in minutes and
    took the machine's CPU. ``RAY_LOG_TO_DRIVER=0`` in the Spark Python workers' environment
    (``SparkContext.environment``, read whenever a Python UDF is created) turns it off for them
    only; the driver keeps its worker logs.
    """
    spark.sparkContext.environment.setdefault("RAY_LOG_TO_DRIVER", "0")


def ray_data_async(
    df: DataFrame,
    profile: str | LatencyProfile,
    capacity: int,
    parallelism: int = 2,
    *,
    warmup: bool = True,
) -> dict[str, Any]:
    """Enrich through Ray Data: ``from_spark`` -> async ``map_batches`` on ``parallelism``
    actors -> ``to_spark``. The result also has ``stage_seconds``, the time of each of the three;
    ``map_batches`` includes starting the actors, which Ray Data does anew for every dataset.

    Each actor asks Ray for 1 CPU (Ray Data's default), so Ray needs ``parallelism`` CPUs free
    besides those RayDP's executors hold.

    Example::

        ray_data_async(make_events(spark, 20_000), "constant", 100, 2)["records_per_s"]
    """
    import ray

    _validate_args(capacity, parallelism)
    free_cpus = ray.available_resources().get("CPU", 0.0)
    if free_cpus < parallelism:
        raise ValueError(
            f"ray_data_async needs {parallelism} free Ray CPUs for its {parallelism} actors, got "
            f"{free_cpus:g}; start Ray with more (ensure_ray(num_cpus=...)) or give Spark fewer "
            "executor cores"
        )
    _quiet_ray_in_spark_workers(df.sparkSession)
    return _measure(
        "ray_data_async",
        _ray_data_async_once,
        df,
        get_profile(profile),
        capacity,
        parallelism,
        warmup,
    )


# -- command line ---------------------------------------------------------------------------------


def _main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.baselines", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--n", type=int, default=20_000, help="records (default 20000)")
    parser.add_argument(
        "--profile",
        action="append",
        choices=profiles.PROFILES,
        help="repeatable (default constant)",
    )
    parser.add_argument("--capacity", type=int, action="append", help="C, repeatable (default 100)")
    parser.add_argument("--parallelism", type=int, default=2, help="P (default 2)")
    args = parser.parse_args(argv)

    from actorflow.spark_bridge.session import ensure_ray, spark_session, stop_spark

    parallelism = args.parallelism
    # Logical CPUs: P for RayDP's executor cores (the Spark baseline's task slots) and P for Ray
    # Data's actors. The work is waiting, not computing, so this may exceed the machine's cores.
    ensure_ray(num_cpus=2 * parallelism)
    spark = spark_session("actorflow-baselines", num_executors=1, executor_cores=parallelism)
    try:
        df = make_events(spark, args.n)
        for profile in args.profile or ["constant"]:
            for capacity in args.capacity or [100]:
                for baseline in (spark_threadpool, ray_data_async):
                    print(baseline(df, profile, capacity, parallelism), flush=True)
    finally:
        stop_spark()


if __name__ == "__main__":
    _main()
