"""How ``enrich()`` scales with the number of rows: speed, memory, pinned objects and cost per record.

For each size N (1 M, 3 M and 10 M rows; ``--quick`` stops at 3 M), on a cached Spark DataFrame of
six columns ``(id: long, ts: timestamp, user: long, payload: string, amount: double, country:
string)`` in partitions of 500,000 rows, one run does, one after the other:

- ``enrich(df, fn, parallelism=2, capacity=100)`` with a trivial ``async def fn(row)`` that awaits
  ``asyncio.sleep(0)`` once and returns ``{"x": row["id"] + 1}``: nothing but actorflow's own cost;
- Spark's ``mapInPandas`` computing the same column vectorised (``x = id + 1``), same input.

Both outputs are materialised alike (``persist`` and a write to Spark's ``noop`` sink, as
:func:`benchmarks.baselines._materialize` does) and then checked in Spark, without collecting:
N rows, each id once, and ``x == id + 1`` in every row. Everything runs in one embedded session
(Spark on Ray with one executor of 2 cores and 4g), after an untimed warm-up of both jobs on
20,000 rows; each size's input, and the Arrow snapshot of it that ``enrich()`` leaves cached in
Spark, is freed before the next size. Measured per size:

- rows/s of each, from the call to the materialised DataFrame;
- the peak RSS of the whole process tree during each job (the driver, Ray's processes and workers,
  RayDP's JVMs, Spark's Python workers), and of actorflow's operator actors alone (the Ray actors
  in namespace ``actorflow`` named ``<job>/enrich[i/2]``), summed over the actors, with and
  without shared pages (an actor's RSS also counts the object store's pages it has read);
- the bytes of Ray's object store still pinned, against a baseline taken before the job: once
  the result DataFrame is materialised, then after a ``gc.collect()`` (what only a reference
  cycle held is gone), then once the caller has ``unpersist()``-ed the result and dropped every
  reference to it;
- the CPU time the operator actors spent per record.

Besides, the CPU time per request of a bare asyncio loop in this process running the same
coroutine 200,000 times with 100 in flight: the floor of any async runtime on this machine. It
runs before Ray and Spark start, and again once they have stopped: on a shared host the machine's
speed drifts during a run, and the two figures bracket the drift. The target is judged against
the first.

Targets, reported and not asserted (a run on a busy 2-core machine should not fail on them):

- actorflow's actor peak RSS at the largest size at most 1.5 x its peak at the smallest (1 M rows
  by default): the actors stream, so their memory should not follow N;
- nothing pinned in the object store after ``unpersist()``;
- actorflow's CPU per record at most 2 x that of the bare asyncio loop.

The last line printed is one JSON object.

    python -m benchmarks.scale                         # 1 M, 3 M and 10 M rows
    python -m benchmarks.scale --quick                 # 1 M and 3 M rows
    python -m benchmarks.scale --sizes 100000,300000   # a smoke run
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import time
from typing import TYPE_CHECKING, Any

import click
import ray

from benchmarks.baselines import _materialize, _RssSampler, make_events
from benchmarks.report import emit

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

P = 2
CAPACITY = 100
DEFAULT_SIZES = (1_000_000, 3_000_000, 10_000_000)
QUICK_MAX = 3_000_000
BARE_REQUESTS = 200_000
COUNTRIES = ("DE", "FR", "GB", "US", "BR", "IN", "JP", "NG")
ROWS_PER_PARTITION = 500_000
# Not the 1g of the other benchmarks: the executor caches the input, enrich()'s Arrow snapshot of
# it (RayDP keeps it to rebuild a lost block) and the persisted output. With 1g, the 3 M run after
# a 1 M one ran out of heap in RayDP's Spark -> Ray conversion (OutOfMemoryError in
# getRDDPartition, which copies a partition into one byte array), with 500,000-row partitions too.
EXECUTOR_MEMORY = "4g"
_WARMUP_ROWS = 20_000
# The actorflow namespace and the operator name enrich() gives its actors (cluster.job, spark_bridge.enrich).
_NAMESPACE = "actorflow"
_OPERATOR = "enrich"
_TARGET_RSS_RATIO = 1.5
_TARGET_CPU_RATIO = 2.0


async def plus_one(row: dict[str, Any]) -> dict[str, Any]:
    """The enrichment: one suspension, as a request that awaits a ready future, and a new column."""
    await asyncio.sleep(0)
    return {"x": row["id"] + 1}


def _plus_one_batches(batches: Any) -> Any:
    """Spark's side of the same job, vectorised: ``x = id + 1`` on each Arrow batch as pandas."""
    for pdf in batches:
        yield pdf.assign(x=pdf["id"] + 1)


