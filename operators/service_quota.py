"""A service's rate quota, shared by every instance that calls the service, and its pauses.

``QuotaSchedule`` hands out the times at which calls may leave, for the whole service: each
``lease`` is a run of ``count`` call times, ``1 / rate`` apart, starting where the last lease
ended or now, whichever is later (a virtual-clock scheduler, the generic cell rate algorithm
without a burst tolerance), and ending at most ``AHEAD_MS`` from now. No two leases share a
time, so however many instances call, the service never sees more than its rate in any second.
An instance asks only while records wait for a call, for no more call times than wait: at
first ``LEASE_MS`` of its share of the rate, twice as many each time records had to wait for a
lease, half as many each time call times went unused, up to ``LEASE_MS`` of the service's rate;
and it asks for the next lease before the last runs out. A call time it did not use within
``STALE_MS`` is dropped, never caught up on, so a slow instance does not burst later.

A pause (an overload answer with ``Retry-After``) moves the schedule past its end and reaches
every instance that watches the quota: the whole service pauses, not one request.

The schedule keeps no saved-up calls, so a new one (after a restore, or after the process that
held it died) has nothing to burst with; it starts ``HOLD_MS`` late, past every lease the old
one may have handed out (``AHEAD_MS``).

``LocalQuota`` keeps a schedule in the process (the harness, one instance alone);
``actors.service_quota`` keeps one in a Ray actor per job and service for all its instances.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol

from .errors import ConfigurationError

__all__ = [
    "AHEAD_MS", "HOLD_MS", "LEASE_MS", "STALE_MS", "Lease", "LocalQuota", "QuotaSchedule", "ServiceQuota",
    "ServiceQuotas", "lease_size",
]

LEASE_MS = 100  # the most an instance asks for at a time: this long at the service's rate
AHEAD_MS = 500  # the latest call time a lease hands out, from now (one call at least)
STALE_MS = 20  # a call time older than this is dropped, not used late
HOLD_MS = AHEAD_MS  # how late a new schedule starts: past what an old one handed out


@dataclass(frozen=True)
class Lease:
    """``count`` call times: ``first_ms``, then every ``spacing_ms``; ``paused_until_ms``: the
    service's pause as the schedule knew it (0: none)."""

    first_ms: float
    spacing_ms: float
    count: int
    paused_until_ms: int = 0


class QuotaSchedule:
    """The call times of a service's rate, ``per_second`` for all its callers (module docstring),
    and its pause; with ``per_second`` None, the pause alone.

    >>> s = QuotaSchedule(10.0, start_ms=0)
    >>> s.lease(2, now_ms=0), s.lease(1, now_ms=50).first_ms
    (Lease(first_ms=0.0, spacing_ms=100.0, count=2, paused_until_ms=0), 200.0)
    >>> s.pause(1_000), s.lease(1, now_ms=300).first_ms
    (True, 1000.0)
    """

    def __init__(self, per_second: float | None, *, start_ms: float) -> None:
        if per_second is not None and not per_second > 0:
            raise ConfigurationError(f"a rate quota must be > 0 calls per second, got {per_second!r}")
        self.per_second = per_second
        self.spacing_ms = 0.0 if per_second is None else 1000.0 / per_second
        self.next_ms = float(start_ms)
        self.paused_until_ms = 0
        self.granted = 0

    def lease(self, count: int, now_ms: float) -> Lease:
        if self.per_second is None:
            raise ConfigurationError("this service has no rate limit to lease calls from")
        first = max(float(now_ms), self.next_ms, float(self.paused_until_ms))
        count = max(1, min(int(count), math.floor((now_ms + AHEAD_MS - first) / self.spacing_ms)))
        self.next_ms = first + count * self.spacing_ms
        self.granted += count
        return Lease(first, self.spacing_ms, count, self.paused_until_ms)

    def pause(self, until_ms: int) -> bool:
        """Pause until ``until_ms``; True when that is later than the pause there was."""
        if until_ms <= self.paused_until_ms:
            return False
        self.paused_until_ms = int(until_ms)
        self.next_ms = max(self.next_ms, float(until_ms))
        return True


def lease_size(per_second: float) -> int:
    """The most calls an instance asks for at a time: ``LEASE_MS`` at ``per_second``, at least one."""
    return max(1, math.ceil(per_second * LEASE_MS / 1000.0))


class ServiceQuota(Protocol):
    """A service's quota and pauses as one instance's gate sees them.

    The methods do not block. ``deliver`` and ``on_pause`` may be called from any thread (the
    gate hands them to its mailbox); ``deliver`` gets a ``Lease``, or the exception that kept
    the quota from giving one.
    """

    def lease(self, count: int, now_ms: int, deliver: Callable[[Lease | BaseException], None]) -> None: ...

    def pause(self, until_ms: int) -> None: ...

    def watch(self, on_pause: Callable[[int], None]) -> None:
        """Call ``on_pause(until_ms)`` for each pause from now on, and for the one there is."""


class LocalQuota:
    """A quota kept in this process, for the instances that share this object."""

    def __init__(self, per_second: float | None, *, start_ms: int = 0) -> None:
        self.schedule = QuotaSchedule(per_second, start_ms=start_ms)
        self._watchers: list[Callable[[int], None]] = []

    def lease(self, count: int, now_ms: int, deliver: Callable[[Lease | BaseException], None]) -> None:
        try:
            lease: Lease | BaseException = self.schedule.lease(count, now_ms)
        except ConfigurationError as error:
            lease = error
        deliver(lease)

    def pause(self, until_ms: int) -> None:
        if self.schedule.pause(until_ms):
            for on_pause in self._watchers:
                on_pause(until_ms)

    def watch(self, on_pause: Callable[[int], None]) -> None:
        self._watchers.append(on_pause)
        if self.schedule.paused_until_ms:
            on_pause(self.schedule.paused_until_ms)  # a pause that began before this instance opened


class ServiceQuotas:
    """The quotas of a job's services by name, kept in this process: what several harnesses
    pass to share one (``OperatorHarness(service_quotas=...)``).

    A name asked for with two different rates is refused: one service has one quota.
    """

    def __init__(self) -> None:
        self._quotas: dict[str, tuple[float | None, LocalQuota]] = {}

    def quota(self, name: str, per_second: float | None, now_ms: int = 0) -> LocalQuota:
        known = self._quotas.get(name)
        if known is None:
            known = self._quotas[name] = (per_second, LocalQuota(per_second, start_ms=now_ms))
        check_same_rate(name, known[0], per_second)
        return known[1]


def check_same_rate(name: str, known: float | None, asked: float | None) -> None:
    if known != asked:
        raise ConfigurationError(
            f"service {name!r} is called with two rate limits, {_rate(known)} and {_rate(asked)}: the operators that "
            "share a service (by Service(name=...)) must give it the same rate_limit")


def _rate(per_second: float | None) -> str:
    return "none" if per_second is None else f"{per_second:g} calls/s"
