"""The service an async operator calls: how many calls at once, how fast, and whether at all.

A ``Service`` describes what an async operator knows of the system it calls; its ``ServiceGate``
stands between the operator's attempts and the user's function. Every attempt asks the gate
before it calls, and tells it how the call ended. The gate holds an attempt back (it waits in
the gate, in the operator's queue and so in its snapshots) while

- ``capacity`` calls are in flight: a fixed number, or ``AdaptiveCapacity`` (``"auto"``), which
  follows what the service takes;
- the ``rate_limit`` has no call left for now (a token bucket, split evenly between the
  operator's instances, each with a burst of 5 % of its second's share, at least one call);
- the service asked for a pause: an overload answer with ``Retry-After`` stops every call of
  the gate until then, not only the one answered;
- the ``breaker`` is open (``CircuitBreaker``).

Before any of that, a ``LookupCache`` may answer the attempt without a call: from the results
of its key, or from the call in flight for its key (see ``LookupCache``).
A ``Hedge`` starts a second call for a call that is slow, with the same idempotency key; the
first answer counts and the other call is cancelled (see ``Hedge``).

**Overload answers.** An attempt that ends in ``ServiceOverloaded``, or in any error with a
``status`` (or ``status_code``, or ``response.status_code``) of 429 or 503, is an overload answer:
the service did not do the work. The gate sends the record again when it may (after the
``Retry-After`` the error carries in ``retry_after_s`` or its ``headers``), up to
``overload_retries`` times per record without counting an attempt of the ``retry`` strategy;
past that, the answer is an ordinary failure. The record's deadline spans all of it.

**Adaptive capacity** is additive increase, multiplicative decrease (TCP's AIMD), with a
plateau. Until the first overload the limit grows by one per success, doubling per round trip
(slow start). An overload answer, or a call cut off by its deadline, lowers it to ``backoff``
times itself, once per round trip (a call started before the last decrease does not lower it
again), and remembers the limit that met it. While the limit is in use, each call that succeeds
raises it by ``1 / limit`` (one per round trip) up to one under that remembered limit, where it
holds for ``probe_after_s``; then it probes above, adding 1, 2, 4, ... calls per round trip until
the next overload, so that a service that has grown is found in a few round trips. AIMD and
not a latency gradient: a rate-limited API says when it is full (429, 503), while its latency
often does not change until then, and a gradient limiter mistakes a slow tail for congestion.
``backoff`` is 0.9, not TCP's 0.5, and the plateau keeps the limit from probing the service's
edge every round trip: each probe costs an overload answer and, with ``Retry-After``, a pause of
every call.

**The circuit breaker** opens after ``failures`` failed calls within ``window_s`` (overload
answers, calls cut off by their deadline, and errors that ``counts`` accepts). While open, no
call leaves: a record's attempt ends at once in its ``timeout()`` (``when_open="fallback"``),
in a ``CircuitOpenError`` (``"fail"``: a dead letter or the job's failure, as ``on_error``
says), or waits for the breaker to close (``"wait"``). After ``open_s`` it lets ``probes`` calls
through (half-open); when they all succeed it closes, and one that fails opens it again.

Threading model: every method runs on the operator's mailbox thread.

>>> Service(capacity="auto", rate_limit=50).capacity
AdaptiveCapacity(initial=8, ceiling=256, floor=1, backoff=0.9, probe_after_s=1.0)
"""

from __future__ import annotations

import math
from collections import deque
import copy
import dataclasses
import heapq
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Union, cast

from .errors import CircuitOpenError, ConfigurationError
from .key_ordered_queue import order_key_of

if TYPE_CHECKING:
    from .async_attempt import AttemptHandler
    from .timers import ProcessingTimeService, TimerHandle

__all__ = [
    "AdaptiveCapacity", "CircuitBreaker", "RateLimit", "Service", "ServiceGate", "ServiceMetrics", "ServiceOverloaded",
    "overload_of",
]