# -- input ----------------------------------------------------------------------------------------


def make_rows(spark: SparkSession, n: int) -> DataFrame:
    """A cached DataFrame of ``n`` rows: :func:`benchmarks.baselines.make_events`'s four columns,
    then ``amount: double`` and ``country: string``, in partitions of ``ROWS_PER_PARTITION``
    consecutive ids (at least ``P`` partitions)."""
    from pyspark.sql import functions as F

    events = make_events(spark, n)
    countries = F.array(*[F.lit(c) for c in COUNTRIES])
    # spark.range() makes as many partitions as Spark has cores whatever N is, so a partition
    # would grow with N, unlike a table read from files; and RayDP's Spark -> Ray conversion holds
    # a whole partition in one byte array in the executor. Partitions of a fixed size keep N the
    # only thing that changes.
    partitions = max(P, -(-n // ROWS_PER_PARTITION))
    df = events.repartitionByRange(partitions, "id").select(
        "*",
        ((F.col("id") * 37 % 100_000) / 100.0).alias("amount"),
        F.element_at(countries, (F.col("id") % len(COUNTRIES) + 1).cast("int")).alias("country"),
    ).persist()
    df.count()
    events.unpersist()  # df's own cache holds the rows now
    return df


def check_plus_one(out: DataFrame, n: int, system: str) -> None:
    """Raise unless ``out`` holds each id ``0 .. n-1`` once with ``x == id + 1``; runs in Spark."""
    from pyspark.sql import functions as F

    row = out.agg(
        F.count(F.lit(1)).alias("rows"),
        F.countDistinct("id").alias("ids"),
        F.min("id").alias("min_id"),
        F.max("id").alias("max_id"),
        # A null x (a row that lost its column) counts as wrong too.
        F.sum(F.when(F.col("x") == F.col("id") + 1, 0).otherwise(1)).alias("wrong_x"),
    ).collect()[0].asDict()
    want = {"rows": n, "ids": n, "min_id": 0, "max_id": n - 1, "wrong_x": 0}
    if row != want:
        raise AssertionError(
            f"{system}: output must hold each of {n} ids once with x = id + 1; expected {want}, got {row}")


# -- measurement ----------------------------------------------------------------------------------


def _actor_pid(actor: Any) -> int:
    return os.getpid()


class _JobSampler(_RssSampler):
    """:class:`~benchmarks.baselines._RssSampler`'s process tree, plus one job's enrich actors alone:
    the peak of their summed RSS and the CPU time they spent while sampled.

    The actors start during the job, so each sample first looks for new ones among the named
    actors of the GCS (no dashboard needed), and asks each new one for its PID with
    ``__ray_call__``; the answer is picked up by a later sample, never waited for, so that a
    slow actor start does not stall the sampling of the tree.

    CPU time runs from the sample that first sees an actor's PID to the last sample before the
    actor exits: its process start-up (imports, unpickling the function) is left out, as a cost
    per job and not per record, and so is at most one interval at its end (with 2 actors and
    0.1 s, at most 0.2 CPU seconds: 0.2 us a record at 1 M rows).

    Threading model: the sampler thread calls ``_sample_mb``; the caller's thread reads the
    figures only after ``__exit__``, which joins that thread.

    Lifecycle: created (baseline sample) -> entered (sampling) -> exited (final sample; figures
    final).
    """

    def __init__(self, job_name: str, interval_s: float = 0.1) -> None:
        self._prefix = f"{job_name}/{_OPERATOR}["
        self._pid_refs: dict[str, Any] = {}  # actor name -> ObjectRef of its PID
        # actor name -> (process, user + system CPU seconds at first sight, at the last sample)
        self._actors: dict[str, tuple[Any, float, float]] = {}
        self.actor_peak_mb = 0.0
        self.actor_peak_private_mb = 0.0  # the same, without shared pages (see _sample_actors)
        # Summed over the actors, each at its first sample: what start-up alone costs, so that
        # the peak can be told apart into a fixed part and what grew with the job.
        self.actor_start_mb = 0.0
        super().__init__(interval_s)

    def __enter__(self) -> _JobSampler:
        super().__enter__()
        return self

    @property
    def actor_cpu_s(self) -> float:
        return sum(last - first for _, first, last in self._actors.values())

    @property
    def actors_seen(self) -> int:
        return len(self._actors)

    def _sample_mb(self) -> float:
        self._sample_actors()
        return super()._sample_mb()

    def _sample_actors(self) -> None:
        psutil = self._psutil
        for named in ray.util.list_named_actors(all_namespaces=True):
            name = named["name"]
            if named["namespace"] == _NAMESPACE and name.startswith(self._prefix) and name not in self._pid_refs:
                try:
                    actor = ray.get_actor(name, namespace=_NAMESPACE)
                except ValueError:
                    continue  # it ended between the listing and the lookup
                self._pid_refs[name] = actor.__ray_call__.remote(_actor_pid)
        waiting = [ref for name, ref in self._pid_refs.items() if name not in self._actors]
        if waiting:
            ready, _ = ray.wait(waiting, num_returns=len(waiting), timeout=0)
            for name, ref in self._pid_refs.items():
                if name in self._actors or ref not in ready:
                    continue
                try:
                    process = psutil.Process(ray.get(ref))
                    with process.oneshot():
                        cpu = sum(process.cpu_times()[:2])
                        self.actor_start_mb += process.memory_info().rss / 2**20
                except (ray.exceptions.RayError, psutil.NoSuchProcess):
                    continue  # it ended before it answered: nothing of it to measure
                self._actors[name] = (process, cpu, cpu)
        rss = private = 0
        for name, (process, first, _) in list(self._actors.items()):
            try:
                with process.oneshot():
                    memory = process.memory_info()
                    rss += memory.rss
                    # Resident pages that are not shared: RSS also counts the pages of the object
                    # store's shared memory that the actor has touched (its input blocks).
                    private += memory.rss - memory.shared
                    cpu = sum(process.cpu_times()[:2])
            except psutil.NoSuchProcess:
                continue  # it exited: its last sample stands
            self._actors[name] = (process, first, cpu)
        self.actor_peak_mb = max(self.actor_peak_mb, rss / 2**20)
        self.actor_peak_private_mb = max(self.actor_peak_private_mb, private / 2**20)


def pinned_bytes() -> int:
    """Bytes of primary copies pinned in the object stores of this Ray cluster, once settled.

    Read from the raylets' own store statistics (``FormatGlobalMemoryInfo``, which
    ``ray memory --stats-only`` prints in whole MiB), in bytes. The alternatives mislead:
    ``available_resources()["object_store_memory"]`` is a scheduling resource that no
    ``ray.put`` changes, and the State API's ``summarize_objects`` needs the dashboard and lists
    references, not memory. The GCS address is this process's own: without it, the lookup takes
    the newest cluster in ``/tmp/ray``, which may be someone else's on this machine.

    Freeing an object is asynchronous (the owner tells the raylet), so the figure is read until
    it stays the same for a second, for at most 30 s.
    """
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address

    def read() -> int:
        state = get_state_from_address(ray.get_runtime_context().gcs_address)
        try:
            stats = get_memory_info_reply(state).store_stats
        finally:
            state.disconnect()
        return int(stats.object_store_bytes_primary_copy + stats.object_store_bytes_fallback)

    deadline = time.monotonic() + 30.0
    last, same = read(), 0
    while same < 4 and time.monotonic() < deadline:
        time.sleep(0.25)
        now = read()
        same = same + 1 if now == last else 0
        last = now
    return last


def bare_asyncio_per_request_us(n: int = BARE_REQUESTS, in_flight: int = CAPACITY, repeats: int = 3) -> float:
    """CPU microseconds per request of a bare asyncio loop in this thread: ``plus_one`` on ``n``
    rows, a task each, at most ``in_flight`` at once; the best of ``repeats`` runs.

    CPU time of this thread only (``time.thread_time``), so that Ray's and py4j's threads in this
    process are not counted. A row here is ``{"id": i}``: turning Arrow data into rows is part of
    what actorflow's figure is compared against.
    """

    async def run() -> int:
        slots = asyncio.Semaphore(in_flight)
        loop = asyncio.get_running_loop()
        pending: set[asyncio.Task[dict[str, Any]]] = set()
        done = 0

        def finished(task: asyncio.Task[dict[str, Any]]) -> None:
            nonlocal done
            pending.discard(task)
            slots.release()
            done += task.result()["x"] > 0

        for i in range(n):
            await slots.acquire()
            task = loop.create_task(plus_one({"id": i}))
            pending.add(task)
            task.add_done_callback(finished)
        while pending:
            await asyncio.wait(set(pending))
        return done

    best = float("inf")
    for _ in range(repeats):
        started = time.thread_time()
        done = asyncio.run(run())
        best = min(best, time.thread_time() - started)
        if done != n:
            raise AssertionError(f"bare asyncio loop: expected {n} results, got {done}")
    return best / n * 1e6


# -- the two jobs ---------------------------------------------------------------------------------


def actorflow_job(df: DataFrame, n: int, job_name: str) -> dict[str, Any]:
    """``enrich()`` with ``plus_one``, materialised and checked; the result is unpersisted and
    dropped before this returns, so that what stays pinned after it can be measured."""
    from actorflow.spark_bridge import enrich

    base = pinned_bytes()
    with _JobSampler(job_name) as sampler:
        started = time.perf_counter()
        out = enrich(df, plus_one, parallelism=P, capacity=CAPACITY, progress=False,
                     checkpoint_interval_ms=None, job_name=job_name)
        assert not isinstance(out, tuple)  # no dead letters were asked for
        out = _materialize(out)
        seconds = time.perf_counter() - started
    pinned_after_job = pinned_bytes() - base
    # Objects that only a reference cycle keeps alive are freed at the next cyclic collection,
    # whenever that comes: measured apart, so that the two figures around it are not left to it.
    gc.collect()
    pinned_after_gc = pinned_bytes() - base
    check_plus_one(out, n, "actorflow")
    if sampler.actors_seen != P:
        raise AssertionError(f"actorflow: expected to sample {P} enrich actors, saw {sampler.actors_seen}")
    # What a user does once done with the result: unpersist it and let it go.
    out.unpersist()
    del out
    gc.collect()
    return {
        "rps": n / seconds,
        "seconds": seconds,
        "tree_peak_rss_mib": sampler.peak_mb,
        "actor_peak_rss_mib": sampler.actor_peak_mb,
        "actor_peak_private_mib": sampler.actor_peak_private_mb,
        "actor_start_rss_mib": sampler.actor_start_mb,
        "actor_cpu_s": sampler.actor_cpu_s,
        "per_record_us": sampler.actor_cpu_s / n * 1e6,
        "pinned_after_job_bytes": pinned_after_job,
        "pinned_after_gc_bytes": pinned_after_gc,
        "pinned_after_unpersist_bytes": pinned_bytes() - base,
    }


def spark_job(df: DataFrame, n: int) -> dict[str, Any]:
    """``mapInPandas`` computing ``x = id + 1``, materialised and checked like actorflow's."""
    from pyspark.sql.types import LongType, StructField, StructType

    base = pinned_bytes()
    schema = StructType([*df.schema.fields, StructField("x", LongType())])
    with _RssSampler() as rss:
        started = time.perf_counter()
        # pyspark's stubs type the function with its own DataFrameLike alias, not pandas.DataFrame.
        fn: Any = _plus_one_batches
        out = _materialize(df.mapInPandas(fn, schema))
        seconds = time.perf_counter() - started
    pinned_after_job = pinned_bytes() - base
    check_plus_one(out, n, "spark")
    out.unpersist()
    return {"rps": n / seconds, "seconds": seconds, "tree_peak_rss_mib": rss.peak_mb,
            "pinned_after_job_bytes": pinned_after_job}


def _drop_input(df: DataFrame) -> None:
    """Free what a size's input holds in the executor, so that the next size starts clean: its
    cache, and (a no-op once enrich() has freed it itself) the Arrow snapshot of it."""
    from actorflow.spark_bridge.arrow_io import release_dataframe

    release_dataframe(df)
    df.unpersist()


# -- command line ---------------------------------------------------------------------------------


def _parse_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(f"sizes must be comma-separated row counts, got {text!r}") from None
    if not sizes or any(n <= 0 for n in sizes):
        raise click.BadParameter(f"sizes must be row counts > 0, got {text!r}")
    return tuple(sorted(set(sizes)))


def _mib(n_bytes: float) -> str:
    return f"{n_bytes / 2**20:,.1f} MiB"


def _print_size(n: int, af: dict[str, Any], sp: dict[str, Any], load_1m: float) -> None:
    rows = [
        ("rows/s", f"{af['rps']:,.0f}", f"{sp['rps']:,.0f}"),
        ("seconds", f"{af['seconds']:.1f}", f"{sp['seconds']:.1f}"),
        ("tree peak RSS", f"{af['tree_peak_rss_mib']:,.0f} MiB", f"{sp['tree_peak_rss_mib']:,.0f} MiB"),
        ("actor peak RSS (2 actors)", f"{af['actor_peak_rss_mib']:,.0f} MiB", "-"),
        ("  of which at their start", f"{af['actor_start_rss_mib']:,.0f} MiB", "-"),
        ("actor peak private (not shared)", f"{af['actor_peak_private_mib']:,.0f} MiB", "-"),
        ("actor CPU per record", f"{af['per_record_us']:.2f} us", "-"),
        ("pinned after job", _mib(af["pinned_after_job_bytes"]), _mib(sp["pinned_after_job_bytes"])),
        ("  then after gc.collect()", _mib(af["pinned_after_gc_bytes"]), "-"),
        ("  then after unpersist()", _mib(af["pinned_after_unpersist_bytes"]), "-"),
    ]
    print(f"\nN = {n:,} rows (load average before: {load_1m:.2f})", flush=True)
    print(f"  {'':<28}{'actorflow':>16}{'spark':>16}")
    for label, a, s in rows:
        print(f"  {label:<28}{a:>16}{s:>16}", flush=True)


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


@click.command()
@click.option("--quick", is_flag=True, help="stop at 3,000,000 rows")
@click.option("--sizes", "sizes_text", default=None,
              help="comma-separated row counts instead of 1000000,3000000,10000000 (e.g. 100000,300000)")
def main(quick: bool, sizes_text: str | None) -> None:
    from pyspark import cloudpickle as spark_cloudpickle

    from actorflow.spark_bridge.session import ensure_ray, spark_session, stop_spark

    sizes = _parse_sizes(sizes_text) if sizes_text else DEFAULT_SIZES
    if quick:
        sizes = tuple(n for n in sizes if n <= QUICK_MAX) or sizes[:1]
    # Before Ray and Spark start: the loop should have the machine's cores to itself.
    bare_us = bare_asyncio_per_request_us()
    print(f"bare asyncio loop: {bare_us:.2f} us CPU per request ({BARE_REQUESTS:,} requests, {CAPACITY} in "
          f"flight); sizes {', '.join(f'{n:,}' for n in sizes)}; P = {P}, {os.cpu_count()} cores", flush=True)
    # Logical CPUs: P for RayDP's executor cores, P for the Ray tasks that move data between Spark
    # and Ray. The operator actors ask for none.
    ensure_ray(num_cpus=2 * P)
    spark = spark_session("actorflow-bench-scale", num_executors=1, executor_cores=P, executor_memory=EXECUTOR_MEMORY)
    # Spark's Python workers cannot import this module (they have neither the driver's working
    # directory nor its sys.path): ship its functions by value.
    spark_cloudpickle.register_pickle_by_value(sys.modules[__name__])
    results: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
    try:
        # Untimed: Spark's first Python workers and code generation, RayDP's first conversion
        # and the first Ray workers are costs of a session, not of the first size.
        warm = make_rows(spark, _WARMUP_ROWS)
        actorflow_job(warm, _WARMUP_ROWS, "scale-warmup")
        spark_job(warm, _WARMUP_ROWS)
        _drop_input(warm)
        for n in sizes:
            df = make_rows(spark, n)
            load_1m = os.getloadavg()[0]
            af = actorflow_job(df, n, f"scale-{n}")
            sp = spark_job(df, n)
            _drop_input(df)
            results[n] = (af, sp)
            _print_size(n, af, sp, load_1m)
    finally:
        stop_spark()
        # Ray's log monitor prints the raylet's and workers' lines to this process's terminal
        # whenever they come; stopped here, none can land after the JSON line.
        ray.shutdown()
    # Again once Ray and Spark are gone, as at the start: on a shared host the speed of the
    # machine drifts during a run, and the two figures bracket that drift.
    bare_end_us = bare_asyncio_per_request_us()

    smallest, largest = sizes[0], sizes[-1]
    af_small, af_large = results[smallest][0], results[largest][0]
    rss_ratio = af_large["actor_peak_rss_mib"] / af_small["actor_peak_rss_mib"]
    private_ratio = af_large["actor_peak_private_mib"] / af_small["actor_peak_private_mib"]
    per_record_us = af_large["per_record_us"]
    cpu_ratio, cpu_ratio_to_end = per_record_us / bare_us, per_record_us / bare_end_us
    pinned_after_unpersist = max(results[n][0]["pinned_after_unpersist_bytes"] for n in sizes)
    print(f"\nactor peak RSS {largest:,} / {smallest:,} rows: {rss_ratio:.2f} x (target <= {_TARGET_RSS_RATIO}: "
          f"{_verdict(rss_ratio <= _TARGET_RSS_RATIO)}); without shared pages {private_ratio:.2f} x")
    print(f"pinned after unpersist(), most of any size: {_mib(pinned_after_unpersist)} (target 0: "
          f"{_verdict(pinned_after_unpersist <= 0)})")
    print(f"CPU per record at {largest:,} rows: actorflow {per_record_us:.2f} us, bare asyncio {bare_us:.2f} us, "
          f"{cpu_ratio:.2f} x (target <= {_TARGET_CPU_RATIO}: {_verdict(cpu_ratio <= _TARGET_CPU_RATIO)}); "
          f"the bare loop took {bare_end_us:.2f} us at the end of the run ({cpu_ratio_to_end:.2f} x)", flush=True)

    def by_size(system: int, key: str, digits: int | None = 1) -> dict[str, Any]:
        # JSON keys are strings; bytes stay whole numbers (digits=None).
        return {str(n): round(results[n][system][key], digits) for n in sizes}

    emit("scale", {
        "sizes": list(sizes),
        "parallelism": P,
        "capacity": CAPACITY,
        "actorflow_rps": by_size(0, "rps"),
        "spark_rps": by_size(1, "rps"),
        "actor_peak_rss_mib": by_size(0, "actor_peak_rss_mib"),
        "actor_start_rss_mib": by_size(0, "actor_start_rss_mib"),
        "tree_peak_rss_mib": by_size(0, "tree_peak_rss_mib"),
        "spark_tree_peak_rss_mib": by_size(1, "tree_peak_rss_mib"),
        "actor_peak_rss_ratio": round(rss_ratio, 3),
        "actor_peak_private_mib": by_size(0, "actor_peak_private_mib"),
        "actor_peak_private_ratio": round(private_ratio, 3),
        "pinned_after_job_bytes": by_size(0, "pinned_after_job_bytes", None),
        "spark_pinned_after_job_bytes": by_size(1, "pinned_after_job_bytes", None),
        "pinned_after_gc_bytes": by_size(0, "pinned_after_gc_bytes", None),
        "pinned_after_unpersist_bytes_by_size": by_size(0, "pinned_after_unpersist_bytes", None),
        "pinned_after_unpersist_bytes": pinned_after_unpersist,
        "per_record_us_by_size": by_size(0, "per_record_us", 3),
        "per_record_us": round(per_record_us, 3),
        "bare_asyncio_per_request_us": round(bare_us, 3),
        "bare_asyncio_end_per_request_us": round(bare_end_us, 3),
        "per_record_ratio": round(cpu_ratio, 3),
        "per_record_ratio_to_end": round(cpu_ratio_to_end, 3),
        "targets": {"actor_peak_rss_ratio_max": _TARGET_RSS_RATIO, "pinned_after_unpersist_bytes": 0,
                    "per_record_ratio_max": _TARGET_CPU_RATIO},
    })


if __name__ == "__main__":
    main()
