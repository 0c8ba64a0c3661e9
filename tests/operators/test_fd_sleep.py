"""The benchmarks' simulated service sleeps on a kernel timer: never early, each sleep at its own deadline."""

from __future__ import annotations

import asyncio
import gc
import os
import time

import pytest

from benchmarks import fd_sleep as fd_sleep_module
from benchmarks.fd_sleep import FD_SLEEP, fd_sleep
from benchmarks.profiles import call_result, get_profile


def test_this_machine_sleeps_on_a_timerfd() -> None:
    # Elsewhere the service falls back to asyncio.sleep, and the benchmarks' figures would say so.
    assert FD_SLEEP == "timerfd"


def test_a_sleep_never_ends_before_its_deadline_and_sleeps_end_in_deadline_order() -> None:
    ended: list[tuple[float, float]] = []

    async def sleeper(seconds: float) -> None:
        started = time.monotonic()
        await fd_sleep(seconds)
        ended.append((seconds, time.monotonic() - started))

    async def main() -> None:
        # Started longest first: the timer is re-armed for each earlier deadline.
        await asyncio.gather(*(sleeper(s) for s in (0.030, 0.020, 0.010, 0.0, 0.015)))

    asyncio.run(main())
    assert [s for s, _ in ended] == [0.0, 0.010, 0.015, 0.020, 0.030]
    assert all(took >= s for s, took in ended), ended


def test_sleeps_due_together_all_end_and_a_cancelled_one_is_dropped() -> None:
    async def main() -> tuple[int, bool]:
        loop = asyncio.get_running_loop()
        cancelled = loop.create_task(fd_sleep(0.01))
        others = [loop.create_task(fd_sleep(0.01)) for _ in range(50)]
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.gather(*others)
        return sum(t.done() and not t.cancelled() for t in others), cancelled.cancelled()

    assert asyncio.run(main()) == (50, True)


def test_a_finished_loop_s_timer_is_closed_with_it() -> None:
    fds = []

    async def main() -> None:
        await fd_sleep(0.001)
        fds.append(fd_sleep_module._timers[asyncio.get_running_loop()].fd)

    asyncio.run(main())
    asyncio.run(main())
    gc.collect()
    assert len(fd_sleep_module._timers) == 0  # nothing keeps a finished loop alive
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)  # closed with its loop


def test_the_profile_call_sleeps_its_latency_and_returns_the_checkable_result() -> None:
    profile = get_profile("constant")

    async def main() -> tuple[int, float]:
        started = time.monotonic()
        result = await profile.async_call(17)
        return result, time.monotonic() - started

    result, took = asyncio.run(main())
    assert result == call_result(17)
    assert took >= profile.latency_ms(17) / 1000.0
