"""Async I/O that knows its service: calls in flight, a rate limit, overload answers with
Retry-After, adaptive capacity and a circuit breaker, each record with exactly one outcome."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actorflow.operators import DEAD_LETTER, ConfigurationError, CoroutineFunction, FixedDelay, OperatorHarness, async_wait
from actorflow.operators.service import (
    AdaptiveCapacity, CircuitBreaker, Hedge, LookupCache, RateLimit, Service, ServiceOverloaded, overload_of,
)
from actorflow.operators.service_quota import ServiceQuotas

from .scripted import Scripted


class HTTPError(Exception):
    """An HTTP client's error, as aiohttp's and requests' carry the status and the headers."""

    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.headers = headers or {}


def _gated(service: Service, *, fallback=None, **options):
    fn = Scripted(fallback=fallback)
    options.setdefault("capacity", 100)
    options.setdefault("mode", "unordered")
    h = OperatorHarness(async_wait(fn, service=service, **options))
    return fn, h


def _feed(h, values, start_ts=0):
    for i, v in enumerate(values):
        h.process_element(v, timestamp_ms=start_ts + i)


# ----------------------------------------------------------------------- overload answers


def test_overload_answers_are_recognised_by_status_and_retry_after():
    assert overload_of(HTTPError(429, {"Retry-After": "1.5"})) == 1.5
    assert overload_of(HTTPError(503)) == 0.0
    assert overload_of(HTTPError(429, {"Retry-After": "Wed, 21 Oct 2026 07:28:00 GMT"})) == 0.0
    assert overload_of(HTTPError(404)) is None
    assert overload_of(ServiceOverloaded(retry_after_s=0.25)) == 0.25
    assert overload_of(ValueError("bad")) is None


# ----------------------------------------------------------------------- capacity


def test_a_fixed_service_capacity_bounds_the_calls_in_flight_below_the_records_in_flight():
    fn, h = _gated(Service(capacity=2), capacity=10)
    _feed(h, "abcde")
    assert [v for v, _ in fn.calls] == ["a", "b"]  # five records in, two calls out
    fn.complete("b")
    h.run_until_idle()
    assert [v for v, _ in fn.calls] == ["a", "b", "c"]
    for v in "acde":
        if v in fn.in_flight():
            fn.complete(v)
        h.run_until_idle()
    for v in fn.in_flight():
        fn.complete(v)
    h.run_until_idle()
    assert sorted(h.output_values()) == list("abcde")
    assert len(fn.calls) == 5


def test_capacity_auto_starts_low_and_grows_while_calls_succeed():
    fn, h = _gated(Service(capacity=AdaptiveCapacity(initial=2, ceiling=16)))
    op = h.chain.operators[0]
    assert op.capacity == 100  # records in flight; the calls stay under the ceiling
    _feed(h, range(100))
    assert len(fn.in_flight()) == 2
    for _ in range(3):
        for v in list(fn.in_flight()):
            fn.complete(v)
        h.run_until_idle()
    # Slow start: one more per success, so the window doubled each round until the ceiling.
    assert op.gate.limit == 16
    assert len(fn.in_flight()) == 16


def test_an_overload_answer_lowers_the_adaptive_limit_once_per_round_trip_and_each_further_one_by_a_call():
    fn, h = _gated(Service(capacity=AdaptiveCapacity(initial=20, ceiling=20, backoff=0.5)))
    _feed(h, range(40))
    gate = h.chain.operators[0].gate
    assert len(fn.in_flight()) == 20
    for v in range(5):  # five overload answers to calls sent before the first decrease
        fn.fail(v, HTTPError(429))
    h.run_until_idle()
    # Halved once for the round trip, then a call less for each further call it turned away:
    # the service had that many slots fewer than the limit said.
    assert gate.limit == 20 * 0.5 - 4
    assert sorted(fn.in_flight()) == list(range(5, 20))  # 15 in flight, over the limit: 0..4 wait
    for v in range(5, 15):
        fn.complete(v)
        h.run_until_idle()
    # Each success while records wait takes it back up, a call at a time, to one under the
    # limit that met the overload, less the four slots the service did not have: 20 - 4 - 1.
    assert gate.limit == 15.0
    assert fn.calls[20:25] == [(0, 2), (1, 2), (2, 2), (3, 2), (4, 2)]  # the turned-away go first again
    fn.fail(0, HTTPError(503))  # sent after the decrease: lowers it again, by the factor
    h.run_until_idle()
    assert gate.limit == 15.0 * 0.5
    assert gate.metrics.overloads == 6


