"""Channels between actors: numbered batches with credit-based flow control.

A channel carries *items*: ``("records", pyarrow.Table)``, ``("watermark", ts_ms)``,
``("status", idle)``, ``("end", None)``. The sender numbers them; the receiver accepts them in
number order (Ray keeps call order per caller, but a retried call may arrive late), into a
bounded buffer. A call returns once its item is in the buffer: that is the acknowledgement.
A sender with ``credits`` unacknowledged items waits for the oldest, so a slow receiver slows
its senders, and backpressure travels up to the source.

Threading model: both ends live on an actor's event loop; nothing here blocks it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Callable

__all__ = ["ChannelSender", "InputGate"]

Item = tuple[str, Any]


class ChannelSender:
    """The sending end of one channel to one receiver actor."""

    def __init__(self, receiver: Any, channel_id: int, *, credits: int = 4) -> None:
        self._receiver = receiver
        self.channel_id = channel_id
        self._credits = credits
        self._seq = 0
        self._unacked: deque[Any] = deque()

    async def send(self, kind: str, payload: Any) -> None:
        while len(self._unacked) >= self._credits:
            await self._unacked.popleft()
        self._unacked.append(self._receiver.push.remote(self.channel_id, self._seq, kind, payload))
        self._seq += 1

    async def flush(self) -> None:
        """Wait until the receiver has accepted every item sent."""
        while self._unacked:
            await self._unacked.popleft()

    @property
    def sent(self) -> int:
        return self._seq


class InputGate:
    """The receiving end of all channels into one actor: ordered per channel, bounded overall."""

    def __init__(self, num_channels: int, *, capacity: int, on_item: Callable[[], None]) -> None:
        self.num_channels = num_channels
        self.capacity = capacity
        self._next_seq = [0] * num_channels
        self._buffer: deque[tuple[int, str, Any]] = deque()
        self._changed = asyncio.Condition()
        self._on_item = on_item

    async def push(self, channel: int, seq: int, kind: str, payload: Any) -> None:
        if not 0 <= channel < self.num_channels:
            raise ValueError(f"channel must be in [0, {self.num_channels}), got {channel}")
        async with self._changed:
            await self._changed.wait_for(
                lambda: seq == self._next_seq[channel] and len(self._buffer) < self.capacity
            )
            self._buffer.append((channel, kind, payload))
            self._next_seq[channel] += 1
            self._changed.notify_all()
        self._on_item()

    def poll(self) -> tuple[int, str, Any] | None:
        """Take the next item, or None; called from the mailbox thread (the loop's thread)."""
        if not self._buffer:
            return None
        item = self._buffer.popleft()
        # Room was made: wake pushes waiting for it (they run when the loop gets control).
        asyncio.get_running_loop().create_task(self._notify())
        return item

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def __len__(self) -> int:
        return len(self._buffer)
