"""Vectorised batch functions: a batch of dict rows in as one ``pyarrow.Table``, a table out.

A model that scores whole columns (numpy, a vectorised UDF, an ONNX session) wants a table, not
a list of dicts. ``arrow_batch(fn)`` marks ``fn(table) -> table`` as such a function; the batched
async operator then calls it with the batch's rows as a table and merges each row of the result
into its input row (a result column replaces an input column of the same name)::

    def score(table: pa.Table) -> pa.Table:
        return pa.table({"score": pc.multiply(table["amount"], 2)})

    stream.async_map_batch(arrow_batch(score), batch_size=1_024)

The result must have exactly one row per input row, in input order; anything else is a
``ResultTypeError`` for every record of the batch. ``fn`` may be an ``async def`` (awaited on the
operator's loop) or a plain function (run where blocking functions run: in Ray tasks).

>>> import pyarrow as pa
>>> f = arrow_batch(lambda t: pa.table({"double": [v * 2 for v in t["x"].to_pylist()]}))
>>> f.rows_function()([{"x": 1}, {"x": 2}])
[[{'x': 1, 'double': 2}], [{'x': 2, 'double': 4}]]
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import pyarrow as pa

from .errors import ConfigurationError, ResultTypeError, describe_value

__all__ = ["ArrowBatchFunction", "arrow_batch", "merge_result_rows", "rows_to_table"]


def rows_to_table(rows: list[Any]) -> pa.Table:
    """The batch's rows (dicts) as one table, column types inferred as Arrow does."""
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ResultTypeError(
                f"an arrow_batch function needs dict rows; row {i} of the batch is a {type(row).__name__}: "
                f"{describe_value(row)}",
                value=row,
            )
    return pa.Table.from_pylist(rows)


def merge_result_rows(rows: list[dict[str, Any]], result: Any) -> list[list[dict[str, Any]]]:
    """One result list per input row: the row updated with its row of ``result``."""
    if isinstance(result, pa.RecordBatch):
        result = pa.Table.from_batches([result])
    if not isinstance(result, pa.Table):
        raise ResultTypeError(
            f"an arrow_batch function must return a pyarrow.Table, got {type(result).__name__}: {describe_value(result)}"
        )
    if result.num_rows != len(rows):
        raise ResultTypeError(
            f"an arrow_batch function returned {result.num_rows} rows for a batch of {len(rows)}; "
            "expected one row per input row, in input order"
        )
    return [[{**row, **new}] for row, new in zip(rows, result.to_pylist())]


class _RowsCall:
    """``fn(table) -> table`` as a function of the batch's rows; picklable, for Ray tasks."""

    def __init__(self, fn: Callable[[pa.Table], Any]) -> None:
        self.fn = fn

    def __call__(self, rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        return merge_result_rows(rows, self.fn(rows_to_table(rows)))


class _AsyncRowsCall:
    """``async def fn(table) -> table`` as an ``async`` function of the batch's rows."""

    def __init__(self, fn: Callable[[pa.Table], Any]) -> None:
        self.fn = fn

    async def __call__(self, rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        return merge_result_rows(rows, await self.fn(rows_to_table(rows)))


class ArrowBatchFunction:
    """Marks ``fn(pa.Table) -> pa.Table`` as a vectorised batch function; see the module docstring."""

    def __init__(self, fn: Callable[[pa.Table], Any]) -> None:
        if isinstance(fn, ArrowBatchFunction):
            fn = fn.fn
        if not callable(fn):
            raise ConfigurationError(f"arrow_batch() needs a function of a pyarrow.Table, got {type(fn).__name__}")
        if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
            raise ConfigurationError(
                f"arrow_batch() needs a function that returns one table, got a generator function {describe_value(fn)}"
            )
        self.fn = fn

    @property
    def is_coroutine(self) -> bool:
        """True for an ``async def`` (awaited on the operator's loop)."""
        return inspect.iscoroutinefunction(self.fn) or inspect.iscoroutinefunction(getattr(self.fn, "__call__", None))

    def rows_function(self) -> Callable[[list[dict[str, Any]]], Any]:
        """``fn`` as a batch function of dict rows returning one result list per row."""
        return _AsyncRowsCall(self.fn) if self.is_coroutine else _RowsCall(self.fn)

    def __repr__(self) -> str:
        return f"arrow_batch({describe_value(self.fn)})"


def arrow_batch(fn: Callable[[pa.Table], Any]) -> ArrowBatchFunction:
    """Mark ``fn(pa.Table) -> pa.Table`` as a vectorised batch function (see the module docstring)."""
    return ArrowBatchFunction(fn)
