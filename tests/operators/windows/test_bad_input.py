"""Bad input and bad configuration: clear errors that name the operator, the record or the window."""

from __future__ import annotations

import pytest

from actorflow.operators import ConfigurationError, OperatorHarness, RecordError, SchemaError, UserFunctionError
from actorflow.operators.windows import (
    Count,
    CountEvictor,
    DynamicEventTimeSessionWindows,
    EventTimeSessionWindows,
    GlobalWindows,
    Sum,
    Trigger,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowOperator,
)


def harness(**kw):
    kw.setdefault("aggregate", Count())
    return OperatorHarness(WindowOperator("k", kw.pop("window", TumblingEventTimeWindows(10)), **kw), name="job/win[0/1]")


@pytest.mark.parametrize(
    "timestamp",
    [
        None,  # no event time at all
        "12",  # a string
        1.5,  # not a whole millisecond
        True,  # a bool is not a time
    ],
)
def test_event_time_window_refuses_records_without_an_int_timestamp(timestamp):
    h = harness()
    with pytest.raises(SchemaError, match=r"job/win\[0/1\]: record \{'k': 'a'\} has timestamp_ms=.*needs an int timestamp"):
        h.process_element({"k": "a"}, timestamp)


def test_whole_float_timestamps_are_accepted_and_processing_time_windows_need_none():
    h = harness()
    h.process_element({"k": "a"}, 3.0)
    h.process_watermark(9)
    assert h.output_values()[0]["result"] == 1
    h = harness(window=TumblingProcessingTimeWindows(10))
    h.process_element({"k": "a"}, None)
    h.set_processing_time(9)
    assert h.output_values()[0]["result"] == 1


def test_unhashable_key():
    h = OperatorHarness(WindowOperator(lambda v: v["tags"], TumblingEventTimeWindows(10), aggregate=Count()), name="job/win[0/1]")
    with pytest.raises(RecordError, match=r"job/win\[0/1\]: key \['x'\] of type list is unhashable.*on record \{'tags': \['x'\]\}"):
        h.process_element({"tags": ["x"]}, 1)


def test_missing_key_column():
    with pytest.raises(UserFunctionError, match=r"key_selector raised KeyError: 'k' on record \{'x': 1\}"):
        harness().process_element({"x": 1}, 1)


def test_reduce_that_raises_names_the_record_and_window():
    h = harness(aggregate=None, reduce=lambda a, b: a["v"] + b["v"])
    h.process_element({"k": "a", "v": 1}, 1)
    h.process_element({"k": "a", "v": 2}, 2)  # reduced to 3, an int, not a dict
    with pytest.raises(UserFunctionError, match=r"reduce function raised TypeError: .* in window TimeWindow\(start_ms=0, end_ms=10\) on record \{'k': 'a', 'v': 4\}") as info:
        h.process_element({"k": "a", "v": 4}, 3)
    assert isinstance(info.value.__cause__, TypeError)


def test_process_function_that_raises_names_the_key_and_window():
    def boom(key, ctx, elements):
        raise ZeroDivisionError("no")

    h = harness(aggregate=None, process=boom)
    h.process_element({"k": "a"}, 1)
    with pytest.raises(UserFunctionError, match=r"job/win\[0/1\]: window function raised ZeroDivisionError: no for key 'a' in window TimeWindow\(start_ms=0, end_ms=10\)"):
        h.process_watermark(9)


def test_dynamic_gap_that_is_not_positive():
    h = harness(window=DynamicEventTimeSessionWindows(lambda v: v["gap"]))
    with pytest.raises(UserFunctionError, match=r"gap_fn must return an int of milliseconds > 0, got 0 on record \{'k': 'a', 'gap': 0\}"):
        h.process_element({"k": "a", "gap": 0}, 1)


def test_per_window_state_is_refused_with_merging_windows():
    def uses_window_state(key, ctx, elements):
        ctx.window_state["x"] = 1
        return []

    h = harness(window=EventTimeSessionWindows(10), aggregate=None, process=uses_window_state)
    h.process_element({"k": "a"}, 1)
    with pytest.raises(RecordError, match="per-window state is not available with merging windows"):
        h.process_watermark(100)


class NoMerge(Trigger):
    pass


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(reduce=lambda a, b: a, aggregate=Count()), "give reduce or aggregate, not both"),
        (dict(aggregate=None), "needs a function: reduce, aggregate or process; got none"),
        (dict(aggregate=len), "aggregate must be an AggregateFunction, got builtin_function_or_method"),
        (dict(reduce=3, aggregate=None), "reduce must be a callable"),
        (dict(allowed_lateness_ms=-1), "allowed_lateness_ms must be an int >= 0, got -1"),
        (dict(late_data_tag=5), "late_data_tag must be a str, got 5"),
        (dict(trigger="count"), "trigger must be a Trigger, got str"),
        (dict(evictor=CountEvictor), "evictor must be an Evictor, got type"),
        (dict(window=EventTimeSessionWindows(5), trigger=NoMerge()), "a merging window assigner .* needs a trigger that can merge"),
        (dict(window=5), "window must be a WindowAssigner or a WindowSpec, got int"),
        (dict(key=7), "key_selector must be a column name, a tuple of column names or a callable, got 7"),
    ],
)
def test_configuration_errors_at_construction(kw, message):
    key = kw.pop("key", "k")
    window = kw.pop("window", GlobalWindows())
    kw.setdefault("aggregate", Sum("v"))
    with pytest.raises(ConfigurationError, match=message):
        WindowOperator(key, window, **kw)


class Forgetful(Trigger):
    def on_element(self, value, timestamp_ms, window, ctx):
        ctx.register_event_time_timer(window.max_timestamp())  # and forgets to return a result

    def on_event_time(self, time_ms, window, ctx):
        raise KeyError("oops")


def test_a_trigger_that_returns_no_result_or_raises():
    from actorflow.operators import ResultTypeError
    from actorflow.operators.windows import TriggerResult

    h = harness(trigger=Forgetful())
    with pytest.raises(ResultTypeError, match=r"job/win\[0/1\]: trigger Forgetful\(\)\.on_element must return a TriggerResult, got None in window TimeWindow\(start_ms=0, end_ms=10\)"):
        h.process_element({"k": "a"}, 1)

    class Returns(Forgetful):
        def on_element(self, value, timestamp_ms, window, ctx):
            super().on_element(value, timestamp_ms, window, ctx)
            return TriggerResult.CONTINUE

    h = harness(trigger=Returns())
    h.process_element({"k": "a"}, 1)
    with pytest.raises(UserFunctionError, match=r"trigger Returns\(\) raised KeyError in on_event_time\(9\): 'oops' for key 'a' in window TimeWindow\(start_ms=0, end_ms=10\)"):
        h.process_watermark(9)
