"""Watermark generation, idleness, and the minimum over inputs (the status valve)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
import pytest

from actorflow.operators import ConfigurationError, ManualClock, Watermark, WatermarkStatus
from actorflow.operators.elements import MAX_WATERMARK, MIN_TIMESTAMP
from actorflow.operators.watermarks import BoundedOutOfOrdernessWatermarks, StatusWatermarkValve, WatermarksWithIdleness
from tests.properties import examples

IDLE, ACTIVE = WatermarkStatus(True), WatermarkStatus(False)


def test_bounded_out_of_orderness_trails_the_largest_timestamp():
    g = BoundedOutOfOrdernessWatermarks(100)
    assert g.on_periodic_emit() == []  # nothing seen: no watermark
    g.on_event(1000)
    g.on_event(950)  # out of order, within the bound: does not move it
    assert g.on_periodic_emit() == [Watermark(899)]
    assert g.on_periodic_emit() == []  # no repeats
    g.on_event(1200)
    assert g.on_periodic_emit() == [Watermark(1099)]
    g.on_event(1000)
    assert g.on_periodic_emit() == []  # never backwards
    # a record at the bound is on time: 1099 < 1000 is false only for records older than 100 ms
    assert g.current_watermark_ms() == 1099


@pytest.mark.parametrize("bad", [-1, 1.5, None])
def test_generator_arguments_are_checked(bad):
    with pytest.raises(ConfigurationError):
        BoundedOutOfOrdernessWatermarks(bad)
    with pytest.raises(ConfigurationError):
        WatermarksWithIdleness(BoundedOutOfOrdernessWatermarks(0), bad if bad != -1 else 0, ManualClock())
    with pytest.raises(ConfigurationError):
        StatusWatermarkValve(0)


def test_the_valve_knows_its_inputs_carry_event_time_even_when_none_got_through():
    # Input 0 says 14,999 and ends; input 1 ends without a word: the minimum never moved, but the
    # records of input 0 carry event time, and the end of input must end it.
    valve = StatusWatermarkValve(2)
    assert not valve.has_event_time
    assert valve.input_watermark(0, 14_999) == []
    assert valve.input_ended(0) == [] and valve.input_ended(1) == []
    assert valve.current_watermark_ms == MIN_TIMESTAMP and valve.has_event_time
    quiet = StatusWatermarkValve(2)
    quiet.input_ended(0), quiet.input_ended(1)
    assert not quiet.has_event_time


def test_idleness_after_a_quiet_period_and_back():
    clock = ManualClock(0)
    g = WatermarksWithIdleness(BoundedOutOfOrdernessWatermarks(0), idleness_ms=100, clock=clock)
    g.on_event(10)
    assert g.on_periodic_emit() == [Watermark(9)]
    clock.advance_to(99)
    assert g.on_periodic_emit() == []  # quiet for 99 ms: still active
    clock.advance_to(100)
    assert g.on_periodic_emit() == [IDLE]
    clock.advance_to(500)
    assert g.on_periodic_emit() == []  # idle once, not on every tick
    g.on_event(20)
    assert g.on_periodic_emit() == [ACTIVE, Watermark(19)]  # active before any watermark
    assert g.on_periodic_emit() == []


def test_steady_data_never_flips_between_idle_and_active():
    clock = ManualClock(0)
    g = WatermarksWithIdleness(BoundedOutOfOrdernessWatermarks(0), idleness_ms=100, clock=clock)
    emitted = []
    for t in range(0, 10_000, 10):  # a tick every 10 ms, a record every 90 ms: always under the idleness
        clock.advance_to(t)
        if t % 90 == 0:
            g.on_event(t)
        emitted += g.on_periodic_emit()
    assert IDLE not in emitted and ACTIVE not in emitted
    assert emitted[-1] == Watermark(9989)  # the last record, at 9990


# ------------------------------------------------------------------------ the valve

W, I, A, E = "wm", "idle", "active", "end"

VALVE_CASES = [
    pytest.param(
        2, [(W, 0, 5), (W, 1, 3), (W, 1, 7), (W, 0, 9)], [[], [Watermark(3)], [Watermark(5)], [Watermark(7)]],
        id="minimum-of-two",  # the slowest input sets the pace
    ),
    pytest.param(
        2, [(W, 0, 5), (W, 1, 8), (W, 1, 4), (W, 0, 4)], [[], [Watermark(5)], [], []],
        id="never-backwards",  # an input's own watermark does not regress, and neither does the output
    ),
    pytest.param(
        2, [(W, 0, 5), (W, 1, 3), (I, 1), (W, 0, 9)], [[], [Watermark(3)], [Watermark(5)], [Watermark(9)]],
        id="idle-input-excluded",  # it held the minimum: going idle recomputes it
    ),
    pytest.param(
        2, [(W, 0, 5), (I, 0), (I, 1), (I, 1), (A, 0), (A, 0)],
        [[], [], [Watermark(5), IDLE], [], [ACTIVE], []],
        id="idle-once-active-once",  # all idle: flush the largest, then IDLE once; ACTIVE once
    ),
    pytest.param(
        2, [(W, 0, 10), (W, 1, 10), (I, 1), (W, 0, 20), (A, 1), (W, 0, 30), (W, 1, 15), (W, 1, 25), (W, 1, 40)],
        [[], [Watermark(10)], [], [Watermark(20)], [], [Watermark(30)], [], [], []],
        id="back-from-idle-behind-does-not-hold-back",  # it rejoins once it catches up
    ),
    pytest.param(
        3, [(W, 0, 5), (W, 1, 3), (W, 2, 8), (E, 1), (E, 0), (W, 2, 9)],
        [[], [], [Watermark(3)], [Watermark(5)], [Watermark(8)], [Watermark(9)]],
        id="ended-inputs-excluded",  # the minimum is recomputed as inputs end
    ),
    pytest.param(
        2, [(W, 0, 5), (E, 0), (E, 1), (W, 1, 7)], [[], [], [], []],
        id="all-ended-emits-nothing",  # the end of input is the host's business
    ),
    pytest.param(
        2, [(W, 0, 5), (I, 1), (E, 0)], [[], [Watermark(5)], [IDLE]],
        id="ended-and-idle-is-idle",  # the only live input is idle
    ),
    pytest.param(
        2, [(I, 0), (I, 1), (W, 0, 4)], [[], [IDLE], [ACTIVE, Watermark(4)]],
        id="watermark-from-idle-input-activates-it",
    ),
]


def drive(valve, step):
    kind, channel, *rest = step
    if kind == W:
        return valve.input_watermark(channel, rest[0])
    if kind == E:
        return valve.input_ended(channel)
    return valve.input_watermark_status(channel, idle=(kind == I))


@pytest.mark.parametrize("n, steps, expected", VALVE_CASES)
def test_valve(n, steps, expected):
    valve = StatusWatermarkValve(n)
    assert [drive(valve, s) for s in steps] == expected


def test_valve_rejects_unknown_channels():
    with pytest.raises(ConfigurationError, match=r"channel must be in \[0, 2\), got 2"):
        StatusWatermarkValve(2).input_watermark(2, 1)


@settings(max_examples=examples(300), deadline=None)
@given(
    n=st.integers(1, 4),
    steps=st.lists(
        st.one_of(
            st.tuples(st.just(W), st.integers(0, 3), st.integers(0, 100)),
            st.tuples(st.sampled_from([I, A, E]), st.integers(0, 3)),
        ),
        max_size=40,
    ),
)
def test_valve_properties(n, steps):
    valve = StatusWatermarkValve(n)
    watermarks: list[int] = []
    statuses: list[bool] = []
    for step in steps:
        if step[1] >= n:
            continue
        for e in drive(valve, step):
            if isinstance(e, Watermark):
                watermarks.append(e.timestamp_ms)
            else:
                statuses.append(e.idle)
    assert watermarks == sorted(set(watermarks))  # strictly increasing: never back, never repeated
    assert all(a != b for a, b in zip(statuses, statuses[1:]))  # IDLE and ACTIVE alternate
    assert not statuses or statuses[0] is True  # the valve starts active


# ------------------------------------------------------- the operator that runs a generator


def test_operator_stamps_records_and_emits_watermarks_and_idleness_periodically():
    from actorflow.operators import OperatorHarness, Record
    from actorflow.operators.watermarks import TimestampsAndWatermarksOperator

    h = OperatorHarness(TimestampsAndWatermarksOperator(
        WatermarksWithIdleness(BoundedOutOfOrdernessWatermarks(10), idleness_ms=250),  # on the operator's clock
        timestamp_fn=lambda v: v["ts"],
        interval_ms=100,
    ))
    h.process_element({"ts": 100})
    h.process_watermark(5)  # upstream watermarks are not this operator's: dropped
    h.set_processing_time(100)
    h.process_element({"ts": 130})
    h.process_element({"ts": 120})  # out of order within the bound
    h.set_processing_time(200)
    h.set_processing_time(300)  # no new record: the same watermark is not repeated
    h.set_processing_time(400)  # 300 ms without records: idle
    h.set_processing_time(500)  # idle once, not at every tick
    h.process_element({"ts": 140})
    h.set_processing_time(600)
    h.end_input()
    assert h.output == [
        Record({"ts": 100}, 100),
        Watermark(89),
        Record({"ts": 130}, 130),
        Record({"ts": 120}, 120),
        Watermark(119),
        IDLE,
        Record({"ts": 140}, 140),
        ACTIVE,
        Watermark(129),
        # The end of input ends event time (a watermark came in): the final watermark passes, as
        # Flink's assigner lets Long.MAX_VALUE through.
        Watermark(MAX_WATERMARK),
    ]


def test_operator_passes_only_the_final_watermark_and_refuses_records_without_event_time():
    from actorflow.operators import OperatorHarness, SchemaError
    from actorflow.operators.elements import MAX_WATERMARK
    from actorflow.operators.watermarks import TimestampsAndWatermarksOperator

    h = OperatorHarness(TimestampsAndWatermarksOperator(BoundedOutOfOrdernessWatermarks(0)), name="job/wm[0/1]")
    h.process_watermark(7)
    h.process_watermark(MAX_WATERMARK)
    assert h.output == [Watermark(MAX_WATERMARK)]
    with pytest.raises(SchemaError, match=r"job/wm\[0/1\]: record 'x' has event time None; a watermark generator needs an int timestamp"):
        h.process_element("x")
    with pytest.raises(ConfigurationError, match="interval_ms must be an int of milliseconds > 0, got 0"):
        TimestampsAndWatermarksOperator(BoundedOutOfOrdernessWatermarks(0), interval_ms=0)


def test_generator_and_window_operator_in_one_chain():
    from actorflow.operators import OperatorHarness
    from actorflow.operators.watermarks import TimestampsAndWatermarksOperator
    from actorflow.operators.windows import Count, TumblingEventTimeWindows, WindowOperator

    h = OperatorHarness([
        TimestampsAndWatermarksOperator(BoundedOutOfOrdernessWatermarks(5), timestamp_fn=lambda v: v["ts"], interval_ms=10),
        WindowOperator("user", TumblingEventTimeWindows(10), aggregate=Count()),
    ])
    for ts in (1, 4, 12, 9, 15):
        h.process_element({"user": "a", "ts": ts})
    h.set_processing_time(10)  # watermark 15 - 5 - 1 = 9: the window [0,10) is complete, 9 was in time
    assert h.output_values() == [{"user": "a", "window_start": 0, "window_end": 10, "result": 3}]
