"""Property tests of the batched async operator, through the harness.

1. Each record has exactly one outcome (a result, a fallback or a dead letter), whatever the
   interleaving of completions, failures, wrong shapes, retries, batch timers and deadlines.
2. Ordered output equals the input stream (less the dead letters); in unordered mode nothing
   crosses a watermark.
3. Snapshot -> restore -> continue equals an uninterrupted run, mid-buffer and mid-flight.

Hypothesis draws the inputs, the configuration and the schedule; a manual clock, no sleeps.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from actorflow.operators import DEAD_LETTER, FixedDelay, OperatorHarness, Record, Watermark, async_wait_batch

from .scripted import ScriptedBatch
from .test_properties import PROPERTY, ended, feed_script, offer, script_items, segments


@st.composite
def batch_configs(draw):
    return {
        "mode": draw(st.sampled_from(["ordered", "unordered"])),
        "batch_size": draw(st.integers(1, 4)),
        "batch_timeout_ms": draw(st.one_of(st.none(), st.integers(1, 50))),
        "capacity": draw(st.integers(1, 3)),
        "timeout_ms": draw(st.one_of(st.none(), st.integers(5, 80))),
        "retry": draw(st.one_of(st.none(), st.builds(FixedDelay, st.integers(2, 3), st.integers(0, 20)))),
        "fallback": draw(st.booleans()),
    }


def normalize(value: Any) -> Any:
    return value[1] if isinstance(value, tuple) and value[0] == "fallback" else value


ACTIONS = ["feed", "feed", "complete", "fail", "wrong-shape", "advance"]


@PROPERTY
@given(items=script_items, config=batch_configs(), data=st.data())
def test_each_record_has_exactly_one_outcome_and_order_and_watermarks_hold(items, config, data):
    fn = ScriptedBatch(fallback=(lambda v: ("fallback", v)) if config["fallback"] else None)
    op = async_wait_batch(
        fn,
        mode=config["mode"],
        batch_size=config["batch_size"],
        batch_timeout_ms=config["batch_timeout_ms"],
        capacity=config["capacity"],
        timeout_ms=config["timeout_ms"],
        retry=config["retry"],
        on_error="dead_letter",
    )
    h = OperatorHarness(op)
    elements = feed_script(items)
    now = 0
    fed = 0

    def act(action: str) -> None:
        nonlocal now, fed
        in_flight = fn.in_flight()
        if action == "feed" and fed < len(elements):
            offer(h, elements[fed])
            fed += 1
        elif action in ("complete", "fail", "wrong-shape") and in_flight:
            i = data.draw(st.sampled_from(in_flight), label=action)
            if action == "complete":
                fn.complete(i)
            elif action == "fail":
                fn.fail(i, ConnectionError("down"))
            else:
                fn.complete(i, [])
            h.run_until_idle()
        else:
            now += data.draw(st.integers(1, 40), label="advance")
            h.set_processing_time(now)
        assert op.batches_in_flight <= config["capacity"]
        assert len(fn.in_flight()) <= config["capacity"]

    for _ in range(data.draw(st.integers(0, 25), label="steps")):
        act(data.draw(st.sampled_from(ACTIONS), label="action"))
    while fed < len(elements):
        act("feed")
        if h.pending_input:
            act(data.draw(st.sampled_from(["complete", "advance"]), label="make-room"))
    h.end_input()
    for _ in range(200):
        if h.is_finished:
            break
        act(data.draw(st.sampled_from(["complete", "complete", "fail", "advance"]), label="finish"))
    assert h.is_finished, "the operator did not drain"

    records = [e for e in elements if isinstance(e, Record)]
    dead = [d.value for d in h.side_outputs.get(DEAD_LETTER, [])]
    emitted = [normalize(v) for v in h.output_values()]
    # 1. exactly one outcome per record
    assert Counter(emitted + dead) == Counter(r.value for r in records)
    # Attempts stay within the strategy's budget.
    max_attempts = 1 if config["retry"] is None else config["retry"].max_attempts
    assert all(attempt <= max_attempts for _, attempt in fn.calls)
    # 2. order and watermarks; every output keeps its own record's timestamp
    out = [Record(normalize(e.value), e.timestamp_ms) if isinstance(e, Record) else e for e in h.output]
    expected = [e for e in ended(elements) if not (isinstance(e, Record) and e.value in dead)]
    if config["mode"] == "ordered":
        assert out == expected
    else:
        assert segments(out) == segments(expected)
    assert [e for e in h.output if isinstance(e, Watermark)] == [e for e in ended(elements) if isinstance(e, Watermark)]
    h.close()


# ------------------------------------------------------------ snapshot -> restore -> continue


@st.composite
def snapshot_schedules(draw):
    items = draw(st.lists(st.sampled_from(["record", "record", "record", "watermark"]), min_size=1, max_size=10))
    elements = feed_script(items)
    ops: list[tuple[str, int]] = []
    for i in range(len(elements)):
        ops.append(("feed", i))
        for _ in range(draw(st.integers(0, 2))):
            ops.append(draw(st.sampled_from([("complete", 0), ("complete", -1), ("advance", 10), ("advance", 30)])))
    return {
        "elements": elements,
        "ops": ops,
        "snapshot_at": draw(st.integers(0, len(ops))),
        "config": {
            "mode": draw(st.sampled_from(["ordered", "unordered"])),
            "batch_size": draw(st.integers(1, 4)),
            "batch_timeout_ms": draw(st.one_of(st.none(), st.integers(5, 50))),
            "capacity": draw(st.integers(1, 3)),
        },
    }


class Run:
    """One harness, driven by the schedule's ops; ``now`` is its processing time."""

    def __init__(self, config: dict[str, Any], elements: list[Any], *, start_ms: int = 0, snapshot: bytes | None = None):
        self.fn = ScriptedBatch()
        self.h = OperatorHarness(async_wait_batch(self.fn, **config), start_ms=start_ms)
        if snapshot is not None:
            self.h.restore(snapshot)
        self.h.open()
        self.elements = elements
        self.now = start_ms

    def apply(self, op: tuple[str, int]) -> None:
        kind, arg = op
        if kind == "feed":
            offer(self.h, self.elements[arg])
        elif kind == "advance":
            self.now += arg
            self.h.set_processing_time(self.now)
        elif self.fn.in_flight():  # "complete" the oldest (0) or the newest (-1) batch in flight
            self.fn.complete(self.fn.in_flight()[arg])
            self.h.run_until_idle()

    def finish(self) -> None:
        self.h.end_input()
        for _ in range(200):
            if self.h.is_finished:
                return
            if self.fn.in_flight():
                self.apply(("complete", 0))
            else:
                self.apply(("advance", 1_000))
        raise AssertionError("the operator did not drain")


@PROPERTY
@given(schedule=snapshot_schedules())
def test_snapshot_restore_continue_equals_an_uninterrupted_run(schedule):
    config, elements, ops = schedule["config"], schedule["elements"], schedule["ops"]
    ref = Run(config, elements)
    for op in ops:
        ref.apply(op)
    ref.finish()

    first = Run(config, elements)
    i = 0
    while i < len(ops) and (i < schedule["snapshot_at"] or first.h.pending_input):
        first.apply(ops[i])
        i += 1
    snapshot = first.h.snapshot()
    before = list(first.h.output)
    pending = first.h.pending_input  # input after the snapshot: fed again after the restore
    fed = sum(1 for kind, _ in ops[:i] if kind == "feed")
    first.h.close()

    second = Run(config, elements, start_ms=first.now, snapshot=snapshot)
    for k in range(fed - pending, fed):
        offer(second.h, elements[k])
    for op in ops[i:]:
        second.apply(op)
    second.finish()

    combined = before + list(second.h.output)
    if config["mode"] == "ordered":
        assert combined == list(ref.h.output)
    else:
        assert segments(combined) == segments(list(ref.h.output))
    assert Counter(r for r in combined if isinstance(r, Record)) == Counter(r for r in elements if isinstance(r, Record))
