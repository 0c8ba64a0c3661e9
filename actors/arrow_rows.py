"""Arrow batches <-> records: the per-record work stays inside an actor.

A channel batch is a ``pyarrow.Table`` whose column ``__ts`` holds each row's event time in
milliseconds (null when there is none). Records inside an operator are Python values; a batch
of dict values becomes a table with one column per key, any other values a ``value`` column.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import pyarrow as pa

from operators.errors import SchemaError, describe_value

__all__ = ["TS_COLUMN", "VALUE_COLUMN", "conform_table", "ipc_bytes", "rows_to_table", "table_to_rows"]

TS_COLUMN = "__ts"
VALUE_COLUMN = "value"


def table_to_rows(table: pa.Table) -> Iterator[tuple[Any, int | None]]:
    """``(value, timestamp_ms)`` per row; a ``value``-only table yields bare values."""
    names = [n for n in table.column_names if n != TS_COLUMN]
    timestamps: Sequence[int | None]
    if TS_COLUMN in table.column_names:
        timestamps = table.column(TS_COLUMN).to_pylist()
    else:
        timestamps = [None] * table.num_rows
    body = table.select(names)
    if names == [VALUE_COLUMN] and table.schema.metadata and table.schema.metadata.get(b"actorflow.bare") == b"1":
        values: list[Any] = body.column(0).to_pylist()
    else:
        values = body.to_pylist()
    return zip(values, timestamps)


def rows_to_table(values: list[Any], timestamps: list[int | None], schema: pa.Schema | None = None) -> pa.Table:
    """Build a channel batch. With ``schema``, every row must fit it, or ``SchemaError`` says which."""
    if values and not isinstance(values[0], dict):
        table = pa.table({VALUE_COLUMN: values})
        table = table.replace_schema_metadata({b"actorflow.bare": b"1"})
    else:
        try:
            table = pa.Table.from_pylist(values, schema=schema) if schema is not None else _from_dicts(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, KeyError) as error:
            raise SchemaError(_which_row(values, schema, error)) from error
    return table.append_column(TS_COLUMN, pa.array(timestamps, type=pa.int64()))


def _from_dicts(values: list[dict[str, Any]]) -> pa.Table:
    # Every key of every row becomes a column: inferring columns from the first row alone
    # would silently drop the keys that only later rows have.
    keys: dict[str, None] = {}
    for value in values:
        if not isinstance(value, dict):
            raise TypeError(f"expected a dict, got {type(value).__name__}")
        keys.update(dict.fromkeys(value))
    return pa.table({k: [v.get(k) for v in values] for k in keys})


def _which_row(values: list[Any], schema: pa.Schema | None, error: Exception) -> str:
    for i, value in enumerate(values):
        if not isinstance(value, dict):
            return f"row {i} is a {type(value).__name__}, expected a dict of column values: {describe_value(value)}"
        try:
            pa.Table.from_pylist([value], schema=schema)
        except Exception as row_error:
            expected = f" (expected schema: {schema.to_string(show_schema_metadata=False)!s})" if schema else ""
            return f"row {describe_value(value)} does not fit the output schema: {row_error}{expected}"
    return f"rows do not fit the output schema: {error}"


def conform_table(table: pa.Table, target: pa.Schema) -> pa.Table:
    """``table``'s columns of ``target``, in its order and types; only timestamps may lose digits."""
    missing = [name for name in target.names if name not in table.column_names]
    if missing:
        raise SchemaError(
            f"table must have columns {target.names}, got {table.column_names} "
            f"(missing {missing})"
        )
    picked = table.select(target.names)
    columns = []
    for field, column in zip(target, picked.columns):
        if column.type == field.type:
            columns.append(column)
            continue
        try:
            # Only timestamp precision may be dropped (ns -> us); other casts must be exact.
            safe = not pa.types.is_timestamp(field.type)
            columns.append(column.cast(field.type, safe=safe))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
            raise SchemaError(
                f"column {field.name!r} must be castable to {field.type}, got {column.type}: "
                f"{error}"
            ) from error
    return pa.Table.from_arrays(columns, schema=target)


def ipc_bytes(tables: list[pa.Table]) -> bytes:
    """One Arrow IPC stream of ``tables`` (which share a schema)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, tables[0].schema) as writer:
        for table in tables:
            writer.write_table(table)
    return sink.getvalue().to_pybytes()
