"""The gate between an async operator's attempts and its service: what ``service.Service`` says.

Every attempt asks ``ServiceGate.admit`` before it calls, and the gate says how each call ended
(``call_ended``, ``forget``); the rules are in ``service``'s docstring. The gate holds the
attempts that may not call yet, the calls in flight and their hedges, the adaptive limit, the
call times leased from the rate quota (``service_quota``), a pause, the breaker's state and the
lookup cache.

Threading model: every method runs on the operator's mailbox thread; the quota's answers come
from any thread, through the mailbox.
"""

from __future__ import annotations

import copy
import heapq
import math
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Any, Callable, cast

from .errors import CircuitOpenError
from .key_ordered_queue import order_key_of
from .service import AdaptiveCapacity, RateLimit, Service, overload_of
from .service_quota import STALE_MS, Lease, LocalQuota, ServiceQuota, lease_size

if TYPE_CHECKING:
    from .async_attempt import AttemptHandler
    from .timers import ProcessingTimeService, TimerHandle

__all__ = ["COUNTERS", "ServiceGate", "ServiceMetrics"]


#: What a gate counts, in the order of its counters' store (``ServiceMetrics``).
COUNTERS = (
    "calls",  # calls that left for the service
    "overloads",  # overload answers (429, 503, ServiceOverloaded)
    "pauses",  # overload answers with a Retry-After that paused the service
    "breaker_opens",
    "breaker_rejections",  # attempts ended (fallback or failure) while the breaker was open
    "probes",  # calls let through while half-open
    "quota_granted",  # call times the quota gave this instance
    "quota_unused",  # of them, those that passed unused (dropped, never used late)
    "cache_hits",  # records answered from the cache, without a call
    "merged",  # records that waited for a call in flight for the same key instead of calling
    "hedges",  # second calls started for slow ones
    "hedge_wins",  # of them, those that answered first
)


def _counter(index: int) -> property:
    def get(self: ServiceMetrics) -> int:
        return int(self.store[index])

    def put(self: ServiceMetrics, value: int) -> None:
        self.store[index] = value

    return property(get, put)


class ServiceMetrics:
    """What a gate counts, for the operator's metrics (``service_*``): the ``COUNTERS``, kept in
    ``store`` (doubles, one per counter; a host may give memory that outlives the process, so
    that the counts of an instance that was killed are not lost), and three gauges."""

    # The counters, as properties over ``store`` (set below, one per name in COUNTERS).
    calls: int
    overloads: int
    pauses: int
    breaker_opens: int
    breaker_rejections: int
    probes: int
    quota_granted: int
    quota_unused: int
    cache_hits: int
    merged: int
    hedges: int
    hedge_wins: int

    def __init__(self, *, limit: float = 0.0, rate_per_s: float = 0.0, store: Any = None) -> None:
        self.store = store if store is not None else memoryview(bytearray(8 * len(COUNTERS))).cast("d")
        self.limit = limit  # calls allowed in flight now
        self.breaker_state = 0  # 0 closed, 1 open, 2 half-open
        self.rate_per_s = rate_per_s  # the service's rate limit, calls per second for all the instances (0: none)

    def __repr__(self) -> str:
        return f"ServiceMetrics({', '.join(f'{k}={v}' for k, v in self.figures().items())})"

    def figures(self) -> dict[str, float]:
        """As the instance's figures: ``service_*`` counters and gauges (``actors.metrics``)."""
        return {"service_calls": self.calls, "service_overloads": self.overloads, "service_pauses": self.pauses,
                "service_breaker_opens": self.breaker_opens, "service_breaker_rejections": self.breaker_rejections,
                "service_probes": self.probes, "service_concurrency_limit": self.limit,
                "service_breaker_state": self.breaker_state, "service_rate_limit": self.rate_per_s,
                "service_quota_granted": self.quota_granted, "service_quota_unused": self.quota_unused,
                "service_cache_hits": self.cache_hits, "service_merged": self.merged,
                "service_hedges": self.hedges, "service_hedge_wins": self.hedge_wins}


for _index, _name in enumerate(COUNTERS):
    setattr(ServiceMetrics, _name, _counter(_index))
del _index, _name

