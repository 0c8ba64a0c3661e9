"""Ring 2 of actorflow: the Ray shell around ring-1 operators."""

from .arrow_rows import RowBatch, SchemaTracker, rows_to_batch, table_to_rows
from .channel import ChannelSender, InputGate
from .naming import instance_name, validate_job_name
from .operator_actor import ChainSpec, OperatorActor
from .source_actor import BlockReader, SourceActor, event_time_ms
from .task_function import RayTaskFunction

__all__ = [
    "BlockReader", "ChainSpec", "ChannelSender", "InputGate", "OperatorActor", "RayTaskFunction", "RowBatch",
    "SchemaTracker", "SourceActor", "event_time_ms", "instance_name", "rows_to_batch", "table_to_rows",
    "validate_job_name",
]
