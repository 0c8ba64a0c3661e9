"""Async I/O: timeouts, retries, failures and dead letters; exactly one outcome each."""

from __future__ import annotations

import pytest

from actorflow.operators import (
    Watermark,
    DEAD_LETTER,
    AsyncTimeoutError,
    ExponentialBackoff,
    FixedDelay,
    OperatorHarness,
    Record,
    ResultTypeError,
    UserFunctionError,
    async_wait,
    empty_result,
    exception_of_type,
)

from .scripted import Scripted


class Transient(Exception):
    pass


class Permanent(Exception):
    pass


# ------------------------------------------------------------------------- timeouts


def test_timeout_calls_the_user_timeout_and_emits_its_fallback():
    fn = Scripted(fallback=lambda v: f"{v}-fallback")
    h = OperatorHarness(async_wait(fn, mode="unordered", capacity=3, timeout_ms=100))
    h.process_element("a", timestamp_ms=1)
    h.process_watermark(5)
    h.process_element("b", timestamp_ms=6)
    h.set_processing_time(99)
    assert h.output == []
    h.set_processing_time(100)  # "a" and "b" time out at 100
    assert h.output == [Record("a-fallback", 1), Watermark(5), Record("b-fallback", 6)]
    assert fn.timeouts == ["a", "b"]


def test_default_timeout_fails_the_job_with_an_error_naming_operator_and_record():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, capacity=2, timeout_ms=50), name="clicks/enrich[0/2]")
    h.process_element({"user": 7}, timestamp_ms=3)
    with pytest.raises(AsyncTimeoutError) as info:
        h.set_processing_time(50)
    message = str(info.value)
    assert "clicks/enrich[0/2]" in message and "{'user': 7}" in message and "timestamp_ms=3" in message
    assert info.value.value == {"user": 7}


def test_timeout_after_completion_is_a_no_op():
    fn = Scripted(fallback=lambda v: "late")
    h = OperatorHarness(async_wait(fn, capacity=2, timeout_ms=100))
    h.process_element("a", timestamp_ms=1)
    fn.complete("a")
    h.run_until_idle()
    h.set_processing_time(500)
    assert h.output == [Record("a", 1)] and fn.timeouts == []


def test_completion_after_the_timeout_is_ignored():
    fn = Scripted(fallback=lambda v: "fallback")
    h = OperatorHarness(async_wait(fn, capacity=2, timeout_ms=100))
    h.process_element("a", timestamp_ms=1)
    h.set_processing_time(100)
    fn.future("a").complete(["too late"])  # the abandoned attempt completes anyway
    h.run_until_idle()
    assert h.output == [Record("fallback", 1)]


def test_completion_queued_before_the_timeout_fires_wins_and_timeout_is_a_no_op():
    fn = Scripted(fallback=lambda v: "fallback")
    h = OperatorHarness(async_wait(fn, capacity=2, timeout_ms=100), auto_run=False)
    h.process_element("a", timestamp_ms=1)
    h.run_until_idle()
    fn.complete("a")  # the result mail is queued ...
    h.set_processing_time(100)  # ... and the timeout mail right behind it
    h.run_until_idle()
    assert h.output == [Record("a", 1)] and fn.timeouts == []


def test_timeout_is_measured_from_the_first_attempt_across_retries():
    fn = Scripted(fallback=lambda v: "gave up")
    h = OperatorHarness(async_wait(fn, capacity=2, timeout_ms=100, retry=FixedDelay(10, 30)))
    h.process_element("a", timestamp_ms=1)
    fn.fail("a", Transient())
    h.set_processing_time(30)  # second attempt
    fn.fail("a", Transient())
    h.set_processing_time(60)  # third attempt
    fn.fail("a", Transient())
    h.set_processing_time(90)  # fourth attempt
    h.set_processing_time(100)  # one deadline for all of them
    assert h.output == [Record("gave up", 1)]
    assert fn.calls == [("a", 1), ("a", 2), ("a", 3), ("a", 4)]


def test_no_retry_after_the_timeout_fired():
    fn = Scripted(fallback=lambda v: "fallback")
    h = OperatorHarness(async_wait(fn, capacity=2, timeout_ms=100, retry=FixedDelay(5, 80)))
    h.process_element("a", timestamp_ms=1)
    fn.fail("a", Transient())  # retry scheduled for 80 ...
    h.set_processing_time(100)  # ... fired at 80, and the deadline at 100 ends the second attempt
    h.set_processing_time(1_000)
    assert fn.calls == [("a", 1), ("a", 2)]
    assert h.output == [Record("fallback", 1)]


