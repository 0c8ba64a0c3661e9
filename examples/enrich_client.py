"""The client side of the test enrichment service: its exceptions, one aiohttp session per event
loop, and ``lookup_user``. ``examples.enrich_service`` re-exports all of them.

Exceptions raised by :func:`lookup_user`::

    EnrichmentServiceError        any answer other than 200
    ├── TransientServiceError     5xx: worth retrying (an outage's 503 included)
    ├── OverloadedError           429: over capacity; wait retry_after_s, then retry
    └── NotFoundError             404: permanent, do not retry

Each has ``user_id``, ``status``, ``body`` and ``retry_after_s`` (the Retry-After header in seconds,
or None), and pickles with all four, as Ray hands it to another process.
"""

from __future__ import annotations

import asyncio
import re
import weakref
from typing import Any

import aiohttp

__all__ = [
    "EnrichmentServiceError",
    "NotFoundError",
    "OverloadedError",
    "TransientServiceError",
    "http_session",
    "lookup_user",
    "parse_retry_after",
]


# delta-seconds (RFC 9110 10.2.3) is 1*DIGIT; a fraction is this service's extension.
_DELTA_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait, from a ``Retry-After`` header in (decimal) seconds; None if the header is
    absent or is an HTTP-date (a form this service never sends, and this client ignores).

    >>> parse_retry_after("2"), parse_retry_after("0.25"), parse_retry_after(None)
    (2.0, 0.25, None)
    >>> parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") is None
    True
    """
    if value is None:
        return None
    value = value.strip()
    return float(value) if _DELTA_SECONDS.fullmatch(value) else None


class EnrichmentServiceError(Exception):
    """The enrichment service answered with a status other than 200.

    ``retry_after_s`` is the wait the service asked for in its ``Retry-After`` header, in seconds,
    or None where it sent none (see :func:`parse_retry_after`).
    """

    def __init__(
        self, user_id: int, status: int, body: str = "", retry_after_s: float | None = None
    ) -> None:
        self.user_id = user_id
        self.status = status
        self.body = body
        self.retry_after_s = retry_after_s
        super().__init__(f"GET /user/{user_id}: expected status 200, got {status} {body!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception pickles as cls(*self.args), and args holds only the message: without this,
        # the error fails to unpickle where Ray or Spark hand it to another process.
        return (type(self), (self.user_id, self.status, self.body, self.retry_after_s))


class TransientServiceError(EnrichmentServiceError):
    """A 5xx answer: the service is unavailable for now, and a retry may succeed.

    ``retry_after_s`` is set where the answer had a ``Retry-After`` header (an outage may send one).
    """


class OverloadedError(EnrichmentServiceError):
    """A 429 answer: the service is over its capacity; wait ``retry_after_s``, then retry."""


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
    session: aiohttp.ClientSession, base_url: str, user_id: int, idempotency_key: str | None = None
) -> dict[str, Any]:
    """Fetch one user's profile; raise :class:`TransientServiceError` on 5xx,
    :class:`OverloadedError` on 429 and :class:`NotFoundError` on 404, each with the answer's
    ``Retry-After`` in ``retry_after_s``.

    It sets no timeout of its own beyond the session's: a per-record deadline belongs to the
    caller (the async operator's ``timeout_ms``), which is how a hanging request is cut short.
    ``idempotency_key`` goes in an ``Idempotency-Key`` header, which the service counts by.
    """
    headers = None if idempotency_key is None else {"Idempotency-Key": idempotency_key}
    async with session.get(f"{base_url}/user/{user_id}", headers=headers) as resp:
        if resp.status == 200:
            body: dict[str, Any] = await resp.json()
            return body
        text = await resp.text()
        retry_after_s = parse_retry_after(resp.headers.get("Retry-After"))
        if resp.status == 404:
            raise NotFoundError(user_id, resp.status, text, retry_after_s)
        if resp.status == 429:
            raise OverloadedError(user_id, resp.status, text, retry_after_s)
        if 500 <= resp.status < 600:
            raise TransientServiceError(user_id, resp.status, text, retry_after_s)
        raise EnrichmentServiceError(user_id, resp.status, text, retry_after_s)