def test_after_an_overload_the_limit_holds_under_it_then_probes_faster_each_round_trip():
    adaptive = AdaptiveCapacity(initial=20, ceiling=200, backoff=0.5, hold_per_call=0, probe_after_s=1.0)
    fn, h = _gated(Service(capacity=adaptive), capacity=200)
    _feed(h, range(2_000))
    gate = h.chain.operators[0].gate
    fn.fail(0, HTTPError(429))  # at 20: the service took no more
    h.run_until_idle()
    assert gate.limit == 10.0

    def round_trip():
        for v in list(fn.in_flight()):
            fn.complete(v)
        h.run_until_idle()

    for _ in range(40):
        round_trip()
    assert gate.limit == 19.0  # back to one under the limit that met the overload, and held there
    h.set_processing_time(1_000)  # a second without an overload: probe above it
    limits = []
    for _ in range(5):
        round_trip()
        limits.append(round(gate.limit, 1))
    assert 19.0 < limits[0] <= 21.0, limits  # the first round trip above it: a probe of a call or two
    # Two round trips above it without an overload: the service grew, and the limit doubles per
    # round trip until it finds the new edge.
    assert limits[2] >= 1.8 * limits[1], limits
    assert limits[-1] > 100, limits


@pytest.mark.parametrize("edge, hold_ms", [(40, 975), (8, 200)])
def test_the_limit_holds_longer_under_a_larger_edge_a_quarter_round_trip_per_call(edge, hold_ms):
    # Calls take 100 ms. Under an edge of 40 the limit (39) holds 0.25 * 39 round trips;
    # under 8 the hold would be 175 ms, and probe_after_s makes it 200.
    adaptive = AdaptiveCapacity(initial=edge, ceiling=200, backoff=0.5, probe_after_s=0.2)
    fn, h = _gated(Service(capacity=adaptive), capacity=200)
    _feed(h, range(5_000))
    gate = h.chain.operators[0].gate
    fn.fail(0, HTTPError(429))  # at t = 0
    h.run_until_idle()
    now, limits = 0, {}
    while now < 1_500:
        now += 25
        h.set_processing_time(now)
        if now % 100 == 0:  # a round trip: every call in flight answers, 100 ms after it left
            for v in list(fn.in_flight()):
                fn.complete(v)
            h.run_until_idle()
        limits[now] = gate.limit
    plateau = edge - 1.0
    assert limits[100] == plateau  # back under the edge within the round trip
    assert all(limit == plateau for t, limit in limits.items() if 100 <= t < hold_ms), limits
    first_probe = min(t for t, limit in limits.items() if limit > plateau)
    assert hold_ms <= first_probe <= hold_ms + 100, (first_probe, limits)


def test_a_probe_that_meets_an_overload_goes_back_to_where_the_limit_held():
    adaptive = AdaptiveCapacity(initial=20, ceiling=200, backoff=0.5, hold_per_call=0, probe_after_s=1.0)
    fn, h = _gated(Service(capacity=adaptive), capacity=200)
    _feed(h, range(2_000))
    gate = h.chain.operators[0].gate
    fn.fail(0, HTTPError(429))
    h.run_until_idle()
    for _ in range(40):
        for v in list(fn.in_flight()):
            fn.complete(v)
        h.run_until_idle()
    assert gate.limit == 19.0
    h.set_processing_time(1_000)
    for v in list(fn.in_flight())[:5]:
        fn.complete(v)  # probing: a little above 19
    h.run_until_idle()
    assert 19.0 < gate.limit < 20.0
    fn.fail(fn.in_flight()[-1], HTTPError(429))  # the service is still 20: the probe met its edge
    h.run_until_idle()
    assert gate.limit == 19.0  # back to the plateau, not halved: the limit under the edge was fine


def test_capacity_auto_is_short_for_a_service_with_adaptive_capacity():
    op = async_wait(Scripted(), capacity="auto")
    assert op.service.capacity == AdaptiveCapacity() and op.capacity == AdaptiveCapacity().ceiling
    with pytest.raises(ConfigurationError, match="both set the calls in flight"):
        async_wait(Scripted(), capacity="auto", service=Service(capacity=4))
    with pytest.raises(ConfigurationError, match="floor <= initial <= ceiling"):
        AdaptiveCapacity(initial=300, ceiling=256)
    with pytest.raises(ConfigurationError, match="capacity must be an int > 0 or 'auto'"):
        async_wait(Scripted(), capacity="lots")


