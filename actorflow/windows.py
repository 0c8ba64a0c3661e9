"""Window assigners, triggers, evictors and aggregations for ``.window(...)`` and the window operator.

>>> import actorflow as af
>>> af.windows.TumblingEventTimeWindows(size_ms=60_000).assign_windows(None, 61_000, None)
[TimeWindow(start_ms=60000, end_ms=120000)]
"""

from .operators.windows import (
    AggregateFunction,
    Aggregations,
    ContinuousEventTimeTrigger,
    ContinuousProcessingTimeTrigger,
    Count,
    CountEvictor,
    CountTrigger,
    DeltaEvictor,
    DynamicEventTimeSessionWindows,
    DynamicProcessingTimeSessionWindows,
    EventTimeSessionWindows,
    EventTimeTrigger,
    Evictor,
    GlobalWindow,
    GlobalWindows,
    LateReason,
    LateRecord,
    Max,
    Mean,
    MergingWindowAssigner,
    Min,
    ProcessingTimeSessionWindows,
    ProcessingTimeTrigger,
    ProcessWindowFunction,
    PurgingTrigger,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    Sum,
    TimeEvictor,
    TimestampedValue,
    TimeWindow,
    Trigger,
    TriggerContext,
    TriggerResult,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowAssigner,
    WindowContext,
    WindowOperator,
    count_window,
    merge_time_windows,
)

__all__ = [
    "AggregateFunction", "Aggregations", "ContinuousEventTimeTrigger", "ContinuousProcessingTimeTrigger", "Count",
    "CountEvictor", "CountTrigger", "DeltaEvictor", "DynamicEventTimeSessionWindows",
    "DynamicProcessingTimeSessionWindows", "EventTimeSessionWindows", "EventTimeTrigger", "Evictor", "GlobalWindow",
    "GlobalWindows", "LateReason", "LateRecord", "Max", "Mean", "MergingWindowAssigner", "Min", "ProcessWindowFunction",
    "ProcessingTimeSessionWindows", "ProcessingTimeTrigger", "PurgingTrigger", "SlidingEventTimeWindows",
    "SlidingProcessingTimeWindows", "Sum", "TimeEvictor", "TimeWindow", "TimestampedValue", "Trigger",
    "TriggerContext", "TriggerResult", "TumblingEventTimeWindows", "TumblingProcessingTimeWindows", "WindowAssigner",
    "WindowContext", "WindowOperator", "count_window", "merge_time_windows",
]
