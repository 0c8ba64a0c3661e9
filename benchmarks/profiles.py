"""The simulated external service of the benchmarks: pure latency, no CPU cost.

Every system under test calls the same service, so that a difference in throughput is the
system's own. A *profile* fixes the latency of each record as a pure function of its id: every
system, every instance and every run sees exactly the same latency for record 17.

- ``"constant"``: 20 ms for every record.
- ``"lognormal"``: median 20 ms, ``sigma = ln(10) / 2.326``, so that the 99th percentile is
  200 ms (ten times the median); the mean is ``20 * exp(sigma**2 / 2)``, about 32.6 ms.
- ``"skewed"``: 20 ms, but a slow shard of users (one user id in ten, ``id // 7``) answers in
  100 ms, and one record in 2,000 (chosen by hash) in 1.5 s: the profile on which ordered
  output pays for a slow head of its queue.

A call sleeps its latency and returns :func:`call_result` of the record id, a value a benchmark
can check to prove that every record was really called. ``async_call`` sleeps with
:func:`benchmarks.fd_sleep.fd_sleep` (for event-loop systems), ``blocking_call`` with
``time.sleep`` (for thread pools). Both end at the deadline, as a socket's answer would: a
thread's sleep does, and ``fd_sleep`` wakes the event loop through a kernel timer on a file
descriptor. ``asyncio.sleep`` would end on the loop's next millisecond tick instead, which
bunches the calls in flight into waves (see ``benchmarks.fd_sleep``). Neither call spends CPU
beyond the cost of sleeping.

Example::

    p = get_profile("lognormal")
    p.latency_ms(17) == p.latency_ms(17)            # True: a function of the id
    mean_latency_ms("lognormal", 50_000)            # about 32.6
    asyncio.run(p.async_call(17)) == call_result(17)
"""

from __future__ import annotations

import asyncio
import heapq
import math
import statistics
import time
from dataclasses import dataclass

import numpy as np

__all__ = [
    "PROFILES",
    "LOGNORMAL_SIGMA",
    "LatencyProfile",
    "get_profile",
    "latency_ms",
    "mean_latency_ms",
    "call_result",
    "bare_asyncio_rps",
    "schedule_rps",
]

# z of the 99th percentile of the standard normal: exp(z * sigma) = 10 puts p99 at 10 x median.
_Z99 = 2.326
LOGNORMAL_SIGMA = math.log(10.0) / _Z99

_MASK64 = (1 << 64) - 1
_STANDARD_NORMAL = statistics.NormalDist()


def _mix64(x: int) -> int:
    """splitmix64's finaliser: spreads consecutive ids over 64 bits, the same in every process
    (``hash()`` is not: it is salted for str, and ``random.Random`` would cost a seeding per id)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def call_result(record_id: int) -> int:
    """What a call for ``record_id`` returns; ``record_id * 31 + 7``, easy to check in Spark SQL."""
    return record_id * 31 + 7


@dataclass(frozen=True)
class LatencyProfile:
    """Per-record latency ``median_ms * exp(sigma * z(record_id))``, where ``z`` is a standard
    normal quantile drawn from ``(seed, record_id)`` by hashing, not by a stateful generator, so
    that the latency of a record does not depend on which records were drawn before it.
    ``sigma = 0`` gives a constant latency.

    Frozen and made of plain fields, so it pickles cheaply into Spark and Ray workers.
    """

    name: str
    median_ms: float
    sigma: float = 0.0
    seed: int = 0
    slow_shard_every: int = 0  # users (record_id // 7) with user % slow_shard_every == 0 are slow
    slow_shard_ms: float = 0.0
    tail_every: int = 0  # one record in tail_every, by hash, takes tail_ms
    tail_ms: float = 0.0

    def latency_ms(self, record_id: int) -> float:
        if self.tail_every and _mix64((record_id ^ (self.seed * 0x2545F4914F6CDD1D)) & _MASK64) % self.tail_every == 0:
            return self.tail_ms
        if self.slow_shard_every and (record_id // 7) % self.slow_shard_every == 0:
            return self.slow_shard_ms
        if self.sigma == 0.0:
            return self.median_ms
        h = _mix64((record_id ^ (self.seed * 0x2545F4914F6CDD1D)) & _MASK64)
        # The top 53 bits, centred in their cell: u is in (0, 1), never 0 or 1, so inv_cdf is
        # finite.
        u = ((h >> 11) + 0.5) / float(1 << 53)
        return self.median_ms * math.exp(self.sigma * _STANDARD_NORMAL.inv_cdf(u))

    async def async_call(self, record_id: int) -> int:
        """The service call for event loops: ``fd_sleep`` of the record's latency."""
        # Imported here: Spark's Python workers unpickle this class by value (see
        # benchmarks.baselines.spark_threadpool) and only ever call blocking_call.
        from benchmarks.fd_sleep import fd_sleep

        await fd_sleep(self.latency_ms(record_id) / 1000.0)
        return call_result(record_id)

    def blocking_call(self, record_id: int) -> int:
        """The service call for threads: ``time.sleep`` of the record's latency (the GIL is
        released while it sleeps)."""
        time.sleep(self.latency_ms(record_id) / 1000.0)
        return call_result(record_id)

    def mean_latency_ms(self, n: int) -> float:
        """Mean latency over record ids ``0 .. n-1``: Little's law's ``L`` for a run of ``n``."""
        if n <= 0:
            raise ValueError(f"n must be > 0, got {n}")
        if self.sigma == 0.0 and not self.tail_every and not self.slow_shard_every:
            return self.median_ms
        return math.fsum(self.latency_ms(i) for i in range(n)) / n


