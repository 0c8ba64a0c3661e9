"""The example enrichment service, through real HTTP on loopback. No Ray, no Spark."""

from __future__ import annotations

import asyncio
import pickle
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from examples.enrich_service import (
    COUNTRIES,
    SEGMENTS,
    EnrichmentService,
    EnrichmentServiceError,
    NotFoundError,
    OverloadedError,
    TransientServiceError,
    busiest_window,
    http_session,
    lookup_user,
    parse_retry_after,
    user_profile,
)


async def _lookup_all(url: str, user_ids: list[int]) -> list[Any]:
    """Look every id up at once; each item is the profile dict or the exception raised."""
    # limit=0: no client-side cap on connections, so all requests are really concurrent.
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(user_id: int) -> Any:
            try:
                return await lookup_user(session, url, user_id)
            except EnrichmentServiceError as exc:
                return exc

        return await asyncio.gather(*(one(u) for u in user_ids))


def _service_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "enrich-service"]


async def _until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not true within {timeout_s} s"
        await asyncio.sleep(0.005)


def test_concurrent_lookups_return_the_user_profile() -> None:
    ids = list(range(200))
    with EnrichmentService(latency_ms_median=5, failure_rate=0.0, hang_rate=0.0) as svc:
        assert svc.url.startswith("http://127.0.0.1:")
        results = asyncio.run(_lookup_all(svc.url, ids))
        stats = svc.stats()

    for user_id, body in zip(ids, results):
        assert set(body) == {"user_id", "segment", "country", "lifetime_value"}
        assert body == user_profile(user_id)
        assert body["segment"] in SEGMENTS
        assert body["country"] in COUNTRIES
        assert isinstance(body["lifetime_value"], float)
    # The profile is derived from the id, but not constant: several segments show up.
    assert len({r["segment"] for r in results}) == len(SEGMENTS)
    assert stats == {
        "requests": 200,
        "in_flight": 0,
        "hangs": 0,
        "tails": 0,
        "rejected_429": 0,
        "outage_requests": 0,
        "by_status": {200: 200},
    }


def test_transient_failures_happen_at_about_the_failure_rate() -> None:
    n = 400
    with EnrichmentService(latency_ms_median=5, failure_rate=0.2, hang_rate=0.0, seed=11) as svc:
        results = asyncio.run(_lookup_all(svc.url, list(range(n))))
        stats = svc.stats()

    failed = [r for r in results if isinstance(r, Exception)]
    assert all(isinstance(r, TransientServiceError) and r.status == 503 for r in failed)
    # Binomial(400, 0.2): mean 80, sd 8. +-24 is three sd.
    assert 56 <= len(failed) <= 104, len(failed)
    assert stats["by_status"] == {200: n - len(failed), 503: len(failed)}


def test_http_session_is_one_per_event_loop_and_serves_many_lookups() -> None:
    async def on_one_loop(url: str) -> tuple[aiohttp.ClientSession, bool, list[Any]]:
        session = http_session()
        profiles = await asyncio.gather(*(lookup_user(http_session(), url, u) for u in range(20)))
        same = all(http_session() is session for _ in range(3))
        await session.close()  # a closed session is replaced on the next call
        replaced = http_session()
        assert replaced is not session and not replaced.closed
        await replaced.close()
        return session, same, profiles

    with EnrichmentService(latency_ms_median=1, failure_rate=0.0, hang_rate=0.0) as svc:
        first, same_first, profiles = asyncio.run(on_one_loop(svc.url))
        second, same_second, _ = asyncio.run(on_one_loop(svc.url))
    assert same_first and same_second
    assert first is not second  # a new loop gets a session of its own
    assert profiles == [user_profile(u) for u in range(20)]
    with pytest.raises(RuntimeError, match="no running event loop"):
        http_session()


def test_negative_ids_are_not_found() -> None:
    ids = list(range(-1, -41, -1))
    with EnrichmentService(latency_ms_median=5, failure_rate=0.0, hang_rate=0.0) as svc:
        results = asyncio.run(_lookup_all(svc.url, ids))
    assert all(isinstance(r, NotFoundError) and r.status == 404 for r in results)
    assert not any(isinstance(r, TransientServiceError) for r in results)
    assert "/user/-1" in str(results[0]) and "404" in str(results[0])


