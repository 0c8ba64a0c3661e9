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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Union, cast

from .errors import CircuitOpenError, ConfigurationError

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
    return Service(service.name, capacity, service.rate_limit, service.breaker, service.overload_retries)


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

    def figures(self) -> dict[str, float]:
        """As the instance's figures: ``service_*`` counters and gauges (``actors.metrics``)."""
        return {"service_calls": self.calls, "service_overloads": self.overloads, "service_pauses": self.pauses,
                "service_breaker_opens": self.breaker_opens, "service_breaker_rejections": self.breaker_rejections,
                "service_probes": self.probes, "service_concurrency_limit": self.limit,
                "service_breaker_state": self.breaker_state, "service_rate_limit": self.rate_per_s}


_CLOSED, _OPEN, _HALF_OPEN = 0, 1, 2
_GO, _WAIT, _REJECT = 0, -1, -2  # _may_call's verdicts; a positive one is the time to look again


class ServiceGate:
    """Decides when each attempt of an operator may call its service (module docstring).

    ``admit(handler)`` says whether the attempt may call now; when not, the gate keeps it and
    calls ``handler.call()`` itself once it may, or ends it as the breaker says
    (``handler.on_circuit_open``). ``call_ended`` and ``forget`` tell it how calls ended.
    """

    def __init__(
        self, service: Service, processing_time: ProcessingTimeService, put_mail: Callable[..., None], *,
        capacity: int, parallelism: int = 1, name: str = "async_wait",
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
        self._calls: dict[AttemptHandler, tuple[int, bool]] = {}  # call in flight -> (its number, is probe)
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
        self.metrics = ServiceMetrics(limit=self.limit, rate_per_s=self._rate)

    # ----------------------------------------------------------------- attempts

    def admit(self, handler: AttemptHandler) -> bool:
        """True: the attempt calls now (it counts as in flight). False: the gate keeps it, or
        ends it because the breaker is open."""
        now = self._time.now_ms()
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

    def call_ended(self, handler: AttemptHandler, error: BaseException | None) -> bool:
        """A call the gate let through ended (``error`` None: it succeeded). True when it was an
        overload answer that the gate will send again: the attempt goes on, without an outcome."""
        entry = self._calls.pop(handler, None)
        if entry is None:
            return False
        number, probe = entry
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

    def forget(self, handler: AttemptHandler, *, cut_off: bool = False) -> None:
        """The attempt left the gate's hands (its outcome is decided, or its deadline passed);
        ``cut_off``: a call of it in flight was cut off by the deadline, which counts as overload."""
        self._overloads.pop(handler, None)
        if handler in self._parked_set:
            self._parked_set.discard(handler)  # left in the deque; skipped when its turn comes
            return
        entry = self._calls.pop(handler, None)
        if entry is None:
            return
        self.in_flight -= 1
        now = self._time.now_ms()
        if cut_off:
            self._overloaded(entry[0])
            self._failed(entry[1], now)
        elif entry[1]:
            self._probes_in_flight -= 1
        self._drain(now)

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
        probe = self._state == _HALF_OPEN
        if probe:
            self._probes_in_flight += 1
            self.metrics.probes += 1
        if self._rate:
            self._tokens -= 1.0
        self.in_flight += 1
        self._calls[handler] = (self._begun, probe)
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
        self._drain(self._time.now_ms())

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
