"""Clocks: the only place where ring 1 may read the wall clock.

Operators ask a ``Clock`` for processing time. Production uses ``SystemClock``; tests use
``ManualClock`` and advance it by hand, so no test sleeps.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

from .errors import ConfigurationError

__all__ = ["Clock", "ManualClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """A source of processing time in milliseconds."""

    def now_ms(self) -> int: ...


class SystemClock:
    """Processing time from the system's wall clock (epoch milliseconds).

    >>> SystemClock().now_ms() > 0
    True
    """

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def __repr__(self) -> str:
        return "SystemClock()"


class ManualClock:
    """A clock that moves only when told to, and never backwards.

    >>> c = ManualClock(10)
    >>> c.advance_to(25); c.now_ms()
    25
    """

    def __init__(self, start_ms: int = 0) -> None:
        self._now_ms = int(start_ms)

    def now_ms(self) -> int:
        return self._now_ms

    def advance_to(self, timestamp_ms: int) -> None:
        if timestamp_ms < self._now_ms:
            raise ConfigurationError(
                f"a manual clock never goes backwards: now is {self._now_ms} ms, got {timestamp_ms} ms"
            )
        self._now_ms = int(timestamp_ms)

    def advance_by(self, delta_ms: int) -> None:
        if delta_ms < 0:
            raise ConfigurationError(f"delta_ms must be >= 0, got {delta_ms}")
        self._now_ms += int(delta_ms)

    def __repr__(self) -> str:
        return f"ManualClock(now_ms={self._now_ms})"