# ------------------------------------------------------------ overload answers sent again


def test_an_overload_with_retry_after_pauses_every_call_and_sends_the_record_again_without_an_attempt():
    fn, h = _gated(Service(capacity=3), retry=None, on_error="dead_letter")
    _feed(h, "abcd")
    assert fn.in_flight() == ["a", "b", "c"]
    fn.fail("b", HTTPError(429, {"Retry-After": "2"}))
    fn.complete("a")
    h.run_until_idle()
    # "a" freed a slot and "b" must go again, but the whole service pauses for 2 s.
    assert [v for v, _ in fn.calls] == ["a", "b", "c"]
    h.set_processing_time(1_999)
    assert len(fn.calls) == 3
    h.set_processing_time(2_000)
    assert [v for v, _ in fn.calls] == ["a", "b", "c", "b", "d"]  # b first: it keeps its place
    fn.complete("b")
    fn.complete("c")
    fn.complete("d")
    h.run_until_idle()
    assert sorted(h.output_values()) == list("abcd")
    assert h.side_output(DEAD_LETTER) == []
    op = h.chain.operators[0]
    assert op.metrics.retries == 0 and op.gate.metrics.pauses == 1 and op.gate.metrics.overloads == 1


def test_past_its_overload_retries_an_overload_answer_is_a_failure_with_its_error():
    fn, h = _gated(Service(capacity=1, overload_retries=2), on_error="dead_letter")
    h.process_element("a", timestamp_ms=1)
    for _ in range(3):
        fn.fail("a", ServiceOverloaded("busy"))
        h.run_until_idle()
    [letter] = h.side_output(DEAD_LETTER)
    assert letter.value == "a" and letter.error_type == "ServiceOverloaded" and letter.attempts == 1
    assert len(fn.calls) == 3


def test_a_deadline_ends_a_record_that_waits_in_the_gate_without_calling():
    fn, h = _gated(Service(capacity=1), fallback=lambda v: f"{v}-late", timeout_ms=100)
    _feed(h, "ab")
    assert fn.in_flight() == ["a"]
    h.set_processing_time(100)  # both deadlines pass: "a" is cut off, "b" never left
    assert sorted(h.output_values()) == ["a-late", "b-late"]
    assert [v for v, _ in fn.calls] == ["a"]
    assert h.chain.operators[0].gate.in_flight == 0
    h.process_element("c", timestamp_ms=5)
    assert fn.in_flight() == ["c"]  # the slot of the cut-off call is free again


# ----------------------------------------------------------------------- rate limit


def _busiest_second(times_ms):
    times = sorted(times_ms)
    return max((sum(1 for u in times[i:] if u < t + 1_000) for i, t in enumerate(times)), default=0)


def test_a_rate_limit_spaces_the_calls_with_no_burst_at_the_start():
    fn, h = _gated(Service(rate_limit=RateLimit(600, per="minute")))  # 10 per second
    _feed(h, range(25))
    assert len(fn.calls) == 1  # the first call at once, the next 100 ms later: no burst
    starts = []
    for now in range(0, 2_001, 10):
        h.set_processing_time(now)
        starts += [now] * (len(fn.calls) - len(starts))
        for v in fn.in_flight():
            fn.complete(v)
        h.run_until_idle()
    assert len(fn.calls) == 21  # at 0, 100, ..., 2000
    assert all(b - a >= 100 for a, b in zip(starts, starts[1:]))
    assert _busiest_second(starts) == 10


def test_without_a_shared_quota_the_rate_limit_is_split_between_the_instances():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, service=Service(rate_limit=100), mode="unordered"))
    h.chain.operators[0].context.parallelism = 4  # 25 per second each
    _feed(h, range(30))
    for now in range(0, 1_001, 5):
        h.set_processing_time(now)
        for v in fn.in_flight():
            fn.complete(v)
    assert len(fn.calls) == 26  # at 0, 40, ..., 1000
    assert h.chain.operators[0].gate.metrics.rate_per_s == 100  # the service's, as last_job() shows it