def _outcome_table(
    seed: int, *, turn_away_first: bool = False, **settings: Any
) -> list[tuple[str, ...]]:
    """Outcome of attempts 1..3 for users 0..59, requested concurrently across users; with
    ``turn_away_first``, after one request per user that capacity 0 answered 429."""

    async def run(url: str) -> list[tuple[str, ...]]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

            async def attempts(user_id: int) -> tuple[str, ...]:
                outcomes = []
                for _ in range(3):  # sequential per user, so attempt numbers are well defined
                    try:
                        await lookup_user(session, url, user_id)
                        outcomes.append("ok")
                    except TransientServiceError:
                        outcomes.append("503")
                return tuple(outcomes)

            return await asyncio.gather(*(attempts(u) for u in range(60)))

    with EnrichmentService(
        latency_ms_median=2, failure_rate=0.3, hang_rate=0.0, seed=seed, **settings
    ) as svc:
        if turn_away_first:
            svc.set_capacity(0)
            turned_away = asyncio.run(_lookup_all(svc.url, list(range(60))))
            assert all(isinstance(r, OverloadedError) for r in turned_away)
            svc.set_capacity(None)
        return asyncio.run(run(svc.url))


def test_outcomes_are_a_function_of_seed_user_and_attempt() -> None:
    first, again, other_seed = _outcome_table(3), _outcome_table(3), _outcome_table(4)
    assert first == again
    assert first != other_seed
    # A retry of a failed attempt can succeed: the attempt number changes the draw.
    assert any(t[0] == "503" and "ok" in t[1:] for t in first)


# _outcome_table(3) as it was before capacity, outages and the tail: per user, attempts 1..3,
# "x" a 503 and "." a 200. Every seeded run in the tests and benchmarks stands on these draws.
_SEED_3_OUTCOMES = """
    ... .x. ... .xx x.. x.. xxx x.. ... ... ..x ..x .x. .x. x.x
    xxx x.x .x. x.. ..x ..x x.. ... ..x x.. ..x ..x ... x.x x..
    ... x.x .x. .x. .x. ... ..x ..x ... .x. ..x x.. x.. .xx x..
    .x. ... xxx ... ... ... .x. x.x ... ... .x. x.x ..x ... ...
""".split()


@pytest.mark.parametrize(
    "settings",
    [
        {},  # the defaults: tail_rate 0, no capacity
        {"tail_rate": 0.5, "tail_ms": 5.0},  # the tail draws from a generator of its own
        {"turn_away_first": True},  # a request turned away with 429 draws nothing
    ],
)
def test_the_draws_are_those_from_before_the_new_behaviours(settings: dict[str, Any]) -> None:
    table = _outcome_table(3, **settings)
    assert ["".join("x" if o == "503" else "." for o in row) for row in table] == _SEED_3_OUTCOMES


