"""Clocks: the manual clock of the tests, and the system clock in milliseconds."""

from __future__ import annotations

import time

import pytest

from actorflow.operators import Clock, ConfigurationError, ManualClock, OperatorHarness, SystemClock
from actorflow.operators.operator import StreamOperator


def test_manual_clock_starts_where_told_and_moves_only_when_told():
    clock = ManualClock(10)
    assert clock.now_ms() == 10
    assert clock.now_ms() == 10  # reading does not move it
    clock.advance_to(25)
    assert clock.now_ms() == 25
    clock.advance_by(5)
    assert clock.now_ms() == 30
    assert ManualClock().now_ms() == 0


@pytest.mark.parametrize(
    "start_ms, target_ms, ok",
    [
        (10, 10, True),  # standing still is allowed
        (10, 11, True),  # forwards by one millisecond
        (10, 9, False),  # backwards by one millisecond
        (10, -5, False),  # backwards past zero
        (0, 2**40, True),  # far forwards (epoch-sized values)
    ],
)
def test_manual_clock_advance_to_never_goes_backwards(start_ms, target_ms, ok):
    clock = ManualClock(start_ms)
    if ok:
        clock.advance_to(target_ms)
        assert clock.now_ms() == target_ms
    else:
        with pytest.raises(ConfigurationError) as info:
            clock.advance_to(target_ms)
        # The message says what the clock is at and what was asked.
        assert "never goes backwards" in str(info.value)
        assert f"{start_ms} ms" in str(info.value) and f"{target_ms} ms" in str(info.value)
        assert clock.now_ms() == start_ms  # unchanged


@pytest.mark.parametrize(
    "delta_ms, ok",
    [
        (0, True),  # no move
        (7, True),  # forwards
        (-1, False),  # backwards
    ],
)
def test_manual_clock_advance_by_rejects_negative_deltas(delta_ms, ok):
    clock = ManualClock(100)
    if ok:
        clock.advance_by(delta_ms)
        assert clock.now_ms() == 100 + delta_ms
    else:
        with pytest.raises(ConfigurationError, match=str(delta_ms)):
            clock.advance_by(delta_ms)
        assert clock.now_ms() == 100


def test_manual_clock_time_is_an_int():
    clock = ManualClock(1.0)  # type: ignore[arg-type]
    clock.advance_to(2.0)  # type: ignore[arg-type]
    assert type(clock.now_ms()) is int


def test_system_clock_returns_epoch_milliseconds():
    before_ms = time.time_ns() // 1_000_000
    now_ms = SystemClock().now_ms()
    after_ms = time.time_ns() // 1_000_000
    assert type(now_ms) is int
    # Milliseconds: not seconds (1000x smaller) and not microseconds (1000x larger).
    assert before_ms <= now_ms <= after_ms


def test_system_clock_does_not_go_backwards_between_reads():
    clock = SystemClock()
    reads = [clock.now_ms() for _ in range(1000)]
    assert reads == sorted(reads)


def test_both_clocks_satisfy_the_clock_protocol():
    assert isinstance(ManualClock(), Clock)
    assert isinstance(SystemClock(), Clock)


def test_harness_processing_time_cannot_go_backwards():
    h = OperatorHarness(StreamOperator(), start_ms=100)
    h.set_processing_time(150)
    with pytest.raises(ConfigurationError, match="never goes backwards"):
        h.set_processing_time(149)
    assert h.clock.now_ms() == 150
    h.close()
