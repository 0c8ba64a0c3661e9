"""Idempotency keys of async requests: the same for a record on every attempt and after a restore.

A service that de-duplicates needs to recognise a request it has seen: a retry, or a record
replayed after a restore from a checkpoint. The async operators give every record a key when
they take it in, and keep it (in their snapshots too) until its outcome is emitted:

* ``<prefix>/<origin joined by ".">`` for a record with an origin, say ``clicks/enrich/0.3.17``
  for ``origin=(0, 3, 17)``. The origin depends on the input alone, so the key does too, whichever
  subtask the record reaches and whatever the order in which requests complete.
* ``<prefix>/#<n>`` for a record without one, ``n`` being its position among the records the
  operator took in (the count is in the operator's snapshot). It is stable only as long as the
  records reach the operator in the same order, and unique only within one operator instance:
  give records an origin when that is not enough.

The prefix is the context's ``request_key_prefix``, meant to be ``<job>/<operator>`` without the
subtask index (after a restore, a record may reach another subtask), or else the operator's name
in its context.

>>> request_key("clicks/enrich", (0, 3, 17), 42), request_key("clicks/enrich", None, 42)
('clicks/enrich/0.3.17', 'clicks/enrich/#42')
"""

from __future__ import annotations

from typing import Any

__all__ = ["request_key"]


def request_key(prefix: str, origin: tuple[Any, ...] | None, sequence: int) -> str:
    """The idempotency key of a record: from its ``origin``, or else from its ``sequence`` number."""
    if origin is None:
        return f"{prefix}/#{sequence}"
    return f"{prefix}/{'.'.join(map(str, origin))}"
