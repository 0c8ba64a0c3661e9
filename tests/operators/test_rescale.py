"""Rescaling keyed state: a run cut anywhere at parallelism p, its instances' states dealt by key
group to p' new instances, and the rest fed to those, gives the output of an uninterrupted run."""

from __future__ import annotations

import pickle
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actorflow.operators import OperatorHarness, Record, Watermark, async_wait, async_wait_batch
from actorflow.operators.errors import StateFormatError
from actorflow.operators.key_groups import index_of_key_group, key_group_of, key_group_range
from actorflow.operators.rescale import rescale_states
from actorflow.operators.state import versioned
from actorflow.operators.windows import TumblingEventTimeWindows, Count, WindowOperator

from .scripted import Scripted, ScriptedBatch
from .windows.test_window_snapshot import FACTORIES, streams
from .windows.transcript import compact, record
from tests.properties import examples

MAX_P = 16


def _owner(key, parallelism):
    return index_of_key_group(key_group_of(key, MAX_P), MAX_P, parallelism)


def _feed_keyed(harnesses, steps):
    for step in steps:
        if step.startswith("wm "):
            for h in harnesses:
                h.process_watermark(int(step[3:]))
        elif step.startswith("pt "):
            for h in harnesses:
                h.set_processing_time(int(step[3:]))
        else:
            value, ts = record(step)
            harnesses[_owner(value["k"], len(harnesses))].process_element(value, ts)


def _records(harnesses):
    """Every window row emitted, as a multiset (instances interleave freely), and the side outputs."""
    rows = Counter(line for h in harnesses for line in compact(h.output) if not line.startswith("wm "))
    sides = Counter((tag, repr(v)) for h in harnesses for tag, values in h.side_outputs.items() for v in values)
    return rows, sides


def _rescaled_run(factory, steps, cut, before, after):
    first = [OperatorHarness(factory()) for _ in range(before)]
    _feed_keyed(first, steps[:cut])
    old = [pickle.loads(h.snapshot()).chain[0] for h in first]
    now = max(h.clock.now_ms() for h in first)
    second = []
    for state in rescale_states(old, after, MAX_P):
        h = OperatorHarness(factory(), start_ms=now)
        h.restore(pickle.dumps([state]))
        h.open()
        second.append(h)
    _feed_keyed(second, steps[cut:])
    return _records(first + second)


@settings(max_examples=examples(150), deadline=None)
@given(factory=st.sampled_from(FACTORIES), steps=streams(), data=st.data())
def test_windows_cut_anywhere_and_resumed_at_any_parallelism_give_the_uninterrupted_output(factory, steps, data):
    before, after = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    cut = data.draw(st.integers(0, len(steps)))
    uninterrupted = OperatorHarness(factory())
    _feed_keyed([uninterrupted], steps)
    assert _rescaled_run(factory, steps, cut, before, after) == _records([uninterrupted])


@pytest.mark.parametrize("before, after", [(2, 3), (3, 1), (1, 4)])
def test_each_key_s_window_moves_whole_to_the_instance_that_owns_its_key_group(before, after):
    keys = [f"user{i}" for i in range(40)]
    first = [OperatorHarness(WindowOperator("k", TumblingEventTimeWindows(100), aggregate=Count())) for _ in range(before)]
    _feed_keyed(first, [f"{k}:1@{t}" for t in (1, 2) for k in keys] + ["wm 50"])
    states = rescale_states([pickle.loads(h.snapshot()).chain[0] for h in first], after, MAX_P)
    for index, state in enumerate(states):
        owned = key_group_range(index, MAX_P, after)
        assert {key_group_of(k, MAX_P) for k, *_ in state["contents"]} <= set(owned)
        assert state["watermark"] == 50
    contents = sorted(entry for state in states for entry in state["contents"])
    assert contents == sorted((k, ("time", 0, 100), "value", 2) for k in keys)  # each key once, its count whole
    assert sum(len(s["timers"]["event"]) for s in states) == len(keys)


# ------------------------------------------------------------------- async_wait and async_batch


def _async(mode):
    fn = Scripted()
    return fn, OperatorHarness(async_wait(fn, mode=mode, capacity=100, timeout_ms=60_000))