def _instances(n, service, quotas, **options):
    """``n`` instances of one operator whose harnesses share ``quotas``, as a job's instances do."""
    fns, hs = [], []
    for i in range(n):
        fn = Scripted()
        options.setdefault("capacity", 100)
        h = OperatorHarness(async_wait(fn, service=service, mode="unordered", **options), name=f"test/op[{i}/{n}]",
                            request_key_prefix="job/op", service_quotas=quotas)
        h.chain.operators[0].context.parallelism = n
        fns.append(fn)
        hs.append(h)
    return fns, hs


def _run_instances(fns, hs, until_ms, step_ms=5, *, answer=None):
    """Move every instance's clock together; each call is answered at the next step. The call
    times of all instances, in ms."""
    times, seen = [], [0] * len(fns)
    for now in range(0, until_ms + 1, step_ms):
        for i, (fn, h) in enumerate(zip(fns, hs)):
            h.set_processing_time(now)
            times += [now] * (len(fn.calls) - seen[i])
            seen[i] = len(fn.calls)
            for v in fn.in_flight():
                if answer is not None and answer(fn, v, now):
                    continue
                fn.complete(v)
            h.run_until_idle()
    return times


def test_instances_that_share_a_quota_keep_to_it_together_in_every_second():
    quotas = ServiceQuotas()
    fns, hs = _instances(4, Service(name="geo", rate_limit=100), quotas)
    for i, h in enumerate(hs):
        _feed(h, range(i * 1_000, i * 1_000 + (400 if i < 3 else 20)))  # the last one runs dry early
    times = _run_instances(fns, hs, 3_000)
    assert _busiest_second(times) <= 100  # 100 per second for the four together, not 100 each
    busy = [t for t in times if t < 3_000]
    assert len(busy) >= 0.95 * 300  # and the quota is used: the idle instance leaves its share to the others
    assert len(fns[3].calls) == 20
    granted = sum(h.chain.operators[0].gate.metrics.quota_granted for h in hs)
    assert granted - len(times) <= 4 * 10  # leased only while records wait: at most a lease each beyond the calls


def test_a_slow_instance_drops_the_call_times_it_missed_instead_of_catching_up():
    quotas = ServiceQuotas()
    [fn], [h] = _instances(1, Service(name="geo", rate_limit=100), quotas)
    _feed(h, range(200))
    h.set_processing_time(50)
    sent = len(fn.calls)
    for v in fn.in_flight():
        fn.complete(v)
    h.set_processing_time(600)  # the mailbox was busy for 550 ms
    h.run_until_idle()
    assert len(fn.calls) - sent <= 1  # no burst of the 55 call times it missed
    metrics = h.chain.operators[0].gate.metrics
    assert metrics.quota_unused > 0  # the times it held were dropped: leased, not used
    assert metrics.quota_granted - metrics.quota_unused - metrics.calls <= 10  # the rest: at most a lease ahead


def test_a_retry_after_on_one_instance_pauses_every_instance_of_the_service():
    quotas = ServiceQuotas()
    fns, hs = _instances(3, Service(name="geo", capacity=4), quotas)
    other_fns, [other] = _instances(1, Service(name="maps", capacity=4), quotas)
    for h in hs + [other]:
        _feed(h, range(50))
    fns[0].fail(fns[0].in_flight()[0], HTTPError(429, {"Retry-After": "2"}))
    hs[0].run_until_idle()
    for fn, h in zip(fns + other_fns, hs + [other]):
        for v in fn.in_flight():
            fn.complete(v)
        h.set_processing_time(1_000)
    assert [len(fn.calls) for fn in fns] == [4, 4, 4]  # no instance of geo called during the pause
    assert len(other_fns[0].calls) > 4  # maps is another service: it went on
    for h in hs:
        h.set_processing_time(2_000)
    assert all(len(fn.calls) > 4 for fn in fns)


def test_one_service_with_two_rate_limits_is_refused_naming_both():
    quotas = ServiceQuotas()
    _instances(1, Service(name="geo", rate_limit=100), quotas)[1][0].open()
    with pytest.raises(ConfigurationError, match=r"'geo' is called with two rate limits, 100 calls/s and 50 calls/s"):
        _instances(1, Service(name="geo", rate_limit=50), quotas)[1][0].open()


def test_a_restored_pause_pauses_the_other_instances_too():
    quotas = ServiceQuotas()
    fns, hs = _instances(2, Service(name="geo", capacity=2), quotas)
    hs[0].open()
    restored = hs[0].chain.operators[0]
    restored.gate.restore({"limit": 2, "slow_start": False, "known_max": 0.0, "paused_ms": 1_500, "open_ms": None})
    _feed(hs[1], range(5))
    assert fns[1].calls == []
    hs[1].set_processing_time(1_500)
    assert len(fns[1].calls) == 2


