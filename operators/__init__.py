"""Ring 1 of actorflow: pure, deterministic operator logic (no Ray, no Spark, no wall clock)."""

from .async_batch_function import (
    AsyncBatchFunction,
    CoroutineBatchFunction,
    FallbackOnBatchTimeout,
    as_async_batch_function,
)
from .arrow_batch import ArrowBatchFunction, arrow_batch
from .async_batch_operator import AsyncBatchWaitOperator, async_wait_batch
from .async_function import (
    AsyncFunction,
    AwaitedAsyncFunction,
    CoroutineFunction,
    FallbackOnTimeout,
    ResultFuture,
    as_async_function,
)
from .async_wait_operator import DEAD_LETTER, AsyncWaitOperator, DeadLetter, async_wait
from .clock import Clock, ManualClock, SystemClock
from .elements import CheckpointBarrier, Record, StreamElement, Watermark, WatermarkStatus
from .errors import (
    ActorflowError,
    AsyncTimeoutError,
    ConfigurationError,
    JobFailedError,
    MailboxClosedError,
    MailboxStateError,
    MailboxThreadError,
    RecordError,
    ResultTypeError,
    SchemaError,
    StateFormatError,
    UserFunctionError,
)
from .coroutine_runner import AsyncioCoroutineRunner
from .harness import OperatorHarness
from .mailbox import MAX_PRIORITY, MIN_PRIORITY, Mail, MailboxState, TaskMailbox
from .mailbox_processor import DefaultActionController, MailboxExecutor, MailboxProcessor, Suspension
from .request_keys import current_request_key, current_request_keys
from .operator import (
    FilterOperator,
    FlatMapOperator,
    MapOperator,
    OperatorChain,
    OperatorContext,
    OperatorMetrics,
    Output,
    StreamOperator,
)
from .retry import ExponentialBackoff, FixedDelay, NoRetry, RetryStrategy, any_exception, empty_result, exception_of_type
from .timers import ManualProcessingTimeService, ProcessingTimeService, Timer, TimerHandle, TimerService
from .watermarks import (
    BoundedOutOfOrdernessWatermarks,
    StatusWatermarkValve,
    TimestampsAndWatermarksOperator,
    WatermarkGenerator,
    WatermarksWithIdleness,
)
from .windows import (
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
    Max,
    Mean,
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
    WindowSpec,
    count_window,
)

__all__ = [
    "ActorflowError", "AsyncBatchFunction", "AsyncBatchWaitOperator", "AsyncFunction", "AwaitedAsyncFunction",
    "CoroutineBatchFunction", "FallbackOnBatchTimeout", "as_async_batch_function", "async_wait_batch", "ArrowBatchFunction", "arrow_batch", "AsyncTimeoutError", "AsyncWaitOperator", "AsyncioCoroutineRunner",
    "CheckpointBarrier", "Clock", "ConfigurationError", "CoroutineFunction", "DEAD_LETTER", "DeadLetter",
    "DefaultActionController", "ExponentialBackoff", "FallbackOnTimeout", "FilterOperator", "FixedDelay", "FlatMapOperator",
    "JobFailedError", "MAX_PRIORITY", "MIN_PRIORITY", "Mail", "MailboxClosedError", "MailboxExecutor",
    "MailboxProcessor", "MailboxState", "MailboxStateError", "MailboxThreadError", "ManualClock",
    "ManualProcessingTimeService", "MapOperator", "NoRetry", "OperatorChain", "OperatorContext",
    "OperatorHarness", "OperatorMetrics", "Output", "ProcessingTimeService", "Record", "RecordError",
    "ResultFuture", "ResultTypeError", "RetryStrategy", "SchemaError", "StateFormatError", "StreamElement", "StreamOperator",
    "Suspension", "SystemClock", "TaskMailbox", "Timer", "TimerHandle", "TimerService", "UserFunctionError",
    "Watermark", "WatermarkStatus", "any_exception", "as_async_function", "async_wait", "current_request_key",
    "current_request_keys", "empty_result", "exception_of_type",
    # windows
    "AggregateFunction", "Aggregations", "ContinuousEventTimeTrigger", "ContinuousProcessingTimeTrigger", "Count",
    "CountEvictor", "CountTrigger", "DeltaEvictor", "DynamicEventTimeSessionWindows",
    "DynamicProcessingTimeSessionWindows", "EventTimeSessionWindows", "EventTimeTrigger", "Evictor", "GlobalWindow",
    "GlobalWindows", "Max", "Mean", "Min", "ProcessWindowFunction", "ProcessingTimeSessionWindows",
    "ProcessingTimeTrigger", "PurgingTrigger", "SlidingEventTimeWindows", "SlidingProcessingTimeWindows", "Sum",
    "TimeEvictor", "TimeWindow", "TimestampedValue", "Trigger", "TriggerContext", "TriggerResult",
    "TumblingEventTimeWindows", "TumblingProcessingTimeWindows", "WindowAssigner", "WindowContext", "WindowOperator",
    "WindowSpec", "count_window",
    # watermarks
    "BoundedOutOfOrdernessWatermarks", "StatusWatermarkValve", "TimestampsAndWatermarksOperator", "WatermarkGenerator",
    "WatermarksWithIdleness",
]
