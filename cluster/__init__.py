"""Ring 3 of actorflow: job graphs, deployment and execution on Ray."""

from .datastream import DataStream, from_arrow, from_blocks
from .job import JobResult, run_job
from .job_graph import JobGraph, OperatorNode, SourceNode, Stage
from .windowed import KeyedStream, WindowedStream

__all__ = [
    "DataStream", "JobGraph", "JobResult", "KeyedStream", "OperatorNode", "SourceNode", "Stage", "WindowedStream",
    "from_arrow", "from_blocks", "run_job",
]
