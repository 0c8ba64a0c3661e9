"""Async I/O: who wins at the deadline, async def functions, a failed operator, retry strategies,
snapshots of a blocked operator."""

from __future__ import annotations

import asyncio

import pytest

from actorflow.operators import (
    DEAD_LETTER,
    AsyncFunction,
    ConfigurationError,
    ExponentialBackoff,
    FixedDelay,
    NoRetry,
    OperatorHarness,
    Record,
    RetryStrategy,
    UserFunctionError,
    Watermark,
    async_wait,
    empty_result,
    exception_of_type,
)

from .scripted import Scripted


class Transient(Exception):
    pass


# ------------------------------------------------------------- the deadline and a completion


def test_a_completion_delivered_before_the_timeout_mail_runs_wins():
    fn = Scripted(fallback=lambda v: "fallback")
    h = OperatorHarness(async_wait(fn, capacity=2, timeout_ms=100), auto_run=False)
    h.process_element("a", timestamp_ms=1)
    h.run_until_idle()
    h.processing_time.advance_to(100)  # the timeout mail is queued first ...
    fn.complete("a")  # ... then the user completes; its result mail is queued behind it
    h.run_until_idle()
    assert h.output == [Record("a", 1)] and fn.timeouts == []


def test_a_completion_that_asks_for_a_retry_after_the_deadline_times_out_instead():
    fn = Scripted(fallback=lambda v: "fallback")
    h = OperatorHarness(async_wait(fn, capacity=2, timeout_ms=100, retry=FixedDelay(3, 10)), auto_run=False)
    h.process_element("a", timestamp_ms=1)
    h.run_until_idle()
    h.processing_time.advance_to(100)
    fn.fail("a", Transient())  # completed before the timeout mail ran, but would be retried
    h.run_until_idle()
    h.set_processing_time(1_000)
    assert fn.calls == [("a", 1)]  # no attempt starts after the deadline
    assert h.output == [Record("fallback", 1)] and fn.timeouts == ["a"]


def test_a_final_failure_delivered_before_the_timeout_mail_runs_wins():
    fn = Scripted(fallback=lambda v: "fallback")
    h = OperatorHarness(async_wait(fn, capacity=2, timeout_ms=100, on_error="dead_letter"), auto_run=False)
    h.process_element("a", timestamp_ms=1)
    h.run_until_idle()
    h.processing_time.advance_to(100)
    fn.fail("a", Transient("no"))
    h.run_until_idle()
    [letter] = h.side_outputs[DEAD_LETTER]
    assert letter.error_type == "Transient" and fn.timeouts == [] and h.output == []


# ------------------------------------------------------------------ async def async_invoke


class PyFlinkShaped(AsyncFunction):
    """PyFlink's shape: ``async def async_invoke(self, value) -> list``."""

    def __init__(self) -> None:
        self.gate: asyncio.Event | None = None

    async def async_invoke(self, value):
        if self.gate is not None:
            await self.gate.wait()
        return [value * 2]


def test_an_async_function_whose_async_invoke_is_an_async_def_is_awaited():
    h = OperatorHarness(async_wait(PyFlinkShaped(), capacity=2))
    h.process_element(21, timestamp_ms=3)
    h.process_watermark(3)
    h.run_until_idle()
    assert h.output == [Record(42, 3), Watermark(3)]


def test_an_async_def_async_invoke_that_completes_its_future_itself():
    class WithFuture(AsyncFunction):
        async def async_invoke(self, value, result_future):
            await asyncio.sleep(0)
            result_future.complete([value, value])

    h = OperatorHarness(async_wait(WithFuture(), capacity=2))
    h.process_element("x", timestamp_ms=1)
    h.run_until_idle()
    assert h.output == [Record("x", 1), Record("x", 1)]


def test_an_async_def_async_invoke_that_raises_is_a_failed_attempt():
    class Raising(AsyncFunction):
        async def async_invoke(self, value):
            raise Transient(f"bad {value}")

    h = OperatorHarness(async_wait(Raising(), capacity=2, on_error="dead_letter"))
    h.process_element("x", timestamp_ms=1)
    h.run_until_idle()
    [letter] = h.side_outputs[DEAD_LETTER]
    assert letter.error_type == "Transient" and "bad x" in letter.error


def test_a_timeout_cancels_the_coroutine_of_an_async_def_async_invoke():
    cancelled = []

    class Hanging(PyFlinkShaped):
        async def async_invoke(self, value):
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(value)
                raise
            return []

    h = OperatorHarness(async_wait(Hanging(), capacity=2, timeout_ms=50, on_error="dead_letter"))
    h.process_element("x", timestamp_ms=1)
    h.run_until_idle()
    h.set_processing_time(50)
    h.run_until_idle()
    assert cancelled == ["x"] and h.side_outputs[DEAD_LETTER][0].error_type == "AsyncTimeoutError"


@pytest.mark.parametrize("fails", [False, True])
def test_pyflinks_plain_timeout_returning_a_list_is_the_fallback(fails):
    class PyFlinkTimeout(AsyncFunction):
        async def async_invoke(self, value):
            await asyncio.Event().wait()  # never answers
            return []

        def timeout(self, value):
            if fails:
                raise TimeoutError(f"gave up on {value}")
            return [f"{value}-fallback"]

    h = OperatorHarness(async_wait(PyFlinkTimeout(), capacity=2, timeout_ms=50, on_error="dead_letter"))
    h.process_element("x", timestamp_ms=1)
    h.run_until_idle()
    h.set_processing_time(50)
    h.run_until_idle()
    if fails:
        [letter] = h.side_outputs[DEAD_LETTER]
        assert letter.error_type == "TimeoutError" and "gave up on x" in letter.error
    else:
        assert h.output == [Record("x-fallback", 1)]


