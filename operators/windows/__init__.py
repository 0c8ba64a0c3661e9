"""Windows: assigners, triggers, evictors, window functions and the keyed window operator.

A keyed window operator is a key selector, a window (an assigner, or ``count_window(...)``) and a
function; triggers, evictors, lateness and a late-data side output are optional:

>>> from actorflow.operators import OperatorHarness
>>> op = WindowOperator(
...     "user",                                     # or ("user", "region"), or a function of the value
...     SlidingEventTimeWindows(size_ms=10, slide_ms=5),
...     aggregate=Aggregations(n=Count(), total=Sum("amount")),
...     allowed_lateness_ms=5,
...     late_data_tag="late",
... )
>>> h = OperatorHarness(op)
>>> h.process_element({"user": "a", "amount": 3}, timestamp_ms=7)
>>> h.process_watermark(9)
>>> h.output_values()
[{'user': 'a', 'window_start': 0, 'window_end': 10, 'n': 1, 'total': 3}]
>>> h.process_element({"user": "a", "amount": 1}, timestamp_ms=2)   # late, but within the lateness
>>> h.output_values()[-1]
{'user': 'a', 'window_start': 0, 'window_end': 10, 'n': 2, 'total': 4}
>>> h.process_watermark(20); h.process_element({"user": "a", "amount": 1}, timestamp_ms=2)
>>> [late] = h.side_outputs["late"]       # a LateRecord: the record, the windows it missed, and why
>>> late.value, late.windows, late.reason.value, late.watermark_ms
({'user': 'a', 'amount': 1}, ((0, 10), (-5, 5)), 'past_allowed_lateness', 20)
"""

from .assigners import (
    DynamicEventTimeSessionWindows,
    DynamicProcessingTimeSessionWindows,
    EventTimeSessionWindows,
    GlobalWindow,
    GlobalWindows,
    MergingWindowAssigner,
    ProcessingTimeSessionWindows,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowAssigner,
    merge_time_windows,
    window_start_with_offset,
)
from .evictors import CountEvictor, DeltaEvictor, Evictor, EvictorContext, TimeEvictor, TimestampedValue
from .functions import (
    AggregateFunction,
    Aggregations,
    BuiltinAggregate,
    Count,
    Max,
    Mean,
    Min,
    ProcessWindowFunction,
    Sum,
    WindowContext,
)
from .merging import MergingWindowSet
from .triggers import (
    ContinuousEventTimeTrigger,
    ContinuousProcessingTimeTrigger,
    CountTrigger,
    EventTimeTrigger,
    NeverTrigger,
    ProcessingTimeTrigger,
    PurgingTrigger,
    Trigger,
    TriggerContext,
    TriggerResult,
)
from .late import LateReason, LateRecord
from .window_operator import WindowOperator, WindowOperatorMetrics, WindowSpec, count_window

__all__ = [
    "AggregateFunction", "Aggregations", "BuiltinAggregate", "ContinuousEventTimeTrigger",
    "ContinuousProcessingTimeTrigger", "Count", "CountEvictor", "CountTrigger", "DeltaEvictor",
    "DynamicEventTimeSessionWindows", "DynamicProcessingTimeSessionWindows", "EventTimeSessionWindows",
    "EventTimeTrigger", "Evictor", "EvictorContext", "GlobalWindow", "GlobalWindows", "LateReason", "LateRecord", "Max",
    "Mean", "MergingWindowAssigner", "MergingWindowSet", "Min", "NeverTrigger", "ProcessWindowFunction",
    "ProcessingTimeSessionWindows", "ProcessingTimeTrigger", "PurgingTrigger", "SlidingEventTimeWindows",
    "SlidingProcessingTimeWindows", "Sum", "TimeEvictor", "TimeWindow", "TimestampedValue", "Trigger",
    "TriggerContext", "TriggerResult", "TumblingEventTimeWindows", "TumblingProcessingTimeWindows",
    "WindowAssigner", "WindowContext", "WindowOperator", "WindowOperatorMetrics", "WindowSpec",
    "count_window", "merge_time_windows", "window_start_with_offset",
]
