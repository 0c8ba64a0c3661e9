"""A real HTTP enrichment service on loopback, for examples and tests.

It plays the external system that an async I/O operator enriches records from: a user-profile
service with realistic latency, transient failures, rare hangs and permanent errors; and, for
clients that adapt to the service (adaptive concurrency, a shared rate quota, a circuit breaker,
hedging), a capacity that can change during a run, outages and a slow tail.

Endpoint::

    GET /user/{user_id}  ->  200 {"user_id": 42, "segment": "loyal", "country": "DE",
                                  "lifetime_value": 1234.5}

Behaviour of one request. At the front door, answered at once (no latency, nothing drawn):

- during an outage (:meth:`EnrichmentService.set_outage`) it answers ``503``, with a body that says
  outage;
- else, if ``capacity`` requests are already being handled, it answers ``429`` with the header
  ``Retry-After: <retry_after_s>``. ``capacity`` is None (no limit) by default; it changes with
  :meth:`EnrichmentService.set_capacity` and with ``capacity_schedule``.

A request let in is then drawn from a per-request random generator:

- it first sleeps a lognormal latency (``latency_ms_median``, ``latency_sigma``), whatever its
  outcome;
- with probability ``tail_rate`` (0 by default) it sleeps ``tail_ms`` more, whatever its outcome:
  the slow tail that hedging is for;
- with probability ``hang_rate`` it then sleeps ``hang_s`` more (30 s by default, far beyond any
  sensible timeout) before answering normally: a hanging service;
- else, with probability ``failure_rate``, it answers ``503`` (transient: a retry may succeed);
- else a negative ``user_id`` answers ``404`` (permanent: a retry never succeeds);
- else it answers ``200`` with the profile, which depends on ``user_id`` only (see
  :func:`user_profile`), never on the seed, so an enriched result can be checked exactly.

Retry-After: HTTP's delta-seconds is an integer number of seconds (RFC 9110, section 10.2.3).
Tests want pauses under a second, so this service sends the seconds rounded to milliseconds, as a
decimal where they are not whole: ``"2"``, ``"0.5"``, ``"0.125"``. :func:`parse_retry_after` reads
both forms; it ignores the HTTP-date form, which this service never sends.

Determinism: the server counts requests per ``user_id``. The latency, the tail and the outcome of a
request are a pure function of ``(seed, user_id, attempt)``, where ``attempt`` is 1 for the first
request for that ``user_id`` that the service lets in, 2 for the second, and so on. They do not
depend on how concurrent requests interleave. A request turned away at the front door draws
nothing, so how many were turned away (which depends on timing) changes no later draw. The tail
is drawn from a generator of its own, so with ``tail_rate=0`` every other draw is what it was
before the tail existed. What is *not* deterministic is the wall-clock time a response
takes beyond the drawn latency (scheduling, the client's own load), and, when two requests for the
same ``user_id`` are in flight at once, which of them gets which attempt number.

The client side, :func:`lookup_user`, :func:`http_session` and the exceptions for each answer
(``OverloadedError`` for a 429, ``TransientServiceError`` for a 5xx, ``NotFoundError`` for a 404),
lives in ``examples.enrich_client`` and is re-exported here.

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
import bisect
import math
import random
import threading
import time
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import aiohttp
from aiohttp import web

from examples.enrich_client import (
    EnrichmentServiceError,
    NotFoundError,
    OverloadedError,
    TransientServiceError,
    http_session,
    lookup_user,
    parse_retry_after,
)

__all__ = [
    "EnrichmentService",
    "EnrichmentServiceError",
    "TransientServiceError",
    "OverloadedError",
    "NotFoundError",
    "busiest_window",
    "http_session",
    "lookup_user",
    "parse_retry_after",
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


def busiest_window(times: Iterable[float], width_s: float = 1.0) -> int:
    """The most of ``times`` that fall in any window ``[t, t + width_s)``; 0 if there are none.

    Half-open, so that a limit of N per second may send N at 0.0 and N more at 1.0:

    >>> busiest_window([0.0, 0.2, 0.9, 1.0, 1.1, 3.0])   # 0.2, 0.9, 1.0 and 1.1
    4
    >>> busiest_window([0.0, 1.0, 2.0])
    1
    """
    if not width_s > 0:
        raise ValueError(f"width_s must be > 0, got {width_s}")
    ordered = sorted(times)
    best = first = 0
    # Two pointers: ordered[first..last] is the longest run ending at ``last`` that fits the window.
    for last, t in enumerate(ordered):
        while t - ordered[first] >= width_s:
            first += 1
        best = max(best, last - first + 1)
    return best


def _format_retry_after(seconds: float) -> str:
    # Milliseconds at most, and whole seconds without a fraction: "2", "0.5", "0.125".
    return f"{seconds:.3f}".rstrip("0").rstrip(".")


class EnrichmentService:
    """An aiohttp server on ``127.0.0.1`` (a free port), run on a background thread.

    Threading model: every public method and property may be called from any thread, and the
    setters (``set_capacity()``, ``set_outage()``) at any time, running or not. Request handlers
    and the ``capacity_schedule`` run only on the service's own thread and event loop. The counters
    and the settings that handlers read are guarded by one lock, so that ``stats()`` reads a
    consistent copy and two requests arriving together cannot both take the last free slot.

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
        capacity: int | None = None,
        retry_after_s: float = 1.0,
        capacity_schedule: Sequence[tuple[float, int | None]] = (),
        tail_rate: float = 0.0,
        tail_ms: float = 1500.0,
    ) -> None:
        """``capacity``: requests handled at once; one more is answered 429 (None: no limit).
        ``retry_after_s``: the ``Retry-After`` of a 429. ``capacity_schedule``: pairs (seconds
        since ``start()``, capacity), applied in order on the service's loop, e.g.
        ``[(0, 100), (5, 20), (10, 100)]``. ``tail_rate``, ``tail_ms``: the slow tail (see the
        module's docstring)."""
        if latency_ms_median < 0:
            raise ValueError(f"latency_ms_median must be >= 0, got {latency_ms_median}")
        if latency_sigma < 0:
            raise ValueError(f"latency_sigma must be >= 0, got {latency_sigma}")
        rates = (("failure_rate", failure_rate), ("hang_rate", hang_rate), ("tail_rate", tail_rate))
        for name, rate in rates:
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {rate}")
        if failure_rate + hang_rate > 1.0:
            raise ValueError(
                f"failure_rate + hang_rate must be <= 1, got {failure_rate} + {hang_rate}"
            )
        if hang_s < 0:
            raise ValueError(f"hang_s must be >= 0, got {hang_s}")
        if tail_ms < 0:
            raise ValueError(f"tail_ms must be >= 0, got {tail_ms}")
        _check_capacity("capacity", capacity)
        _check_retry_after(retry_after_s)
        schedule = tuple((float(at_s), cap) for at_s, cap in capacity_schedule)
        previous = 0.0
        for at_s, cap in schedule:
            if not previous <= at_s < math.inf:
                raise ValueError(
                    "capacity_schedule times must be >= 0 and in order, "
                    f"got {at_s} after {previous}"
                )
            _check_capacity(f"capacity_schedule's capacity at {at_s} s", cap)
            previous = at_s
        self.latency_ms_median = latency_ms_median
        self.latency_sigma = latency_sigma
        self.failure_rate = failure_rate
        self.hang_rate = hang_rate
        self.seed = seed
        self.hang_s = hang_s
        self.retry_after_s = retry_after_s
        self.capacity_schedule = schedule
        self.tail_rate = tail_rate
        self.tail_ms = tail_ms

        self._state = "NEW"
        self._lifecycle_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self._schedule_task: asyncio.Task[None] | None = None

        # Touched by handlers on the service thread, and by the setters and readers on any thread.
        self._stats_lock = threading.Lock()
        self._capacity = capacity
        self._outage = False
        self._outage_retry_after_s: float | None = None
        self._attempts: Counter[int] = Counter()  # requests let in, per user: the draws' attempt
        self._calls_by_user: Counter[int] = Counter()  # requests received, per user
        # time.monotonic() of every arrival, taken under the lock, so in order; 8 bytes each.
        self._arrivals = array("d")
        self._by_status: Counter[int] = Counter()
        self._requests = 0
        self._in_flight = 0
        self._hangs = 0
        self._tails = 0
        self._rejected_429 = 0
        self._outage_requests = 0
        self._refuse_next = 0  # requests still to answer 429 at once (refuse_next)
        self._refuse_retry_after_s: float | None = None
        self._refusals = array("d")  # time.monotonic() of each request refuse_next turned away
        self._failing_users: frozenset[int] = frozenset()  # answered 503 (set_failing_users)
        self._calls_by_key: Counter[str] = Counter()  # requests received, per Idempotency-Key
        self._answered_by_key: Counter[str] = Counter()  # of them, those answered 200

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

    @property
    def capacity(self) -> int | None:
        """Requests handled at once now, beyond which one is answered 429; None: no limit."""
        with self._stats_lock:
            return self._capacity

    def set_capacity(self, n: int | None) -> None:
        """Handle at most ``n`` requests at once from now on (None: no limit; 0: answer all 429).

        Lowering it turns away nothing already let in: those requests finish, and new ones are let
        in again once fewer than ``n`` are in flight. It holds until the next entry of
        ``capacity_schedule``, if any is still to come.
        """
        _check_capacity("capacity", n)
        with self._stats_lock:
            self._capacity = n

    def set_outage(self, on: bool, *, retry_after_s: float | None = None) -> None:
        """Start (``on=True``) or end an outage, during which every request is answered 503 at
        once; with ``retry_after_s``, the 503s carry that ``Retry-After``."""
        if retry_after_s is not None:
            _check_retry_after(retry_after_s)
        with self._stats_lock:
            self._outage = on
            self._outage_retry_after_s = retry_after_s

    def refuse_next(self, count: int = 1, *, retry_after_s: float | None = None) -> None:
        """Answer the next ``count`` requests 429 at once, with ``retry_after_s`` as their
        ``Retry-After`` if given; ``refusal_times()`` says when they came."""
        if retry_after_s is not None:
            _check_retry_after(retry_after_s)
        with self._stats_lock:
            self._refuse_next = count
            self._refuse_retry_after_s = retry_after_s

    def set_failing_users(self, users: Iterable[int]) -> None:
        """Answer 503 at once to every request for these users from now on (a shard that is
        down), until set again; an empty set ends it."""
        with self._stats_lock:
            self._failing_users = frozenset(users)

    def calls_by_key(self) -> dict[str, int]:
        """Requests received per ``Idempotency-Key`` header, a copy (requests without one: none)."""
        with self._stats_lock:
            return dict(self._calls_by_key)

    def answered_by_key(self) -> dict[str, int]:
        """Requests answered 200 per ``Idempotency-Key`` header, a copy: a service that
        de-duplicates would have done the work for each key once."""
        with self._stats_lock:
            return dict(self._answered_by_key)

    def refusal_times(self) -> list[float]:
        """The ``time.monotonic()`` of each request that ``refuse_next`` turned away."""
        with self._stats_lock:
            return self._refusals.tolist()

    def stats(self) -> dict[str, Any]:
        """Counters since start, as a consistent copy::

            {"requests": 412,                 # requests received, turned away or not
             "in_flight": 1,                  # let in, not yet answered
             "hangs": 1,                      # requests drawn to hang (answered or not)
             "tails": 3,                      # requests drawn to the slow tail
             "rejected_429": 5,               # answered 429: over capacity
             "outage_requests": 7,            # received during an outage, each answered 503
             "by_status": {200: 385, 503: 16, 404: 6, 429: 5}}   # responses sent

        A hanging request appears in ``by_status`` only once it has been answered, and never if
        ``stop()`` cancelled it. A request turned away (429, or 503 in an outage) is answered at
        once, so it is never in ``in_flight``.
        """
        with self._stats_lock:
            return {
                "requests": self._requests,
                "in_flight": self._in_flight,
                "hangs": self._hangs,
                "tails": self._tails,
                "rejected_429": self._rejected_429,
                "outage_requests": self._outage_requests,
                "by_status": dict(self._by_status),
            }

    def calls_by_user(self) -> dict[int, int]:
        """Requests received per ``user_id``, a copy: every one, those answered 429 or 503 in an
        outage included; a request whose id is not an integer (400) counts for no user."""
        with self._stats_lock:
            return dict(self._calls_by_user)

    def arrival_times(self) -> list[float]:
        """The ``time.monotonic()`` of every request's arrival (all of them), in arrival order."""
        with self._stats_lock:
            return self._arrivals.tolist()

    def busiest_second(self, start: float | None = None, end: float | None = None) -> int:
        """The most requests that arrived in any 1-second window (see :func:`busiest_window`),
        counting arrivals ``start <= t < end`` (``time.monotonic()`` values; None: no bound).

        This is how a test sees that the clients together kept to a rate limit."""
        times = self.arrival_times()
        first = 0 if start is None else bisect.bisect_left(times, start)
        last = len(times) if end is None else bisect.bisect_left(times, end)
        return busiest_window(times[first:last])

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
        # The schedule counts from here; entries due at 0 hold before the first request.
        loop = asyncio.get_running_loop()
        started = loop.time()
        schedule = list(self.capacity_schedule)
        while schedule and schedule[0][0] == 0:
            self.set_capacity(schedule.pop(0)[1])
        # backlog 1024: a test opens hundreds of connections at once, and the default 128
        # would drop SYNs, which the kernel retries only after a whole second.
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        self._runner = runner
        # Port 0 asks the kernel for a free port; read back the one it chose.
        self._port = runner.addresses[0][1]
        if schedule:  # a task only once nothing can fail, so none is left pending if start() fails
            self._schedule_task = loop.create_task(self._apply_schedule(started, schedule))

    async def _apply_schedule(
        self, started: float, schedule: list[tuple[float, int | None]]
    ) -> None:
        # One task, in order: two timers due at the same instant could fire in either order.
        loop = asyncio.get_running_loop()
        for at_s, capacity in schedule:
            await asyncio.sleep(max(0.0, started + at_s - loop.time()))
            self.set_capacity(capacity)

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

    def _draw_tail(self, user_id: int, attempt: int) -> bool:
        """Whether a request gets the slow tail; from a generator of its own, so that
        ``tail_rate`` changes none of the draws in :meth:`_draw`."""
        if self.tail_rate == 0.0:
            return False
        return random.Random(f"{self.seed}/{user_id}/{attempt}/tail").random() < self.tail_rate

    async def _handle_user(self, request: web.Request) -> web.Response:
        raw = request.match_info["user_id"]
        user_id: int | None
        try:
            user_id = int(raw)
        except ValueError:
            user_id = None
        # The front door, decided in one step under the lock: a request let in takes its slot
        # before the next one is looked at.
        retry_after_s: float | None = None
        idempotency_key = request.headers.get("Idempotency-Key")
        with self._stats_lock:
            self._requests += 1
            self._arrivals.append(time.monotonic())
            if user_id is not None:
                self._calls_by_user[user_id] += 1
            if idempotency_key is not None:
                self._calls_by_key[idempotency_key] += 1
            capacity = self._capacity
            if user_id in self._failing_users:
                door, retry_after_s = "failing", None
            elif self._outage:
                self._outage_requests += 1
                door, retry_after_s = "outage", self._outage_retry_after_s
            elif self._refuse_next:
                self._refuse_next -= 1
                self._rejected_429 += 1
                self._refusals.append(self._arrivals[-1])
                door, retry_after_s = "refused", self._refuse_retry_after_s
            elif capacity is not None and self._in_flight >= capacity:
                self._rejected_429 += 1
                door, retry_after_s = "full", self.retry_after_s
            else:
                self._in_flight += 1
                door = "in"
        if door == "outage":
            return self._count(_refusal(503, "outage: the service is down", retry_after_s))
        if door == "full":
            error = f"over capacity: {capacity} requests in flight already"
            return self._count(_refusal(429, error, retry_after_s))
        if door == "refused":
            return self._count(_refusal(429, "refused: told to turn this request away", retry_after_s))
        if door == "failing":
            return self._count(_refusal(503, f"user {user_id}'s shard is down", None))
        try:
            if user_id is None:
                return self._count(
                    web.json_response(
                        {"error": f"user_id must be an integer, got {raw!r}"}, status=400
                    )
                )
            with self._stats_lock:
                self._attempts[user_id] += 1
                attempt = self._attempts[user_id]
            latency_ms, outcome = self._draw(user_id, attempt)
            if self._draw_tail(user_id, attempt):
                with self._stats_lock:
                    self._tails += 1
                latency_ms += self.tail_ms
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
            if idempotency_key is not None:
                with self._stats_lock:
                    self._answered_by_key[idempotency_key] += 1
            return self._count(web.json_response(user_profile(user_id)))
        finally:
            with self._stats_lock:
                self._in_flight -= 1

    def _count(self, response: web.Response) -> web.Response:
        with self._stats_lock:
            self._by_status[response.status] += 1
        return response


def _refusal(status: int, error: str, retry_after_s: float | None) -> web.Response:
    """An answer at the front door: no latency, and ``Retry-After`` where there is a wait."""
    headers = {} if retry_after_s is None else {"Retry-After": _format_retry_after(retry_after_s)}
    return web.json_response({"error": error}, status=status, headers=headers)


def _check_capacity(name: str, capacity: int | None) -> None:
    if capacity is not None and not (isinstance(capacity, int) and capacity >= 0):
        raise ValueError(f"{name} must be an int >= 0 or None, got {capacity!r}")


def _check_retry_after(retry_after_s: float) -> None:
    if not 0 <= retry_after_s < math.inf:
        raise ValueError(f"retry_after_s must be >= 0 and finite, got {retry_after_s}")


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