class ServiceOverloaded(Exception):
    """Raised by a user's function when the service answered that it is overloaded.

    ``retry_after_s``: how long the service asked callers to wait (its ``Retry-After``), if it did.
    """

    def __init__(self, message: str = "the service is overloaded", retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.retry_after_s))


_OVERLOAD_STATUSES = frozenset({429, 503})


def _retry_after(error: BaseException) -> float | None:
    seconds = getattr(error, "retry_after_s", None)
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
        return max(0.0, float(seconds))
    headers = getattr(error, "headers", None)
    if headers is None:
        headers = getattr(getattr(error, "response", None), "headers", None)
    if isinstance(headers, Mapping) or hasattr(headers, "get"):
        text = headers.get("Retry-After")  # type: ignore[union-attr]
        try:
            return max(0.0, float(text)) if text is not None else None
        except (TypeError, ValueError):
            return None  # an HTTP date: no pause of its own, the limit still falls
    return None


def overload_of(error: BaseException | None) -> float | None:
    """For an overload answer, the seconds the service asked to wait (0.0 when it did not say);
    None for anything else.

    >>> overload_of(ServiceOverloaded(retry_after_s=2))
    2.0
    >>> class HTTPError(Exception):
    ...     status = 503
    >>> overload_of(HTTPError()), overload_of(KeyError("x")), overload_of(None)
    (0.0, None, None)
    """
    if error is None:
        return None
    if not isinstance(error, ServiceOverloaded):
        status = getattr(error, "status", None)
        if status is None:
            status = getattr(error, "status_code", None)
        if status is None:
            status = getattr(getattr(error, "response", None), "status_code", None)
        if status not in _OVERLOAD_STATUSES:
            return None
    seconds = _retry_after(error)
    return 0.0 if seconds is None else seconds


