"""Records that did not make the main output, as Arrow tables: each record's own columns and
types, then what happened to it. Dead letters say why they failed; a window's late records say
which windows they missed, why, and the watermark they met (``operators.windows.LateRecord``).

A streaming job stages each checkpoint's side-output records as it stages its output
(``actors.instance_checkpoints.pack_side_records``), and its side sinks unpack and describe them
(``side_records_table``) when they publish an epoch.

>>> diagnostic_names(["user", "late_reason"], LATE_FIELDS, prefix="late_", always=True)["reason"]
'late_late_reason'
>>> side_records_table([{"user": 1}], None).to_pylist()
[{'user': 1}]
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from actorflow.actors.arrow_rows import SchemaTracker, conform_table
from actorflow.operators.async_attempt import DeadLetter
from actorflow.operators.windows.late import LateRecord

__all__ = [
    "DEAD_LETTER_FIELDS", "LATE_FIELDS", "dead_letters_table", "diagnosed_table", "diagnostic_names",
    "late_records_table", "side_records_table",
]

_WINDOW = pa.struct([("start_ms", pa.int64()), ("end_ms", pa.int64())])

#: What a late record says besides its columns, each as ``late_<name>``.
LATE_FIELDS = [
    pa.field("reason", pa.string()),  # behind_watermark, past_allowed_lateness or window_closed
    pa.field("windows", pa.list_(_WINDOW)),  # the windows it missed, in ms
    pa.field("watermark_ms", pa.int64()),  # the window operator's watermark when it came
]

#: What a dead letter says besides its columns. A record column of the same name keeps its name;
#: the dead-letter column then becomes ``dead_letter_<name>``.
DEAD_LETTER_FIELDS = [
    pa.field("error_type", pa.string()),
    pa.field("error", pa.string()),
    pa.field("attempts", pa.int64()),
    pa.field("operator", pa.string()),
    pa.field("request_key", pa.string()),  # the idempotency key of its requests
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


def diagnosed_table(
    values: list[Any], input_schema: pa.Schema | None, fields: list[pa.Field], said: dict[str, list[Any]], *,
    prefix: str, always: bool,
) -> pa.Table:
    """The records ``values`` with their own columns and types (the input's, widened by what the
    records hold, then their new columns), then a column per diagnostic field, named as
    ``diagnostic_names`` says (``said``: the field's value for each record)."""
    base = input_schema if input_schema is not None else pa.schema([])
    records = SchemaTracker(input_schema).table(
        [dict(v) if isinstance(v, dict) else {"value": v} for v in values]
    ) if values else base.empty_table()
    record_schema = pa.unify_schemas([base, records.schema], promote_options="permissive")
    names = diagnostic_names(record_schema.names, fields, prefix=prefix, always=always)
    table = conform_table(records, record_schema, fill_missing=True)
    for field in fields:
        table = table.append_column(field.with_name(names[field.name]), pa.array(said[field.name], type=field.type))
    return table


def late_records_table(records: list[Any], input_schema: pa.Schema | None) -> pa.Table:
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
    return diagnosed_table([r.value for r in late], input_schema, LATE_FIELDS, said, prefix="late_", always=True)


def dead_letters_table(letters: list[DeadLetter], input_schema: pa.Schema | None) -> pa.Table:
    """The failed records with their own columns and types, then why each failed."""
    said: dict[str, list[Any]] = {
        "error_type": [letter.error_type for letter in letters],
        "error": [letter.error for letter in letters],
        "attempts": [letter.attempts for letter in letters],
        "operator": [letter.operator for letter in letters],
        "request_key": [letter.request_key for letter in letters],
    }
    return diagnosed_table([letter.value for letter in letters], input_schema, DEAD_LETTER_FIELDS, said,
                           prefix="dead_letter_", always=False)


def side_records_table(records: list[Any], input_schema: pa.Schema | None) -> pa.Table:
    """One side output's records as a table: dead letters or late records described as above, a
    user's own side output (a window function's ``output(tag, value)``) as its values."""
    if records and all(isinstance(r, DeadLetter) for r in records):
        return dead_letters_table(records, input_schema)
    if records and all(isinstance(r, LateRecord) for r in records):
        return late_records_table(records, input_schema)
    return SchemaTracker(None).table([dict(v) if isinstance(v, dict) else {"value": v} for v in records])

