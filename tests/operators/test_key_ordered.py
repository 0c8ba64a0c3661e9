"""Async I/O in key-ordered mode: a key's records leave in input order, other keys overtake them,
no record crosses a watermark or a status, and snapshots keep every key's order."""

from __future__ import annotations

import pickle
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actorflow.operators import (
    ConfigurationError,
    OperatorHarness,
    Record,
    RecordError,
    Watermark,
    WatermarkStatus,
    async_wait,
    async_wait_batch,
)

from .scripted import Scripted, ScriptedBatch


def _by_key(make_fn=None, **options):
    fn = Scripted() if make_fn is None else make_fn()
    options.setdefault("capacity", 100)
    return fn, OperatorHarness(async_wait(fn, mode="key_ordered", order_key=lambda v: v[0], **options))


def test_a_keys_records_leave_in_input_order_while_other_keys_overtake_them():
    fn, h = _by_key()
    for i, v in enumerate([("a", 1), ("b", 1), ("a", 2), ("b", 2)]):
        h.process_element(v, timestamp_ms=i)
    fn.complete(("a", 2))
    fn.complete(("b", 2))
    fn.complete(("b", 1))
    h.run_until_idle()
    # b's two records are out, in order; a's second waits for its first.
    assert h.output_values() == [("b", 1), ("b", 2)]
    fn.complete(("a", 1))
    h.run_until_idle()
    assert h.output_values() == [("b", 1), ("b", 2), ("a", 1), ("a", 2)]


def test_no_record_crosses_a_watermark_or_a_status_and_none_overtakes_a_record():
    fn, h = _by_key()
    h.process_element(("a", 1), timestamp_ms=1)
    h.process_watermark(1)
    h.process_element(("b", 1), timestamp_ms=2)
    h.process_watermark_status(True)
    h.process_element(("c", 1), timestamp_ms=3)
    fn.complete(("c", 1))
    fn.complete(("b", 1))
    h.run_until_idle()
    assert h.output == []  # everything waits for ("a", 1), ahead of the watermark
    fn.complete(("a", 1))
    h.run_until_idle()
    assert h.output == [Record(("a", 1), 1), Watermark(1), Record(("b", 1), 2), WatermarkStatus(True),
                        Record(("c", 1), 3)]


def test_a_column_or_columns_of_a_row_make_the_key():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, mode="key_ordered", order_key=("country", "user"), capacity=10))
    rows = [{"country": "DE", "user": 1, "i": 0}, {"country": "DE", "user": 2, "i": 1}, {"country": "DE", "user": 1, "i": 2}]
    for i, row in enumerate(rows):
        h.process_element(row, timestamp_ms=i)
    fn.complete(rows[2])
    fn.complete(rows[1])
    h.run_until_idle()
    assert [r["i"] for r in h.output_values()] == [1]  # ("DE", 1)'s second row waits for its first
    fn.complete(rows[0])
    h.run_until_idle()
    assert [r["i"] for r in h.output_values()] == [1, 0, 2]


def test_the_mode_and_the_key_go_together():
    with pytest.raises(ConfigurationError, match="needs an order_key"):
        async_wait(Scripted(), mode="key_ordered")
    with pytest.raises(ConfigurationError, match="order_key is for mode='key_ordered'; mode is 'ordered'"):
        async_wait(Scripted(), order_key="user")
    with pytest.raises(ConfigurationError, match="order_key must be a column name"):
        async_wait(Scripted(), mode="key_ordered", order_key=3)
    with pytest.raises(ConfigurationError, match="mode must be 'ordered', 'unordered' or 'key_ordered'"):
        async_wait(Scripted(), mode="by_key")


def test_a_key_that_cannot_be_computed_fails_the_operator_naming_the_record():
    fn = Scripted()
    h = OperatorHarness(async_wait(fn, mode="key_ordered", order_key="user", capacity=10, name="enrich"))
    with pytest.raises(RecordError, match=r"enrich: the order key of record \{'id': 1\} could not be computed "
                                          r"with OrderKey\('user'\): KeyError: 'user'") as failed:
        h.process_element({"id": 1}, timestamp_ms=1)
    assert failed.value.value == {"id": 1} and isinstance(failed.value.__cause__, KeyError)