def test_retry_timer_past_the_deadline_never_fires():
    fn = Scripted(fallback=lambda v: "fallback")
    h = OperatorHarness(async_wait(fn, capacity=2, timeout_ms=100, retry=FixedDelay(5, 500)))
    h.process_element("a", timestamp_ms=1)
    fn.fail("a", Transient())
    h.set_processing_time(10_000)
    assert fn.calls == [("a", 1)] and h.output == [Record("fallback", 1)]


# -------------------------------------------------------------------------- retries


@pytest.mark.parametrize(
    "strategy, expected_delays",
    [
        (FixedDelay(4, 25), [25, 25, 25]),  # the same wait before every retry
        (ExponentialBackoff(5, 10, 2.0, 50), [10, 20, 40, 50]),  # doubling, capped at 50
        (ExponentialBackoff(3, 7, 3.0), [7, 21]),  # no cap
    ],
)
def test_retry_delays_follow_the_strategy(strategy, expected_delays):
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, capacity=2, retry=strategy, on_error="dead_letter"))
    h.process_element("a", timestamp_ms=1)
    now = 0
    for delay in expected_delays:
        fn.fail("a", Transient())
        h.run_until_idle()
        attempts = len(fn.calls)
        h.set_processing_time(now + delay - 1)
        assert len(fn.calls) == attempts  # not yet
        now += delay
        h.set_processing_time(now)
        assert len(fn.calls) == attempts + 1
    fn.fail("a", Transient())  # the last attempt fails: attempts exhausted
    h.run_until_idle()
    [letter] = h.side_outputs[DEAD_LETTER]
    assert letter.attempts == strategy.max_attempts and letter.error_type == "Transient"


def test_delays_depend_only_on_the_elements_own_attempt_count():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, mode="unordered", capacity=4, retry=ExponentialBackoff(4, 10, 2.0)))
    h.process_element("a", timestamp_ms=1)
    fn.fail("a", Transient())
    h.set_processing_time(10)  # "a" attempt 2
    fn.fail("a", Transient())  # "a" now waits 20
    h.process_element("b", timestamp_ms=2)
    fn.fail("b", Transient())  # "b" waits 10 (its first retry), not 40
    h.set_processing_time(20)
    assert fn.calls[-1] == ("b", 2)
    h.set_processing_time(29)
    assert ("a", 3) not in fn.calls
    h.set_processing_time(30)
    assert fn.calls[-1] == ("a", 3)


def test_retry_on_result_predicate():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, capacity=2, retry=FixedDelay(3, 10, retry_on_result=empty_result)))
    h.process_element("a", timestamp_ms=1)
    fn.complete("a", [])
    h.set_processing_time(10)
    fn.complete("a", ["found"])
    h.run_until_idle()
    assert h.output == [Record("found", 1)]


def test_result_still_retryable_when_attempts_run_out_is_emitted():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, capacity=2, retry=FixedDelay(2, 10, retry_on_result=empty_result)))
    h.process_element("a", timestamp_ms=1)
    h.process_element("b", timestamp_ms=2)
    fn.complete("a", [])
    h.set_processing_time(10)
    fn.complete("a", [])  # second and last attempt: the empty result stands
    fn.complete("b")
    h.run_until_idle()
    assert h.output == [Record("b", 2)]


def test_exception_predicate_retries_only_matching_errors():
    fn = Scripted()
    strategy = FixedDelay(5, 10, retry_on_exception=exception_of_type(Transient))
    h = OperatorHarness(async_wait(fn, capacity=2, retry=strategy, on_error="dead_letter"))
    h.process_element("a", timestamp_ms=1)
    fn.fail("a", Transient())
    h.set_processing_time(10)
    fn.fail("a", Permanent("no such user"))  # not retried
    h.set_processing_time(1_000)
    assert fn.calls == [("a", 1), ("a", 2)]
    [letter] = h.side_outputs[DEAD_LETTER]
    assert letter.error_type == "Permanent" and "no such user" in letter.error and letter.attempts == 2


def test_end_of_input_cuts_no_retry_short_every_attempt_keeps_its_backoff():
    fn = Scripted()
    strategy = ExponentialBackoff(max_attempts=4, initial_delay_ms=100, multiplier=2.0)
    h = OperatorHarness(async_wait(fn, capacity=2, retry=strategy, on_error="dead_letter"))
    h.process_element("a", timestamp_ms=1)
    fn.fail("a", Transient())  # retry due at 100
    h.end_input()
    assert fn.calls == [("a", 1)] and not h.is_finished  # the end of input did not fire it early
    started_at = {}
    for now in range(0, 1_001, 10):
        h.set_processing_time(now)
        for _, attempt in fn.calls:
            if attempt not in started_at:
                started_at[attempt] = now
                if attempt < 4:
                    fn.fail("a", Transient())
    # Delays of 100, 200 and 400 ms between the attempts, as configured.
    assert started_at == {1: 0, 2: 100, 3: 300, 4: 700}
    assert fn.calls == [("a", 1), ("a", 2), ("a", 3), ("a", 4)]
    fn.fail("a", Transient())  # the fourth and last attempt
    h.run_until_idle()
    [letter] = h.side_outputs[DEAD_LETTER]
    assert (letter.value, letter.attempts) == ("a", 4)
    assert h.is_finished