# ---------------------------------------------------------------------- circuit breaker


def _breaker(when_open: str, **options):
    return Service(breaker=CircuitBreaker(failures=3, window_s=10, open_s=5, probes=1, when_open=when_open), **options)


def test_the_breaker_opens_after_failures_in_its_window_and_ends_records_without_calls():
    fn, h = _gated(_breaker("fail"), on_error="dead_letter")
    _feed(h, "abc")
    for v in "abc":
        fn.fail(v, ConnectionError("refused"))
    h.run_until_idle()
    _feed(h, "de", start_ts=10)
    letters = h.side_output(DEAD_LETTER)
    assert [d.value for d in letters] == ["a", "b", "c", "d", "e"]
    assert [d.error_type for d in letters[3:]] == ["CircuitOpenError"] * 2
    assert "circuit breaker" in letters[3].error
    assert [v for v, _ in fn.calls] == ["a", "b", "c"]  # d and e never reached the service
    gate = h.chain.operators[0].gate
    assert gate.metrics.breaker_opens == 1 and gate.metrics.breaker_rejections == 2 and gate.metrics.breaker_state == 1


def test_half_open_lets_one_probe_through_and_its_success_closes_the_breaker():
    fn, h = _gated(_breaker("wait"), on_error="dead_letter")
    _feed(h, "abc")
    for v in "abc":
        fn.fail(v, ConnectionError())
    h.run_until_idle()
    _feed(h, "defg", start_ts=10)
    assert len(fn.calls) == 3  # open: d..g wait
    h.set_processing_time(5_000)
    assert [v for v, _ in fn.calls][3:] == ["d"]  # one probe
    gate = h.chain.operators[0].gate
    assert gate.metrics.breaker_state == 2 and gate.metrics.probes == 1
    fn.complete("d")
    h.run_until_idle()
    assert gate.metrics.breaker_state == 0
    assert [v for v, _ in fn.calls][3:] == ["d", "e", "f", "g"]
    for v in "efg":
        fn.complete(v)
    h.run_until_idle()
    assert sorted(h.output_values()) == list("defg")


def test_a_failed_probe_opens_the_breaker_again():
    fn, h = _gated(_breaker("wait"), on_error="dead_letter")
    _feed(h, "abc")
    for v in "abc":
        fn.fail(v, ConnectionError())
    h.run_until_idle()
    h.process_element("d", timestamp_ms=10)
    h.set_processing_time(5_000)
    fn.fail("d", ConnectionError())
    h.run_until_idle()
    gate = h.chain.operators[0].gate
    assert gate.metrics.breaker_state == 1 and gate.metrics.breaker_opens == 2
    h.process_element("e", timestamp_ms=11)
    h.set_processing_time(9_999)
    assert [v for v, _ in fn.calls] == list("abcd")
    h.set_processing_time(10_000)
    assert [v for v, _ in fn.calls] == list("abcde")


def test_with_when_open_fallback_an_open_breaker_answers_with_the_fallback_and_counts_no_timeout():
    fn, h = _gated(_breaker("fallback"), fallback=lambda v: f"{v}-fallback", on_error="dead_letter")
    _feed(h, "abc")
    for v in "abc":
        fn.fail(v, ConnectionError())
    h.run_until_idle()
    h.process_element("d", timestamp_ms=10)
    assert h.output_values() == ["d-fallback"]
    op = h.chain.operators[0]
    assert op.metrics.timeouts == 0 and op.gate.metrics.breaker_rejections == 1


def test_errors_the_breaker_does_not_count_leave_it_closed():
    not_found = CircuitBreaker(failures=2, counts=lambda e: not isinstance(e, KeyError))
    fn, h = _gated(Service(breaker=not_found), on_error="dead_letter")
    _feed(h, "abc")
    for v in "abc":
        fn.fail(v, KeyError(v))
    h.run_until_idle()
    h.process_element("d", timestamp_ms=9)
    assert fn.in_flight() == ["d"]


# ----------------------------------------------------------------------- snapshots


