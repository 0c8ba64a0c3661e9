"""The service an async operator calls: how many calls at once, how fast, and whether at all.

A ``Service`` describes what an async operator knows of the system it calls; its ``ServiceGate``
(``service_gate``) stands between the operator's attempts and the user's function. Every attempt asks the gate
before it calls, and tells it how the call ended. The gate holds an attempt back (it waits in
the gate, in the operator's queue and so in its snapshots) while

- ``capacity`` calls are in flight: a fixed number, or ``AdaptiveCapacity`` (``"auto"``), which
  follows what the service takes;
- the ``rate_limit`` has no call time for it yet: the quota hands out call times ``1 / rate``
  apart for the whole service, in short leases to each instance that waits for some, with no
  burst (``service_quota``); on Ray one actor per job and service keeps it for every instance;
- the service asked for a pause: an overload answer with ``Retry-After`` stops every call of
  the service until then, on every instance, not only the one answered;
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
times itself, once per round trip, and remembers the limit that met it. Each further overload
answer to a call started before that decrease takes one call off the limit and off the
remembered one (the service had that slot fewer), so that a service whose capacity drops far is
followed within a round trip or two, as DCTCP cuts deeper the more of its window was marked.
While the limit is in use, each call that succeeds raises it by one (doubling per round trip)
up to one under the remembered limit, where it holds for a quarter of a round trip per call of
the limit (``hold_per_call``; at least ``probe_after_s``); then it probes above, adding one
call in a round trip, then two; an overload sends it back to where it held,
and two round trips without one mean that the service has grown: the limit doubles per round
trip again (slow start) until it finds the new edge.

AIMD and not a latency gradient: a rate-limited API says when it is full (429, 503), while its
latency often does not change until then, and a gradient limiter mistakes a slow tail for
congestion. ``backoff`` is 0.9, not TCP's 0.5, and the plateau keeps the limit from probing
the service's edge every round trip: each probe costs an overload answer and, with
``Retry-After``, a pause of every call. What a pause costs grows with the limit, while what a
probe can find shrinks with it (one call more is an eighth at 8 and a fortieth at 40), so the
hold grows with the limit, as AIMD's own climb back takes longer from a larger window: probes
cost about the same share of the calls at every limit, and a small limit finds a grown service
sooner.

**The circuit breaker** opens after ``failures`` failed calls within ``window_s`` (overload
answers, calls cut off by their deadline, and errors that ``counts`` accepts). While open, no
call leaves: a record's attempt ends at once in its ``timeout()`` (``when_open="fallback"``),
in a ``CircuitOpenError`` (``"fail"``: a dead letter or the job's failure, as ``on_error``
says), or waits for the breaker to close (``"wait"``). After ``open_s`` it lets ``probes`` calls
through (half-open); when they all succeed it closes, and one that fails opens it again.

>>> Service(capacity="auto", rate_limit=50).capacity
AdaptiveCapacity(initial=8, ceiling=256, floor=1, backoff=0.9, hold_per_call=0.25, probe_after_s=0.2)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Literal, Union

from .errors import ConfigurationError

__all__ = [
    "AdaptiveCapacity", "CircuitBreaker", "Hedge", "LookupCache", "RateLimit", "Service", "ServiceOverloaded",
    "as_service", "ceiling_of", "check_breaker_fallback", "overload_of", "slots_of",
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
    if hasattr(headers, "get"):
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
    #: above it again: ``hold_per_call`` round trips per call of the limit, and at least
    #: ``probe_after_s`` (at most 5 s).
    hold_per_call: float = 0.25
    probe_after_s: float = 0.2

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
        for name in ("hold_per_call", "probe_after_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ConfigurationError(f"AdaptiveCapacity({name}=...) must be a number >= 0, got {value!r}")


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
    ``name`` tags the service's metrics (default: the operator's name); operators of a job that
    give the same ``name`` share its rate quota and its pauses.
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

    @property
    def calls_per_second(self) -> float | None:
        """The rate limit in calls per second for all the instances; None without one."""
        rate = self.rate_limit
        return rate.per_second if isinstance(rate, RateLimit) else None


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
