"""The enrichment benchmark's schedule bound: what a runtime that costs nothing reaches on exactly the run's records."""

from __future__ import annotations

import pytest

from benchmarks.profiles import get_profile, mean_latency_ms, schedule_rps


def test_with_one_latency_for_all_the_schedule_is_littles_law() -> None:
    # 1,000 records, two instances of 10 slots, 20 ms each: 50 rounds of 20 ms, one second.
    assert schedule_rps("constant", 1_000, 10, 2) == pytest.approx(1_000.0)
    assert schedule_rps("constant", 1_000, 10, 2) == pytest.approx(2 * 10 / mean_latency_ms("constant", 1_000) * 1000)


def test_the_run_ends_with_its_slowest_share() -> None:
    # Three records over two instances: ids 0 and 1 on the first, id 2 on the second, all at once.
    lognormal = get_profile("lognormal")
    slowest = max(lognormal.latency_ms(i) for i in range(3))
    assert schedule_rps("lognormal", 3, 100, 2) == pytest.approx(3 / slowest * 1000)
    # With one slot, an instance calls one record after the other.
    first = lognormal.latency_ms(0) + lognormal.latency_ms(1)
    assert schedule_rps("lognormal", 3, 1, 2) == pytest.approx(3 / max(first, lognormal.latency_ms(2)) * 1000)


def test_under_a_spread_of_latencies_a_short_run_stays_below_littles_law_and_a_long_one_nears_it() -> None:
    little = 2 * 50 / mean_latency_ms("lognormal", 40_000) * 1000
    short, long = schedule_rps("lognormal", 2_000, 50, 2), schedule_rps("lognormal", 40_000, 50, 2)
    assert short < long < little * 1.01
    assert long > 0.9 * little and short < 0.9 * little
