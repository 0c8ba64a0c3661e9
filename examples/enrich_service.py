"""A real HTTP enrichment service on loopback, for examples and tests.

It plays the external system that an async I/O operator enriches records from: a user-profile
service with realistic latency, transient failures, rare hangs and permanent errors.

Endpoint::

    GET /user/{user_id}  ->  200 {"user_id": 42, "segment": "loyal", "country": "DE",
                                  "lifetime_value": 1234.5}

Behaviour of one request, drawn from a per-request random generator:

- it first sleeps a lognormal latency (``latency_ms_median``, ``latency_sigma``), whatever its
  outcome;
- with probability ``hang_rate`` it then sleeps ``hang_s`` more (30 s by default, far beyond any
  sensible timeout) before answering normally: a hanging service;
- else, with probability ``failure_rate``, it answers ``503`` (transient: a retry may succeed);
- else a negative ``user_id`` answers ``404`` (permanent: a retry never succeeds);
- else it answers ``200`` with the profile, which depends on ``user_id`` only (see
  :func:`user_profile`), never on the seed, so an enriched result can be checked exactly.

Determinism: the server counts requests per ``user_id``. The latency and the outcome of a request
are a pure function of ``(seed, user_id, attempt)``, where ``attempt`` is 1 for the first request
for that ``user_id`` in this service's life, 2 for the second, and so on. They do not depend on
how concurrent requests interleave. What is *not* deterministic is the wall-clock time a response
takes beyond the drawn latency (scheduling, the client's own load), and, when two requests for the
same ``user_id`` are in flight at once, which of them gets which attempt number.

Exceptions raised by :func:`lookup_user`::

    EnrichmentServiceError        any answer other than 200
    ├── TransientServiceError     5xx: worth retrying
    └── NotFoundError             404: permanent, do not retry

Example::

    import asyncio, aiohttp
    from examples.enrich_service import EnrichmentService, lookup_user

    async def main(url):
        async with aiohttp.ClientSession() as session:
            return await lookup_user(session, url, 42)

    with EnrichmentService(failure_rate=0.0, hang_rate=0.0) as service:
        print(asyncio.run(main(service.url)))

Why a background thread and not a subprocess: the thread starts in milliseconds, ``stats()``
reads the counters directly instead of over IPC, and nothing outlives the process that started it
if a test dies (the thread is a daemon). The clients that matter in actorflow runs are Ray actors in
other processes, so the server's loop shares the GIL only with the driver, which is mostly waiting.
A client in the *same* process (as in the tests) does share the GIL with the server: that is fine
for hundreds of requests, but a load test at tens of thousands of requests/s should run the
service in a process of its own.
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
import weakref
from collections import Counter
from typing import Any

import aiohttp
from aiohttp import web

__all__ = [
    "EnrichmentService",
    "EnrichmentServiceError",
    "TransientServiceError",
    "NotFoundError",
    "http_session",
    "lookup_user",
    "user_profile",
    "SEGMENTS",
    "COUNTRIES",
]

SEGMENTS = ("new", "casual", "regular", "loyal", "vip")
COUNTRIES = ("DE", "FR", "GB", "US", "BR", "IN", "JP", "NG")

_MASK64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a cheap, well-spread hash of an int, stable across processes
    (unlike ``hash()``, which is salted for str and not specified for big ints)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def user_profile(user_id: int) -> dict[str, Any]:
    """The body that ``GET /user/{user_id}`` answers with 200; a pure function of ``user_id``.

    >>> user_profile(42) == user_profile(42)
    True
    >>> user_profile(42)["segment"] in SEGMENTS
    True
    """
    h = _mix64(user_id & _MASK64)
    return {
        "user_id": user_id,
        "segment": SEGMENTS[h % len(SEGMENTS)],
        "country": COUNTRIES[(h >> 8) % len(COUNTRIES)],
        # Two decimals, like money; from 16 further bits so it is independent of the segment.
        "lifetime_value": round(((h >> 16) & 0xFFFF) / 0xFFFF * 5000.0, 2),
    }


class EnrichmentServiceError(Exception):
    """The enrichment service answered with a status other than 200."""

    def __init__(self, user_id: int, status: int, body: str = "") -> None:
        self.user_id = user_id
        self.status = status
        self.body = body
        super().__init__(f"GET /user/{user_id}: expected status 200, got {status} {body!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception pickles as cls(*self.args), and args holds only the message: without this,
        # the error fails to unpickle where Ray or Spark hand it to another process.
        return (type(self), (self.user_id, self.status, self.body))


class TransientServiceError(EnrichmentServiceError):
    """A 5xx answer: the service is unavailable for now, and a retry may succeed."""


class NotFoundError(EnrichmentServiceError):
    """A 404 answer: the user does not exist, and a retry will not change that."""


# One session per event loop, keyed by the loop itself: an id could be reused once a loop is gone.
_http_sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession]
_http_sessions = weakref.WeakKeyDictionary()


def http_session() -> aiohttp.ClientSession:
    """The running event loop's aiohttp session, made on its first use on that loop.

    aiohttp wants one session for many requests: a session per request opens a new connection
    per request. An operator actor runs one event loop, so each actor gets one connection pool,
    for as long as it lives. The pool has no limit of its own: the operator's ``capacity``
    bounds the requests in flight.
    """
    loop = asyncio.get_running_loop()
    session = _http_sessions.get(loop)
    if session is None or session.closed:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
        session = _http_sessions[loop] = aiohttp.ClientSession(connector=connector)
    return session


async def lookup_user(
    session: aiohttp.ClientSession, base_url: str, user_id: int
) -> dict[str, Any]:
    """Fetch one user's profile; raise :class:`TransientServiceError` on 5xx and
    :class:`NotFoundError` on 404.

    It sets no timeout of its own beyond the session's: a per-record deadline belongs to the
    caller (the async operator's ``timeout_ms``), which is how a hanging request is cut short.
    """
    async with session.get(f"{base_url}/user/{user_id}") as resp:
        if resp.status == 200:
            body: dict[str, Any] = await resp.json()
            return body
        text = await resp.text()
        if resp.status == 404:
            raise NotFoundError(user_id, resp.status, text)
        if 500 <= resp.status < 600:
            raise TransientServiceError(user_id, resp.status, text)
        raise EnrichmentServiceError(user_id, resp.status, text)


class EnrichmentService:
    """An aiohttp server on ``127.0.0.1`` (a free port), run on a background thread.

    Threading model: ``start()``, ``stop()``, ``stats()`` and ``url`` may be called from any
    thread. Request handlers run only on the service's own thread and event loop; the counters
    they update are guarded by a lock so that ``stats()`` reads a consistent copy.

    Lifecycle: NEW --start()--> RUNNING --stop()--> STOPPED. ``start()`` returns once the socket
    accepts connections. ``stop()`` cancels handlers still sleeping (hanging requests included)
    within about ``0.25 s`` rather than waiting for them; a stopped service cannot be restarted.
    """

    def __init__(
        self,
        latency_ms_median: float = 20.0,
        latency_sigma: float = 0.6,
        failure_rate: float = 0.02,
        hang_rate: float = 0.0005,
        seed: int = 7,
        *,
        hang_s: float = 30.0,
    ) -> None:
        if latency_ms_median < 0:
            raise ValueError(f"latency_ms_median must be >= 0, got {latency_ms_median}")
        if latency_sigma < 0:
            raise ValueError(f"latency_sigma must be >= 0, got {latency_sigma}")
        for name, rate in (("failure_rate", failure_rate), ("hang_rate", hang_rate)):
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {rate}")
        if failure_rate + hang_rate > 1.0:
            raise ValueError(
                f"failure_rate + hang_rate must be <= 1, got {failure_rate} + {hang_rate}"
            )
        if hang_s < 0:
            raise ValueError(f"hang_s must be >= 0, got {hang_s}")
        self.latency_ms_median = latency_ms_median
        self.latency_sigma = latency_sigma
        self.failure_rate = failure_rate
        self.hang_rate = hang_rate
        self.seed = seed
        self.hang_s = hang_s

        self._state = "NEW"
        self._lifecycle_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

        # Touched by handlers on the service thread, read by stats() on any thread.
        self._stats_lock = threading.Lock()
        self._attempts: Counter[int] = Counter()
        self._by_status: Counter[int] = Counter()
        self._requests = 0
        self._in_flight = 0
        self._hangs = 0

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> EnrichmentService:
        """Start serving; return once the port accepts connections. Returns ``self``."""
        with self._lifecycle_lock:
            if self._state != "NEW":
                raise RuntimeError(f"service is {self._state}; start() needs NEW")
            ready = threading.Event()
            failure: list[BaseException] = []
            self._thread = threading.Thread(
                target=self._serve, args=(ready, failure), name="enrich-service", daemon=True
            )
            self._thread.start()
            ready.wait()
            if failure:
                self._thread.join()
                self._state = "STOPPED"
                raise RuntimeError("enrichment service failed to start") from failure[0]
            self._state = "RUNNING"
            return self

    def stop(self) -> None:
        """Stop serving and join the service thread. Idempotent."""
        with self._lifecycle_lock:
            if self._state != "RUNNING":
                self._state = "STOPPED"
                return
            assert self._loop is not None and self._thread is not None
            loop = self._loop
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(timeout=10)
            self._state = "STOPPED"

    def __enter__(self) -> EnrichmentService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """The base URL, e.g. ``http://127.0.0.1:40123``; only while running."""
        if self._state != "RUNNING" or self._port is None:
            raise RuntimeError(f"service is {self._state}; url needs RUNNING")
        return f"http://127.0.0.1:{self._port}"

    def stats(self) -> dict[str, Any]:
        """Counters since start, as a consistent copy::

            {"requests": 412,                 # requests received
             "in_flight": 1,                  # received, not yet answered
             "hangs": 1,                      # requests drawn to hang (answered or not)
             "by_status": {200: 392, 503: 9, 404: 10}}   # responses sent

        A hanging request appears in ``by_status`` only once it has been answered, and never if
        ``stop()`` cancelled it.
        """
        with self._stats_lock:
            return {
                "requests": self._requests,
                "in_flight": self._in_flight,
                "hangs": self._hangs,
                "by_status": dict(self._by_status),
            }

    # -- the service thread ------------------------------------------------------------------

    def _serve(self, ready: threading.Event, failure: list[BaseException]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._startup())
        except BaseException as exc:  # report to start(), which re-raises on the caller's thread
            failure.append(exc)
            ready.set()
            loop.close()
            return
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _startup(self) -> None:
        app = web.Application()
        app.router.add_get("/user/{user_id}", self._handle_user)
        # A short shutdown_timeout: stop() must not wait out a 30 s hang.
        runner = web.AppRunner(app, shutdown_timeout=0.25, access_log=None)
        await runner.setup()
        # backlog 1024: a test opens hundreds of connections at once, and the default 128
        # would drop SYNs, which the kernel retries only after a whole second.
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        self._runner = runner
        # Port 0 asks the kernel for a free port; read back the one it chose.
        self._port = runner.addresses[0][1]

    async def _shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        # Handlers still sleeping (hanging requests, idle keep-alive connections) are cancelled
        # and awaited here, rather than destroyed while pending when the loop closes.
        current = asyncio.current_task()
        pending = [task for task in asyncio.all_tasks() if task is not current]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def _draw(self, user_id: int, attempt: int) -> tuple[float, str]:
        """(latency in ms, outcome) for one request: a pure function of (seed, user_id, attempt)."""
        # A str seed is hashed with SHA-512 by random.Random: stable across processes and runs.
        rng = random.Random(f"{self.seed}/{user_id}/{attempt}")
        latency_ms = (
            rng.lognormvariate(math.log(self.latency_ms_median), self.latency_sigma)
            if self.latency_ms_median > 0
            else 0.0
        )
        u = rng.random()
        if u < self.hang_rate:
            return latency_ms, "hang"
        if u < self.hang_rate + self.failure_rate:
            return latency_ms, "fail"
        return latency_ms, "ok"

    async def _handle_user(self, request: web.Request) -> web.Response:
        raw = request.match_info["user_id"]
        with self._stats_lock:
            self._requests += 1
            self._in_flight += 1
        try:
            try:
                user_id = int(raw)
            except ValueError:
                return self._count(
                    web.json_response(
                        {"error": f"user_id must be an integer, got {raw!r}"}, status=400
                    )
                )
            with self._stats_lock:
                self._attempts[user_id] += 1
                attempt = self._attempts[user_id]
            latency_ms, outcome = self._draw(user_id, attempt)
            await asyncio.sleep(latency_ms / 1000.0)
            if outcome == "hang":
                with self._stats_lock:
                    self._hangs += 1
                await asyncio.sleep(self.hang_s)
            elif outcome == "fail":
                return self._count(
                    web.json_response({"error": "service unavailable, try again"}, status=503)
                )
            if user_id < 0:
                return self._count(
                    web.json_response({"error": f"no user {user_id}"}, status=404)
                )
            return self._count(web.json_response(user_profile(user_id)))
        finally:
            with self._stats_lock:
                self._in_flight -= 1

    def _count(self, response: web.Response) -> web.Response:
        with self._stats_lock:
            self._by_status[response.status] += 1
        return response


async def _demo(url: str, n: int) -> None:
    async with aiohttp.ClientSession() as session:

        async def one(user_id: int) -> str:
            try:
                await lookup_user(session, url, user_id)
                return "ok"
            except EnrichmentServiceError as exc:
                return type(exc).__name__

        outcomes = await asyncio.gather(*(one(i) for i in range(-5, n - 5)))
    print(dict(Counter(outcomes)))


if __name__ == "__main__":
    # python -m examples.enrich_service: a few hundred lookups against a fresh service.
    with EnrichmentService(failure_rate=0.05, hang_rate=0.0) as svc:
        print("serving on", svc.url)
        asyncio.run(_demo(svc.url, 300))
        print(svc.stats())
