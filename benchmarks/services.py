"""Async I/O against a service that pushes back: adaptive capacity, a shared rate quota, a breaker.

Every part runs the real pipeline (Ray actors, ``from_arrow(...).async_map(...)``) against the
real HTTP service of ``examples/enrich_service.py`` on 127.0.0.1, and compares with baselines
measured in the same run:

- **Adaptive capacity under a stepping capacity.** The service takes ``HIGH`` requests at once,
  then ``LOW``, then ``HIGH`` again (one phase each), and answers the rest 429 with a short
  ``Retry-After``. ``capacity="auto"`` runs through all three phases; a sweep of fixed
  capacities (``Service(capacity=c)``, which sends 429s again in the same way) runs against each
  level alone. Per phase: throughput ÷ the best fixed capacity's; the 429s as a share of all
  calls; and seconds to settle after each step (from the step until every half second of the
  rest of the phase runs at 0.85 of the best fixed throughput or more).
- **The rate quota at 1, 4 and 16 instances.** ``Service(rate_limit=Q)``, one quota for all the
  instances: the busiest second of arrivals at the service ÷ Q; the mean rate ÷ Q once every
  instance has started (from the last instance's first call to the last call), which is
  ``rate_mean_vs_quota_min``; and the mean between the very first and last call, which on a
  machine with fewer cores than instances also holds the seconds the actors take to start.
- **The breaker during an outage.** The service answers 503 for ``OUTAGE_S``, then recovers; with
  ``CircuitBreaker(when_open="wait")`` the rows wait. The calls the service got while the
  breaker was open (after the first ones that opened it) ÷ the breaker's probes, and the seconds
  from the service's return to the first successful call.

- **Hedging** on a slow tail (3 % of calls 1 s slower): p99 of a row's latency (from its first
  call) with ``Hedge(percentile=0.95)`` ÷ without, and the second calls per row.
- **The lookup cache** on Zipf-distributed keys: calls ÷ unique keys, and throughput ÷ no cache.
- **Key-ordered mode** on ``benchmarks.enrich``'s skewed profile at C = 64: ÷ unordered and
  ÷ ordered.

    python -m benchmarks.services [--quick]
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks.report import emit
from examples.enrich_service import EnrichmentService, http_session, lookup_user

HIGH, LOW = 40, 8  # requests the service takes at once in each phase
LATENCY_MS = 100.0  # median latency: HIGH / latency = 400 calls/s, LOW / latency = 80
RETRY_AFTER_S = 0.05
QUOTA = 100.0  # calls per second for the rate quota's runs
OUTAGE_S = 3.0


def _lookup(url: str) -> Any:
    async def call(row: dict[str, Any]) -> list[dict[str, Any]]:
        await lookup_user(http_session(), url, int(row["id"]) % 1000)
        return [{"id": row["id"], "done_at": time.time()}]

    return call


def _run(n: int, url: str, *, service: Any, capacity: Any, parallelism: int = 1, name: str,
         by_part: bool = False) -> tuple[Any, Any]:
    """Run ``n`` rows through the pipeline; the completion times (wall clock) and the job.
    ``by_part``: the completion times per input part instead (part ``i`` holds the ids ``i mod
    parts``; there are ``max(parallelism, 4)`` parts)."""
    from actorflow.cluster import from_arrow

    parts = max(parallelism, 4)
    tables = [pa.table({"id": pa.array(range(i, n, parts), pa.int64())}) for i in range(parts)]
    stream = from_arrow(tables, parallelism=parallelism, job_name=name).async_map(
        _lookup(url), ordered=False, capacity=capacity, service=service, parallelism=parallelism, timeout_ms=600_000)
    result = stream.execute(progress=False)
    out = result.to_arrow()
    ids = out.column("id").to_numpy()
    if len(ids) != n or len(np.unique(ids)) != n:
        raise AssertionError(f"{name}: expected each of {n} ids once, got {len(ids)} rows, {len(np.unique(ids))} distinct")
    done = out.column("done_at").to_numpy()
    if by_part:
        return [np.sort(done[ids % parts == i]) for i in range(parts)], result
    return np.sort(done), result


def _steady_rate(done: np.ndarray, skip_s: float) -> float:
    """Completions per second after the first ``skip_s`` seconds (the ramp)."""
    start = done[0] + skip_s
    tail = done[done >= start]
    return (len(tail) - 1) / (tail[-1] - tail[0]) if len(tail) > 1 else 0.0


def best_fixed(level: int, phase_s: float, capacities: list[int]) -> tuple[int, float, dict[int, float]]:
    """The fixed capacity with the best steady throughput against a service of ``level``."""
    from actorflow.operators.service import Service

    rates: dict[int, float] = {}
    n = int(level / LATENCY_MS * 1000 * phase_s)
    with EnrichmentService(latency_ms_median=LATENCY_MS, latency_sigma=0.2, failure_rate=0.0, hang_rate=0.0,
                           capacity=level, retry_after_s=RETRY_AFTER_S) as svc:
        for c in capacities:
            done, _ = _run(n, svc.url, service=Service(capacity=c), capacity=max(c, 1), name=f"bench-fixed-{level}-{c}")
            rates[c] = round(_steady_rate(done, 0.5), 1)
            print(f"  service {level} at once, fixed capacity {c}: {rates[c]:,.0f} calls/s", flush=True)
    best = max(rates, key=lambda c: rates[c])
    return best, rates[best], rates


def adaptive(phase_s: float, best: dict[int, float]) -> dict[str, Any]:
    """capacity="auto" through HIGH -> LOW -> HIGH; per phase, throughput against the best fixed."""
    levels = [HIGH, LOW, HIGH]
    expected = sum(level / LATENCY_MS * 1000 * phase_s for level in levels)
    n = int(expected * 1.3)  # still running when the last phase ends
    with EnrichmentService(latency_ms_median=LATENCY_MS, latency_sigma=0.2, failure_rate=0.0, hang_rate=0.0,
                           capacity=HIGH, retry_after_s=RETRY_AFTER_S) as svc:
        steps: list[float] = []

        def stepper() -> None:
            # The phases start with the first call the service receives.
            while not svc.arrival_times():
                time.sleep(0.005)
            t0 = time.time()
            steps.append(t0)
            for level in levels[1:]:
                time.sleep(max(0.0, t0 + phase_s * len(steps) - time.time()))
                svc.set_capacity(level)
                steps.append(time.time())

        thread = threading.Thread(target=stepper, daemon=True)
        thread.start()
        done, job = _run(n, svc.url, service=None, capacity="auto", name="bench-adaptive")
        thread.join()
        stats = svc.stats()
    phases = []
    for i, level in enumerate(levels):
        start, end = steps[i], steps[i] + phase_s
        in_phase = done[(done >= start) & (done < end)]
        rate = len(in_phase) / phase_s
        bins = np.arange(start, end, 0.5)
        per_bin = np.array([((done >= b) & (done < b + 0.5)).sum() / 0.5 for b in bins])
        good = per_bin >= 0.85 * best[level]
        # Settled: the first half second from which every half second to the phase's end is good.
        settle = next((float(bins[j] - start) for j in range(len(bins)) if good[j:].all()), None)
        phases.append({"level": level, "calls_per_s": round(rate, 1), "best_fixed_calls_per_s": best[level],
                       "vs_best_fixed": round(rate / best[level], 3), "settle_s": settle})
        print(f"  adaptive, phase {i + 1} (service {level} at once): {rate:,.0f} calls/s = "
              f"{rate / best[level]:.2f} of the best fixed; settled after {settle} s", flush=True)
    share_429 = stats["rejected_429"] / stats["requests"]
    [summary] = [o for o in job.operators if o.services]
    return {"phases": phases, "share_429": round(share_429, 4), "calls": stats["requests"],
            "final_limit": summary.services["async_map"]["service_concurrency_limit"]}


def rate_quota(instances: int, seconds: float) -> dict[str, Any]:
    from actorflow.operators.service import Service

    n = int(QUOTA * seconds)
    with EnrichmentService(latency_ms_median=5, latency_sigma=0.2, failure_rate=0.0, hang_rate=0.0) as svc:
        parts, job = _run(n, svc.url, service=Service(rate_limit=QUOTA), capacity=50, parallelism=instances,
                          name=f"bench-rate-{instances}", by_part=True)
        arrivals = np.array(svc.arrival_times())
        busiest = svc.busiest_second()
    mean = (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])
    # Once every instance has started (an instance reads one part when there are as many parts
    # as instances): from the last part's first call to the very last call.
    if instances > 1:
        start = max(p[0] for p in parts)
    else:
        start = min(p[0] for p in parts)
    done = np.sort(np.concatenate(parts))
    end = done[-1]
    steady = ((done >= start) & (done <= end)).sum() / (end - start) if end - start >= 1.0 else None
    [summary] = [o for o in job.operators if o.services]
    figures = summary.services["async_map"]
    row = {"instances": instances, "busiest_second": busiest, "busiest_vs_quota": round(busiest / QUOTA, 3),
           "mean_vs_quota": round(mean / QUOTA, 3),
           "steady_mean_vs_quota": None if steady is None else round(steady / QUOTA, 3),
           "steady_s": round(end - start, 2), "span_s": round(arrivals[-1] - arrivals[0], 2),
           "quota_unused": figures["service_quota_unused"] / figures["service_quota_granted"]}
    print(f"  rate quota {QUOTA:.0f}/s at {instances} instances: busiest second {busiest} "
          f"({row['busiest_vs_quota']}x), mean {mean:,.1f}/s ({row['mean_vs_quota']}x) over {row['span_s']} s, "
          f"{row['steady_mean_vs_quota']}x once every instance had started ({row['steady_s']} s); "
          f"{row['quota_unused']:.1%} of the leased call times unused", flush=True)
    return row


def breaker(n: int) -> dict[str, Any]:
    from actorflow.operators.service import CircuitBreaker, Service

    # A probe answered 503 is sent again: enough times for every probe of the outage.
    service = Service(breaker=CircuitBreaker(failures=5, window_s=10, open_s=0.5, when_open="wait"), overload_retries=100)
    with EnrichmentService(latency_ms_median=20, latency_sigma=0.2, failure_rate=0.0, hang_rate=0.0) as svc:
        svc.set_outage(True)
        back: list[float] = []

        def restore() -> None:
            while not svc.arrival_times():
                time.sleep(0.005)
            time.sleep(OUTAGE_S)
            back.append(time.time())
            svc.set_outage(False)

        thread = threading.Thread(target=restore, daemon=True)
        thread.start()
        _, job = _run(n, svc.url, service=service, capacity=8, name="bench-breaker")
        thread.join()
        arrivals_mono = np.array(svc.arrival_times())
        stats = svc.stats()
    # arrival_times() is time.monotonic(): the outage's calls are those before its end, in the
    # same clock; the first ones (sent at once, before any answer) opened the breaker.
    first = arrivals_mono[0]
    outage_end_mono = first + OUTAGE_S
    during = arrivals_mono[arrivals_mono < outage_end_mono]
    while_open = int((during > first + 0.05).sum())
    after = arrivals_mono[arrivals_mono >= outage_end_mono]
    [summary] = [o for o in job.operators if o.services]
    figures = summary.services["async_map"]
    probes = int(figures["service_probes"])
    recover_s = round(float(after[0] - outage_end_mono), 3) if len(after) else None
    row = {"outage_calls": stats["outage_requests"], "calls_while_open": while_open, "probes": probes,
           "calls_vs_probes": round(while_open / probes, 3) if probes else None, "recover_s": recover_s,
           "breaker_opens": int(figures["service_breaker_opens"])}
    print(f"  breaker: {stats['outage_requests']} calls during a {OUTAGE_S:.0f} s outage, {while_open} of them while "
          f"open, {probes} probes; first call {recover_s} s after the service returned", flush=True)
    return row


# Per (run, row id), when the row's first call started, in the actor's process (which a later
# run's actor may reuse: hence the run in the key).
_FIRST_CALL: dict[tuple[str, int], float] = {}


def _timed_lookup(url: str, run: str) -> Any:
    """A lookup that answers with when the row's first call started: with a hedge, a row has two
    calls, and its latency counts from the first."""
    async def call(row: dict[str, Any]) -> list[dict[str, Any]]:
        first = _FIRST_CALL.setdefault((run, int(row["id"])), time.time())
        await lookup_user(http_session(), url, int(row["id"]) % 1000)
        return [{"id": row["id"], "first_call": first, "done_at": time.time()}]

    return call


def hedging(n: int) -> dict[str, Any]:
    """p99 of a row's latency with Hedge(percentile=0.95) against without, on a slow tail."""
    from actorflow.cluster import from_arrow
    from actorflow.operators.service import Hedge, Service

    figures: dict[str, Any] = {}
    for label, service in (("plain", None), ("hedged", Service(hedge=Hedge(percentile=0.95)))):
        with EnrichmentService(latency_ms_median=10, latency_sigma=0.3, failure_rate=0.0, hang_rate=0.0,
                               tail_rate=0.03, tail_ms=1_000, seed=11) as svc:
            tables = [pa.table({"id": pa.array(range(i, n, 4), pa.int64())}) for i in range(4)]
            stream = from_arrow(tables, parallelism=1, job_name=f"bench-hedge-{label}").async_map(
                _timed_lookup(svc.url, f"{label}-{time.time()}"), ordered=False, capacity=20, service=service, timeout_ms=600_000)
            result = stream.execute(progress=False)
            out = result.to_arrow()
            requests = svc.stats()["requests"]
        ids = out.column("id").to_numpy()
        if len(ids) != n or len(np.unique(ids)) != n:
            raise AssertionError(f"hedging {label}: expected each of {n} ids once, got {len(ids)} rows")
        latency_ms = (out.column("done_at").to_numpy() - out.column("first_call").to_numpy()) * 1000
        figures[label] = {"p50_ms": round(float(np.percentile(latency_ms, 50)), 1),
                          "p99_ms": round(float(np.percentile(latency_ms, 99)), 1), "calls": requests}
        if label == "hedged":
            [summary] = [o for o in result.operators if o.services]
            figures[label]["hedges"] = int(summary.services["async_map"]["service_hedges"])
    plain, hedged = figures["plain"], figures["hedged"]
    row = {**figures, "p99_vs_plain": round(hedged["p99_ms"] / plain["p99_ms"], 3),
           "extra_calls": round(hedged["hedges"] / n, 4)}
    print(f"  hedging: p99 {plain['p99_ms']:,.0f} ms plain, {hedged['p99_ms']:,.0f} ms hedged "
          f"({row['p99_vs_plain']}x), {hedged['hedges']} second calls for {n} rows ({row['extra_calls']:.1%})", flush=True)
    return row


