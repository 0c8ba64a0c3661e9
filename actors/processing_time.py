"""Processing time on a Ray actor: timers from the asyncio loop, delivered as mails."""

from __future__ import annotations

import asyncio
from typing import Callable

from operators.clock import Clock, SystemClock
from operators.mailbox_processor import MailboxExecutor
from operators.timers import TimerHandle

__all__ = ["AsyncioProcessingTimeService"]


class _LoopTimerHandle(TimerHandle):
    __slots__ = ("loop_handle",)

    def __init__(self, timestamp_ms: int) -> None:
        super().__init__(timestamp_ms)
        self.loop_handle: asyncio.TimerHandle | None = None

    def cancel(self) -> None:
        super().cancel()
        if self.loop_handle is not None:
            self.loop_handle.cancel()


class AsyncioProcessingTimeService:
    """Schedules callbacks with ``loop.call_later``; each runs as a mail on the mailbox thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, executor: MailboxExecutor, clock: Clock | None = None) -> None:
        self._loop = loop
        self._executor = executor
        self._clock = clock or SystemClock()

    def now_ms(self) -> int:
        return self._clock.now_ms()

    def register_timer(self, timestamp_ms: int, callback: Callable[[int], None]) -> TimerHandle:
        handle = _LoopTimerHandle(timestamp_ms)
        delay_s = max(0.0, (timestamp_ms - self._clock.now_ms()) / 1000.0)

        def fire() -> None:
            if not handle.cancelled:
                self._executor.execute(_run, f"processing timer @{timestamp_ms}", handle, callback)

        handle.loop_handle = self._loop.call_later(delay_s, fire)
        return handle


def _run(handle: TimerHandle, callback: Callable[[int], None]) -> None:
    if not handle.cancelled:
        callback(handle.timestamp_ms)