def test_a_hanging_request_outlives_the_client_timeout_and_stop_cancels_it() -> None:
    svc = EnrichmentService(latency_ms_median=1, failure_rate=0.0, hang_rate=1.0, hang_s=30.0)
    svc.start()
    url = svc.url

    async def timed_out_lookup() -> None:
        timeout = aiohttp.ClientTimeout(total=0.3)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            with pytest.raises(asyncio.TimeoutError):
                await lookup_user(session, url, 1)

    asyncio.run(timed_out_lookup())
    stats = svc.stats()
    assert stats["hangs"] == 1 and stats["by_status"] == {}

    started = time.monotonic()
    svc.stop()
    assert time.monotonic() - started < 2.0, "stop() waited for the 30 s hang"
    assert _service_threads() == []
    svc.stop()  # idempotent

    async def connect_after_stop() -> None:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.ClientConnectionError):
                await lookup_user(session, url, 1)

    asyncio.run(connect_after_stop())
    with pytest.raises(RuntimeError, match="STOPPED"):
        svc.url
    with pytest.raises(RuntimeError, match="start\\(\\) needs NEW"):
        svc.start()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"failure_rate": 1.5}, "failure_rate must be in \\[0, 1\\], got 1.5"),
        ({"hang_rate": -0.1}, "hang_rate must be in \\[0, 1\\], got -0.1"),
        ({"failure_rate": 0.7, "hang_rate": 0.4}, "failure_rate \\+ hang_rate must be <= 1"),
        ({"latency_ms_median": -1}, "latency_ms_median must be >= 0, got -1"),
        ({"tail_rate": 1.5}, "tail_rate must be in \\[0, 1\\], got 1.5"),
        ({"tail_ms": -5}, "tail_ms must be >= 0, got -5"),
        ({"capacity": -1}, "capacity must be an int >= 0 or None, got -1"),
        ({"retry_after_s": -0.5}, "retry_after_s must be >= 0 and finite, got -0.5"),
        ({"retry_after_s": float("inf")}, "retry_after_s must be >= 0 and finite, got inf"),
        # Out of order: the schedule is applied in order, so a later entry could never come first.
        (
            {"capacity_schedule": [(1.0, 5), (0.5, 10)]},
            "capacity_schedule times must be >= 0 and in order, got 0.5 after 1.0",
        ),
        (
            {"capacity_schedule": [(1.0, -2)]},
            "capacity_schedule's capacity at 1.0 s must be an int >= 0 or None, got -2",
        ),
    ],
)
def test_invalid_settings_are_rejected_at_construction(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        EnrichmentService(**kwargs)


def test_invalid_settings_are_rejected_by_the_setters_too() -> None:
    svc = EnrichmentService()
    with pytest.raises(ValueError, match="capacity must be an int >= 0 or None, got -1"):
        svc.set_capacity(-1)
    with pytest.raises(ValueError, match="retry_after_s must be >= 0 and finite, got -1"):
        svc.set_outage(True, retry_after_s=-1)
    assert svc.capacity is None


@pytest.mark.parametrize("retry_after_s", [None, 0.5])
@pytest.mark.parametrize(
    "error_type", [EnrichmentServiceError, TransientServiceError, OverloadedError, NotFoundError]
)
def test_errors_survive_pickling_as_they_cross_processes(
    error_type: type[EnrichmentServiceError], retry_after_s: float | None
) -> None:
    # Ray and Spark pickle an exception to hand it to another process.
    args: tuple[Any, ...] = (-3, 404, "no user -3")  # the three arguments of old still do
    if retry_after_s is not None:
        args += (retry_after_s,)
    error = pickle.loads(pickle.dumps(error_type(*args)))
    assert type(error) is error_type
    assert (error.user_id, error.status, error.body) == (-3, 404, "no user -3")
    assert error.retry_after_s == retry_after_s
    assert str(error) == "GET /user/-3: expected status 200, got 404 'no user -3'"


def test_beyond_capacity_requests_are_answered_429_at_once_and_set_capacity_changes_it() -> None:
    # A request let in sleeps 2 s and then hangs, so it holds its slot until stop(): no race
    # between the requests let in finishing and the next ones arriving.
    svc = EnrichmentService(
        latency_ms_median=2000, latency_sigma=0.0, failure_rate=0.0, hang_rate=1.0,
        capacity=3, retry_after_s=0.25,
    )
    svc.start()

    async def run(url: str) -> tuple[list[Any], float, list[Any]]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

            async def outcome(user_id: int) -> Any:
                try:
                    return await lookup_user(session, url, user_id)
                except EnrichmentServiceError as exc:
                    return exc

            held = [asyncio.ensure_future(outcome(u)) for u in range(3)]
            await _until(lambda: svc.stats()["in_flight"] == 3)
            started = time.monotonic()
            turned_away = await asyncio.gather(*(outcome(u) for u in range(10, 15)))
            took = time.monotonic() - started
            # Mid-run, from this thread: two more slots. The five 429s hold none of them.
            svc.set_capacity(5)
            held += [asyncio.ensure_future(outcome(u)) for u in (20, 21)]
            await _until(lambda: svc.stats()["in_flight"] == 5)
            full_again = [await outcome(30)]
            for task in held:
                task.cancel()
            await asyncio.gather(*held, return_exceptions=True)
            return turned_away, took, full_again

    try:
        turned_away, took, full_again = asyncio.run(run(svc.url))
        stats = svc.stats()
    finally:
        svc.stop()
    assert took < 1.0, f"a 429 waited {took:.2f} s, as if it slept the 2 s latency"
    for error in turned_away + full_again:
        assert isinstance(error, OverloadedError) and not isinstance(error, TransientServiceError)
        assert (error.status, error.retry_after_s) == (429, 0.25)
        assert "over capacity" in error.body
    assert stats["requests"] == 3 + 5 + 2 + 1
    assert (stats["in_flight"], stats["rejected_429"], stats["by_status"]) == (5, 6, {429: 6})


@pytest.mark.parametrize(
    "retry_after_s, header",
    [
        (2.0, "2"),  # whole seconds: HTTP's own delta-seconds
        (0.5, "0.5"),  # a fraction: the decimal extension, for sub-second tests
        (0.125, "0.125"),
        (1.23456, "1.235"),  # rounded to milliseconds
        (0.0, "0"),
    ],
)
def test_a_429_says_when_to_retry_in_seconds_with_at_most_three_decimals(
    retry_after_s: float, header: str
) -> None:
    async def get(url: str) -> tuple[int, str | None, Any]:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{url}/user/1") as resp:
                return resp.status, resp.headers.get("Retry-After"), await resp.json()

    with EnrichmentService(capacity=0, retry_after_s=retry_after_s) as svc:
        status, sent, body = asyncio.run(get(svc.url))
    assert (status, sent) == (429, header)
    assert "over capacity" in body["error"]
    assert parse_retry_after(sent) == round(retry_after_s, 3)


@pytest.mark.parametrize(
    "value, seconds",
    [
        ("2", 2.0),  # delta-seconds
        ("0.25", 0.25),  # the decimal extension
        (" 3 ", 3.0),
        (None, None),  # no header
        ("Wed, 21 Oct 2015 07:28:00 GMT", None),  # an HTTP-date: ignored
        ("-1", None),
        ("1e3", None),
        ("inf", None),
        ("", None),
    ],
)
def test_parse_retry_after(value: str | None, seconds: float | None) -> None:
    assert parse_retry_after(value) == seconds


def test_the_capacity_schedule_applies_in_order_on_the_services_own_clock() -> None:
    # Two entries at 0: applied in order, so the service starts with capacity 0.
    schedule = [(0.0, 5), (0.0, 0), (0.3, 2), (0.8, None)]
    started = time.monotonic()
    with EnrichmentService(latency_ms_median=1, failure_rate=0.0, hang_rate=0.0,
                           capacity_schedule=schedule) as svc:
        at_start = asyncio.run(_lookup_all(svc.url, [1]))
        seen = [svc.capacity]
        while seen[-1] is not None:
            assert time.monotonic() - started < 5.0, f"the schedule stopped at {seen}"
            time.sleep(0.01)
            if svc.capacity != seen[-1]:
                seen.append(svc.capacity)
        opened = time.monotonic() - started
        at_end = asyncio.run(_lookup_all(svc.url, [1]))
    assert seen == [0, 2, None]
    assert opened >= 0.8
    assert isinstance(at_start[0], OverloadedError)
    assert at_end == [user_profile(1)]


def test_an_outage_answers_503_at_once_and_is_counted_apart() -> None:
    with EnrichmentService(latency_ms_median=800, latency_sigma=0.0, failure_rate=0.0,
                           hang_rate=0.0) as svc:
        svc.set_outage(True)
        started = time.monotonic()
        down = asyncio.run(_lookup_all(svc.url, [1, 2, 3]))
        took = time.monotonic() - started
        svc.set_outage(True, retry_after_s=0.5)
        down_with_a_wait = asyncio.run(_lookup_all(svc.url, [4]))
        svc.set_outage(False)
        back = asyncio.run(_lookup_all(svc.url, [1]))
        stats = svc.stats()
    assert took < 0.5, f"an outage's 503 waited {took:.2f} s, as if it slept the 0.8 s latency"
    for error in down + down_with_a_wait:
        assert isinstance(error, TransientServiceError) and error.status == 503
        assert "outage" in error.body
    assert [e.retry_after_s for e in down + down_with_a_wait] == [None, None, None, 0.5]
    assert back == [user_profile(1)]
    assert stats["requests"] == 5 and stats["outage_requests"] == 4
    assert stats["by_status"] == {503: 4, 200: 1}


def _tail_run(seed: int) -> tuple[set[int], dict[str, Any]]:
    """Users 0..59 looked up once at once, with a 0.4 s tail; the users whose lookup was slow."""

    async def timed(url: str) -> list[tuple[Any, float]]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

            async def one(user_id: int) -> tuple[Any, float]:
                started = time.monotonic()
                body = await lookup_user(session, url, user_id)
                return body, time.monotonic() - started

            return await asyncio.gather(*(one(u) for u in range(60)))

    with EnrichmentService(latency_ms_median=1, latency_sigma=0.0, failure_rate=0.0, hang_rate=0.0,
                           seed=seed, tail_rate=0.25, tail_ms=400) as svc:
        results = asyncio.run(timed(svc.url))
        stats = svc.stats()
    assert [body for body, _ in results] == [user_profile(u) for u in range(60)]  # slow, not wrong
    return {u for u, (_, took) in enumerate(results) if took >= 0.35}, stats


@pytest.mark.parametrize("seed", [5, 6])
def test_the_slow_tail_delays_the_requests_drawn_for_it(seed: int) -> None:
    slow, stats = _tail_run(seed)
    # The draw of EnrichmentService._draw_tail: a generator of its own per (seed, user, attempt).
    drawn = {u for u in range(60) if random.Random(f"{seed}/{u}/1/tail").random() < 0.25}
    assert slow == drawn
    assert 5 <= len(drawn) <= 25 and stats["tails"] == len(drawn)


def test_calls_by_user_and_arrival_times_count_every_request_turned_away_or_not() -> None:
    async def run(svc: EnrichmentService) -> list[int]:
        async with aiohttp.ClientSession() as session:

            async def status(user_id: int | str) -> int:
                async with session.get(f"{svc.url}/user/{user_id}") as resp:
                    return resp.status

            statuses = [await status(u) for u in (1, 1, 2, -3)]
            svc.set_capacity(0)
            statuses.append(await status(1))
            svc.set_capacity(None)
            svc.set_outage(True)
            statuses.append(await status(2))
            svc.set_outage(False)
            statuses.append(await status("abc"))
            return statuses

    before = time.monotonic()
    with EnrichmentService(latency_ms_median=1, failure_rate=0.0, hang_rate=0.0) as svc:
        statuses = asyncio.run(run(svc))
        calls, arrivals = svc.calls_by_user(), svc.arrival_times()
        busiest = svc.busiest_second()
        # Half-open [start, end): the 3rd, 4th and 5th arrivals.
        between = svc.busiest_second(start=arrivals[2], end=arrivals[5])
        stats = svc.stats()
    after = time.monotonic()
    assert statuses == [200, 200, 200, 404, 429, 503, 400]
    assert calls == {1: 3, 2: 2, -3: 1}  # "abc" is no user's
    calls[1] = 99
    assert svc.calls_by_user()[1] == 3  # a copy
    assert len(arrivals) == 7 and arrivals == sorted(arrivals)
    assert before <= arrivals[0] and arrivals[-1] <= after
    assert busiest == 7  # seven quick requests in a row, well within one second
    assert between == 3
    assert (stats["requests"], stats["rejected_429"], stats["outage_requests"]) == (7, 1, 1)
    assert stats["by_status"] == {200: 3, 404: 1, 429: 1, 503: 1, 400: 1}


@pytest.mark.parametrize(
    "times, width_s, expected",
    [
        ([], 1.0, 0),  # no arrivals
        ([5.0], 1.0, 1),
        ([0.0, 0.2, 0.9, 1.0, 1.1, 3.0], 1.0, 4),  # 0.2 to 1.1 is the busiest second
        ([0.0, 1.0, 2.0, 3.0], 1.0, 1),  # half-open: a second apart is two windows
        ([0.0, 0.999, 1.998], 1.0, 2),
        ([3.0, 0.1, 2.5, 0.2, 2.9, 0.3, 2.6], 1.0, 4),  # unsorted: 2.5, 2.6, 2.9 and 3.0
        ([0.0, 0.0, 0.0, 0.5], 1.0, 4),  # arrivals at the same instant all count
        ([0.0, 0.05, 0.1, 0.5], 0.1, 2),  # another width: 0.1 starts the next window
    ],
)
def test_busiest_window_counts_the_most_arrivals_in_any_window(
    times: list[float], width_s: float, expected: int
) -> None:
    assert busiest_window(times, width_s) == expected


def test_busiest_window_needs_a_positive_width() -> None:
    with pytest.raises(ValueError, match="width_s must be > 0, got 0"):
        busiest_window([1.0], 0)


@pytest.mark.processes
def test_a_service_process_in_a_script_without_a_main_guard_says_why_it_did_not_start(tmp_path) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "no_guard.py"
    script.write_text(
        "from examples.service_process import ServiceProcess\n"
        "service = ServiceProcess().start()  # no `if __name__ == '__main__':` around it\n"
        "service.stop()\n"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(script)], cwd=root, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: the enrichment service process died before it started"), done.stderr[-2000:]
    assert f"first runs {script} again" in last and 'if __name__ == "__main__":' in last