def cache(n: int) -> dict[str, Any]:
    """A lookup cache on Zipf-distributed keys: calls per unique key, and throughput against none."""
    from actorflow.cluster import from_arrow
    from actorflow.operators.service import LookupCache, Service

    rng = np.random.default_rng(5)
    users = np.minimum(rng.zipf(1.2, n), 5_000).astype(np.int64)
    unique = len(np.unique(users))
    rows: dict[str, Any] = {}
    for label, service in (("none", None), ("cached", Service(cache=LookupCache(key="user", ttl_s=600)))):
        with EnrichmentService(latency_ms_median=20, latency_sigma=0.3, failure_rate=0.0, hang_rate=0.0) as svc:
            async def call(row: dict[str, Any], url: str = svc.url) -> list[dict[str, Any]]:
                user = await lookup_user(http_session(), url, int(row["user"]))
                return [{"id": row["id"], "segment": user["segment"]}]

            tables = [pa.table({"id": pa.array(range(i, n, 4), pa.int64()), "user": pa.array(users[i::4])})
                      for i in range(4)]
            stream = from_arrow(tables, parallelism=1, job_name=f"bench-cache-{label}").async_map(
                call, ordered=False, capacity=50, service=service, timeout_ms=600_000)
            started = time.perf_counter()
            out = stream.execute(progress=False).to_arrow()
            seconds = time.perf_counter() - started
            calls = svc.stats()["requests"]
        if out.num_rows != n:
            raise AssertionError(f"cache {label}: expected {n} rows, got {out.num_rows}")
        rows[label] = {"calls": calls, "records_per_s": round(n / seconds, 1)}
    row = {**rows, "unique_keys": unique, "calls_vs_unique_keys": round(rows["cached"]["calls"] / unique, 3),
           "throughput_vs_no_cache": round(rows["cached"]["records_per_s"] / rows["none"]["records_per_s"], 2)}
    print(f"  cache: {n} rows, {unique} unique keys (Zipf 1.2): {rows['cached']['calls']} calls cached "
          f"({row['calls_vs_unique_keys']}x the keys) against {rows['none']['calls']}; "
          f"throughput {row['throughput_vs_no_cache']}x", flush=True)
    return row


