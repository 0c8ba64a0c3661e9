"""The input channels of a stream task: a queue per channel, and aligned checkpoint barriers.

After Flink's ``SingleCheckpointBarrierHandler`` (aligned, exactly once) with the in-flight input
of its unaligned checkpoints: a channel whose next item is a barrier gives nothing to ``poll``
until ``take_aligned_barrier`` finds the same checkpoint's barrier in every live channel. The
items still queued in front of the barriers are returned with it: the checkpoint holds them as
in-flight input, so it need not wait until the operator has worked through them. They are
processed afterwards as usual.

Threading model: one thread (the mailbox thread) files, polls and aligns; nothing here blocks.
A host that fills the queues from elsewhere (an actor's remote calls, on the same event loop)
learns of room made through ``on_taken``.

>>> from actorflow.operators.elements import Watermark
>>> channels = InputChannels(2)
>>> _ = channels.file(0, CheckpointBarrier(1)); _ = channels.file(1, Watermark(5))
>>> channels.poll(), channels.take_aligned_barrier()
((1, Watermark(timestamp_ms=5)), None)
>>> _ = channels.file(1, CheckpointBarrier(1)); channels.take_aligned_barrier()
(1, [[], []])
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from .channel_items import ChannelItem, EndOfInput
from .elements import CheckpointBarrier
from .errors import ConfigurationError

__all__ = ["InputChannels"]


class InputChannels:
    """``num_channels`` queues of channel items, polled round-robin, aligned at barriers."""

    def __init__(self, num_channels: int, *, on_taken: Callable[[int], None] | None = None) -> None:
        if isinstance(num_channels, bool) or not isinstance(num_channels, int) or num_channels <= 0:
            raise ConfigurationError(f"num_channels must be an int > 0, got {num_channels!r}")
        self.num_channels = num_channels
        self._queues: list[deque[ChannelItem]] = [deque() for _ in range(num_channels)]
        self._filed = [0] * num_channels  # items that entered each queue so far
        self._taken = [0] * num_channels  # items that left it
        self._ended = [False] * num_channels  # the end item was filed
        self._turn = 0
        self._on_taken = on_taken
        self.barriers = 0  # barriers queued, on all channels

    def file(self, channel: int, item: ChannelItem) -> int:
        """Put ``item`` at the end of ``channel``'s queue; returns its number on the channel."""
        if not 0 <= channel < self.num_channels:
            raise ValueError(f"channel must be in [0, {self.num_channels}), got {channel}")
        self._queues[channel].append(item)
        match item:
            case CheckpointBarrier():
                self.barriers += 1
            case EndOfInput():
                self._ended[channel] = True
        number = self._filed[channel]
        self._filed[channel] += 1
        return number

    def queued(self, channel: int) -> int:
        return len(self._queues[channel])

    def taken(self, channel: int) -> int:
        """Items that left ``channel``'s queue so far (polled, aligned or dropped)."""
        return self._taken[channel]

    def poll(self) -> tuple[int, ChannelItem] | None:
        """The next item, round-robin over channels not held by a barrier; None if none."""
        n = self.num_channels
        for step in range(n):
            channel = (self._turn + step) % n
            queue = self._queues[channel]
            if queue and not isinstance(queue[0], CheckpointBarrier):
                self._turn = (channel + 1) % n
                item = queue.popleft()
                self._taken_one(channel)
                return channel, item
        return None

    def take_aligned_barrier(self) -> tuple[int, list[list[ChannelItem]]] | None:
        """The checkpoint whose barrier every live channel has delivered, with each channel's
        items in front of it; None while some channel's barrier is still to come.

        A barrier of an older checkpoint than another channel's is dropped: that checkpoint
        cannot complete (a source declined it), and it must not hold the channel.
        A channel that ended without the barrier counts as aligned.
        """
        while True:
            firsts: list[tuple[int, int] | None] = [
                next(((i, item.checkpoint_id) for i, item in enumerate(queue)
                      if isinstance(item, CheckpointBarrier)), None)
                for queue in self._queues
            ]
            ids = [f[1] for f in firsts if f is not None]
            if not ids:
                return None
            target = max(ids)
            older = next(((c, f[0]) for c, f in enumerate(firsts) if f is not None and f[1] < target), None)
            if older is None:
                break
            self._remove(*older)
        for channel, first in enumerate(firsts):
            if first is None and not self._ended[channel]:
                return None
        in_front: list[list[ChannelItem]] = []
        for channel, first in enumerate(firsts):
            queue = self._queues[channel]
            if first is None:
                in_front.append(list(queue))
            else:
                in_front.append([queue[i] for i in range(first[0])])
                self._remove(channel, first[0])
        return target, in_front

    def drop_barriers(self, checkpoint_id: int) -> None:
        """Forget the barriers of an aborted checkpoint (and older ones)."""
        for channel, queue in enumerate(self._queues):
            for i in reversed(range(len(queue))):
                item = queue[i]
                if isinstance(item, CheckpointBarrier) and item.checkpoint_id <= checkpoint_id:
                    self._remove(channel, i)

    def _remove(self, channel: int, index: int) -> None:
        if isinstance(self._queues[channel][index], CheckpointBarrier):
            self.barriers -= 1
        del self._queues[channel][index]
        self._taken_one(channel)

    def _taken_one(self, channel: int) -> None:
        self._taken[channel] += 1
        if self._on_taken is not None:
            self._on_taken(channel)

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues)