def _async_batch(mode):
    # Room in the queue for every record a test feeds: what an instance has not taken in is in
    # front of it, in a channel, not in its state.
    fn = ScriptedBatch()
    return fn, OperatorHarness(async_wait_batch(fn, batch_size=3, mode=mode, capacity=12, timeout_ms=60_000))


@settings(max_examples=examples(100), deadline=None)
@given(data=st.data(), kind=st.sampled_from([_async, _async_batch]), mode=st.sampled_from(["ordered", "unordered"]),
       keyed=st.booleans())
def test_records_in_flight_move_to_their_key_s_new_owner_and_each_comes_out_once_never_behind_a_watermark(
        data, kind, mode, keyed):
    before, after = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    olds = [kind(mode) for _ in range(before)]
    watermark, n = 0, data.draw(st.integers(1, 30))
    for i in range(n):
        if data.draw(st.booleans()):
            watermark += data.draw(st.integers(1, 5))
            for _, h in olds:
                h.process_watermark(watermark)
        value = (f"k{data.draw(st.integers(0, 5))}", i)
        fn, h = olds[_owner(value[0], before) if keyed else i % before]
        h.process_element(value, watermark + data.draw(st.integers(1, 5)))  # never behind the watermark
        if data.draw(st.booleans()) and fn.in_flight():
            flying = fn.in_flight()
            fn.complete(flying[data.draw(st.integers(0, len(flying) - 1))])
            h.run_until_idle()
    old_states = [pickle.loads(h.snapshot()).chain[0] for _, h in olds]
    left = {tuple(fn.calls[i][0]) for fn, _ in olds for i in fn.in_flight()} if kind is _async_batch else set()
    key_of = (lambda v: v[0]) if keyed else None
    news = []
    for state in rescale_states(old_states, after, MAX_P, key_of):
        fn, h = kind(mode)
        h.restore(pickle.dumps([state]))
        h.open()
        news.append((fn, h))
        for item in state["items"]:
            if keyed and item[0] == "record":
                assert _owner(item[1][0], after) == len(news) - 1
        if kind is _async_batch:  # each batch of a state is one that had left, with records that were in it
            numbers = {item[3] for item in state["items"] if item[0] == "record" and item[3] is not None}
            assert sorted(b[0] for b in state["batches"]) == sorted(numbers)
    for fn, h in news:
        h.end_input()  # a batch operator's buffered rest leaves as a last batch
        while fn.in_flight():
            for i in list(fn.in_flight()):
                fn.complete(i)
            h.run_until_idle()
    if kind is _async_batch and not keyed:  # a batch that had left went whole to one instance, sent again as it was
        again = [tuple(v) for fn, _ in news for v, _ in fn.calls]
        assert all(again.count(batch) == 1 for batch in left), (left, again)
    emitted = [e.value[1] for _, h in olds + news for e in h.output if isinstance(e, Record)]
    assert sorted(emitted) == list(range(n))  # each record once
    for _, h in olds + news:
        seen = -1
        for e in h.output:
            if isinstance(e, Watermark):
                seen = max(seen, e.timestamp_ms)
            else:
                assert e.timestamp_ms > seen, (e, seen)  # no record came out behind a watermark it preceded
    if mode == "ordered" and keyed:  # a key's records stay in input order on its one new owner
        for _, h in news:
            by_key: dict[str, list[int]] = {}
            for e in h.output:
                if isinstance(e, Record):
                    by_key.setdefault(e.value[0], []).append(e.value[1])
            assert all(ids == sorted(ids) for ids in by_key.values())


def test_a_state_that_cannot_rescale_is_refused_naming_its_kind():
    with pytest.raises(StateFormatError, match=r"of different kinds: \['async_batch', 'mystery'\]"):
        rescale_states([versioned("async_batch", {"items": [], "batches": [], "sequence": 0, "flush_remaining_ms": None}),
                        {"format": "mystery"}], 2, MAX_P)
    with pytest.raises(StateFormatError, match="'mystery' cannot resume at another parallelism"):
        rescale_states([{"format": "mystery"}], 2, MAX_P)
    assert rescale_states([None, None], 3, MAX_P) == [None, None, None]
