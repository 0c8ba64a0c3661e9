"""Run an awaitable on a running event loop while another task ticks, to see whether it blocked the loop."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable


@dataclass
class Watched:
    result: Any
    elapsed_s: float
    longest_gap_s: float  # the longest the loop went without a tick while the awaitable ran
    ticks: int


async def while_ticking(make: Callable[[], Awaitable[Any]], every_s: float = 0.01) -> Watched:
    """Await ``make()`` while a task ticks every ``every_s`` on the same loop."""
    ticks: list[float] = []
    stop = asyncio.Event()

    async def tick() -> None:
        while not stop.is_set():
            ticks.append(time.perf_counter())
            await asyncio.sleep(every_s)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(5 * every_s)  # the ticker runs before the awaitable starts
    started = time.perf_counter()
    try:
        result = await make()
    finally:
        ended = time.perf_counter()
        stop.set()
        await ticker
    during = [started] + [t for t in ticks if started < t < ended] + [ended]
    gap = max(b - a for a, b in zip(during, during[1:]))
    return Watched(result, ended - started, gap, len(during) - 2)
