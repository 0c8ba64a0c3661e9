"""The harness as a context manager: whatever the block does, its requests end and its loop closes.

Flink's test harnesses are ``AutoCloseable`` for the same reason: a test that fails half-way must
not leave the operator's work running behind it (here: coroutines pending on a loop that is
never closed, which asyncio reports as "Task was destroyed but it is pending!" at exit).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from actorflow.operators import OperatorHarness, async_wait
from actorflow.operators.errors import MailboxClosedError


def _hanging(cancelled: list[Any]) -> Any:
    async def call(value: Any) -> list[Any]:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(value)
            raise
        return [value]

    return call


def test_leaving_the_block_cancels_the_pending_requests_and_closes_the_loop() -> None:
    cancelled: list[Any] = []
    with OperatorHarness(async_wait(_hanging(cancelled), capacity=4)) as h:
        h.process_element("a", timestamp_ms=1)
        h.process_element("b", timestamp_ms=2)
        assert cancelled == []  # both requests are in flight
    assert sorted(cancelled) == ["a", "b"]
    assert h.loop.is_closed()


def test_an_error_in_the_block_comes_out_unchanged_and_the_harness_is_closed_all_the_same() -> None:
    cancelled: list[Any] = []
    with pytest.raises(KeyError, match="from the test"):
        with OperatorHarness(async_wait(_hanging(cancelled), capacity=4)) as h:
            h.process_element("a", timestamp_ms=1)
            raise KeyError("from the test")
    assert cancelled == ["a"]
    assert h.loop.is_closed()


def test_close_after_close_does_nothing_and_drops_nothing() -> None:
    h = OperatorHarness(async_wait(_hanging([]), capacity=1))
    h.process_element("a", timestamp_ms=1)
    h.close()
    assert h.close() == []
    with pytest.raises(MailboxClosedError, match="this harness is closed"):
        h.process_element("b", timestamp_ms=2)


def test_the_module_docstring_example_runs_as_written() -> None:
    import doctest

    import actorflow.operators.harness

    result = doctest.testmod(actorflow.operators.harness)
    assert result.attempted >= 3 and result.failed == 0, result
