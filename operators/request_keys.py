"""Idempotency keys of async requests: the same for a record on every attempt and after a restore.

A service that de-duplicates needs to recognise a request it has seen: a retry, or a record
replayed after a restore from a checkpoint. The async operators give every record a key when
they take it in, and keep it (in their snapshots too) until its outcome is emitted:

* ``<prefix>/<origin joined by ".">`` for a record with an origin, say ``clicks/enrich/0.3.17``
  for ``origin=(0, 3, 17)``. The origin depends on the input alone, so the key does too, whichever
  subtask the record reaches and whatever the order in which requests complete. Its parts should
  hold no ``.`` of their own: ``("a.b",)`` and ``("a", "b")`` would share a key.
* ``<prefix>/#<n>`` for a record without one, ``n`` being its position among the records the
  operator took in (the count is in the operator's snapshot). It is stable only as long as the
  records reach the operator in the same order, and unique only within one operator instance:
  give records an origin when that is not enough.

The prefix is the context's ``request_key_prefix``, meant to be ``<job>/<operator>`` without the
subtask index (after a restore, a record may reach another subtask), or else the operator's name
in its context.

A user function reads the key of its request from its ``ResultFuture`` (``idempotency_key``, or
``idempotency_keys`` for a batch), or by calling ``current_request_key()`` (``current_request_keys()``
for a batch) while it serves the request: in ``async_invoke`` and ``timeout``, in the coroutines
they start, and in a blocking function that runs in a Ray task.

>>> request_key("clicks/enrich", (0, 3, 17), 42), request_key("clicks/enrich", None, 42)
('clicks/enrich/0.3.17', 'clicks/enrich/#42')
>>> call_in_request("clicks/enrich/0.3.17", None, current_request_key), current_request_key()
('clicks/enrich/0.3.17', None)
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Callable, Optional, Sequence, TypeVar, Union

__all__ = ["RequestKey", "call_in_request", "current_request_key", "current_request_keys", "key_text", "request_key"]

T = TypeVar("T")

# A key as an operator keeps it: its text, or the ``(prefix, origin, sequence)`` it is made of,
# formatted only when someone reads it. Most keys are never read, and a record arrives far more
# often than a key is asked for.
RequestKey = Union[str, tuple[str, Optional[tuple[Any, ...]], int]]

# The request being served: ``(key, keys)``, a record's key or a batch's keys. A task (and so a
# coroutine on the runner) copies the context it was created in, so a request's coroutine keeps
# its key while other requests run on the same loop. One variable, so that a request sets one.
# A record's coroutine on the runner gets ``(key, None)`` set in its task's own context instead.
CURRENT_REQUEST: ContextVar[tuple[RequestKey | None, tuple[RequestKey, ...] | None]] = ContextVar(
    "actorflow_request", default=(None, None))


def request_key(prefix: str, origin: tuple[Any, ...] | None, sequence: int) -> str:
    """The idempotency key of a record: from its ``origin``, or else from its ``sequence`` number."""
    if origin is None:
        return f"{prefix}/#{sequence}"
    if len(origin) == 3:  # (split, piece, row): a source's records, the common case
        split, piece, row = origin
        return f"{prefix}/{split}.{piece}.{row}"
    return f"{prefix}/{'.'.join(map(str, origin))}"


def key_text(key: RequestKey) -> str:
    """The text of a key kept as its parts (or already text)."""
    return key if isinstance(key, str) else request_key(*key)


def current_request_key() -> str | None:
    """The idempotency key of the record whose request is being served; None outside one.

    None in a batch request too: a batch has one key per record (``current_request_keys()``).

    >>> from actorflow.operators import OperatorHarness, async_wait
    >>> async def lookup(user_id):
    ...     return [(user_id, current_request_key())]
    >>> h = OperatorHarness(async_wait(lookup), request_key_prefix="clicks/enrich")
    >>> h.process_element("u1", origin=(0, 7)); h.run_until_idle(); h.output_values()
    [('u1', 'clicks/enrich/0.7')]
    """
    key = CURRENT_REQUEST.get()[0]
    return None if key is None else key_text(key)


def current_request_keys() -> list[str] | None:
    """The idempotency keys of the records of the batch being served, in order; None outside one.

    >>> from actorflow.operators import OperatorHarness, async_wait_batch
    >>> async def score(values):
    ...     return [[(v, k)] for v, k in zip(values, current_request_keys())]
    >>> h = OperatorHarness(async_wait_batch(score, batch_size=2), request_key_prefix="p")
    >>> h.process_element("a", origin=(0,)); h.process_element("b", origin=(1,)); h.run_until_idle()
    >>> h.output_values()
    [('a', 'p/0'), ('b', 'p/1')]
    """
    keys = CURRENT_REQUEST.get()[1]
    return None if keys is None else [key_text(k) for k in keys]


def call_in_request(
    key: RequestKey | None, keys: Sequence[RequestKey] | None, fn: Callable[..., T], *args: Any
) -> T:
    """``fn(*args)`` with ``key`` (one record's) or ``keys`` (a batch's) as the current request's.

    What ``fn`` starts in the current context (tasks, coroutines) keeps them; they are reset when
    ``fn`` returns, so they never leak into the next request served on this thread.
    """
    token = CURRENT_REQUEST.set((key, None if keys is None else tuple(keys)))
    try:
        return fn(*args)
    finally:
        CURRENT_REQUEST.reset(token)
