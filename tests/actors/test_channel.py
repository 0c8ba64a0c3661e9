"""Channels: numbered batches, per-channel order, credit-based flow control (no Ray needed)."""

from __future__ import annotations

import asyncio

import pytest

from actorflow.actors.channel import ChannelSender, InputGate
from actorflow.operators.channel_items import Records
from actorflow.operators.elements import CheckpointBarrier, Watermark


class _Call:
    def __init__(self, fn):
        self._fn = fn

    def remote(self, *args):
        return asyncio.ensure_future(self._fn(*args))


class FakeReceiver:
    """Stands in for an actor handle: ``push.remote`` returns an awaitable acknowledgement."""

    def __init__(self, gate):
        self.calls = []

        async def push(channel, seq, items):
            self.calls.append([type(item).__name__ for item in items])
            await gate.push(channel, seq, items)

        self.push = _Call(push)


def test_gate_accepts_items_in_sequence_order_whatever_the_arrival_order():
    async def scenario():
        gate = InputGate(1, capacity=10, on_item=lambda: None)
        late = asyncio.ensure_future(gate.push(0, 1, [Records("second")]))
        await asyncio.sleep(0)
        assert len(gate) == 0  # seq 1 waits for seq 0
        await gate.push(0, 0, [Records("first")])
        await late
        return [gate.poll()[1].batch, gate.poll()[1].batch]

    assert asyncio.run(scenario()) == ["first", "second"]


def test_sender_waits_when_its_credits_are_used_up_and_the_gate_is_full():
    async def scenario():
        gate = InputGate(1, capacity=2, on_item=lambda: None)
        sender = ChannelSender(FakeReceiver(gate), 0, credits=2)
        for i in range(4):  # two fit in the gate, two are unacknowledged calls
            await sender.send(Records(i))
            await asyncio.sleep(0)  # a turn of the loop each: a call each
        blocked = asyncio.ensure_future(sender.send(Records(4)))
        await asyncio.sleep(0.05)
        assert not blocked.done()  # no credit left: the sender waits
        taken = [gate.poll()[1].batch for _ in range(2)]  # the receiver makes room
        await asyncio.wait_for(blocked, 1)
        await asyncio.sleep(0)
        taken += [gate.poll()[1].batch for _ in range(2)]
        return taken

    assert asyncio.run(scenario()) == [0, 1, 2, 3]


def test_items_sent_in_one_turn_of_the_loop_leave_in_one_call_and_in_order():
    async def scenario():
        gate = InputGate(1, capacity=10, on_item=lambda: None)
        receiver = FakeReceiver(gate)
        sender = ChannelSender(receiver, 0, credits=2)
        await sender.send(Records(0))
        await sender.send(Watermark(5))  # no pause between them: one call
        await asyncio.sleep(0)
        await sender.send(Records(1))
        sender.send_now(CheckpointBarrier(7))  # what was sent before goes first, in its own call
        await sender.flush()
        return receiver.calls, [gate.poll()[1] for _ in range(3)], gate.take_aligned_barrier()

    calls, items, aligned = asyncio.run(scenario())
    assert calls == [["Records", "Watermark"], ["Records"], ["CheckpointBarrier"]]
    assert items == [Records(0), Watermark(5), Records(1)]
    assert aligned is not None and aligned[0] == 7


def test_a_gate_files_the_items_of_calls_in_sequence_order_across_calls_of_several_items():
    async def scenario():
        gate = InputGate(1, capacity=10, on_item=lambda: None)
        late = asyncio.ensure_future(gate.push(0, 2, [Records("c")]))
        await asyncio.sleep(0)
        await gate.push(0, 0, [Records("a"), Watermark(1)])
        await late
        return [gate.poll()[1] for _ in range(3)]

    assert asyncio.run(scenario()) == [Records("a"), Watermark(1), Records("c")]


def test_gate_rejects_an_unknown_channel():
    async def scenario():
        gate = InputGate(2, capacity=2, on_item=lambda: None)
        await gate.push(5, 0, [Records(None)])

    with pytest.raises(ValueError, match=r"channel must be in \[0, 2\), got 5"):
        asyncio.run(scenario())


def test_a_call_that_cannot_be_made_fails_the_next_send_and_the_flush():
    class Gone:
        class push:  # noqa: N801 - stands in for an actor method
            @staticmethod
            def remote(*args):
                raise RuntimeError("the receiver is gone")

    async def scenario():
        sender = ChannelSender(Gone(), 0, credits=2)
        await sender.send(Records(0))  # leaves after this turn of the loop, and fails then
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="the receiver is gone"):
            await sender.send(Records(1))
        with pytest.raises(RuntimeError, match="the receiver is gone"):
            await sender.flush()

    asyncio.run(scenario())


def test_partitioner_rejects_an_unknown_partitioning():
    from actorflow.actors.output import Partitioner

    with pytest.raises(ValueError, match="partitioning must be 'forward', 'rebalance' or 'hash', got 'broadcast'"):
        Partitioner("broadcast", 2)