def key_ordered(n: int) -> dict[str, Any]:
    """benchmarks.enrich's skewed profile at C = 64: key-ordered against unordered and ordered."""
    from benchmarks.enrich import _arrow_input, actorflow_stage
    from benchmarks.profiles import get_profile

    tables, profile = _arrow_input(n), get_profile("skewed")
    rps = {kind: actorflow_stage(tables, profile, 64, kind=kind)["stage_records_per_s"]
           for kind in ("unordered", "ordered", "key_ordered")}
    row = {**{f"{k}_rps": v for k, v in rps.items()},
           "key_ordered_vs_unordered": round(rps["key_ordered"] / rps["unordered"], 3),
           "key_ordered_vs_ordered": round(rps["key_ordered"] / rps["ordered"], 3)}
    print(f"  key-ordered, skewed profile, C = 64: {rps['key_ordered']:,.0f}/s = {row['key_ordered_vs_unordered']}x "
          f"unordered, {row['key_ordered_vs_ordered']}x ordered", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter phases (a few minutes in all)")
    args = parser.parse_args()
    from actorflow.spark_bridge.session import ensure_ray

    ensure_ray(num_cpus=4)
    phase_s = 4.0 if args.quick else 8.0
    print(f"service latency {LATENCY_MS:.0f} ms; capacity {HIGH} -> {LOW} -> {HIGH}, {phase_s:.0f} s each", flush=True)
    best: dict[int, float] = {}
    sweeps: dict[int, dict[int, float]] = {}
    for level in (HIGH, LOW):
        capacities = sorted({max(1, level // 2), level, level * 3 // 2})
        _, best[level], sweeps[level] = best_fixed(level, phase_s, capacities)
    adapt = adaptive(phase_s, best)
    rates = [rate_quota(p, 4.0 if args.quick else 8.0) for p in (1, 4, 16)]
    brk = breaker(300)
    hedge = hedging(1_000 if args.quick else 3_000)
    cached = cache(4_000 if args.quick else 12_000)
    ordered = key_ordered(20_000 if args.quick else 100_000)
    phases = adapt["phases"]
    settles = [p["settle_s"] for p in phases[1:]]
    summary = {
        "benchmark": "services",
        "quick": args.quick,
        "phase_s": phase_s,
        "adaptive_vs_best_fixed": [p["vs_best_fixed"] for p in phases],
        "adaptive_vs_best_fixed_min": min(p["vs_best_fixed"] for p in phases),
        "share_429": adapt["share_429"],
        "settle_s": settles,
        "settle_s_max": None if None in settles else max(settles),
        "fixed_sweep_calls_per_s": {str(k): {str(c): r for c, r in v.items()} for k, v in sweeps.items()},
        "adaptive": adapt,
        "rate": rates,
        "rate_busiest_second_vs_quota_max": max(r["busiest_vs_quota"] for r in rates),
        "rate_mean_vs_quota_min": min(r["steady_mean_vs_quota"] or 0.0 for r in rates),
        "rate_mean_vs_quota_whole_run_min": min(r["mean_vs_quota"] for r in rates),
        "breaker": brk,
        "breaker_calls_vs_probes": brk["calls_vs_probes"],
        "breaker_recover_s": brk["recover_s"],
        "hedging": hedge,
        "hedged_p99_vs_plain": hedge["p99_vs_plain"],
        "hedge_extra_calls": hedge["extra_calls"],
        "cache": cached,
        "cache_calls_vs_unique_keys": cached["calls_vs_unique_keys"],
        "cache_throughput_vs_no_cache": cached["throughput_vs_no_cache"],
        "key_ordered": ordered,
        "key_ordered_vs_unordered": ordered["key_ordered_vs_unordered"],
        "key_ordered_vs_ordered": ordered["key_ordered_vs_ordered"],
    }
    emit("services", summary)


if __name__ == "__main__":
    main()
