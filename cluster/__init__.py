"""Ring 3 of actorflow: job graphs, deployment and execution on Ray."""

from .datastream import DataStream, from_arrow, from_blocks
from .job import JobResult, run_job
from .job_graph import JobGraph, OperatorNode, SourceNode, Stage

__all__ = ["DataStream", "JobGraph", "JobResult", "OperatorNode", "SourceNode", "Stage", "from_arrow", "from_blocks", "run_job"]