_CLOSED, _OPEN, _HALF_OPEN = 0, 1, 2
_NO_KEY = object()  # a call that no cache key stands for
_SERVED = object()  # _served answered the attempt, or made it wait for another's call
_IMMUTABLE = (int, float, str, bytes, bool, type(None))


def _private(raw: Any) -> Any:
    """A copy of a cached answer that no other record shares (immutable values are shared)."""
    if type(raw) is list:
        return [r if type(r) in _IMMUTABLE else copy.deepcopy(r) for r in raw]
    return raw if type(raw) in _IMMUTABLE else copy.deepcopy(raw)


_GO, _WAIT, _REJECT = 0, -1, -2  # _may_call's verdicts; a positive one is the time to look again
SHED_PER_OVERLOAD = 1.0  # what each further overload answer of a round trip takes off the limit
HOLD_MAX_S = 5.0  # the longest the limit holds under an edge before it probes above


class ServiceGate:
    """Decides when each attempt of an operator may call its service (module docstring).

    ``admit(handler)`` says whether the attempt may call now; when not, the gate keeps it and
    calls ``handler.call()`` itself once it may, or ends it as the breaker says
    (``handler.on_circuit_open``). ``call_ended`` and ``forget`` tell it how calls ended.
    """

    def __init__(
        self, service: Service, processing_time: ProcessingTimeService, put_mail: Callable[..., None], *,
        capacity: int, parallelism: int = 1, name: str = "async_wait", finish: Callable[[Any, Any], Any] | None = None,
        quota: ServiceQuota | None = None, counters: Any = None,
    ) -> None:
        self.service = service
        self.name = service.name or name
        self._time = processing_time
        self._put = put_mail  # completions.put: how a rejection re-enters the handler
        spec = service.capacity
        self._adaptive = spec if isinstance(spec, AdaptiveCapacity) else None
        if self._adaptive is not None:
            self.limit = float(self._adaptive.initial)
        else:
            self.limit = float(capacity if spec is None else min(cast(int, spec), capacity))
        self._slow_start = True
        self._known_max = 0.0  # the limit at the last overload: what the service did not take
        self._overload_ms = 0  # when that was
        self._rtt_ms: float | None = None  # smoothed latency of successful calls
        self._gain = 1.0  # while probing above it: calls added per round trip, doubled each round
        self._gain_from = 0.0  # the limit where the current gain started
        self._begun = 0  # calls let through so far: a call's number orders it against a decrease
        self._decrease_at = 0  # the calls numbered below this were sent before the last decrease
        self.in_flight = 0
        # call in flight -> (its number, is probe, its cache key or _NO_KEY, when it started)
        self._calls: dict[AttemptHandler, tuple[int, bool, Any, int]] = {}
        self._parked: deque[AttemptHandler] = deque()
        self._again: deque[AttemptHandler] = deque()  # overloaded calls to send again, before the parked
        self._parked_set: set[AttemptHandler] = set()
        self._overloads: dict[AttemptHandler, int] = {}
        rate = service.rate_limit
        assert rate is None or isinstance(rate, RateLimit)
        # The rate's call times come in leases from the quota: the service's, shared by every
        # instance (``quota``), or else this instance's even share of the rate, kept here.
        self._rate = 0.0 if rate is None else rate.per_second
        if rate is not None and quota is None:
            self._rate = rate.per_second / max(1, parallelism)
            quota = LocalQuota(self._rate, start_ms=processing_time.now_ms())
        self._quota = quota
        # What a lease asks for: this instance's share of LEASE_MS at first; twice as much each
        # time records had to wait for a lease, half as much each time call times went unused.
        self._lease_most = lease_size(self._rate) if self._rate else 0
        self._lease_size = 0 if rate is None else lease_size(rate.per_second / max(1, parallelism))
        self._leased = 0  # the calls the last lease was for
        self._leases: deque[list[float]] = deque()  # [next call time, spacing, calls left]
        self._leasing = False  # a lease is on its way
        if quota is not None:
            quota.watch(lambda until_ms: self._put(self._on_paused, until_ms))
        self._paused_until = 0
        self._breaker = service.breaker
        self._state = _CLOSED
        self._failures: deque[int] = deque()
        self._open_until = 0
        self._probes_in_flight = 0
        self._probe_successes = 0
        self._wake: TimerHandle | None = None
        self._wake_at: int | None = None
        cache = service.cache
        self._cache = cache
        self._cache_key = None if cache is None else order_key_of(cache.key)
        self._cached: OrderedDict[Any, tuple[int, list[Any]]] = OrderedDict()  # key -> (expires at, results)
        self._leaders: dict[Any, AttemptHandler] = {}  # key -> the attempt whose call is for it
        self._followers: dict[AttemptHandler, list[AttemptHandler]] = {}  # leader -> who waits for its call
        self._following: dict[AttemptHandler, AttemptHandler] = {}  # follower -> its leader
        # The function's ``finish(value, raw)`` (an ``async def``'s direct_finish), which makes a
        # record's results of what its coroutine returned: the cache keeps what the coroutine
        # returned, and each record's results are made of it and its own value.
        self._finish = finish
        self._raw: dict[AttemptHandler, Any] = {}  # what a leader's coroutine returned, until its call ends
        #: Whether the calls must tell what their coroutine returned before ``finish`` (the cache keeps that).
        self.caches_raw = cache is not None and finish is not None
        self.hedge = service.hedge
        self._latencies: deque[int] = deque(maxlen=1_000)  # of recent successful calls, for a percentile
        self._hedge_due: list[tuple[int, int, AttemptHandler]] = []  # heap of (due, call number, handler)
        self._hedging: set[AttemptHandler] = set()  # attempts with a second call in flight
        # ``counters``: where the counts go (``ServiceMetrics.store``), if the host keeps them.
        self.metrics = ServiceMetrics(limit=self.limit, rate_per_s=0.0 if rate is None else rate.per_second,
                                      store=counters)

    # ----------------------------------------------------------------- attempts

    def admit(self, handler: AttemptHandler) -> bool:
        """True: the attempt calls now (it counts as in flight). False: the gate keeps it, or
        ends it because the breaker is open."""
        now = self._time.now_ms()
        key = _NO_KEY if self._cache is None else self._served(handler, now)
        if key is _SERVED:
            return False
        verdict = _WAIT if self._parked or self._again else self._may_call(now)
        if verdict == _GO:
            self._begin(handler, now, key)
            return True
        if verdict == _REJECT:
            self._reject(handler)
            return False
        self._parked.append(handler)
        self._parked_set.add(handler)
        if verdict > 0:
            self._wake_up_at(verdict)
        return False

    def call_ended(self, handler: AttemptHandler, error: BaseException | None, results: Any = None) -> bool:
        """A call the gate let through ended (``error`` None: it succeeded with ``results``). True
        when it was an overload answer that the gate will send again: the attempt goes on,
        without an outcome."""
        entry = self._calls.pop(handler, None)
        if entry is None:
            return False
        number, probe, key, started_ms = entry
        raw = self._raw.pop(handler, results) if self._raw else results
        if error is None and self.hedge is not None:
            self._latencies.append(self._time.now_ms() - started_ms)
        if error is None and self._adaptive is not None:
            latency = self._time.now_ms() - started_ms
            self._rtt_ms = latency if self._rtt_ms is None else self._rtt_ms + (latency - self._rtt_ms) / 8
        if key is not _NO_KEY:
            self._lead_ended(handler, key, raw if error is None else None)
        self.in_flight -= 1
        now = self._time.now_ms()
        retry_after = overload_of(error)
        if error is None:
            self._succeeded(probe)
        elif retry_after is not None:
            self.metrics.overloads += 1
            self._overloaded(number)
            if retry_after > 0:
                self._paused_until = max(self._paused_until, now + math.ceil(retry_after * 1000))
                self.metrics.pauses += 1
                if self._quota is not None:
                    self._quota.pause(self._paused_until)  # every instance of the service pauses
            self._failed(probe, now)
        else:
            counts = self._breaker.counts if self._breaker is not None else None
            if counts is None or counts(error):
                self._failed(probe, now)
            elif probe:
                self._succeeded(probe)  # the service answered: it is up
        again = False
        if retry_after is not None:
            sent_again = self._overloads.get(handler, 0)
            if sent_again < self.service.overload_retries:
                self._overloads[handler] = sent_again + 1
                handler.future = None
                self._again.append(handler)  # it keeps its place: before the records behind it
                self._parked_set.add(handler)
                again = True
        self._drain(now)
        return again

    def hedge_ended(self, handler: AttemptHandler, *, won: bool) -> None:
        """One of an attempt's two calls answered first, and the other was cancelled."""
        if handler in self._hedging:
            self._hedging.discard(handler)
            self.in_flight -= 1
            self.metrics.hedge_wins += won

    def forget(self, handler: AttemptHandler, *, cut_off: bool = False) -> None:
        """The attempt left the gate's hands (its outcome is decided, or its deadline passed);
        ``cut_off``: a call of it in flight was cut off by the deadline, which counts as overload."""
        self._overloads.pop(handler, None)
        if handler in self._hedging:  # its second call, cancelled with the first
            self._hedging.discard(handler)
            self.in_flight -= 1
        if handler in self._parked_set:
            self._parked_set.discard(handler)  # left in the deque; skipped when its turn comes
            return
        leader = self._following.pop(handler, None)
        if leader is not None:
            self._followers[leader].remove(handler)
            return
        entry = self._calls.pop(handler, None)
        if entry is None:
            return
        if entry[2] is not _NO_KEY:
            self._lead_ended(handler, entry[2], None)
        self.in_flight -= 1
        now = self._time.now_ms()
        if cut_off:
            self._overloaded(entry[0])
            self._failed(entry[1], now)
        elif entry[1]:
            self._probes_in_flight -= 1
        self._drain(now)

    # -------------------------------------------------------------- the cache

    def _key(self, handler: AttemptHandler) -> Any:
        """The cache key of the handler's record, or _NO_KEY where it has none that hashes."""
        try:
            key = self._cache_key(handler.record.value)  # type: ignore[misc, attr-defined]
            hash(key)
        except Exception:
            return _NO_KEY  # called as if there were no cache
        return key

    def _served(self, handler: AttemptHandler, now: int) -> Any:
        """Answer the attempt from the cache, or make it wait for the call in flight for its key:
        _SERVED; else the attempt's cache key (_NO_KEY where it has none), for its own call."""
        key = self._key(handler)
        if key is _NO_KEY:
            return key
        hit = self._cached.get(key)
        if hit is not None:
            if hit[0] > now:
                self._cached.move_to_end(key)
                self.metrics.cache_hits += 1
                self._answer(handler, hit[1])
                return _SERVED
            del self._cached[key]
        leader = self._leaders.get(key)
        if leader is None:
            return key
        self._followers[leader].append(handler)
        self._following[handler] = leader
        self.metrics.merged += 1
        return _SERVED

    def note_raw(self, handler: AttemptHandler, raw: Any) -> None:
        """What the coroutine of the handler's call returned, before ``finish``: what the cache keeps."""
        if handler in self._calls and self._calls[handler][2] is not _NO_KEY:
            self._raw[handler] = raw

    def _answer(self, handler: AttemptHandler, raw: Any) -> None:
        """The handler's results, made of a cached answer without a call."""
        results, error = _private(raw), None
        if self._finish is not None:
            try:
                results = self._finish(handler.record.value, results)  # type: ignore[attr-defined]
            except Exception as exc:
                results, error = None, exc
        self._put(handler.on_attempt_complete, handler.attempt, None if error is not None else list(results), error)

    def _lead_ended(self, leader: AttemptHandler, key: Any, results: Any) -> None:
        """The call for ``key`` ended: with ``results``, they go to the cache and to each record
        that waited for them; else those records are sent themselves."""
        if self._leaders.get(key) is leader:
            del self._leaders[key]
        followers = self._followers.pop(leader, [])
        for follower in followers:
            del self._following[follower]
        if results is not None:
            assert self._cache is not None
            self._cached[key] = (self._time.now_ms() + math.ceil(self._cache.ttl_s * 1000), _private(results))
            self._cached.move_to_end(key)
            while len(self._cached) > self._cache.max_size:
                self._cached.popitem(last=False)
            for follower in followers:
                self._answer(follower, results)
            return
        for follower in followers:
            self._parked.append(follower)  # each goes through the gate now, its own call
            self._parked_set.add(follower)

    # -------------------------------------------------------------- internals

    def _may_call(self, now: int) -> int:
        if self._breaker is not None and self._state != _CLOSED:
            if self._state == _OPEN:
                if now < self._open_until:
                    return self._open_until if self._breaker.when_open == "wait" else _REJECT
                self._state, self._probes_in_flight, self._probe_successes = _HALF_OPEN, 0, 0
                self.metrics.breaker_state = _HALF_OPEN
            if self._probes_in_flight + self._probe_successes >= self._breaker.probes:
                return _WAIT if self._breaker.when_open == "wait" or self._probes_in_flight else _REJECT
        if now < self._paused_until:
            return self._paused_until
        if self.in_flight >= int(self.limit):
            return _WAIT
        if self._rate:
            slot = self._slot(now)
            if slot is None:
                if not self._leasing:
                    self._lease_size = min(self._lease_most, self._lease_size * 2)
                self._lease(now)
                return _WAIT  # until the lease comes (_on_lease)
            if slot > now:
                return math.ceil(slot)
        return _GO

    def _begin(self, handler: AttemptHandler, now: int, key: Any) -> None:
        """Let the attempt's call go; ``key``: its cache key (``_served``'s), whose call it leads."""
        if key is not _NO_KEY:
            self._leaders[key] = handler  # _served found no call in flight for it
            self._followers[handler] = []
        probe = self._state == _HALF_OPEN
        if probe:
            self._probes_in_flight += 1
            self.metrics.probes += 1
        if self._rate:
            self._take_slot(now)
        self.in_flight += 1
        self._calls[handler] = (self._begun, probe, key, now)
        if self.hedge is not None and not probe:
            delay = self._hedge_delay()
            if delay is not None:
                heapq.heappush(self._hedge_due, (now + delay, self._begun, handler))
                self._wake_up_at(now + delay)
        self._begun += 1
        self.metrics.calls += 1

    def _reject(self, handler: AttemptHandler) -> None:
        self.metrics.breaker_rejections += 1
        self._overloads.pop(handler, None)
        error = CircuitOpenError(
            f"not sent: the circuit breaker of {self.name} is open (it opened after {self._breaker.failures} failed calls "  # type: ignore[union-attr]
            f"within {self._breaker.window_s} s; it probes again {max(0, self._open_until - self._time.now_ms())} ms from now)")  # type: ignore[union-attr]
        self._put(handler.on_circuit_open, handler.attempt, error)

    def _drain(self, now: int) -> None:
        while self._again or self._parked:
            parked = self._again or self._parked
            handler = parked[0]
            if handler not in self._parked_set:
                parked.popleft()
                continue
            verdict = self._may_call(now)
            if verdict == _WAIT:
                return
            if verdict > 0:
                self._wake_up_at(verdict)
                return
            parked.popleft()
            self._parked_set.discard(handler)
            if handler.deadline_ms is not None and handler.deadline_ms <= now:
                handler.on_timeout()  # its deadline passed while it waited: it is not sent
                continue
            key = _NO_KEY if self._cache is None else self._served(handler, now)
            if key is _SERVED:
                continue
            if verdict == _REJECT:
                self._reject(handler)
                continue
            self._begin(handler, now, key)
            handler.call()

    def _wake_up_at(self, when_ms: int) -> None:
        if self._wake_at is not None and self._wake_at <= when_ms:
            return
        if self._wake is not None:
            self._wake.cancel()
        self._wake_at = when_ms
        self._wake = self._time.register_timer(when_ms, self._on_wake)

    def _on_wake(self, timestamp_ms: int) -> None:
        self._wake = self._wake_at = None
        now = self._time.now_ms()
        if self._hedge_due:
            self._start_hedges(now)
        self._drain(now)

    # ------------------------------------------------------------- rate quota

    def _slot(self, now: int) -> float | None:
        """The next call time of the leases, dropping those more than STALE_MS past; None: none left."""
        leases = self._leases
        while leases:
            lease = leases[0]
            late = now - STALE_MS - lease[0]
            if late > 0:
                dropped = min(int(lease[2]), math.ceil(late / lease[1]))
                lease[0] += dropped * lease[1]
                lease[2] -= dropped
                self.metrics.quota_unused += dropped
                self._lease_size = max(1, self._lease_size // 2)
            if lease[2] > 0:
                return lease[0]
            leases.popleft()
        return None

    def _take_slot(self, now: int) -> None:
        """A call leaves at the next call time (``_slot`` found it due); ask for the next lease
        early, while records wait, so that the calls do not wait for it."""
        lease = self._leases[0]
        lease[0] += lease[1]
        lease[2] -= 1
        if not lease[2]:
            self._leases.popleft()
        if self._parked_set and sum(left for _, _, left in self._leases) * 2 <= self._leased:
            self._lease(now)

    def _lease(self, now: int) -> None:
        """Ask the quota for call times: one for each record that waits for a call, up to a lease."""
        if not self._leasing:
            assert self._quota is not None
            self._leasing = True
            self._leased = min(self._lease_size, max(1, len(self._parked_set)))
            self._quota.lease(self._leased, now, lambda lease: self._put(self._on_lease, lease))

    def _on_lease(self, lease: Lease | BaseException) -> None:
        self._leasing = False
        if isinstance(lease, BaseException):
            raise lease  # the quota could not be reached: the operator fails, and a restore retries
        self._leases.append([lease.first_ms, lease.spacing_ms, float(lease.count)])
        self.metrics.quota_granted += lease.count
        self._paused_until = max(self._paused_until, lease.paused_until_ms)
        self._drain(self._time.now_ms())

    def _on_paused(self, until_ms: int) -> None:
        """An instance of the service (this one, or another) was asked to pause until ``until_ms``."""
        if until_ms > self._paused_until:
            self._paused_until = until_ms
            self._drain(self._time.now_ms())

    # ---------------------------------------------------------------- hedging

    def _hedge_delay(self) -> int | None:
        hedge = self.hedge
        assert hedge is not None
        if hedge.after_ms is not None:
            return hedge.after_ms
        if len(self._latencies) < hedge.min_samples:
            return None
        ordered = sorted(self._latencies)
        return max(1, ordered[min(len(ordered) - 1, int(hedge.percentile * len(ordered)))])  # type: ignore[operator]

    def _may_hedge(self, now: int) -> bool:
        """Room for a second call: beyond the calls in flight by a tenth of the limit (at least
        one), with the breaker closed, no pause, and a call of the rate limit to spare (none
        while records wait for their first call)."""
        if self._state != _CLOSED or now < self._paused_until:
            return False
        if len(self._hedging) >= max(1, int(self.limit * 0.1)):
            return False
        if self._rate:
            if self._parked or self._again:
                return False
            slot = self._slot(now)
            if slot is None or slot > now:
                return False
        return True

    def _start_hedges(self, now: int) -> None:
        """A second call for each call whose hedge delay has passed, where there is room for it."""
        due = self._hedge_due
        while due and due[0][0] <= now:
            _, number, handler = heapq.heappop(due)
            entry = self._calls.get(handler)
            if entry is None or entry[0] != number or handler in self._hedging or not handler.is_calling:
                continue  # that call has ended, or has its hedge
            if not self._may_hedge(now):
                continue
            if not handler.start_hedge():
                continue
            self._hedging.add(handler)
            self.in_flight += 1
            if self._rate:
                self._take_slot(now)
            self.metrics.hedges += 1
            self.metrics.calls += 1
        if due:
            self._wake_up_at(due[0][0])

    def _succeeded(self, probe: bool) -> None:
        if probe:
            self._probes_in_flight -= 1
            self._probe_successes += 1
            if self._state == _HALF_OPEN and self._probe_successes >= self._breaker.probes:  # type: ignore[union-attr]
                self._state = _CLOSED
                self._failures.clear()
                self.metrics.breaker_state = _CLOSED
        adaptive = self._adaptive
        if adaptive is not None and (self._parked or self._again or self.in_flight + 1 >= int(self.limit)):
            self._grow(adaptive)

    def _grow(self, adaptive: AdaptiveCapacity) -> None:
        """A call succeeded while the limit was in use (module docstring, "Adaptive capacity")."""
        limit = self.limit
        if self._slow_start:
            limit += 1.0
        elif limit < self._known_max - 1.0:
            limit = min(limit + 1.0, self._known_max - 1.0)  # back to just under it, doubling per round trip
        elif self._time.now_ms() - self._overload_ms >= self._hold_ms(adaptive):
            limit += self._gain / limit  # probing above it, faster each round trip
            if limit >= self._gain_from + self._gain:
                self._gain_from, self._gain = limit, self._gain * 2
                # Two round trips above it without an overload: the service has grown, and the
                # limit doubles each round trip again until it finds the new edge.
                self._slow_start = self._gain >= 4
        self.limit = min(float(adaptive.ceiling), limit)
        self.metrics.limit = self.limit

    def _hold_ms(self, adaptive: AdaptiveCapacity) -> float:
        """How long the limit holds under the edge it met before it probes above: ``hold_per_call``
        round trips per call of the limit, within ``probe_after_s`` and ``HOLD_MAX_S``."""
        held = adaptive.hold_per_call * self.limit * (self._rtt_ms or 0.0)
        return min(HOLD_MAX_S * 1000, max(adaptive.probe_after_s * 1000, held))

    def _overloaded(self, number: int) -> None:
        adaptive = self._adaptive
        if adaptive is None:
            return
        if number < self._decrease_at:
            # Sent before the last decrease, which answered for the round trip; each more call
            # of that round trip turned away was a slot the service did not have.
            self.limit = max(float(adaptive.floor), self.limit - SHED_PER_OVERLOAD)
            self._known_max = max(float(adaptive.floor), self._known_max - SHED_PER_OVERLOAD)
            self.metrics.limit = self.limit
            return
        # A probe above the plateau that met an overload goes back to the plateau: the limit
        # under it was fine. Otherwise the limit backs off.
        plateau = None if self._slow_start else self._known_max - 1.0
        self._slow_start = False
        limit = self.limit * adaptive.backoff
        if plateau is not None and self.limit > plateau:
            limit = max(limit, plateau)
        self._known_max = self.limit
        self._overload_ms = self._time.now_ms()
        self.limit = max(float(adaptive.floor), limit)
        self._gain, self._gain_from = 1.0, self.limit
        self._decrease_at = self._begun
        self.metrics.limit = self.limit

    def _failed(self, probe: bool, now: int) -> None:
        breaker = self._breaker
        if breaker is None:
            return
        if probe:
            self._probes_in_flight -= 1
        if self._state == _HALF_OPEN and probe:
            self._open(now)
            return
        if self._state != _CLOSED:
            return  # a call sent before the breaker opened: it knows already
        failures = self._failures
        failures.append(now)
        while failures and failures[0] <= now - breaker.window_s * 1000:
            failures.popleft()
        if len(failures) >= breaker.failures:
            self._open(now)

    def _open(self, now: int) -> None:
        assert self._breaker is not None
        self._state = _OPEN
        self._open_until = now + math.ceil(self._breaker.open_s * 1000)
        self._failures.clear()
        self.metrics.breaker_opens += 1
        self.metrics.breaker_state = _OPEN
        if self._breaker.when_open == "wait":
            self._wake_up_at(self._open_until)

    # --------------------------------------------------------------- snapshots

    def snapshot(self) -> dict[str, Any]:
        """What a restore keeps: the learned limit, the rest of a pause and of an open breaker."""
        now = self._time.now_ms()
        return {"limit": self.limit, "slow_start": self._slow_start, "known_max": self._known_max,
                "paused_ms": max(0, self._paused_until - now),
                "open_ms": max(0, self._open_until - now) if self._state == _OPEN else None}

    def restore(self, state: dict[str, Any]) -> None:
        now = self._time.now_ms()
        if self._adaptive is not None:
            self.limit = min(float(self._adaptive.ceiling), max(float(self._adaptive.floor), float(state["limit"])))
            self._slow_start = bool(state["slow_start"])
            self._known_max = float(state.get("known_max", 0.0))
            self._overload_ms = now  # hold under it for a while after the restore, too
            self._gain_from = self.limit
            self.metrics.limit = self.limit
        self._paused_until = now + int(state["paused_ms"])
        if self._paused_until > now and self._quota is not None:
            self._quota.pause(self._paused_until)
        if state["open_ms"] is not None and self._breaker is not None:
            self._state, self._open_until = _OPEN, now + int(state["open_ms"])
            self.metrics.breaker_state = _OPEN
            if self._breaker.when_open == "wait":
                self._wake_up_at(self._open_until)
