"""The job graph: operators, their parallelism and partitioning, fused into actor stages.

Consecutive operators with the same parallelism and forward partitioning are *chained* into one
actor, so records pass between them as plain calls; a change of parallelism or a ``key_by``
starts a new stage, connected by a rebalancing or hashing channel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import pyarrow as pa

from operators.errors import ConfigurationError
from operators.operator import StreamOperator

__all__ = ["JobGraph", "OperatorNode", "SourceNode", "Stage"]


@dataclass
class SourceNode:
    """Blocks of Arrow data, split over ``parallelism`` readers in contiguous ranges.

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

    def split(self) -> list[list[Any]]:
        """Contiguous block ranges of about equal row counts, in order (so order can be kept)."""
        self.load()
        assert self.blocks is not None and self.block_rows is not None
        n = self.parallelism
        total = self.total_rows
        ranges: list[list[Any]] = [[] for _ in range(n)]
        seen = 0
        for block, rows in zip(self.blocks, self.block_rows):
            index = min(n - 1, (seen * n) // total) if total else 0
            ranges[index].append(block)
            seen += rows
        return ranges


@dataclass
class OperatorNode:
    name: str
    factory: Callable[[], StreamOperator]
    parallelism: int
    partitioning: str = "forward"  # how records reach this node from the one before
    key: Callable[[Any], Any] | None = None


@dataclass
class Stage:
    """Operators fused into one actor per subtask."""

    nodes: list[OperatorNode]
    parallelism: int
    partitioning: str
    key: Callable[[Any], Any] | None = None

    @property
    def name(self) -> str:
        return "+".join(n.name for n in self.nodes)


@dataclass
class JobGraph:
    source: SourceNode
    nodes: list[OperatorNode] = field(default_factory=list)

    def with_node(self, node: OperatorNode) -> "JobGraph":
        names = {n.name for n in self.nodes}
        if node.name in names:
            base, i = node.name, 2
            while f"{base}_{i}" in names:
                i += 1
            node.name = f"{base}_{i}"
        return JobGraph(self.source, [*self.nodes, node])

    def stages(self) -> list[Stage]:
        """Fuse nodes into stages; the first stage reads the source with forward channels."""
        if not self.nodes:
            raise ConfigurationError("a job needs at least one operator between source and sink, got none")
        stages: list[Stage] = []
        upstream_parallelism = self.source.parallelism
        for node in self.nodes:
            forward = node.partitioning == "forward" and node.parallelism == upstream_parallelism
            if stages and forward:
                stages[-1].nodes.append(node)
            else:
                partitioning = "forward" if forward else ("hash" if node.partitioning == "hash" else "rebalance")
                stages.append(Stage([node], node.parallelism, partitioning, node.key))
            upstream_parallelism = node.parallelism
        return stages
