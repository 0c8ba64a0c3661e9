"""Records that did not make the result, as DataFrames: each record's own columns and types, then
what happened to it. Dead letters say why they failed (``dead_letters_to_dataframe`` in
``streams``); a window's late records say which windows they missed, why, and the watermark they
met (``operators.windows.LateRecord``).

>>> diagnostic_names(["user", "late_reason"], LATE_FIELDS, prefix="late_", always=True)["reason"]
'late_late_reason'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from actorflow.actors.arrow_rows import SchemaTracker, conform_table
from actorflow.operators.windows.late import LateRecord

from .arrow_io import tables_to_dataframe

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["LATE_FIELDS", "diagnosed_dataframe", "diagnostic_names", "late_records_to_dataframe"]

_WINDOW = pa.struct([("start_ms", pa.int64()), ("end_ms", pa.int64())])

#: What a late record says besides its columns, each as ``late_<name>``.
LATE_FIELDS = [
    pa.field("reason", pa.string()),  # behind_watermark, past_allowed_lateness or window_closed
    pa.field("windows", pa.list_(_WINDOW)),  # the windows it missed, in ms
    pa.field("watermark_ms", pa.int64()),  # the window operator's watermark when it came
]


def diagnostic_names(record_columns: list[str], fields: list[pa.Field], *, prefix: str, always: bool) -> dict[str, str]:
    """The column of each diagnostic field, never one of the record's own: the field's name
    (``prefix`` + name where ``always``), with ``prefix`` put in front again while it is taken."""
    taken = set(record_columns)
    names = {}
    for field in fields:
        name = prefix + field.name if always else field.name
        while name in taken:
            name = prefix + name
        taken.add(name)
        names[field.name] = name
    return names


def diagnosed_dataframe(
    spark: SparkSession, values: list[Any], input_schema: pa.Schema, fields: list[pa.Field],
    said: dict[str, list[Any]], *, prefix: str, always: bool,
) -> DataFrame:
    """The records ``values`` with their own columns and types (the input's, widened by what the
    records hold, then their new columns), then a column per diagnostic field, named as
    ``diagnostic_names`` says (``said``: the field's value for each record)."""
    records = SchemaTracker(input_schema).table(
        [dict(v) if isinstance(v, dict) else {"value": v} for v in values]
    ) if values else input_schema.empty_table()
    record_schema = pa.unify_schemas([input_schema, records.schema], promote_options="permissive")
    names = diagnostic_names(record_schema.names, fields, prefix=prefix, always=always)
    schema = pa.schema(list(record_schema) + [f.with_name(names[f.name]) for f in fields])
    table = conform_table(records, record_schema, fill_missing=True)
    for field in fields:
        table = table.append_column(field.with_name(names[field.name]), pa.array(said[field.name], type=field.type))
    return tables_to_dataframe(spark, [table], schema)


def late_records_to_dataframe(spark: SparkSession, records: list[Any], input_schema: pa.Schema) -> DataFrame:
    """A late-data side output: each record's columns, then ``late_reason``, ``late_windows`` and
    ``late_watermark_ms``."""
    late: list[LateRecord] = [r for r in records if isinstance(r, LateRecord)]
    if len(late) != len(records):
        raise TypeError(f"a late-data side output holds LateRecords, got {type(records[len(late)]).__name__}")
    said: dict[str, list[Any]] = {
        "reason": [r.reason.value for r in late],
        "windows": [[{"start_ms": s, "end_ms": e} for s, e in r.windows] for r in late],
        "watermark_ms": [r.watermark_ms for r in late],
    }
    return diagnosed_dataframe(spark, [r.value for r in late], input_schema, LATE_FIELDS, said, prefix="late_", always=True)