def test_a_snapshot_keeps_each_keys_order_through_a_restore():
    fn, h = _by_key(capacity=10, timeout_ms=1_000)
    for i, v in enumerate([("a", 1), ("b", 1), ("a", 2)]):
        h.process_element(v, timestamp_ms=i)
    fn.complete(("a", 2))  # done, but behind ("a", 1)
    h.run_until_idle()
    snapshot = h.snapshot()
    items = pickle.loads(snapshot).chain[0]["items"]
    assert [item[1] for item in items] == [("a", 1), ("b", 1), ("a", 2)]  # input order

    fn2 = Scripted()
    h2 = OperatorHarness(async_wait(fn2, mode="key_ordered", order_key=lambda v: v[0], capacity=10, timeout_ms=1_000))
    h2.restore(snapshot)
    h2.open()
    assert sorted(v for v, _ in fn2.calls) == [("a", 1), ("a", 2), ("b", 1)]  # all asked again
    fn2.complete(("a", 2))
    fn2.complete(("b", 1))
    h2.run_until_idle()
    assert h2.output_values() == [("b", 1)]
    fn2.complete(("a", 1))
    h2.run_until_idle()
    assert h2.output_values() == [("b", 1), ("a", 1), ("a", 2)]


def test_batches_keep_a_keys_order_too():
    fn = ScriptedBatch()
    h = OperatorHarness(async_wait_batch(fn, batch_size=2, mode="key_ordered", order_key=lambda v: v[0], capacity=4))
    for i, v in enumerate([("a", 1), ("b", 1), ("a", 2), ("c", 1)]):
        h.process_element(v, timestamp_ms=i)
    assert [values for values, _ in fn.calls] == [[("a", 1), ("b", 1)], [("a", 2), ("c", 1)]]
    fn.futures[1].complete([[v] for v in [("a", 2), ("c", 1)]])
    h.run_until_idle()
    assert h.output_values() == [("c", 1)]  # ("a", 2) waits for its key's first record
    fn.futures[0].complete([[v] for v in [("a", 1), ("b", 1)]])
    h.run_until_idle()
    assert h.output_values() == [("c", 1), ("a", 1), ("a", 2), ("b", 1)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcd"), st.booleans()), min_size=1, max_size=40), st.randoms())
def test_any_completion_order_keeps_each_keys_order_and_every_watermarks_place(script, rng: random.Random):
    fn, h = _by_key(capacity=8, queue_capacity=8)
    sent: list = []
    for i, (key, watermark_after) in enumerate(script):
        value = (key, i)
        h.process_element(value, timestamp_ms=i)
        sent.append(value)
        if watermark_after:
            h.process_watermark(i)
            sent.append(Watermark(i))
        # Complete a random request in flight now and then, so that the queue fills and drains.
        while fn.in_flight() and rng.random() < 0.5:
            fn.complete(rng.choice(fn.in_flight()))
            h.run_until_idle()
    while fn.in_flight():
        fn.complete(rng.choice(fn.in_flight()))
        h.run_until_idle()
    out = [e if isinstance(e, Watermark) else e.value for e in h.output]
    # Every record once; per key, input order; each watermark after exactly the records before it.
    assert sorted(v for v in out if not isinstance(v, Watermark)) == sorted(v for v in sent if not isinstance(v, Watermark))
    for key in "abcd":
        assert [v for v in out if not isinstance(v, Watermark) and v[0] == key] == \
               [v for v in sent if not isinstance(v, Watermark) and v[0] == key]
    for w in (e for e in sent if isinstance(e, Watermark)):
        before = {v for v in sent[:sent.index(w)] if not isinstance(v, Watermark)}
        assert {v for v in out[:out.index(w)] if not isinstance(v, Watermark)} == before
