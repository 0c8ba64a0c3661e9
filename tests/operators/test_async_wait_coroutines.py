"""An ``async def`` run by the operator itself (``direct_coroutine``) behaves exactly as one run
through a ``ResultFuture``: every case runs on both paths and must give the same outcomes.

The direct path is what ``async_wait(async_def)`` and ``FallbackOnTimeout`` around it take; the
``ResultFuture`` path is the same coroutine behind an ``AsyncFunction`` that does not offer it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import pytest

from actorflow.operators import (
    DEAD_LETTER,
    CoroutineFunction,
    FallbackOnTimeout,
    FixedDelay,
    OperatorHarness,
    Record,
    ResultTypeError,
    UserFunctionError,
    async_wait,
    current_request_key,
)
from actorflow.operators.async_attempt import CoroutineCall


class ViaFuture(CoroutineFunction):
    """The same coroutine, through ``async_invoke`` and its ``ResultFuture``."""

    def direct_coroutine(self) -> Callable[[Any], Any] | None:
        return None


def function(fn: Callable[[Any], Any], path: str, fallback: Callable[[Any], list[Any]] | None = None,
             finish: Callable[[Any, Any], Any] | None = None) -> Any:
    inner = CoroutineFunction(fn, finish) if path == "direct" else ViaFuture(fn, finish)
    return inner if fallback is None else FallbackOnTimeout(inner, fallback)


PATHS = ["direct", "future"]


@pytest.mark.parametrize("path", PATHS)
def test_each_attempt_of_the_direct_path_is_a_coroutine_call_and_the_other_a_result_future(path: str) -> None:
    async def slow(value: Any) -> list[Any]:
        await asyncio.Event().wait()
        return [value]

    h = OperatorHarness(async_wait(function(slow, path), capacity=2))
    h.process_element("a", timestamp_ms=1)
    h.run_until_idle()
    [entry] = list(h.chain.operators[0].queue)
    assert isinstance(entry.handler.future, CoroutineCall) == (path == "direct")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bad", ["a string", {"a": 1}, 42, None])
def test_a_coroutine_that_returns_no_list_is_a_clear_failure(path: str, bad: Any) -> None:
    async def wrong(value: Any) -> Any:
        await asyncio.sleep(0)
        return bad

    h = OperatorHarness(async_wait(function(wrong, path), capacity=2, on_error="dead_letter"))
    h.process_element("a", timestamp_ms=1)
    h.run_until_idle()
    [letter] = h.side_outputs[DEAD_LETTER]
    assert letter.error_type == "ResultTypeError" and "needs a list of results, got" in letter.error
    h2 = OperatorHarness(async_wait(function(wrong, path), capacity=2))
    with pytest.raises(ResultTypeError, match="record 'a' .* needs a list of results, got"):
        h2.process_element("a", timestamp_ms=1)


@pytest.mark.parametrize("path", PATHS)
def test_a_function_that_raises_before_giving_a_coroutine_is_a_failed_attempt(path: str) -> None:
    async def two_args(value: Any, other: Any) -> list[Any]:
        return [value]

    h = OperatorHarness(async_wait(function(two_args, path), capacity=2, on_error="dead_letter",
                                   retry=FixedDelay(2, 10)))
    h.process_element("a", timestamp_ms=1)
    h.run_until_idle()
    h.set_processing_time(10)
    [letter] = h.side_outputs[DEAD_LETTER]
    assert letter.error_type == "TypeError" and letter.attempts == 2


@pytest.mark.parametrize("path", PATHS)
def test_a_coroutine_that_swallows_its_cancellation_at_the_deadline_gives_only_the_fallback(path: str) -> None:
    async def stubborn(value: Any) -> list[Any]:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return [f"{value}-late"]  # answers anyway, after the deadline
        return []

    h = OperatorHarness(async_wait(function(stubborn, path, fallback=lambda v: [f"{v}-fallback"]),
                                   capacity=2, timeout_ms=50))
    h.process_element("a", timestamp_ms=1)
    h.run_until_idle()
    h.set_processing_time(50)
    h.run_until_idle()
    assert h.output == [Record("a-fallback", 1)]
    assert h.chain.operators[0].metrics.timeouts == 1


@pytest.mark.parametrize("path", PATHS)
def test_retries_see_the_original_input_and_the_same_key_however_the_coroutine_changes_it(path: str) -> None:
    seen: list[tuple[dict[str, Any], str | None]] = []

    async def flaky(row: dict[str, Any]) -> list[Any]:
        seen.append((dict(row), current_request_key()))
        row["spoiled"] = True  # a function that changes its argument
        await asyncio.sleep(0)
        if len(seen) < 3:
            raise UserFunctionError("try again")
        return [{**row, "ok": current_request_key()}]

    h = OperatorHarness(async_wait(function(flaky, path), capacity=2, retry=FixedDelay(3, 5)),
                        request_key_prefix="job/enrich")
    h.process_element({"id": 7}, timestamp_ms=1, origin=(0, 1, 2))
    for t in (5, 10):
        h.run_until_idle()
        h.set_processing_time(t)
    h.run_until_idle()
    assert seen == [({"id": 7}, "job/enrich/0.1.2")] * 3
    assert h.output_values() == [{"id": 7, "spoiled": True, "ok": "job/enrich/0.1.2"}]
    assert h.chain.operators[0].metrics.retries == 2


@pytest.mark.parametrize("path", PATHS)
def test_a_result_that_comes_before_the_deadline_mail_wins_and_a_late_one_loses(path: str) -> None:
    gates: dict[str, asyncio.Event] = {}

    async def gated(value: str) -> list[Any]:
        gates[value] = asyncio.Event()
        await gates[value].wait()
        return [value]

    h = OperatorHarness(async_wait(function(gated, path, fallback=lambda v: [f"{v}-fallback"]),
                                   capacity=4, timeout_ms=100, mode="unordered"))
    for v in "abc":
        h.process_element(v, timestamp_ms=1)
    h.run_until_idle()
    gates["a"].set()
    h.run_until_idle()
    h.set_processing_time(100)  # b and c time out; a already answered
    gates["b"].set()  # after the deadline: cancelled, ignored
    h.run_until_idle()
    assert sorted(h.output_values()) == ["a", "b-fallback", "c-fallback"]


@pytest.mark.parametrize("factory", [False, True])
def test_the_coroutine_runner_keeps_a_loops_task_factory_and_each_requests_key(factory: bool) -> None:
    """A loop without a task factory gets its tasks made directly; one with a factory (a user's,
    or a tracing library's) still gets every task through it. Either way each coroutine sees the
    key of its own request, and a cancel stops it."""
    from actorflow.operators.coroutine_runner import AsyncioCoroutineRunner
    from actorflow.operators.request_keys import call_in_request

    async def main() -> tuple[list[Any], int, int]:
        loop = asyncio.get_running_loop()
        made: list[Any] = []
        if factory:
            def task_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
                made.append(coro)
                return asyncio.Task(coro, loop=loop, **kwargs)

            loop.set_task_factory(task_factory)
        runner = AsyncioCoroutineRunner(loop)
        seen: list[Any] = []

        async def request(n: int) -> list[Any]:
            await asyncio.sleep(0)
            return [(n, current_request_key())]

        async def hang() -> None:
            await asyncio.sleep(60)

        for n in range(3):
            call_in_request(f"k{n}", None, runner.submit, request(n), lambda result, error: seen.append((result, error)))
        cancel = runner.submit(hang(), lambda result, error: seen.append(("hang", result, error)))
        cancel()
        for _ in range(5):
            await asyncio.sleep(0)
        return seen, len(made), len(asyncio.all_tasks()) - 1  # (asyncio.run's shutdown makes more)

    seen, made, left = asyncio.run(main())
    assert seen == [([(0, "k0")], None), ([(1, "k1")], None), ([(2, "k2")], None)]
    assert made == (4 if factory else 0)
    assert left == 0  # the cancelled coroutine is gone, and reported nothing


@pytest.mark.parametrize("path", PATHS)
def test_finish_makes_the_results_from_the_input_the_coroutine_got_and_what_it_returned(path: str) -> None:
    async def lookup(row: dict[str, Any]) -> dict[str, Any]:
        row["seen"] = True  # its own copy: finish sees the change
        await asyncio.sleep(0)
        return {"x": row["id"] + 1}

    def merge(row: dict[str, Any], result: dict[str, Any]) -> list[Any]:
        return [{**row, **result}]

    h = OperatorHarness(async_wait(function(lookup, path, finish=merge), capacity=2))
    h.process_element({"id": 1}, timestamp_ms=1)
    h.process_element({"id": 2}, timestamp_ms=2)
    h.run_until_idle()
    assert h.output == [Record({"id": 1, "seen": True, "x": 2}, 1), Record({"id": 2, "seen": True, "x": 3}, 2)]


@pytest.mark.parametrize("path", PATHS)
def test_an_error_that_finish_raises_is_the_attempts_own_and_is_retried(path: str) -> None:
    calls: list[int] = []

    async def lookup(row: dict[str, Any]) -> Any:
        calls.append(row["id"])
        await asyncio.sleep(0)
        return "not a dict"

    def strict(row: dict[str, Any], result: Any) -> list[Any]:
        if not isinstance(result, dict):
            raise ResultTypeError(f"expected a dict, got {result!r}")
        return [result]

    h = OperatorHarness(async_wait(function(lookup, path, finish=strict), capacity=2, on_error="dead_letter",
                                   retry=FixedDelay(2, 10)))
    h.process_element({"id": 1}, timestamp_ms=1)
    h.run_until_idle()
    h.set_processing_time(10)
    h.run_until_idle()
    [letter] = h.side_outputs[DEAD_LETTER]
    assert letter.error_type == "ResultTypeError" and "expected a dict, got 'not a dict'" in letter.error
    assert letter.attempts == 2 and calls == [1, 1]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", ["ordered", "unordered"])
def test_a_record_in_flight_is_one_slotted_request_that_reference_counting_frees_once_emitted(mode: str, path: str) -> None:
    import gc

    gates: dict[str, asyncio.Event] = {}

    async def gated(value: str) -> list[Any]:
        gates[value] = asyncio.Event()
        await gates[value].wait()
        return [value.upper()]

    op = async_wait(function(gated, path), mode=mode, capacity=1, timeout_ms=1_000, copy_inputs="shallow")
    h = OperatorHarness(op)
    h.process_element("a", timestamp_ms=1)
    blocked = h.chain.blocked_check()  # once the operator is open, as the actor asks
    h.process_element("b", timestamp_ms=2)  # waits for room
    h.run_until_idle()
    assert blocked() and op.is_blocked()
    (request,) = list(op.queue)
    # The queue entry is the attempt handler: one object, with no __dict__ behind its slots.
    assert request.handler is request and request.record.value == "a"
    assert not hasattr(request, "__dict__")
    kind = type(request)
    del request

    def live_requests() -> list[Any]:
        return [o.record.value for o in gc.get_objects() if type(o) is kind and o.op is op]

    assert live_requests() == ["a"]
    gc.disable()  # what frees it must be reference counting, not the cyclic collector
    try:
        gates["a"].set()
        h.run_until_idle()
        assert live_requests() == ["b"]  # "b" has started; "a" is gone
    finally:
        gc.enable()
    assert not blocked() and not op.is_blocked()
    gates["b"].set()
    h.run_until_idle()
    assert h.output_values() == ["A", "B"]
