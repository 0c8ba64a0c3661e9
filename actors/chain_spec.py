"""What one operator actor runs, and how it talks to its neighbours: the job's plan for an instance."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import pyarrow as pa

from actorflow.operators.channel_items import Partitioning
from actorflow.operators.key_groups import DEFAULT_MAX_PARALLELISM
from actorflow.operators.operator import StreamOperator

from .naming import instance_name, task_name

__all__ = ["ChainSpec"]


@dataclass
class ChainSpec:
    """What one operator actor runs, and how it talks to its neighbours."""

    job: str
    name: str
    index: int
    parallelism: int
    num_inputs: int
    operator_factories: list[Callable[[], StreamOperator]]
    partitioning: Partitioning = Partitioning.FORWARD
    key: Any = None  # the next stage's key: a column name, a tuple of them, a function or a KeyRouter
    # With hash partitioning: the factory of the next stage's head operator, whose
    # pre_aggregate a batch may go through before the split (a keyed window stage).
    downstream_head: Callable[[], StreamOperator] | None = None
    output_schema: pa.Schema | None = None
    input_schema: pa.Schema | None = None  # the source's column types, which output columns keep
    batch_size: int = 2048
    input_capacity: int = 4
    outbox_capacity: int = 8
    credits: int = 4
    rows_per_round: int = 256
    mails_per_round: int = 4
    linger_ms: int = 20
    # A checkpointed job: where states and output epochs go (``write_state``, ``read_state``,
    # ``stage``), who is told of each snapshot, the attempt, and the checkpoint to restore.
    checkpoints: Any = None
    coordinator: Any = None
    attempt: int = 0
    restore: int | None = None
    # A streaming job's instance: its number among all the job's instances. Each checkpoint then
    # stages the side outputs since the last one (``stage_side``), and they leave the state.
    side_index: int | None = None
    # Per operator of the chain: the quota actor of the service it calls, where the job shares
    # one between instances (``service_quota``), else None.
    service_quotas: list[Any] | None = None
    # A keyed stage: the key that routes records to it (a ``KeyRouter`` over the job's key
    # groups), with which a restore at another parallelism deals its in-flight records.
    input_key: Any = None
    max_parallelism: int = DEFAULT_MAX_PARALLELISM

    def __post_init__(self) -> None:
        self.partitioning = Partitioning(self.partitioning)

    @property
    def instance_name(self) -> str:
        return instance_name(self.job, self.name, self.index, self.parallelism, self.attempt)

    @property
    def task(self) -> str:
        return task_name(self.name, self.index, self.parallelism)