def test_a_snapshot_holds_the_records_waiting_in_the_gate_and_the_pause_survives_a_restore():
    fn, h = _gated(Service(capacity=2), on_error="dead_letter")
    _feed(h, "abcd")
    fn.fail("a", HTTPError(429, {"Retry-After": "3"}))
    h.run_until_idle()
    h.set_processing_time(1_000)
    snapshot = h.snapshot()
    h.close()

    fn2, h2 = _gated(Service(capacity=2), on_error="dead_letter")
    h2.restore(snapshot)
    h2.set_processing_time(1_000)
    h2.open()
    # b was in flight and a waited to go again: the pause has 2 s left, and both wait for it.
    assert fn2.calls == []
    h2.set_processing_time(3_000)
    assert sorted(v for v, _ in fn2.calls) == ["a", "b"]
    for _ in range(2):
        for v in fn2.in_flight():
            fn2.complete(v)
        h2.run_until_idle()
    assert sorted(h2.output_values()) == list("abcd")


def test_the_learned_limit_survives_a_restore():
    fn, h = _gated(Service(capacity=AdaptiveCapacity(initial=8, ceiling=32, backoff=0.5)))
    _feed(h, range(8))
    fn.fail(0, HTTPError(429))
    h.run_until_idle()
    snapshot = h.snapshot()
    fn2, h2 = _gated(Service(capacity=AdaptiveCapacity(initial=8, ceiling=32, backoff=0.5)))
    h2.restore(snapshot)
    h2.open()
    assert h2.chain.operators[0].gate.limit == 4.0
    assert len(fn2.in_flight()) == 4


# ------------------------------------------------------------------ one outcome each


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_every_record_gets_one_outcome_and_the_gate_holds_its_bounds(seed):
    rng = random.Random(seed)
    breaker = CircuitBreaker(failures=4, window_s=1, open_s=0.2, when_open=rng.choice(["fail", "wait", "fallback"]))
    service = Service(capacity=AdaptiveCapacity(initial=3, ceiling=12), rate_limit=200, breaker=breaker,
                      overload_retries=rng.choice([0, 2, 5]), hedge=rng.choice([None, Hedge(after_ms=15)]))
    fn, h = _gated(service, fallback=lambda v: -v - 1, on_error="dead_letter", timeout_ms=rng.choice([None, 300]))
    h.open()
    gate = h.chain.operators[0].gate
    n = 60
    fed, now = 0, 0
    while True:
        if fed < n and rng.random() < 0.4:
            h.process_element(fed, timestamp_ms=fed)
            fed += 1
        in_flight = fn.in_flight()
        calls = sum(1 for futures in fn.pending.values() for f in futures if not f.done)
        assert gate.in_flight == calls  # every call the gate counts is one the function has, hedges too
        if in_flight and rng.random() < 0.6:
            v = rng.choice(in_flight)
            roll = rng.random()
            if roll < 0.6:
                fn.complete(v)
            elif roll < 0.8:
                fn.fail(v, HTTPError(429, {"Retry-After": rng.choice(["0", "0.05"])}))
            else:
                fn.fail(v, ConnectionError())
            h.run_until_idle()
        else:
            now += rng.choice([1, 5, 20, 100])
            h.set_processing_time(now)
        out = len(h.output_values()) + len(h.side_output(DEAD_LETTER))
        if fed == n and out == n:
            break
        assert now < 600_000, "records were left without an outcome"
    keys = [v if v >= 0 else -v - 1 for v in h.output_values()] + [d.value for d in h.side_output(DEAD_LETTER)]
    assert sorted(keys) == list(range(n))  # each record once: no loss, no duplicate
    assert gate.in_flight == 0


# ----------------------------------------------------------------------- lookup cache


