"""The operator actor's side of its stream task (``operators.stream_task.TaskHost``): the output
the task asks about, the rows of a batch, and what the actor does at a snapshot, at the end and at
a fault point. Runs on the mailbox thread."""

from __future__ import annotations

from typing import Any, Callable

import pyarrow as pa

from actorflow.operators.channel_items import ChannelItem
from actorflow.operators.mailbox_processor import DefaultActionController
from actorflow.operators.stream_task import Rows

from .arrow_rows import is_bare, table_to_rows
from .instance_figures import InstanceFigures
from .output import BatchingOutput, Outbox

__all__ = ["ActorTaskHost"]


class ActorTaskHost:
    """``snapshot``, ``finished`` and ``fault_point`` are the actor's; the output and the figures
    are attached once the actor has started (``attach``), before the task runs."""

    def __init__(
        self, *, snapshot: Callable[[int, list[list[ChannelItem]]], None],
        finished: Callable[[DefaultActionController], None], fault_point: Callable[[str], None],
    ) -> None:
        self.snapshot = snapshot
        self.finished = finished
        self.fault_point = fault_point
        self._outbox: Outbox | None = None
        self._output: BatchingOutput | None = None
        self._figures: InstanceFigures | None = None

    def attach(self, outbox: Outbox, output: BatchingOutput, figures: InstanceFigures) -> None:
        self._outbox, self._output, self._figures = outbox, output, figures

    def output_is_full(self) -> bool:
        if self._outbox.is_full():  # type: ignore[union-attr]
            self._figures.output_full()  # type: ignore[union-attr]
            return True
        return False

    def rows_of(self, batch: Any) -> Rows:
        return list(table_to_rows(batch)), batch.origin_list()

    def whole_batch(self, batch: Any) -> tuple[pa.Table, pa.Array] | None:
        return None if batch.timestamps is None or is_bare(batch.table) else (batch.table, batch.timestamps)

    def emitted(self) -> int:
        output = self._output
        return output.records_out + output.buffered  # type: ignore[union-attr]
