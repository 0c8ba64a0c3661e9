"""The sink actor: collects the pipeline's Arrow batches and side outputs, in channel order."""

from __future__ import annotations

import asyncio
from typing import Any

import pyarrow as pa

from .arrow_rows import TS_COLUMN

__all__ = ["SinkActor"]


class SinkActor:
    """``num_channels`` main channels (0..n-1) and ``num_side_channels`` side channels after them.

    The results are handed out per channel by ``take_table``; the table is the call's return
    value, so the caller owns it and it outlives this actor.
    """

    def __init__(self, name: str, num_channels: int, num_side_channels: int = 0) -> None:
        self.name = name
        self._n = num_channels
        self._items: dict[int, dict[int, tuple[str, Any]]] = {c: {} for c in range(num_channels + num_side_channels)}
        self._ended: set[int] = set()
        self._done = asyncio.Event()
        self.rows = 0

    def __repr__(self) -> str:
        return self.name

    async def push(self, channel: int, seq: int, kind: str, payload: Any) -> None:
        self._items[channel][seq] = (kind, payload)
        if kind == "records":
            self.rows += payload.num_rows
        elif kind == "end":
            self._ended.add(channel)
            if len(self._ended) == len(self._items):
                self._done.set()

    async def wait_done(self) -> int:
        await self._done.wait()
        return self.rows

    async def take_table(self, channel: int, keep_timestamps: bool = False) -> pa.Table | None:
        items = self._items[channel]
        tables = [payload for _, (kind, payload) in sorted(items.items()) if kind == "records" and payload.num_rows]
        if not tables:
            return None
        table = pa.concat_tables(tables, promote_options="permissive")
        if not keep_timestamps and TS_COLUMN in table.column_names:
            table = table.drop_columns([TS_COLUMN])
        return table

    async def schemas(self) -> list[pa.Schema | None]:
        """Per main channel, the schema of its output without timestamps; None if it is empty."""
        out: list[pa.Schema | None] = []
        for channel in range(self._n):
            tables = [p for _, (kind, p) in sorted(self._items[channel].items()) if kind == "records" and p.num_rows]
            if not tables:
                out.append(None)
                continue
            schema = pa.unify_schemas([t.schema for t in tables], promote_options="permissive")
            out.append(pa.schema([f for f in schema if f.name != TS_COLUMN]))
        return out

    async def take_side(self, tag: str) -> list[Any]:
        out: list[Any] = []
        for channel in range(self._n, len(self._items)):
            for _, (kind, payload) in sorted(self._items[channel].items()):
                if kind == "side" and payload[0] == tag:
                    out.extend(payload[1])
        return out