def _cached(ttl_s=60.0, max_size=100, **service):
    return Service(cache=LookupCache(key=lambda v: v // 10, ttl_s=ttl_s, max_size=max_size), **service)


def test_a_key_with_fresh_results_is_answered_from_the_cache_without_a_call():
    fn, h = _gated(_cached())
    h.process_element(11, timestamp_ms=1)
    fn.complete(11, [{"user": 1}])
    h.run_until_idle()
    h.process_element(12, timestamp_ms=2)  # same key (1): no call
    h.process_element(25, timestamp_ms=3)  # key 2: a call
    assert [v for v, _ in fn.calls] == [11, 25]
    out = h.output_values()
    assert out == [{"user": 1}, {"user": 1}]
    out[0]["user"] = "changed"  # each record got its own copy
    assert out[1] == {"user": 1}
    assert h.chain.operators[0].gate.metrics.cache_hits == 1


def test_records_for_a_key_in_flight_wait_for_that_one_call():
    fn, h = _gated(_cached(), capacity=10)
    _feed(h, [31, 32, 33, 41])
    assert [v for v, _ in fn.calls] == [31, 41]  # one call per key
    fn.complete(31, ["three"])
    h.run_until_idle()
    assert sorted(h.output_values()) == ["three"] * 3
    gate = h.chain.operators[0].gate
    assert gate.metrics.merged == 2 and gate.metrics.calls == 2


def test_a_failed_call_caches_nothing_and_the_records_that_waited_call_themselves():
    fn, h = _gated(_cached(), capacity=10, on_error="dead_letter")
    _feed(h, [51, 52])
    fn.fail(51, ConnectionError("reset"))
    h.run_until_idle()
    assert [v for v, _ in fn.calls] == [51, 52]  # 52 called itself once 51 failed
    fn.complete(52, ["five"])
    h.run_until_idle()
    assert h.output_values() == ["five"] and [d.value for d in h.side_output(DEAD_LETTER)] == [51]


def test_results_expire_after_their_ttl_and_the_least_recently_used_key_leaves_first():
    fn, h = _gated(_cached(ttl_s=1.0, max_size=2))
    for i, v in enumerate([10, 20, 30]):  # keys 1, 2, 3: key 1 leaves the cache for key 3
        h.process_element(v, timestamp_ms=i)
        fn.complete(v, [v])
        h.run_until_idle()
    h.process_element(21, timestamp_ms=5)  # key 2: cached
    h.process_element(11, timestamp_ms=6)  # key 1: evicted, called again
    assert [v for v, _ in fn.calls] == [10, 20, 30, 11]
    fn.complete(11, [11])
    h.set_processing_time(1_000)  # key 2's results have expired
    h.process_element(22, timestamp_ms=7)
    assert [v for v, _ in fn.calls][-1] == 22


def test_a_cut_off_call_lets_the_records_that_waited_for_it_call_themselves():
    fn, h = _gated(_cached(), fallback=lambda v: "late", capacity=10, timeout_ms=100)
    h.process_element(61, timestamp_ms=1)
    h.set_processing_time(50)
    h.process_element(62, timestamp_ms=2)  # waits for 61's call; its own deadline is at 150
    h.set_processing_time(100)  # 61 is cut off: 62 calls itself
    assert h.output_values() == ["late"] and [v for v, _ in fn.calls] == [61, 62]
    fn.complete(62, ["six"])
    h.run_until_idle()
    assert h.output_values() == ["late", "six"]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_with_a_cache_every_record_gets_its_keys_answer_once_and_calls_never_exceed_records(seed):
    rng = random.Random(seed)
    fn, h = _gated(_cached(ttl_s=rng.choice([0.05, 1.0]), max_size=rng.choice([1, 3, 100]), capacity=4),
                   capacity=20, on_error="dead_letter")
    n, fed, now = 80, 0, 0
    keys: Counter[int] = Counter()
    while True:
        if fed < n and rng.random() < 0.5:
            value = rng.randrange(12) * 10 + rng.randrange(10)  # key: value // 10
            keys[value // 10] += 1
            h.process_element(value, timestamp_ms=fed)
            fed += 1
        in_flight = fn.in_flight()
        if in_flight and rng.random() < 0.5:
            v = rng.choice(in_flight)
            if rng.random() < 0.8:
                fn.complete(v, [v // 10])  # the answer for the record's key
            else:
                fn.fail(v, ConnectionError())
            h.run_until_idle()
        else:
            now += rng.choice([1, 10, 50])
            h.set_processing_time(now)
        done = len(h.output_values()) + len(h.side_output(DEAD_LETTER))
        if fed == n and done == n:
            break
        assert now < 600_000, "records were left without an outcome"
    # Each record got one outcome, and an answer is always for the record's own key.
    answered = Counter(h.output_values()) + Counter(d.value // 10 for d in h.side_output(DEAD_LETTER))
    assert answered == keys
    assert len(fn.calls) <= n


# ------------------------------------------------------------------------- hedging


def test_a_slow_call_gets_a_second_call_with_the_same_key_and_the_first_answer_wins():
    fn, h = _gated(Service(hedge=Hedge(after_ms=100)), retry=FixedDelay(3, 10))
    h.process_element("a", timestamp_ms=1)
    h.set_processing_time(99)
    assert len(fn.pending["a"]) == 1
    h.set_processing_time(100)
    first, second = fn.pending["a"]
    assert second.idempotency_key == first.idempotency_key  # the same request, sent twice
    second.complete(["from the hedge"])
    h.run_until_idle()
    assert first.done  # the slow call was cancelled
    first.complete(["too late"])  # a cancelled call that answers anyway changes nothing
    h.run_until_idle()
    assert h.output_values() == ["from the hedge"]
    op = h.chain.operators[0]
    assert (op.gate.metrics.hedges, op.gate.metrics.hedge_wins, op.gate.in_flight, op.metrics.retries) == (1, 1, 0, 0)


def test_when_the_first_call_answers_first_the_hedge_is_cancelled():
    fn, h = _gated(Service(hedge=Hedge(after_ms=100)))
    h.process_element("a", timestamp_ms=1)
    h.set_processing_time(150)
    first, second = fn.pending["a"]
    first.complete(["first"])
    h.run_until_idle()
    assert second.done and h.output_values() == ["first"]
    assert h.chain.operators[0].gate.metrics.hedge_wins == 0


def test_second_calls_go_beyond_the_limit_by_a_tenth_of_it_and_the_deadline_spans_both_calls():
    fn, h = _gated(Service(capacity=20, hedge=Hedge(after_ms=100)), fallback=lambda v: f"{v}-late", timeout_ms=300)
    _feed(h, range(25))
    h.set_processing_time(200)
    assert sum(len(fs) == 2 for fs in fn.pending.values()) == 2  # 20 calls in flight, 2 more
    assert h.chain.operators[0].gate.in_flight == 22
    fn2, h2 = _gated(Service(hedge=Hedge(after_ms=100)), fallback=lambda v: f"{v}-late", timeout_ms=300)
    h2.process_element("a", timestamp_ms=1)
    h2.set_processing_time(300)
    assert len(fn2.pending["a"]) == 2 and all(f.done for f in fn2.pending["a"])  # both cancelled at the deadline
    assert h2.output_values() == ["a-late"] and h2.chain.operators[0].gate.in_flight == 0


def test_a_percentile_hedge_waits_for_enough_latencies_then_hedges_past_them():
    fn, h = _gated(Service(hedge=Hedge(percentile=0.9, min_samples=10)), capacity=50)
    for i in range(10):  # ten calls of 20 ms
        h.process_element(i, timestamp_ms=i)
        h.set_processing_time(h.clock.now_ms() + 20)
        fn.complete(i)
        h.run_until_idle()
    assert all(len(fs) == 1 for fs in fn.pending.values())  # no hedge while the latencies were unknown
    start = h.clock.now_ms()
    h.process_element("slow", timestamp_ms=99)
    h.set_processing_time(start + 19)
    assert len(fn.pending["slow"]) == 1
    h.set_processing_time(start + 20)
    assert len(fn.pending["slow"]) == 2


def test_hedge_settings_are_checked():
    with pytest.raises(ConfigurationError, match="one of after_ms"):
        Hedge()
    with pytest.raises(ConfigurationError, match=r"percentile=\.\.\.\) must be in \(0, 1\)"):
        Hedge(percentile=95)


def test_the_cache_keeps_what_the_function_returned_and_each_record_gets_its_own_row_of_it():
    # As enrich() does: the coroutine returns the new columns, and finish() merges them into the
    # record's own row. Two rows of one user share the call, and each keeps its own columns.
    calls = []

    async def segment(row):
        calls.append(row["id"])
        return {"segment": f"s{row['user']}"}

    def merge(row, new):
        return [{**row, **new}]

    op = async_wait(CoroutineFunction(segment, finish=merge), mode="unordered", capacity=10,
                    service=Service(cache=LookupCache(key="user")))
    h = OperatorHarness(op)
    for i, user in enumerate([7, 7, 8, 7]):
        h.process_element({"id": i, "user": user}, timestamp_ms=i)
    h.run_until_idle()
    assert sorted(calls) == [0, 2]  # one call per user
    assert sorted(h.output_values(), key=lambda r: r["id"]) == [
        {"id": 0, "user": 7, "segment": "s7"}, {"id": 1, "user": 7, "segment": "s7"},
        {"id": 2, "user": 8, "segment": "s8"}, {"id": 3, "user": 7, "segment": "s7"}]