def test_a_plain_async_invoke_beside_an_async_def_timeout_is_called_directly():
    class AsyncFallback(AsyncFunction):
        def async_invoke(self, value, result_future):
            self.future = result_future

        async def timeout(self, value):
            await asyncio.sleep(0)
            return [f"{value}-fallback"]

    fn = AsyncFallback()
    h = OperatorHarness(async_wait(fn, capacity=2, timeout_ms=50))
    h.process_element("x", timestamp_ms=1)
    h.set_processing_time(50)
    h.run_until_idle()
    assert h.output == [Record("x-fallback", 1)]
    assert not asyncio.all_tasks(h.loop)  # no task was made for the plain async_invoke


def test_an_async_generator_is_rejected_when_the_operator_is_built():
    class Streaming(AsyncFunction):
        async def async_invoke(self, value):
            yield [value]

    async def streaming(value):
        yield [value]

    for fn in (Streaming(), streaming):
        with pytest.raises(ConfigurationError, match="async generator"):
            async_wait(fn, capacity=2)


def test_a_coroutine_returned_by_a_plain_function_is_named_and_closed():
    import asyncio

    from actorflow.operators.async_function import results_error

    coroutine = asyncio.sleep(0, [1])
    error = results_error(coroutine, "the return value of lookup")
    assert error is not None
    assert "needs a list of results, got coroutine" in str(error)
    assert "declare it async def and await the call" in str(error)
    assert coroutine.cr_frame is None  # closed: Python does not warn that it was never awaited
    assert "await" not in str(results_error({"x": 1}, "the return value of lookup"))


# ---------------------------------------------------------------------- a failed operator


def test_once_the_operator_has_failed_later_completions_emit_nothing():
    fn = Scripted(fallback=lambda v: "fallback")
    h = OperatorHarness(async_wait(fn, mode="unordered", capacity=3, timeout_ms=100))
    for v in "abc":
        h.process_element(v, timestamp_ms=1)
    with pytest.raises(UserFunctionError):
        fn.fail("a", KeyError("x"))
        h.run_until_idle()
    fn.complete("b")
    h.run_until_idle()
    h.set_processing_time(100)  # "c" would time out into a fallback
    assert h.output == [] and fn.timeouts == []


# ------------------------------------------------------------------------ retry strategies


@pytest.mark.parametrize(
    "build",
    [
        lambda: FixedDelay(3, 10, retry_on_exception=None),
        lambda: ExponentialBackoff(3, 10, retry_on_exception=None, retry_on_result=None),
    ],
)
def test_a_retry_strategy_that_could_never_retry_is_rejected(build):
    with pytest.raises(ConfigurationError, match="needs retry_on_result or retry_on_exception, got neither"):
        build()


def test_no_retry_needs_no_predicate():
    assert NoRetry().max_attempts == 1


def test_a_retry_strategys_repr_shows_its_predicates():
    strategy = ExponentialBackoff(
        4, 10, retry_on_result=empty_result, retry_on_exception=exception_of_type(ConnectionError)
    )
    text = repr(strategy)
    assert "retry_on_result=empty_result" in text
    assert "retry_on_exception=exception_of_type(ConnectionError)" in text
    assert "retry_on_exception=any_exception" in repr(FixedDelay(2, 5))


def test_a_strategy_subclass_is_checked_too():
    class Custom(RetryStrategy):
        def delay_ms(self, attempts_made: int) -> int:
            return 1

    with pytest.raises(ConfigurationError, match="Custom needs"):
        Custom(3, retry_on_exception=None)


# ------------------------------------------------------------------ a snapshot while blocked


def test_a_snapshot_of_a_full_operator_through_the_harness_continues_like_an_uninterrupted_run():
    def make(fn):
        return async_wait(fn, mode="ordered", capacity=1)

    def run_to_end(h, fn):
        h.end_input()
        while fn.in_flight():
            fn.complete(fn.in_flight()[0])
            h.run_until_idle()
        assert h.is_finished

    fn_ref = Scripted()
    ref = OperatorHarness(make(fn_ref))
    for v in "abcd":
        ref.process_element(v, timestamp_ms=ord(v))
    run_to_end(ref, fn_ref)

    fn1 = Scripted()
    h1 = OperatorHarness(make(fn1))
    for v in "abcd":
        h1.process_element(v, timestamp_ms=ord(v))
    # "a" is in flight, "b" waits for room inside the operator, "c" and "d" wait in the input.
    assert [v for v, _ in fn1.calls] == ["a"] and h1.pending_input == 2
    snapshot = h1.snapshot()

    fn2 = Scripted()
    h2 = OperatorHarness(make(fn2))
    h2.restore(snapshot)
    for v in "cd":  # the input after the snapshot comes again
        h2.process_element(v, timestamp_ms=ord(v))
    run_to_end(h2, fn2)
    assert h2.output == ref.output == [Record(v, ord(v)) for v in "abcd"]
