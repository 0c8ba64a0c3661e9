"""Windows: assigners, triggers, evictors, window functions and the keyed window operator."""

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
from .window_operator import WindowOperator, WindowOperatorMetrics, WindowSpec, count_window

__all__ = [
    "AggregateFunction", "Aggregations", "BuiltinAggregate", "ContinuousEventTimeTrigger",
    "ContinuousProcessingTimeTrigger", "Count", "CountEvictor", "CountTrigger", "DeltaEvictor",
    "DynamicEventTimeSessionWindows", "DynamicProcessingTimeSessionWindows", "EventTimeSessionWindows",
    "EventTimeTrigger", "Evictor", "EvictorContext", "GlobalWindow", "GlobalWindows", "Max", "Mean",
    "MergingWindowAssigner", "MergingWindowSet", "Min", "NeverTrigger", "ProcessWindowFunction",
    "ProcessingTimeSessionWindows", "ProcessingTimeTrigger", "PurgingTrigger", "SlidingEventTimeWindows",
    "SlidingProcessingTimeWindows", "Sum", "TimeEvictor", "TimeWindow", "TimestampedValue", "Trigger",
    "TriggerContext", "TriggerResult", "TumblingEventTimeWindows", "TumblingProcessingTimeWindows",
    "WindowAssigner", "WindowContext", "WindowOperator", "WindowOperatorMetrics", "WindowSpec",
    "count_window", "window_start_with_offset",
]
