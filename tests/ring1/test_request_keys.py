"""Idempotency keys of async requests: made from the origin, or from the count of records taken in.

A key is the same on every attempt of its record and after a restore; one made from an origin
does not depend on timing.
"""

from __future__ import annotations

import doctest
import pickle

from operators import OperatorHarness, async_wait, async_wait_batch
from operators import request_keys

from .scripted import Scripted, ScriptedBatch


def keys_in(snapshot: bytes) -> list[str]:
    """The keys of the records in the snapshot of a one-operator harness."""
    return [item[-1] for item in pickle.loads(snapshot)[0]["items"] if item[0] == "record"]


def test_docstring_examples():
    result = doctest.testmod(request_keys)
    assert result.attempted > 0 and result.failed == 0


def test_a_key_is_the_prefix_and_the_origin_or_the_count_of_records_taken_in():
    h = OperatorHarness(async_wait(Scripted(), capacity=10), request_key_prefix="clicks/enrich")
    h.process_element("a", origin=(0, 3, 17))
    h.process_element("b")  # the second record taken in
    h.process_element("c", origin=("part-1", 0))
    h.process_element("d")
    assert keys_in(h.snapshot()) == ["clicks/enrich/0.3.17", "clicks/enrich/#1", "clicks/enrich/part-1.0", "clicks/enrich/#3"]


def test_without_a_prefix_the_key_starts_with_the_operator_name_in_its_context():
    h = OperatorHarness(async_wait(Scripted(), capacity=10), name="job/lookup[1/4]")
    h.process_element("a", origin=(5,))
    assert keys_in(h.snapshot()) == ["job/lookup[1/4]/5"]


def test_the_async_operators_of_one_chain_have_keys_of_their_own():
    h = OperatorHarness([async_wait(Scripted(), capacity=10), async_wait(Scripted(), capacity=10)],
                        request_key_prefix="job/enrich")
    h.process_element("a", origin=(1,))
    first, second = pickle.loads(h.snapshot())
    assert [item[-1] for item in first["items"]] == ["job/enrich#0/1"]
    assert second["items"] == []  # nothing has reached it yet


def test_the_count_of_records_taken_in_is_restored_from_the_snapshot():
    def make():
        return async_wait(Scripted(), capacity=10)

    h1 = OperatorHarness(make(), request_key_prefix="p")
    for v in "abc":
        h1.process_element(v)
    snap = h1.snapshot()
    assert pickle.loads(snap)[0]["sequence"] == 3

    h2 = OperatorHarness(make(), request_key_prefix="p")
    h2.restore(snap)
    h2.process_element("d")
    assert keys_in(h2.snapshot()) == ["p/#0", "p/#1", "p/#2", "p/#3"]


def test_batched_records_have_keys_of_their_own_and_keep_them_through_a_restore():
    fn = ScriptedBatch()

    def make():
        return async_wait_batch(fn, batch_size=2, capacity=1)

    h1 = OperatorHarness(make(), request_key_prefix="p")
    for i, v in enumerate("abcde"):
        h1.process_element(v, origin=(i,) if v != "c" else None)
    snap = h1.snapshot()
    state = pickle.loads(snap)[0]
    assert [item[5] for item in state["items"]] == ["p/0", "p/1", "p/#2", "p/3", "p/4"]
    assert state["sequence"] == 5

    fn = ScriptedBatch()
    h2 = OperatorHarness(make(), request_key_prefix="p")
    h2.restore(snap)
    h2.process_element("f")
    fn.complete(0)  # a and b leave: room for f
    h2.run_until_idle()
    assert h2.output_values() == ["a", "b"]
    assert [item[5] for item in pickle.loads(h2.snapshot())[0]["items"]] == ["p/#2", "p/3", "p/4", "p/#5"]


def test_records_of_a_snapshot_without_keys_get_them_at_the_restore():
    # A bare list of six-field items: the format from before records had an origin and a key.
    old = pickle.dumps([[("record", "a", 1, 1, None, None), ("watermark", 1), ("record", "b", 2, 1, None, None)]])
    h = OperatorHarness(async_wait(Scripted(), capacity=10), request_key_prefix="p")
    h.restore(old)
    h.process_element("c")
    assert keys_in(h.snapshot()) == ["p/#0", "p/#1", "p/#2"]