_PROFILES: dict[str, LatencyProfile] = {
    "constant": LatencyProfile("constant", median_ms=20.0),
    "lognormal": LatencyProfile("lognormal", median_ms=20.0, sigma=LOGNORMAL_SIGMA, seed=20240607),
    "skewed": LatencyProfile("skewed", median_ms=20.0, seed=20251123, slow_shard_every=10, slow_shard_ms=100.0,
                             tail_every=2_000, tail_ms=1_500.0),
}
PROFILES: tuple[str, ...] = tuple(_PROFILES)


def get_profile(profile: str | LatencyProfile) -> LatencyProfile:
    """The profile of that name (a profile passes through)."""
    if isinstance(profile, LatencyProfile):
        return profile
    try:
        return _PROFILES[profile]
    except KeyError:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}") from None


def latency_ms(profile: str | LatencyProfile, record_id: int) -> float:
    """The latency of ``record_id`` under ``profile``, in milliseconds."""
    return get_profile(profile).latency_ms(record_id)


def mean_latency_ms(profile: str | LatencyProfile, n: int) -> float:
    """Mean latency of record ids ``0 .. n-1`` under ``profile``, from the same per-record values
    the calls sleep; ``capacity * instances / mean_latency_ms * 1000`` is the Little's-law bound in
    records/s."""
    return get_profile(profile).mean_latency_ms(n)


def schedule_rps(profile: str | LatencyProfile, n: int, capacity: int, instances: int) -> float:
    """Records/s of a runtime that costs nothing, on exactly these records: each of ``instances``
    takes a contiguous share of ids ``0 .. n-1`` (as an unordered stage's splits do) and starts
    its next record the moment one of its ``capacity`` slots frees; the rate is ``n`` over the
    time its slowest instance finishes.

    Little's law (``mean_latency_ms``) holds for an endless stream. A finite run also waits for
    its last calls: at most ``capacity`` calls are in flight when the input ends, and under a
    spread of latencies the slowest of them sets the end. With ``n`` of 50,000, ``capacity``
    of 1,000 and the lognormal profile this schedule reaches 0.55 of Little's bound.
    """
    p = get_profile(profile)
    finish = 0.0
    for share in np.array_split(np.arange(n), instances):
        slots = [0.0] * min(capacity, len(share))
        for record_id in share.tolist():
            heapq.heapreplace(slots, slots[0] + p.latency_ms(record_id))
        finish = max(finish, max(slots, default=0.0))
    return n / finish * 1000.0 if finish else float("inf")


async def _trivial_request(record_id: int) -> int:
    await asyncio.sleep(0)  # one suspension, as a request that awaits a ready future
    return record_id


async def _run_trivial_requests(n: int) -> float:
    started = time.perf_counter()
    results = await asyncio.gather(*(_trivial_request(i) for i in range(n)))
    elapsed = time.perf_counter() - started
    if len(results) != n:  # pragma: no cover - gather returns one result per awaitable
        raise RuntimeError(f"expected {n} results, got {len(results)}")
    return n / elapsed


def bare_asyncio_rps(n: int = 20_000, repeats: int = 3) -> float:
    """Requests/s that a bare asyncio loop on one thread reaches for trivial requests, measured.

    A request is a task for a coroutine that suspends once (``asyncio.sleep(0)``) and returns: the
    scheduling cost of an async request with none of its waiting. This is the ceiling of one
    event loop, hence of one async instance, whatever the capacity. The best of ``repeats`` runs
    on fresh loops is returned, so that a stray pause of the machine does not lower the ceiling.
    """
    if n <= 0:
        raise ValueError(f"n must be > 0, got {n}")
    if repeats <= 0:
        raise ValueError(f"repeats must be > 0, got {repeats}")
    return max(asyncio.run(_run_trivial_requests(n)) for _ in range(repeats))
