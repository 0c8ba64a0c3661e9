"""The job graph: operators, their parallelism and partitioning, fused into actor stages.

Consecutive operators with the same parallelism and forward partitioning are *chained* into one
actor, so records pass between them as plain calls; a change of parallelism or a ``key_by``
starts a new stage, connected by a rebalancing or hashing channel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import pyarrow as pa

from actorflow.operators.channel_items import Partitioning
from actorflow.operators.errors import ConfigurationError
from actorflow.operators.key_groups import DEFAULT_MAX_PARALLELISM, check_max_parallelism
from actorflow.operators.operator import StreamOperator

__all__ = ["JobGraph", "OperatorNode", "SourceNode", "Stage"]


@dataclass
class SourceNode:
    """Blocks of Arrow data, split over ``parallelism`` readers.

    Splits are contiguous ranges of rows, so that input order can be kept, unless the job
    routes by key (see ``JobGraph.splits``).

    The blocks may come from a ``loader``, called once, when the job first needs them: a job
    then starts its actors while its input is still being prepared (for example converted from
    a Spark DataFrame). The loader returns ``(blocks, block_rows)``.
    """

    blocks: list[Any] | None
    block_rows: list[int] | None
    parallelism: int
    timestamp_column: str | None = None
    out_of_orderness_ms: int = 0
    batch_size: int = 2048
    name: str = "source"
    loader: Callable[[], tuple[list[Any], list[int]]] | None = None
    schema: pa.Schema | None = None  # the blocks' columns, whose types the output keeps
    idleness_ms: int | None = None  # a split that waits this long for data goes idle
    #: An unbounded input (a streaming query's): no blocks; each split's epochs are fed to its
    #: reader while the job runs (``cluster.streaming``).
    unbounded: bool = False

    def load(self) -> None:
        """Fetch the blocks from the loader, if that has not happened yet."""
        if self.blocks is None or self.block_rows is None:
            if self.loader is None:
                raise ConfigurationError("a source needs blocks or a loader, got neither")
            blocks, rows = self.loader()
            if len(blocks) != len(rows):
                raise ConfigurationError(f"the source's loader gave {len(blocks)} blocks but {len(rows)} row counts")
            self.blocks, self.block_rows = blocks, rows

    @property
    def total_rows(self) -> int:
        self.load()
        assert self.block_rows is not None
        return sum(self.block_rows)

    def split(self, interleave: bool = False) -> list[list[Any]]:
        """Contiguous ranges of rows of equal counts, in order (so order can be kept): whole
        blocks, or ``(block, offset, length)`` pieces of a block that two readers share.

        With ``interleave``, pieces of ``batch_size`` rows are dealt round-robin instead, as
        ``(block, offset, length)``: on input sorted by event time every split then moves
        through time at about the same pace, so that the slowest split, which holds the
        watermark back, is never far behind the others and window state stays small.
        """
        self.load()
        assert self.blocks is not None and self.block_rows is not None
        n = self.parallelism
        if interleave:
            pieces: list[list[Any]] = [[] for _ in range(n)]
            turn = 0
            for block, rows in zip(self.blocks, self.block_rows):
                for offset in range(0, rows, self.batch_size):
                    pieces[turn].append((block, offset, min(self.batch_size, rows - offset)))
                    turn = (turn + 1) % n
            return pieces
        total = self.total_rows
        ranges: list[list[Any]] = [[] for _ in range(n)]
        if not total:
            ranges[0] = list(self.blocks)
            return ranges
        # Reader k reads rows [k * total // n, (k + 1) * total // n): a block that straddles a
        # bound is cut into pieces, so that shares differ by one row at most, whatever the blocks.
        bounds = [k * total // n for k in range(n + 1)]
        start = 0
        for block, rows in zip(self.blocks, self.block_rows):
            end = start + rows
            for k in range(n):
                first, last = max(start, bounds[k]), min(end, bounds[k + 1])
                if first < last:
                    ranges[k].append(block if last - first == rows else (block, first - start, last - first))
            start = end
        return ranges


@dataclass
class OperatorNode:
    name: str
    factory: Callable[[], StreamOperator]
    parallelism: int
    partitioning: Partitioning = Partitioning.FORWARD  # how records reach this node from the one before
    key: Any = None  # with HASH: a column name, a tuple of them, or a function of the record
    side_tags: tuple[str, ...] = ()  # side outputs it writes (the late-data tag of a window)
    task_workers: int = 0  # Ray tasks each instance keeps running (blocking calls): each takes a worker process
    service: Any = None  # the operators.service.Service its operator calls, if it says

    def __post_init__(self) -> None:
        self.partitioning = Partitioning(self.partitioning)


@dataclass
class Stage:
    """Operators fused into one actor per subtask."""

    nodes: list[OperatorNode]
    parallelism: int
    partitioning: Partitioning
    key: Any = None

    @property
    def name(self) -> str:
        return "+".join(n.name for n in self.nodes)


@dataclass
class JobGraph:
    source: SourceNode
    nodes: list[OperatorNode] = field(default_factory=list)
    #: The key groups of its keyed state (``operators.key_groups``): the most instances a keyed
    #: stage can have, now or when the job resumes at another parallelism.
    max_parallelism: int = DEFAULT_MAX_PARALLELISM

    def with_node(self, node: OperatorNode) -> "JobGraph":
        names = {n.name for n in self.nodes}
        if node.name in names:
            base, i = node.name, 2
            while f"{base}_{i}" in names:
                i += 1
            node.name = f"{base}_{i}"
        return JobGraph(self.source, [*self.nodes, node], self.max_parallelism)

    @property
    def side_tags(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(tag for node in self.nodes for tag in node.side_tags))

    @property
    def worker_processes(self) -> int:
        """Worker processes the operators take besides the actors' own: their Ray tasks'."""
        return sum(node.task_workers * node.parallelism for node in self.nodes)

    @property
    def routes_by_key(self) -> bool:
        return any(node.partitioning is Partitioning.HASH for node in self.nodes)

    def splits(self) -> list[list[Any]]:
        """The source's splits: interleaved when the job routes by key, whose output order is
        the windows' and not the input's; contiguous otherwise, so that order can be kept."""
        return self.source.split(interleave=self.routes_by_key)

    def reads_source(self, stages: list[Stage]) -> bool:
        """Whether the first of ``stages`` reads the source itself (no source actors): chained
        to it, or keyed with its parallelism (each instance routes its split by key)."""
        first = stages[0]
        return first.partitioning is Partitioning.FORWARD or (
            first.partitioning is Partitioning.HASH and self.source.parallelism == first.parallelism)

    def stages(self) -> list[Stage]:
        """Fuse nodes into stages; the first stage reads the source with forward channels.
        A keyed stage with more instances than ``max_parallelism`` is refused, naming both."""
        if not self.nodes:
            raise ConfigurationError("a job needs at least one operator between source and sink, got none")
        check_max_parallelism(self.max_parallelism)
        for node in self.nodes:
            if node.partitioning is Partitioning.HASH:
                check_max_parallelism(self.max_parallelism, node.parallelism, what=f"keyed operator {node.name!r}")
        stages: list[Stage] = []
        upstream_parallelism = self.source.parallelism
        for node in self.nodes:
            forward = node.partitioning is Partitioning.FORWARD and node.parallelism == upstream_parallelism
            if stages and forward:
                stages[-1].nodes.append(node)
            else:
                partitioning = Partitioning.FORWARD if forward else (
                    Partitioning.HASH if node.partitioning is Partitioning.HASH else Partitioning.REBALANCE)
                stages.append(Stage([node], node.parallelism, partitioning, node.key))
            upstream_parallelism = node.parallelism
        return stages
