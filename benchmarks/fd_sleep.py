"""``await fd_sleep(seconds)``: an asyncio sleep that ends when its deadline passes, as a socket's answer would.

``asyncio.sleep`` ends on a loop timer, and the loop waits for its timers in whole milliseconds
(``epoll_wait`` takes milliseconds; asyncio rounds the wait up). With a hundred calls in flight,
every call due within one millisecond ends in the same wake-up of the loop, and the calls that
replace them start together too: the calls in flight move in waves. Each call of a wave then
waits, besides its own latency, for the handling of the whole wave before it, and a thread's
``time.sleep`` pays neither. A service on a socket does not cause this: the kernel wakes the loop
when the answer is readable.

``fd_sleep`` waits the same way as a socket read. Each event loop gets one Linux ``timerfd``, a
file descriptor that becomes readable at a time given to the nanosecond; the loop watches it
with ``add_reader``, as it watches a socket. The timer is armed for the earliest deadline of the
sleeps in flight, and each time it fires, it ends every sleep that is due and is armed again for
the next. A sleep never ends before its deadline. Where ``timerfd`` is missing (not Linux), it
is ``asyncio.sleep``: ``FD_SLEEP`` says which one runs.

Example::

    async def call():
        await fd_sleep(0.020)      # 20 ms, ended by the kernel's timer, not on a millisecond tick
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import heapq
import itertools
import os
import time
import weakref
from typing import Any

__all__ = ["FD_SLEEP", "fd_sleep"]

_CLOCK_MONOTONIC = 1  # time.monotonic_ns() reads this clock on Linux
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        create, settime = libc.timerfd_create, libc.timerfd_settime
    except (OSError, AttributeError):
        return None
    create.argtypes, create.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
    settime.restype = ctypes.c_int
    return libc


_LIBC = _libc()
#: ``"timerfd"`` where the kernel's timers are at hand, else ``"asyncio.sleep"``.
FD_SLEEP = "timerfd" if _LIBC is not None else "asyncio.sleep"


class _LoopTimer:
    """One loop's timerfd and the sleeps waiting on it, as (deadline in ns, order, future)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        fd = _LIBC.timerfd_create(_CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), f"timerfd_create: {os.strerror(ctypes.get_errno())}")
        self.fd = fd
        self._due: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._armed: int | None = None
        self._spec = _Itimerspec()
        loop.add_reader(fd, self._fire)
        # The loop's selector holds this object through the reader; nothing here holds the loop.
        weakref.finalize(loop, os.close, fd)

    def sleep(self, loop: asyncio.AbstractEventLoop, seconds: float) -> asyncio.Future[None]:
        future = loop.create_future()
        deadline = time.monotonic_ns() + max(0, round(seconds * 1e9))
        heapq.heappush(self._due, (deadline, next(self._order), future))
        if self._armed is None or deadline < self._armed:
            self._arm(deadline)
        return future

    def _arm(self, deadline: int) -> None:
        self._armed = deadline
        value = self._spec.it_value
        value.tv_sec, value.tv_nsec = divmod(deadline, 1_000_000_000)
        if _LIBC.timerfd_settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) != 0:
            raise OSError(ctypes.get_errno(), f"timerfd_settime: {os.strerror(ctypes.get_errno())}")

    def _fire(self) -> None:
        try:
            os.read(self.fd, 8)  # the expirations count; reading it makes the fd unreadable again
        except BlockingIOError:
            pass
        due, now = self._due, time.monotonic_ns()
        while due and due[0][0] <= now:
            future = heapq.heappop(due)[2]
            if not future.done():  # a cancelled sleep is simply dropped
                future.set_result(None)
        self._armed = None
        if due:
            self._arm(due[0][0])


_timers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopTimer] = weakref.WeakKeyDictionary()


async def fd_sleep(seconds: float) -> None:
    """Sleep ``seconds`` on the running loop, ended by the kernel's timer at the deadline."""
    if _LIBC is None:
        await asyncio.sleep(seconds)
        return
    loop = asyncio.get_running_loop()
    timer = _timers.get(loop)
    if timer is None:
        timer = _timers[loop] = _LoopTimer(loop)
    await timer.sleep(loop, seconds)
