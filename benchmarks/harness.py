"""The test harness's cost per record: how many records a ring-1 test can push through it.

100,000 records (``--quick``: 20,000) through ``OperatorHarness.process_element`` for three
chains: a map, a keyed tumbling-window count, and an ordered async operator whose scripted
function completes each record at once. Each is set against the same operators driven without a
harness, by calling ``process_element`` on the chain itself (the map and the window; the async
operator needs the mailbox the harness brings), measured in the same run: the ratio is what the
harness adds. Each figure is the best of three runs. The last line printed is one JSON object.

    python -m benchmarks.harness
    python -m benchmarks.harness --quick
"""

from __future__ import annotations

import time
from typing import Any, Callable

import click

from actorflow.operators import MapOperator, OperatorHarness, Record, async_wait
from actorflow.operators.windows import Count, TumblingEventTimeWindows, WindowOperator
from benchmarks.report import emit


async def _echo(value: Any) -> list[Any]:
    return [value]


def _chains() -> dict[str, Callable[[], Any]]:
    return {
        "map": lambda: MapOperator(lambda v: v, "map"),
        "window": lambda: WindowOperator("k", TumblingEventTimeWindows(100), aggregate=Count()),
        "async_ordered": lambda: async_wait(_echo, mode="ordered", capacity=100),
    }


def _through_harness(make: Callable[[], Any], n: int) -> float:
    """Records per second through the harness, every call as a test makes it."""
    h = OperatorHarness(make())
    started = time.perf_counter()
    for i in range(n):
        h.process_element({"k": i % 10}, i)
    h.process_watermark(n)
    h.run_until_idle()
    elapsed = time.perf_counter() - started
    assert len(h.output_records()) > 0
    return n / elapsed


def _bare(make: Callable[[], Any], n: int) -> float:
    """Records per second calling the operator's process_element directly (its output a list)."""
    h = OperatorHarness(make())
    h.open()
    op = h.chain.head
    started = time.perf_counter()
    for i in range(n):
        op.process_element(Record({"k": i % 10}, i))
    elapsed = time.perf_counter() - started
    return n / elapsed


@click.command()
@click.option("--quick", is_flag=True, help="20,000 records instead of 100,000")
def main(quick: bool) -> None:
    n = 20_000 if quick else 100_000
    figures: dict[str, Any] = {"records": n}
    for name, make in _chains().items():
        harness_rps = max(_through_harness(make, n) for _ in range(3))
        figures[f"{name}_harness_rps"] = round(harness_rps)
        figures[f"{name}_harness_us_per_record"] = round(1e6 / harness_rps, 2)
        figures[f"{name}_harness_s_per_100k"] = round(100_000 / harness_rps, 2)
        line = f"{name:<14}{harness_rps:>12,.0f} records/s through the harness ({1e6 / harness_rps:.1f} µs each)"
        if name != "async_ordered":
            bare_rps = max(_bare(make, n) for _ in range(3))
            figures[f"{name}_bare_rps"] = round(bare_rps)
            figures[f"{name}_harness_vs_bare"] = round(harness_rps / bare_rps, 3)
            line += f", {bare_rps:,.0f} bare ({harness_rps / bare_rps:.2f} x)"
        print(line, flush=True)
    emit("harness", figures)


if __name__ == "__main__":
    main()