@dataclass(frozen=True)
class AdaptiveCapacity:
    """Calls in flight that follow the service: AIMD between ``floor`` and ``ceiling``."""

    initial: int = 8
    ceiling: int = 256
    floor: int = 1
    backoff: float = 0.9
    #: How long the limit holds just under the last limit that met an overload before it probes
    #: above it again.
    probe_after_s: float = 1.0

    def __post_init__(self) -> None:
        for name in ("initial", "ceiling", "floor"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigurationError(f"AdaptiveCapacity({name}=...) must be an int >= 1, got {value!r}")
        if not self.floor <= self.initial <= self.ceiling:
            raise ConfigurationError(
                f"AdaptiveCapacity needs floor <= initial <= ceiling, got {self.floor}, {self.initial}, {self.ceiling}")
        if not isinstance(self.backoff, (int, float)) or not 0 < self.backoff < 1:
            raise ConfigurationError(f"AdaptiveCapacity(backoff=...) must be in (0, 1), got {self.backoff!r}")
        if not isinstance(self.probe_after_s, (int, float)) or isinstance(self.probe_after_s, bool) or self.probe_after_s < 0:
            raise ConfigurationError(f"AdaptiveCapacity(probe_after_s=...) must be seconds >= 0, got {self.probe_after_s!r}")


@dataclass(frozen=True)
class RateLimit:
    """At most ``calls`` calls per ``per`` (``"second"`` or ``"minute"``), for all the operator's
    instances together."""

    calls: float
    per: Literal["second", "minute"] = "second"

    def __post_init__(self) -> None:
        if not isinstance(self.calls, (int, float)) or isinstance(self.calls, bool) or not self.calls > 0:
            raise ConfigurationError(f"RateLimit(calls=...) must be a number > 0, got {self.calls!r}")
        if self.per not in ("second", "minute"):
            raise ConfigurationError(f"RateLimit(per=...) must be 'second' or 'minute', got {self.per!r}")

    @property
    def per_second(self) -> float:
        return float(self.calls) if self.per == "second" else self.calls / 60.0


@dataclass(frozen=True)
class CircuitBreaker:
    """Stop calling a service that fails: open after ``failures`` failed calls within
    ``window_s``, probe with ``probes`` calls after ``open_s``."""

    failures: int = 5
    window_s: float = 10.0
    open_s: float = 5.0
    probes: int = 1
    when_open: Literal["fallback", "fail", "wait"] = "fail"
    #: Which errors count as failures of the service (overload answers and deadlines always do);
    #: default: every error.
    counts: Callable[[BaseException], bool] | None = None

    def __post_init__(self) -> None:
        for name in ("failures", "probes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigurationError(f"CircuitBreaker({name}=...) must be an int >= 1, got {value!r}")
        for name in ("window_s", "open_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ConfigurationError(f"CircuitBreaker({name}=...) must be a number of seconds > 0, got {value!r}")
        if self.when_open not in ("fallback", "fail", "wait"):
            raise ConfigurationError(f"CircuitBreaker(when_open=...) must be 'fallback', 'fail' or 'wait', got {self.when_open!r}")
        if self.counts is not None and not callable(self.counts):
            raise ConfigurationError(f"CircuitBreaker(counts=...) must be callable, got {type(self.counts).__name__}")


@dataclass(frozen=True)
class LookupCache:
    """Results kept per lookup key, for ``ttl_s``, at most ``max_size`` keys (least recently used
    first out). ``key``: a column of a dict record, a tuple of columns, or a function of the record.

    A record whose key has fresh results gets a copy of them without a call; one whose key is
    being called for already waits for that call and gets a copy of its results (one call,
    several outcomes). A call that fails leaves nothing in the cache, and the records that waited
    for it are sent themselves. The cache is not in the checkpoint: after a restore, each key
    costs one call again.
    """

    key: Any
    ttl_s: float = 60.0
    max_size: int = 100_000

    def __post_init__(self) -> None:
        if self.key is None:
            raise ConfigurationError("LookupCache(key=...) needs a column, a tuple of columns or a function of the record")
        if not isinstance(self.ttl_s, (int, float)) or isinstance(self.ttl_s, bool) or not self.ttl_s > 0:
            raise ConfigurationError(f"LookupCache(ttl_s=...) must be seconds > 0, got {self.ttl_s!r}")
        if not isinstance(self.max_size, int) or isinstance(self.max_size, bool) or self.max_size < 1:
            raise ConfigurationError(f"LookupCache(max_size=...) must be an int >= 1, got {self.max_size!r}")


@dataclass(frozen=True)
class Hedge:
    """A second call for a slow one: after ``after_ms``, or after the ``percentile`` of the
    latencies of the service's recent successful calls (once ``min_samples`` are known).

    The second call has the record's idempotency key, like the first. The first answer is the
    attempt's; the other call is cancelled. Second calls may go beyond the calls in flight by a
    tenth of the limit (at least one); they need a closed breaker, no pause, and a call of the
    rate limit to spare. Where there is no room, the first call goes on alone.
    """

    after_ms: int | None = None
    percentile: float | None = None
    min_samples: int = 20

    def __post_init__(self) -> None:
        if (self.after_ms is None) == (self.percentile is None):
            raise ConfigurationError("Hedge needs one of after_ms (a fixed delay) or percentile (of recent latencies), "
                                     f"got after_ms={self.after_ms!r}, percentile={self.percentile!r}")
        if self.after_ms is not None and (not isinstance(self.after_ms, int) or isinstance(self.after_ms, bool)
                                          or self.after_ms < 1):
            raise ConfigurationError(f"Hedge(after_ms=...) must be an int >= 1, got {self.after_ms!r}")
        if self.percentile is not None and (not isinstance(self.percentile, (int, float)) or not 0 < self.percentile < 1):
            raise ConfigurationError(f"Hedge(percentile=...) must be in (0, 1), such as 0.95, got {self.percentile!r}")
        if not isinstance(self.min_samples, int) or isinstance(self.min_samples, bool) or self.min_samples < 1:
            raise ConfigurationError(f"Hedge(min_samples=...) must be an int >= 1, got {self.min_samples!r}")


CapacitySpec = Union[int, Literal["auto"], AdaptiveCapacity, None]
RateSpec = Union[float, RateLimit, None]


@dataclass(frozen=True)
class Service:
    """What an async operator knows of the service it calls (see the module docstring).

    ``capacity``: calls in flight per instance (an int, ``"auto"`` or ``AdaptiveCapacity``; None:
    as many as the operator's own ``capacity``). ``rate_limit``: calls per second for all the
    instances (a number, or ``RateLimit``). ``breaker``: a ``CircuitBreaker``, or None.
    ``overload_retries``: overload answers sent again per record before one counts as a failure.
    ``name`` tags the service's metrics (default: the operator's name).
    """

    name: str | None = None
    capacity: CapacitySpec = None
    rate_limit: RateSpec = None
    breaker: CircuitBreaker | None = None
    overload_retries: int = 10
    cache: LookupCache | None = None
    hedge: Hedge | None = None

    def __post_init__(self) -> None:
        capacity = self.capacity
        if capacity == "auto":
            object.__setattr__(self, "capacity", AdaptiveCapacity())
        elif not (capacity is None or isinstance(capacity, AdaptiveCapacity)
                  or (isinstance(capacity, int) and not isinstance(capacity, bool) and capacity >= 1)):
            raise ConfigurationError(f"Service(capacity=...) must be an int >= 1, 'auto' or AdaptiveCapacity, got {capacity!r}")
        rate = self.rate_limit
        if rate is not None and not isinstance(rate, RateLimit):
            if not isinstance(rate, (int, float)) or isinstance(rate, bool):
                raise ConfigurationError(
                    f"Service(rate_limit=...) must be calls per second (a number) or RateLimit, got {rate!r}")
            object.__setattr__(self, "rate_limit", RateLimit(rate))
        if self.breaker is not None and not isinstance(self.breaker, CircuitBreaker):
            raise ConfigurationError(f"Service(breaker=...) must be a CircuitBreaker, got {type(self.breaker).__name__}")
        retries = self.overload_retries
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            raise ConfigurationError(f"Service(overload_retries=...) must be an int >= 0, got {retries!r}")
        if self.hedge is not None and not isinstance(self.hedge, Hedge):
            raise ConfigurationError(f"Service(hedge=...) must be a Hedge, got {type(self.hedge).__name__}")
        if self.cache is not None and not isinstance(self.cache, LookupCache):
            raise ConfigurationError(f"Service(cache=...) must be a LookupCache, got {type(self.cache).__name__}")
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise ConfigurationError(f"Service(name=...) must be a non-empty str, got {self.name!r}")


def as_service(service: Service | None, capacity: Any) -> Service | None:
    """The ``Service`` of an async operator given ``service=`` and its ``capacity`` (which may
    be ``"auto"`` or an ``AdaptiveCapacity``, short for ``Service(capacity=...)``)."""
    adaptive = capacity == "auto" or isinstance(capacity, AdaptiveCapacity)
    if service is not None and not isinstance(service, Service):
        raise ConfigurationError(f"service must be a Service, got {type(service).__name__}")
    if not adaptive:
        return service
    if service is None:
        return Service(capacity=capacity)
    if service.capacity is not None:
        raise ConfigurationError("capacity='auto' and Service(capacity=...) both set the calls in flight; give one")
    return dataclasses.replace(service, capacity=capacity)


def slots_of(capacity: Any, service: Service | None) -> tuple[Service | None, int]:
    """An async operator's ``Service`` and the records it holds in flight, from its ``capacity``
    (an int, ``"auto"`` or ``AdaptiveCapacity``) and ``service=``: the adaptive ceiling for
    ``"auto"``, else ``capacity`` as given (for the caller to check: it may be no int at all).

    >>> slots_of("auto", None)[1], slots_of(32, Service(rate_limit=5))[1]
    (256, 32)
    """
    resolved = as_service(service, capacity)
    ceiling = ceiling_of(resolved, capacity)
    return resolved, capacity if ceiling is None else ceiling


def check_breaker_fallback(service: Service | None, fallback: Any) -> None:
    """Refuse ``CircuitBreaker(when_open="fallback")`` without a fallback to answer with."""
    breaker = None if service is None else service.breaker
    if breaker is not None and breaker.when_open == "fallback" and fallback is None:
        raise ConfigurationError("CircuitBreaker(when_open='fallback') answers with the fallback, and none was given "
                                 "(fallback=...); or choose when_open='fail' or 'wait'")


def ceiling_of(service: Service | None, capacity: Any) -> int | None:
    """The most records an operator with this service and ``capacity`` must hold in flight:
    the adaptive ceiling when ``capacity`` is ``"auto"``; None where ``capacity`` says it."""
    if capacity == "auto" or isinstance(capacity, AdaptiveCapacity):
        assert service is not None and isinstance(service.capacity, AdaptiveCapacity)
        return service.capacity.ceiling
    return None


@dataclass
class ServiceMetrics:
    """What a gate counts, for the operator's metrics (``service_*``)."""

    calls: int = 0  # calls that left for the service
    overloads: int = 0  # overload answers (429, 503, ServiceOverloaded)
    pauses: int = 0  # overload answers with a Retry-After that paused the gate
    breaker_opens: int = 0
    breaker_rejections: int = 0  # attempts ended (fallback or failure) while the breaker was open
    probes: int = 0  # calls let through while half-open
    limit: float = 0.0  # calls allowed in flight now
    breaker_state: int = 0  # 0 closed, 1 open, 2 half-open
    rate_per_s: float = 0.0  # this instance's share of the rate limit (0: none)
    cache_hits: int = 0  # records answered from the cache, without a call
    merged: int = 0  # records that waited for a call in flight for the same key instead of calling
    hedges: int = 0  # second calls started for slow ones
    hedge_wins: int = 0  # of them, those that answered first

    def figures(self) -> dict[str, float]:
        """As the instance's figures: ``service_*`` counters and gauges (``actors.metrics``)."""
        return {"service_calls": self.calls, "service_overloads": self.overloads, "service_pauses": self.pauses,
                "service_breaker_opens": self.breaker_opens, "service_breaker_rejections": self.breaker_rejections,
                "service_probes": self.probes, "service_concurrency_limit": self.limit,
                "service_breaker_state": self.breaker_state, "service_rate_limit": self.rate_per_s,
                "service_cache_hits": self.cache_hits, "service_merged": self.merged,
                "service_hedges": self.hedges, "service_hedge_wins": self.hedge_wins}


_CLOSED, _OPEN, _HALF_OPEN = 0, 1, 2
_NO_KEY = object()  # a call that no cache key stands for
_IMMUTABLE = (int, float, str, bytes, bool, type(None))


def _private(raw: Any) -> Any:
    """A copy of a cached answer that no other record shares (immutable values are shared)."""
    if type(raw) is list:
        return [r if type(r) in _IMMUTABLE else copy.deepcopy(r) for r in raw]
    return raw if type(raw) in _IMMUTABLE else copy.deepcopy(raw)
_GO, _WAIT, _REJECT = 0, -1, -2  # _may_call's verdicts; a positive one is the time to look again


class ServiceGate:
    """Decides when each attempt of an operator may call its service (module docstring).

    ``admit(handler)`` says whether the attempt may call now; when not, the gate keeps it and
    calls ``handler.call()`` itself once it may, or ends it as the breaker says
    (``handler.on_circuit_open``). ``call_ended`` and ``forget`` tell it how calls ended.
    """

    def __init__(
        self, service: Service, processing_time: ProcessingTimeService, put_mail: Callable[..., None], *,
        capacity: int, parallelism: int = 1, name: str = "async_wait", finish: Callable[[Any, Any], Any] | None = None,
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
        self._rate = 0.0 if rate is None else rate.per_second / max(1, parallelism)  # per ms below
        self._burst = max(1.0, self._rate * 0.05)
        self._tokens = 0.0  # no burst at the start, nor after a restore
        self._tokens_at = processing_time.now_ms()
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
        self.metrics = ServiceMetrics(limit=self.limit, rate_per_s=self._rate)

    # ----------------------------------------------------------------- attempts

    def admit(self, handler: AttemptHandler) -> bool:
        """True: the attempt calls now (it counts as in flight). False: the gate keeps it, or
        ends it because the breaker is open."""
        now = self._time.now_ms()
        if self._cache is not None and self._served(handler, now):
            return False
        verdict = _WAIT if self._parked or self._again else self._may_call(now)
        if verdict == _GO:
            self._begin(handler, now)
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

    def _served(self, handler: AttemptHandler, now: int) -> bool:
        """Answer the attempt from the cache, or make it wait for the call in flight for its key."""
        key = self._key(handler)
        if key is _NO_KEY:
            return False
        hit = self._cached.get(key)
        if hit is not None:
            if hit[0] > now:
                self._cached.move_to_end(key)
                self.metrics.cache_hits += 1
                self._answer(handler, hit[1])
                return True
            del self._cached[key]
        leader = self._leaders.get(key)
        if leader is None:
            return False
        self._followers[leader].append(handler)
        self._following[handler] = leader
        self.metrics.merged += 1
        return True

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
            tokens = min(self._burst, self._tokens + (now - self._tokens_at) * self._rate / 1000.0)
            self._tokens, self._tokens_at = tokens, now
            if tokens < 1.0:
                return now + max(1, math.ceil((1.0 - tokens) * 1000.0 / self._rate))
        return _GO

    def _begin(self, handler: AttemptHandler, now: int) -> None:
        key = _NO_KEY
        if self._cache is not None:
            key = self._key(handler)
            if key is not _NO_KEY and key not in self._leaders:
                self._leaders[key] = handler
                self._followers[handler] = []
            else:
                key = _NO_KEY
        probe = self._state == _HALF_OPEN
        if probe:
            self._probes_in_flight += 1
            self.metrics.probes += 1
        if self._rate:
            self._tokens -= 1.0
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
            if self._cache is not None and self._served(handler, now):
                continue
            if verdict == _REJECT:
                self._reject(handler)
                continue
            self._begin(handler, now)
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
            self._tokens = min(self._burst, self._tokens + (now - self._tokens_at) * self._rate / 1000.0)
            self._tokens_at = now
            if self._tokens < 1.0:
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
                self._tokens -= 1.0
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
            limit = min(limit + 1.0 / limit, self._known_max - 1.0)  # back to just under it
        elif self._time.now_ms() - self._overload_ms >= adaptive.probe_after_s * 1000:
            limit += self._gain / limit  # probing above it, faster each round trip
            if limit >= self._gain_from + self._gain:
                self._gain_from, self._gain = limit, self._gain * 2
        self.limit = min(float(adaptive.ceiling), limit)
        self.metrics.limit = self.limit

    def _overloaded(self, number: int) -> None:
        adaptive = self._adaptive
        if adaptive is None or number < self._decrease_at:
            return  # sent before the last decrease: that one answered for it
        self._slow_start = False
        self._known_max = self.limit
        self._overload_ms = self._time.now_ms()
        self.limit = max(float(adaptive.floor), self.limit * adaptive.backoff)
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
        if state["open_ms"] is not None and self._breaker is not None:
            self._state, self._open_until = _OPEN, now + int(state["open_ms"])
            self.metrics.breaker_state = _OPEN
            if self._breaker.when_open == "wait":
                self._wake_up_at(self._open_until)
