"""Routing records by key: to the instance that owns the key's key group (``operators.key_groups``).

Every process agrees on a key's group (a stable hash of its value, not Python's ``hash()``), and
instance ``i`` of ``p`` owns the contiguous range ``key_group_range(i, max_parallelism, p)``, so
that a job resumed at another parallelism moves whole key groups.

- Supported key values: ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, ``Decimal``,
  ``date``/``datetime``/``time``/``timedelta``, and tuples of them. A value read from an Arrow
  column and the same value in a Python dict route alike, and so do keys that are equal in Python
  (``1``, ``1.0``, ``True`` and ``Decimal(1)`` key one window, so they go to one instance).
- A batch keyed by a column is routed without a Python call per row: the column is dictionary
  encoded and each distinct key hashed once.

>>> KeyRouter("country").target({"country": "DE"}, 2) == KeyRouter("country").target({"country": "DE"}, 2)
True
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from actorflow.operators.elements import Record
from actorflow.operators.errors import RecordError, SchemaError, describe_value
from actorflow.operators.key_groups import (
    DEFAULT_MAX_PARALLELISM, check_max_parallelism, index_of_key_group, key_group_of, stable_hash,
)
from actorflow.operators.windows.records import key_function

from .arrow_rows import RowBatch, is_bare, table_to_rows

__all__ = ["KeyRouter", "as_router", "stable_hash"]  # stable_hash: operators.key_groups's


_KNOWN_KEYS = 1 << 16  # keys whose targets a router remembers, at most


class KeyRouter:
    """The key of a record (a column name, a tuple of them, or a function) and its target instance."""

    def __init__(self, key_selector: Any, *, operator: str = "key_by", max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> None:
        self.key_selector = key_selector
        self.operator = operator
        self.max_parallelism = check_max_parallelism(max_parallelism)
        self._select, self.fields = key_function(key_selector)
        # Each batch's distinct keys, mostly the same from batch to batch: their targets, by count
        # of targets. Equal keys hash alike (stable_hash), so a dict holds one entry for them.
        self._known: dict[int, dict[Any, int]] = {}

    def key(self, value: Any, timestamp_ms: int | None = None) -> Any:
        """The key of ``value``; a missing column or a raising function names the record."""
        try:
            return self._select(value)
        except Exception as error:
            record = Record(value, timestamp_ms)
            if self.fields is not None and isinstance(error, (KeyError, TypeError)):
                columns = list(value) if isinstance(value, dict) else type(value).__name__
                raise SchemaError(
                    f"{self.operator}: key column {error.args[0] if isinstance(error, KeyError) else self.fields!r} "
                    f"not found in record {describe_value(record.value)}; key_by{self.fields!r} needs it, "
                    f"the record has {columns}"
                ) from error
            raise RecordError(
                f"key_by function raised {type(error).__name__}: {error} on record {describe_value(value)}",
                operator=self.operator, value=value, timestamp_ms=timestamp_ms,
            ) from error

    def target_of_key(self, key: Any, num_targets: int, value: Any = None) -> int:
        if num_targets > self.max_parallelism:
            check_max_parallelism(self.max_parallelism, num_targets, what=f"{self.operator}'s next stage")
        try:
            return index_of_key_group(key_group_of(key, self.max_parallelism), self.max_parallelism, num_targets)
        except TypeError as error:
            raise RecordError(f"{error}, on record {describe_value(value)}", operator=self.operator, value=value) from None

    def target(self, value: Any, num_targets: int, timestamp_ms: int | None = None) -> int:
        return self.target_of_key(self.key(value, timestamp_ms), num_targets, value)

    def split(self, batch: RowBatch, num_targets: int) -> list[RowBatch]:
        """``batch`` cut into one batch per target (some may be empty), each in input order."""
        targets = self._targets(batch, num_targets)
        return [batch.filter(pc.equal(targets, t)) for t in range(num_targets)]

    def _targets(self, batch: RowBatch, n: int) -> pa.Array:
        table = batch.table
        if self.fields is not None and len(self.fields) == 1 and not is_bare(table):
            field = self.fields[0]
            if field not in table.column_names:
                first = table.slice(0, 1).to_pylist()
                raise SchemaError(
                    f"{self.operator}: key column {field!r} not found in record "
                    f"{describe_value(first[0] if first else None)}; key_by({field!r}) needs it, the record has "
                    f"{table.column_names}"
                )
            column = table.column(field)
            if not pa.types.is_nested(column.type):
                encoded = pc.dictionary_encode(column.combine_chunks(), null_encoding="encode")
                known = self._known.setdefault(n, {})
                if len(known) > _KNOWN_KEYS:
                    known.clear()
                per_key = []
                for k in encoded.dictionary.to_pylist():
                    t = known.get(k)
                    if t is None:
                        t = known[k] = self.target_of_key(k, n)
                    per_key.append(t)
                return pc.take(pa.array(per_key, pa.int32()), encoded.indices)
        cache: dict[Any, int] = {}
        targets = []
        for value, ts in table_to_rows(batch):
            key = self.key(value, ts)
            try:
                t = cache.get(key)
            except TypeError:
                t = None  # an unhashable key: target_of_key says so, naming the record
            if t is None:
                t = self.target_of_key(key, n, value)
                cache[key] = t
            targets.append(t)
        return pa.array(targets, pa.int32())

    def __repr__(self) -> str:
        return f"KeyRouter({self.key_selector!r}, max_parallelism={self.max_parallelism})"


def as_router(key: Any, max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> KeyRouter | None:
    """A ``KeyRouter`` for a key selector (or None); a router stays as it is."""
    if key is None or isinstance(key, KeyRouter):
        return key
    return KeyRouter(key, max_parallelism=max_parallelism)

