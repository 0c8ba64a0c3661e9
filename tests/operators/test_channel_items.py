"""Channel items: one class per kind, one ``match`` dispatch, partitioning as an enum."""

from __future__ import annotations

import pickle

import pytest

from actorflow.operators.channel_items import (
    END_OF_INPUT, ChannelItem, EndOfInput, PartialAggregates, Partitioning, Records,
)
from actorflow.operators.elements import CheckpointBarrier, Watermark, WatermarkStatus


def _describe(item: ChannelItem) -> str:
    match item:
        case Records(batch=batch):
            return f"records {batch}"
        case PartialAggregates(table=table, rows=rows):
            return f"partials of {rows} rows: {table}"
        case Watermark(timestamp_ms=ts):
            return f"watermark {ts}"
        case WatermarkStatus(idle=idle):
            return "idle" if idle else "active"
        case CheckpointBarrier(checkpoint_id=checkpoint_id):
            return f"barrier {checkpoint_id}"
        case EndOfInput():
            return "end"
    raise AssertionError(f"no case for {item!r}")


@pytest.mark.parametrize("item, described", [
    (Records("b"), "records b"),
    (PartialAggregates("t", 7), "partials of 7 rows: t"),
    (Watermark(5), "watermark 5"),
    (WatermarkStatus(True), "idle"),
    (WatermarkStatus(False), "active"),
    (CheckpointBarrier(3), "barrier 3"),
    (END_OF_INPUT, "end"),
])
def test_each_item_reaches_its_case_and_survives_the_wire(item, described):
    assert _describe(item) == described
    # Items travel in Ray calls: pickled, they must come back equal and match the same case.
    again = pickle.loads(pickle.dumps(item, protocol=5))
    assert again == item and _describe(again) == described


def test_items_have_no_instance_dict():
    # Slotted: a batch's item adds no per-instance dictionary to what travels.
    for item in (Records(1), PartialAggregates(1, 1), END_OF_INPUT):
        assert not hasattr(item, "__dict__")


@pytest.mark.parametrize("text, member", [
    ("forward", Partitioning.FORWARD),
    ("hash", Partitioning.HASH),
    ("rebalance", Partitioning.REBALANCE),
])
def test_partitioning_reads_its_name(text, member):
    assert Partitioning(text) is member



def test_stream_elements_survive_the_wire_too():
    for element in (Watermark(-(2**63)), WatermarkStatus.IDLE(), CheckpointBarrier(2**40)):
        again = pickle.loads(pickle.dumps(element, protocol=5))
        assert again == element and type(again) is type(element)