def test_end_of_input_lets_a_late_retry_succeed():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, capacity=2, retry=FixedDelay(3, 1_000)))
    h.process_element("a", timestamp_ms=1)
    fn.fail("a", Transient())
    h.end_input()
    h.set_processing_time(1_000)
    fn.complete("a")  # the second attempt succeeds: the record is not lost to the end of input
    h.run_until_idle()
    assert h.output == [Record("a", 1)] and h.is_finished


# ------------------------------------------------------------- failures, dead letters


def test_user_failure_fails_the_job_with_operator_record_and_cause():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, capacity=2), name="job/enrich[1/2]")
    h.process_element({"id": 5}, timestamp_ms=9)
    with pytest.raises(UserFunctionError) as info:
        fn.fail({"id": 5}, KeyError("segment"))
        h.run_until_idle()
    error = info.value
    assert "job/enrich[1/2]" in str(error) and "{'id': 5}" in str(error) and "KeyError" in str(error)
    assert isinstance(error.__cause__, KeyError) and error.timestamp_ms == 9


@pytest.mark.parametrize("mode", ["ordered", "unordered"])
def test_a_failure_amid_a_burst_of_completions_lets_out_the_results_before_it_and_none_after(mode):
    # The four completions share one mail of completions, whose results leave at its end: a
    # record that fails the operator first lets out what the burst completed before it.
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, mode=mode, capacity=4))
    for i, value in enumerate("abcd"):
        h.process_element(value, timestamp_ms=i)
    fn.complete("b")
    fn.complete("a")
    fn.fail("c", Permanent("400"))
    fn.complete("d")
    with pytest.raises(UserFunctionError, match="Permanent: 400"):
        h.run_until_idle()
    expected = [Record("a", 0), Record("b", 1)] if mode == "ordered" else [Record("b", 1), Record("a", 0)]
    assert h.output == expected


def test_async_invoke_that_raises_is_an_exceptional_completion():
    class Raising(Scripted):
        def async_invoke(self, value, result_future):
            raise ValueError(f"bad {value}")

    h = OperatorHarness(async_wait(Raising(), capacity=2, on_error="dead_letter"))
    h.process_element("x", timestamp_ms=1)
    [letter] = h.side_outputs[DEAD_LETTER]
    assert letter.value == "x" and letter.error_type == "ValueError" and "bad x" in letter.error


def test_dead_letter_carries_input_attempts_error_and_timestamp():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, capacity=2, retry=FixedDelay(2, 5), on_error="dead_letter"), name="j/op[0/1]")
    h.process_element("a", timestamp_ms=11)
    h.process_element("b", timestamp_ms=12)
    fn.fail("a", Transient("503"))
    h.set_processing_time(5)
    fn.fail("a", Transient("503 again"))
    fn.complete("b")
    h.run_until_idle()
    assert h.output == [Record("b", 12)]
    [letter] = h.side_outputs[DEAD_LETTER]
    assert (letter.value, letter.timestamp_ms, letter.attempts, letter.error_type, letter.operator) == (
        "a", 11, 2, "Transient", "j/op[0/1]",
    )
    assert "503 again" in letter.error


def test_timeout_without_fallback_goes_to_dead_letters_when_asked():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, capacity=2, timeout_ms=10, on_error="dead_letter"))
    h.process_element("a", timestamp_ms=1)
    h.set_processing_time(10)
    [letter] = h.side_outputs[DEAD_LETTER]
    assert letter.error_type == "AsyncTimeoutError"


@pytest.mark.parametrize("bad", ["a string", {"a": 1}, 42, None])
def test_result_of_the_wrong_type_is_a_clear_failure(bad):
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, capacity=2))
    h.process_element("a", timestamp_ms=1)
    with pytest.raises(ResultTypeError, match="needs a list of results, got"):
        fn.future("a").complete(bad)
        h.run_until_idle()


def test_second_completion_is_ignored():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, capacity=2))
    h.process_element("a", timestamp_ms=1)
    future = fn.future("a")
    future.complete(["first"])
    future.complete(["second"])
    future.complete_exceptionally(RuntimeError("third"))
    h.run_until_idle()
    assert h.output == [Record("first", 1)]
