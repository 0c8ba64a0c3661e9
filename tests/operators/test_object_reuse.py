"""Async I/O keeps its own copy of what it buffers, unless ``object_reuse=True`` says the caller
never changes an object it has handed on.

A map in front that returns one object, changed for each input, must change neither a buffered
record's retry, nor its output, nor the snapshot.
"""

from __future__ import annotations

import pickle

import pytest

from actorflow.operators import (
    ConfigurationError,
    FixedDelay,
    MapOperator,
    OperatorHarness,
    Record,
    async_wait,
    async_wait_batch,
)

from .scripted import Scripted, ScriptedBatch


class Reused:
    """A map function that returns the same dict for every input, changed in place."""

    def __init__(self) -> None:
        self.row: dict[str, object] = {}

    def __call__(self, user: int) -> dict[str, object]:
        self.row["user"] = user
        return self.row


def async_items(h: OperatorHarness) -> list[object]:
    """The values of the records in the async operator's snapshot (the chain's second operator)."""
    return [item[1] for item in h.chain.snapshot_state()[1]["items"] if item[0] == "record"]


@pytest.mark.parametrize("copy_inputs", [True, "shallow", False])
def test_a_reused_object_in_front_changes_neither_the_retry_the_output_nor_the_snapshot(copy_inputs):
    fn = Scripted()
    h = OperatorHarness([
        MapOperator(Reused(), name="reused"),
        async_wait(fn, capacity=10, retry=FixedDelay(3, 10), copy_inputs=copy_inputs),
    ])
    h.process_element(1, timestamp_ms=1)
    h.process_element(2, timestamp_ms=2)
    assert async_items(h) == [{"user": 1}, {"user": 2}]
    fn.fail({"user": 1}, RuntimeError("503"))
    h.set_processing_time(10)
    assert fn.calls[-1] == ({"user": 1}, 2)  # the retry sends user 1's row again
    fn.complete({"user": 1})
    fn.complete({"user": 2})
    h.run_until_idle()
    assert h.output == [Record({"user": 1}, 1), Record({"user": 2}, 2)]


def test_a_snapshot_restores_each_records_own_value():
    fn = Scripted()
    h = OperatorHarness([MapOperator(Reused(), name="reused"), async_wait(fn, capacity=10)])
    h.process_element(1, timestamp_ms=1)
    h.process_element(2, timestamp_ms=2)
    fn2 = Scripted()
    h2 = OperatorHarness([MapOperator(Reused(), name="reused"), async_wait(fn2, capacity=10)])
    h2.restore(h.snapshot())
    h2.open()
    assert [v for v, _ in fn2.calls] == [{"user": 1}, {"user": 2}]


def test_batch_a_reused_object_changes_neither_the_batch_retry_nor_the_snapshot():
    fn = ScriptedBatch()
    h = OperatorHarness([
        MapOperator(Reused(), name="reused"),
        async_wait_batch(fn, batch_size=1, capacity=2, retry=FixedDelay(3, 10)),
    ])
    h.process_element(1, timestamp_ms=1)
    h.process_element(2, timestamp_ms=2)
    assert async_items(h) == [{"user": 1}, {"user": 2}]
    fn.fail(0, RuntimeError("503"))
    h.set_processing_time(10)
    assert fn.calls[-1] == ([{"user": 1}], 2)
    fn.complete(1)
    fn.complete(2)
    h.run_until_idle()
    assert h.output == [Record({"user": 1}, 1), Record({"user": 2}, 2)]


def test_batch_records_buffered_before_their_batch_leaves_keep_their_own_values():
    fn = ScriptedBatch()
    h = OperatorHarness([MapOperator(Reused(), name="reused"), async_wait_batch(fn, batch_size=2, capacity=2)])
    h.process_element(1, timestamp_ms=1)  # buffered while user 2 changes the row
    h.process_element(2, timestamp_ms=2)
    assert fn.batches() == [[{"user": 1}, {"user": 2}]]


def test_nested_values_are_copied_and_immutable_ones_are_kept_as_they_are():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, capacity=10, copy_inputs=False))
    row = {"user": 1, "tags": ["a"]}
    text = "immutable"
    h.process_element(row, timestamp_ms=1)
    h.process_element(text, timestamp_ms=2)
    row["tags"].append("b")  # the caller changes what it handed on
    assert fn.calls[0][0] == {"user": 1, "tags": ["a"]} and fn.calls[0][0] is not row
    assert fn.calls[1][0] is text  # nothing to copy


def test_object_reuse_keeps_the_callers_object_and_its_changes():
    # The contract of object_reuse=True: the caller must not change an object it handed on.
    # Breaking it shows: the operator and its function see the change.
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, capacity=10, copy_inputs=False, object_reuse=True))
    row = {"user": 1}
    h.process_element(row, timestamp_ms=1)
    assert fn.calls[0][0] is row
    row["user"] = 2
    assert pickle.loads(pickle.dumps(h.chain.snapshot_state()))[0]["items"][0][1] == {"user": 2}


@pytest.mark.parametrize("make", [
    lambda: async_wait(Scripted(), object_reuse="yes"),
    lambda: async_wait_batch(ScriptedBatch(), batch_size=2, object_reuse=1),
])
def test_object_reuse_must_be_a_bool(make):
    with pytest.raises(ConfigurationError, match="object_reuse must be True or False"):
        make()
