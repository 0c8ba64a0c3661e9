"""The example enrichment service, through real HTTP on loopback. No Ray, no Spark."""

from __future__ import annotations

import asyncio
import pickle
import threading
import time
from typing import Any

import aiohttp
import pytest

from examples.enrich_service import (
    COUNTRIES,
    SEGMENTS,
    EnrichmentService,
    EnrichmentServiceError,
    NotFoundError,
    TransientServiceError,
    http_session,
    lookup_user,
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
    assert stats == {"requests": 200, "in_flight": 0, "hangs": 0, "by_status": {200: 200}}


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


def _outcome_table(seed: int) -> list[tuple[str, ...]]:
    """Outcome of attempts 1..3 for users 0..59, requested concurrently across users."""

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

    with EnrichmentService(latency_ms_median=2, failure_rate=0.3, hang_rate=0.0, seed=seed) as svc:
        return asyncio.run(run(svc.url))


def test_outcomes_are_a_function_of_seed_user_and_attempt() -> None:
    first, again, other_seed = _outcome_table(3), _outcome_table(3), _outcome_table(4)
    assert first == again
    assert first != other_seed
    # A retry of a failed attempt can succeed: the attempt number changes the draw.
    assert any(t[0] == "503" and "ok" in t[1:] for t in first)


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
    ],
)
def test_invalid_settings_are_rejected_at_construction(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        EnrichmentService(**kwargs)


@pytest.mark.parametrize(
    "error_type", [EnrichmentServiceError, TransientServiceError, NotFoundError]
)
def test_errors_survive_pickling_as_they_cross_processes(
    error_type: type[EnrichmentServiceError],
) -> None:
    # Ray and Spark pickle an exception to hand it to another process.
    error = pickle.loads(pickle.dumps(error_type(-3, 404, "no user -3")))
    assert type(error) is error_type
    assert (error.user_id, error.status, error.body) == (-3, 404, "no user -3")
    assert str(error) == "GET /user/-3: expected status 200, got 404 'no user -3'"


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
