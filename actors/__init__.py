"""Ring 2 of actorflow: the Ray shell around ring-1 operators."""

from .arrow_rows import RowBatch, SchemaTracker, rows_to_batch, table_to_rows
from .batch_task_function import RayBatchTaskFunction, batch_function_kind, make_batch_function
from .channel import ChannelSender, InputGate
from .naming import instance_name, validate_job_name
from .operator_actor import ChainSpec, OperatorActor
from .source_actor import BlockReader, SourceActor, event_time_ms
from .task_function import RayTaskFunction

__all__ = [
    "BlockReader", "ChainSpec", "ChannelSender", "InputGate", "OperatorActor", "RayBatchTaskFunction", "RayTaskFunction", "RowBatch",
    "SchemaTracker", "SourceActor", "batch_function_kind", "event_time_ms", "instance_name", "make_batch_function", "rows_to_batch", "table_to_rows",
    "validate_job_name",
]
