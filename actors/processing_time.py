"""Processing time on a Ray actor: one loop alarm for the earliest timer; timers run as mails."""

from __future__ import annotations

import asyncio

from actorflow.operators.clock import Clock, SystemClock
from actorflow.operators.mailbox_processor import MailboxExecutor
from actorflow.operators.timers import TimerQueue

__all__ = ["AsyncioProcessingTimeService"]


class AsyncioProcessingTimeService(TimerQueue):
    """Keeps one ``loop.call_later`` armed for the earliest timer, however many are pending.

    Timeouts are registered in deadline order, so a new timer rarely moves the alarm.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, executor: MailboxExecutor, clock: Clock | None = None) -> None:
        super().__init__(clock or SystemClock(), executor)
        self._loop = loop
        self._alarm: tuple[int, asyncio.TimerHandle] | None = None

    def _registered(self, timestamp_ms: int) -> None:
        if self._alarm is None or timestamp_ms < self._alarm[0]:
            self._arm(timestamp_ms)

    def _arm(self, timestamp_ms: int) -> None:
        if self._alarm is not None:
            self._alarm[1].cancel()
        delay_s = max(0.0, (timestamp_ms - self._clock.now_ms()) / 1000.0)
        self._alarm = (timestamp_ms, self._loop.call_later(delay_s, self._on_alarm))

    def _on_alarm(self) -> None:
        self._alarm = None
        self.fire_due()
        next_ms = self.next_due_ms()
        if next_ms is not None:
            self._arm(next_ms)

    def close(self) -> None:
        if self._alarm is not None:
            self._alarm[1].cancel()
            self._alarm = None
