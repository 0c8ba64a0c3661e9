"""Channels: numbered batches, per-channel order, credit-based flow control (no Ray needed)."""

from __future__ import annotations

import asyncio

import pytest

from actors.channel import ChannelSender, InputGate


class _Call:
    def __init__(self, fn):
        self._fn = fn

    def remote(self, *args):
        return asyncio.ensure_future(self._fn(*args))


class FakeReceiver:
    """Stands in for an actor handle: ``push.remote`` returns an awaitable acknowledgement."""

    def __init__(self, gate):
        self.push = _Call(gate.push)


def test_gate_accepts_items_in_sequence_order_whatever_the_arrival_order():
    async def scenario():
        gate = InputGate(1, capacity=10, on_item=lambda: None)
        late = asyncio.ensure_future(gate.push(0, 1, "records", "second"))
        await asyncio.sleep(0)
        assert len(gate) == 0  # seq 1 waits for seq 0
        await gate.push(0, 0, "records", "first")
        await late
        return [gate.poll()[2], gate.poll()[2]]

    assert asyncio.run(scenario()) == ["first", "second"]


def test_sender_waits_when_its_credits_are_used_up_and_the_gate_is_full():
    async def scenario():
        gate = InputGate(1, capacity=2, on_item=lambda: None)
        sender = ChannelSender(FakeReceiver(gate), 0, credits=2)
        for i in range(4):  # two fit in the gate, two are unacknowledged calls
            await sender.send("records", i)
        blocked = asyncio.ensure_future(sender.send("records", 4))
        await asyncio.sleep(0.05)
        assert not blocked.done()  # no credit left: the sender waits
        taken = [gate.poll()[2] for _ in range(2)]  # the receiver makes room
        await asyncio.wait_for(blocked, 1)
        await asyncio.sleep(0)
        taken += [gate.poll()[2] for _ in range(2)]
        return taken

    assert asyncio.run(scenario()) == [0, 1, 2, 3]


def test_gate_rejects_an_unknown_channel():
    async def scenario():
        gate = InputGate(2, capacity=2, on_item=lambda: None)
        await gate.push(5, 0, "records", None)

    with pytest.raises(ValueError, match=r"channel must be in \[0, 2\), got 5"):
        asyncio.run(scenario())
