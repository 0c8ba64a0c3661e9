"""The thread that takes an actor's output blocks: a stream that breaks fails the job, never a short result."""

from __future__ import annotations

import threading

import pytest

from actorflow.cluster.job import _BlockDrain


def _stream(blocks, error=None, gate=None):
    yield from blocks
    if gate is not None:
        gate.wait()
    if error is not None:
        raise error


def test_a_stream_that_ends_gives_every_block_in_order():
    drain = _BlockDrain(_stream(["b0", "b1", "b2"]), "clicks/echo[0/2] output")
    drain.join(5)
    assert drain.blocks == ["b0", "b1", "b2"]


def test_a_stream_that_breaks_is_raised_naming_the_instance_and_the_blocks_taken():
    broken = ConnectionError("the owner of the stream went away")
    drain = _BlockDrain(_stream(["b0", "b1"], error=broken), "clicks/echo[1/2] output")
    with pytest.raises(RuntimeError, match=r"clicks/echo\[1/2\] output: its stream of blocks failed after 2 "
                                           r"block\(s\), so the result would miss rows: ConnectionError") as raised:
        drain.join(5)
    assert raised.value.__cause__ is broken


def test_a_stream_that_does_not_end_is_raised():
    gate = threading.Event()
    drain = _BlockDrain(_stream(["b0"], gate=gate), "clicks/echo[0/2] output")
    try:
        with pytest.raises(RuntimeError, match="did not end with the job"):
            drain.join(0.2)
    finally:
        gate.set()
