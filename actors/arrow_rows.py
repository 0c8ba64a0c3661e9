"""Arrow batches <-> records: the per-record work stays inside an actor.

A channel batch is a ``RowBatch``: a ``pyarrow.Table`` of the user's columns, and beside it (never
inside it, so no name of the user's can collide with it) each row's event time in milliseconds.
Records inside an operator are Python values; a batch of dict values becomes a table with one
column per key, any other values a ``value`` column.

Types: rows go through Python and back, and Python has one ``int``, one ``float`` and naive or
aware ``datetime``s. ``SchemaTracker`` gives every output column back its exact Arrow type: the
type the column had on input (``hint``, the source's schema) if the values still fit it without
change, else the type the column took in the actor's earlier batches, else the inferred one.
Columns that disagree widen where Spark would (int → bigint → double, decimals to the wider one,
null to anything); any other disagreement is a ``SchemaError`` naming the column, both types and a
row, raised at the batch where it first shows.
"""

from __future__ import annotations

import datetime
import functools
import itertools
import operator
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from actorflow.operators.errors import SchemaError, describe_value

__all__ = [
    "RowBatch", "SchemaTracker", "VALUE_COLUMN", "conform_table", "has_null_type", "ipc_bytes", "is_bare", "rows_to_batch",
    "string_for_null", "table_to_rows", "unify_output_schemas",
]

VALUE_COLUMN = "value"
_BARE = {b"actorflow.bare": b"1"}


class RowBatch(NamedTuple):
    """A batch on a channel: the user's columns, each row's event time (or None), and where each
    row came from (its *origin*, which makes its idempotency key; or None).

    ``origins`` is a list, one tuple per row; or, for rows of one piece of the input, a
    ``(split, piece, rows)`` triple: ``rows`` is an int, the first of a run of rows (row ``i`` came
    from ``(split, piece, rows + i)``), or an int64 ``pyarrow.Array`` of each row's position in the
    piece (rows picked out of it, as a key split picks them). Neither costs a Python object per row
    until a record needs its origin.
    """

    table: pa.Table
    timestamps: pa.Array | None  # int64 milliseconds, one per row; None when no row has one
    origins: Any = None

    @property
    def num_rows(self) -> int:
        return self.table.num_rows

    def slice(self, offset: int, length: int) -> "RowBatch":
        ts = None if self.timestamps is None else self.timestamps.slice(offset, length)
        origins = self.origins
        if isinstance(origins, tuple):
            split, piece, rows = origins
            origins = (split, piece, rows + offset if isinstance(rows, int) else rows.slice(offset, length))
        elif origins is not None:
            origins = origins[offset:offset + length]
        return RowBatch(self.table.slice(offset, length), ts, origins)

    def filter(self, mask: pa.Array) -> "RowBatch":
        """The rows where ``mask`` is true, with their event times and origins."""
        ts = None if self.timestamps is None else self.timestamps.filter(mask)
        origins = self.origins
        if isinstance(origins, tuple):
            split, piece, rows = origins
            if isinstance(rows, int):
                rows = pc.add(pc.indices_nonzero(mask).cast(pa.int64()), rows)
            else:
                rows = rows.filter(mask)
            origins = (split, piece, rows)
        elif origins is not None:
            origins = [o for o, keep in zip(origins, mask.to_pylist()) if keep]
        return RowBatch(self.table.filter(mask), ts, origins)

    def origin_list(self) -> list[Any] | None:
        """One origin per row, or None."""
        origins = self.origins
        if isinstance(origins, tuple):
            split, piece, rows = origins
            if isinstance(rows, int):  # zipped in C: three quarters of a comprehension's time
                return list(zip(itertools.repeat(split), itertools.repeat(piece), range(rows, rows + self.num_rows)))
            return [(split, piece, row) for row in rows.to_pylist()]
        return origins


def is_bare(table: pa.Table) -> bool:
    """True for a batch of bare values (not dicts) in one ``value`` column."""
    metadata = table.schema.metadata
    return table.column_names == [VALUE_COLUMN] and bool(metadata) and metadata.get(b"actorflow.bare") == b"1"


def table_to_rows(batch: RowBatch) -> Iterator[tuple[Any, int | None]]:
    """``(value, timestamp_ms)`` per row; a bare-value batch yields bare values."""
    table = batch.table
    timestamps: Sequence[int | None]
    timestamps = batch.timestamps.to_pylist() if batch.timestamps is not None else [None] * table.num_rows
    if is_bare(table):
        values: list[Any] = column_values(table.column(0))
    else:
        values = _row_builder(tuple(table.column_names))([column_values(c) for c in table.columns])
    return zip(values, timestamps)


@functools.lru_cache(maxsize=64)
def _row_builder(names: tuple[str, ...]) -> Callable[[list[list[Any]]], list[dict[str, Any]]]:
    """A function from column lists to one dict per row, for these column names.

    A dict display with the names as constants builds a row in about half the time of
    ``dict(zip(names, row))``. A name given twice keeps its last column, as in
    ``Table.to_pylist()``: so does a display. Names are embedded by ``repr``, which any ``str``
    survives.
    """
    if not names:
        return lambda columns: []
    variables = [f"c{i}" for i in range(len(names))]
    display = ", ".join(f"{name!r}: {v}" for name, v in zip(names, variables))
    source = f"lambda columns: [{{{display}}} for {', '.join(variables)}, in zip(*columns)]"
    return eval(source, {"__builtins__": {"zip": zip}})  # noqa: S307 - source built from repr() of str only


_EPOCH = datetime.datetime(1970, 1, 1)
_EPOCH_DATE = datetime.date(1970, 1, 1)
_MICROS = {"s": 1_000_000, "ms": 1_000, "us": 1}
_UTC_NAMES = frozenset({"UTC", "Etc/UTC", "+00:00", "Z"})
_DATETIME_MIN_US = (datetime.datetime.min - _EPOCH) // datetime.timedelta(microseconds=1)
_DATETIME_MAX_US = (datetime.datetime.max - _EPOCH) // datetime.timedelta(microseconds=1)


def column_values(column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """``column.to_pylist()``, faster for timestamps and dates.

    pyarrow builds each ``datetime`` value by value (2.5-3.7 µs a value for a UTC timestamp
    here, 0.7 µs for a date); timedelta arithmetic gives the same values, time zones and folds
    in about 0.4 µs (0.4 µs for a date), and in about 0.09 µs where numpy makes the timedeltas (a
    column without nulls). Nanosecond timestamps, values out of ``datetime``'s range and every
    other type are pyarrow's own.
    """
    kind = column.type
    try:
        if pa.types.is_timestamp(kind) and kind.unit in _MICROS:
            return _timestamps(column, kind)
        if pa.types.is_date32(kind):
            return _dates(column)
    except (OverflowError, ValueError):
        pass  # out of datetime's range: pyarrow raises its own error, or converts its own way
    return column.to_pylist()


def _timestamps(column: pa.Array | pa.ChunkedArray, kind: pa.TimestampType) -> list[Any]:
    ints = column.cast(pa.int64())
    scale = _MICROS[kind.unit]
    if ints.null_count == 0 and len(ints) > 0:
        low, high = pc.min_max(ints).values()
        if _DATETIME_MIN_US <= low.as_py() * scale and high.as_py() * scale <= _DATETIME_MAX_US:
            # numpy turns ticks into naive datetimes, or into timedeltas from the epoch, in C: ten
            # and four times faster than Python per value. Out of datetime's range it would give
            # ints instead, so only within it.
            ticks = np.asarray(ints)
            if kind.tz is None:
                return ticks.astype(f"datetime64[{kind.unit}]").astype(object).tolist()  # type: ignore[no-any-return]
            zone, utc_in_zone = _zone_epoch(kind)
            shifted = map(utc_in_zone.__add__, ticks.astype(f"timedelta64[{kind.unit}]").astype(object).tolist())
            return list(shifted) if kind.tz in _UTC_NAMES else list(map(zone.fromutc, shifted))
    ticks = ints.to_pylist()
    delta = datetime.timedelta  # (days, seconds, microseconds): positional is faster than keywords
    if kind.tz is None:
        epoch = _EPOCH
        return [None if t is None else epoch + delta(0, 0, t * scale) for t in ticks]
    zone, utc_in_zone = _zone_epoch(kind)
    if kind.tz in _UTC_NAMES:  # no offset, no fold: adding to the epoch is already fromutc()'s result
        return [None if t is None else utc_in_zone + delta(0, 0, t * scale) for t in ticks]
    from_utc = zone.fromutc
    return [None if t is None else from_utc(utc_in_zone + delta(0, 0, t * scale)) for t in ticks]


def _zone_epoch(kind: pa.TimestampType) -> tuple[Any, datetime.datetime]:
    """The zone of ``kind`` as pyarrow gives it, and the epoch in it. A UTC time moves into the
    zone as ``datetime.astimezone()`` does: ``zone.fromutc(utc_in_zone + delta)``."""
    zone = pa.scalar(0, kind).as_py().tzinfo
    return zone, _EPOCH.replace(tzinfo=zone)


def _dates(column: pa.Array | pa.ChunkedArray) -> list[Any]:
    epoch, delta = _EPOCH_DATE, datetime.timedelta
    return [None if d is None else epoch + delta(days=d) for d in column.cast(pa.int32()).to_pylist()]


def rows_to_batch(
    values: list[Any], timestamps: list[int | None], schema: pa.Schema | None = None,
    tracker: "SchemaTracker | None" = None, origins: list[Any] | None = None,
) -> RowBatch:
    """Build a channel batch.

    With ``schema``, every row must fit it exactly, or ``SchemaError`` says which row does not.
    Otherwise ``tracker`` (or a fresh one) decides each column's type.
    """
    # list.count() runs in C: a generator over the rows would cost more than the check is worth.
    ts = pa.array(timestamps, type=pa.int64()) if timestamps.count(None) < len(timestamps) else None
    if values and not isinstance(values[0], dict):
        table = pa.table({VALUE_COLUMN: values}).replace_schema_metadata(_BARE)
    elif schema is not None:
        try:
            table = _fit(values, schema)
        except SchemaError as error:
            raise SchemaError(_which_row(values, schema, error)) from error
    else:
        table = (tracker or SchemaTracker()).table(values)
    if origins is not None and origins.count(None) == len(origins):
        origins = None
    return RowBatch(table, ts, origins)


class SchemaTracker:
    """Builds tables of dict rows, keeping each column's type stable across an actor's batches.

    ``hint`` is the schema the columns had on input. See the module docstring for the rules.

    >>> t = SchemaTracker(pa.schema([("n", pa.int32())]))
    >>> t.table([{"n": 1, "new": 2.5}]).schema.types
    [DataType(int32), DataType(double)]
    """

    def __init__(self, hint: pa.Schema | None = None) -> None:
        self._hint = {f.name: f.type for f in hint} if hint is not None else {}
        self._types: dict[str, pa.DataType] = {}

    def table(self, values: list[Any]) -> pa.Table:
        gathered = _same_keys_columns(values)
        if gathered is None:
            # Every key of every row becomes a column: inferring columns from the first row alone
            # would silently drop the keys that only later rows have.
            keys: dict[str, None] = {}
            seen: Any = None  # the key set of the last row that brought new keys
            for value in values:
                if not isinstance(value, dict):
                    raise SchemaError(
                        f"every record must be a dict of column values once the first is, got a "
                        f"{type(value).__name__}: {describe_value(value)}"
                    )
                if value.keys() != seen:  # rows mostly share their keys: compared in place, not copied
                    keys.update(dict.fromkeys(value))
                    seen = value.keys()
            gathered = {name: [v.get(name) for v in values] for name in keys}
            if values and not gathered:  # Arrow has no rows without columns: they would vanish
                raise SchemaError(
                    f"{len(values)} records are empty dicts, and no record of their batch has a column; "
                    "a row needs at least one column"
                )
        # Arrow would refuse a name of another type with "expected bytes, int found", naming
        # neither the name nor a row.
        bad = [name for name in gathered if not isinstance(name, str)]
        if bad:
            row = next((v for v in values if isinstance(v, dict) and bad[0] in v), None)
            raise SchemaError(
                f"column name {describe_value(bad[0])} ({type(bad[0]).__name__}) is not a str, in row "
                f"{describe_value(row)}; a column name must be a str"
            )
        return pa.table({name: self._column(name, column, values) for name, column in gathered.items()})

    def table_of_arrow(self, table: pa.Table) -> pa.Table:
        """``table`` with the types its columns would have taken as Python values through ``table()``.

        For an operator that computes its output as Arrow columns (the window operator's panes):
        the same rows as dicts would give the same table, without a Python object per value.
        """
        rows: list[Any] = []

        def lazy_rows() -> list[Any]:
            if not rows:
                rows.extend(table.to_pylist())
            return rows

        columns = {name: self._settle(name, _as_from_python(table.column(name)), lazy_rows) for name in table.column_names}
        return pa.table(columns)

    def _column(self, name: str, column: list[Any], rows: list[Any]) -> pa.Array:
        known = self._types.get(name)
        target = known if known is not None else self._hint.get(name)
        if target is not None and _has_map(target):
            # Arrow infers a dict as a struct and cannot infer a map at all: a map column's
            # values must fit its type (a dict, or (key, value) pairs).
            array = _build_exact(name, column, rows, target)
        else:
            try:
                array = _utc_datetimes(column) if target is not None and pa.types.is_timestamp(target) else None
                if array is None:
                    array = pa.array(column)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as error:
                raise SchemaError(_mixed_types(name, column, rows, error)) from error
        return self._settle(name, array, lambda: rows)

    def _settle(self, name: str, array: pa.Array, rows: Callable[[], list[Any]]) -> pa.Array:
        """``array`` as the column's type: the input's or the earlier batches', widened if need be."""
        known = self._types.get(name)
        target = known if known is not None else self._hint.get(name)
        if target is not None and array.type != target:
            try:
                array = array.cast(target, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                if known is not None:
                    array = self._widen(name, known, array, rows)
                # else: the values no longer fit the input's type; the user changed the column.
        elif target is None and pa.types.is_timestamp(array.type) and array.type.tz is None:
            # A new column of naive datetimes: read as UTC, Spark's session time zone here.
            array = array.cast(pa.timestamp(array.type.unit, tz="UTC"))
        if known is None or (known == pa.null() and array.type != pa.null()):
            self._types[name] = array.type
        return array

    def _widen(self, name: str, known: pa.DataType, array: pa.Array, rows: Callable[[], list[Any]]) -> pa.Array:
        try:
            wider = pa.unify_schemas(
                [pa.schema([(name, known)]), pa.schema([(name, array.type)])], promote_options="permissive"
            ).field(name).type
            array = array.cast(wider, safe=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as error:
            row = next((r for r in rows() if r.get(name) is not None), None)
            raise SchemaError(
                f"column {name!r} holds {known} in earlier rows and {array.type} in row {describe_value(row)}; "
                "a column needs one type (integers widen to bigint and double, as in Spark)"
            ) from error
        self._types[name] = wider
        return array


_TZINFO = operator.attrgetter("tzinfo")


def _utc_datetimes(column: list[Any]) -> pa.Array | None:
    """``pa.array(column)`` for a column of ``datetime``s (and None) that all carry one UTC zone,
    in a third of the time; None for any other column, which ``pa.array`` then converts.

    Arrow calls the zone's ``utcoffset()`` for each value (about 0.5 µs), and looks for pytz at
    each call. Datetimes that share one ``tzinfo`` subtract without it: their differences from
    the epoch in that zone are the microseconds since the epoch in UTC.
    """
    present = [v for v in column if v is not None]
    if not present or set(map(type, present)) != {datetime.datetime}:
        return None
    zones = set(map(_TZINFO, present))
    if len(zones) != 1:
        return None
    zone = zones.pop()
    kind = _utc_timestamp_type(zone) if zone is not None else None
    if kind is None:
        return None
    epoch = _EPOCH.replace(tzinfo=zone)
    deltas = [None if v is None else v - epoch for v in column]
    return pa.array(deltas, pa.duration("us")).view(kind)


@functools.lru_cache(maxsize=16)
def _utc_timestamp_type(zone: datetime.tzinfo) -> pa.DataType | None:
    """The type ``pa.array`` gives datetimes in ``zone`` if it is UTC (no offset, ever); else None."""
    if type(zone) is datetime.timezone:
        if zone.utcoffset(None) != datetime.timedelta(0):
            return None
    elif getattr(zone, "key", None) not in _UTC_NAMES or type(zone).__module__ != "zoneinfo":
        return None
    return pa.array([_EPOCH.replace(tzinfo=zone)]).type


def _same_keys_columns(values: list[Any]) -> dict[str, list[Any]] | None:
    """The columns of ``values`` when every row is a plain dict with the first row's keys (the
    usual case, found with C loops); None otherwise, and the caller looks at each row.

    Rows of one length that all hold every key of the first have its key set exactly.
    """
    first = values[0] if values else None
    if type(first) is not dict or not first:
        return None
    keys = tuple(first)
    if set(map(type, values)) != {dict} or set(map(len, values)) != {len(keys)}:
        return None
    try:
        # A column at a time: a C loop per key, with no tuple per row to transpose.
        return {key: list(map(operator.itemgetter(key), values)) for key in keys}
    except KeyError:
        return None


def _as_from_python(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """``column`` with the type Arrow infers for its values as Python objects (ints are int64,
    floats double, ...), as a column that went through Python rows would have it."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    t = array.type
    if pa.types.is_integer(t) and not pa.types.is_uint64(t):
        return array.cast(pa.int64())
    if pa.types.is_floating(t):
        return array.cast(pa.float64())
    if pa.types.is_boolean(t) or t == pa.string() or t == pa.binary() or pa.types.is_null(t):
        return array
    if pa.types.is_timestamp(t):
        return array.cast(_python_timestamp_type(t))
    return pa.array(array.to_pylist())  # decimals and the rest: the type depends on the values


@functools.cache
def _python_timestamp_type(t: pa.TimestampType) -> pa.DataType:
    """What Arrow infers for the datetimes a column of ``t`` gives as Python objects.

    A datetime's type does not depend on its value, so any value of ``t`` tells. Once per type:
    Arrow's inference from an aware datetime tries to import pytz each time.
    """
    return pa.array([pa.scalar(0, t).as_py()]).type


def _has_map(data_type: pa.DataType) -> bool:
    if pa.types.is_map(data_type):
        return True
    return any(_has_map(data_type.field(i).type) for i in range(data_type.num_fields))


def _build_exact(name: str, column: list[Any], rows: list[Any], target: pa.DataType) -> pa.Array:
    # Arrow cannot infer a map from Python values; build it with its type and make sure that
    # nothing changed on the way (a float in an int field would be truncated silently).
    try:
        array = pa.array(column, type=target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as error:
        raise SchemaError(f"column {name!r} must hold {target}: {error}") from error
    for value, back, row in zip(column, array.to_pylist(), rows):
        if _normal(value) != _normal(back):
            raise SchemaError(
                f"column {name!r} must hold {target}, got {describe_value(value)} in row {describe_value(row)}"
            )
    return array


def _normal(value: Any) -> Any:
    if isinstance(value, dict):
        return sorted(([k, _normal(v)] for k, v in value.items()), key=repr)
    if isinstance(value, (list, tuple)):
        items = [_normal(v) for v in value]
        if all(isinstance(v, (list, tuple)) and len(v) == 2 for v in value):
            return sorted(items, key=repr)  # a map given as (key, value) pairs
        return items
    return value


def _mixed_types(name: str, column: list[Any], rows: list[Any], error: Exception) -> str:
    seen: dict[str, Any] = {}
    for value, row in zip(column, rows):
        if value is not None:
            seen.setdefault(type(value).__name__, row)
    if len(seen) > 1:
        (first, row_a), (second, row_b) = list(seen.items())[:2]
        return (
            f"column {name!r} holds {first} in row {describe_value(row_a)} and {second} in row "
            f"{describe_value(row_b)}; a column needs one type (integers widen to bigint and double, as in Spark)"
        )
    return f"column {name!r} cannot become an Arrow column: {error}"


def _fit(values: list[Any], schema: pa.Schema) -> pa.Table:
    # Never pa.Table.from_pylist(values, schema=...): it truncates a float given for an int.
    return conform_table(SchemaTracker(schema).table(values), schema, fill_missing=True)


def _which_row(values: list[Any], schema: pa.Schema, error: Exception) -> str:
    for i, value in enumerate(values):
        if not isinstance(value, dict):
            return f"row {i} is a {type(value).__name__}, expected a dict of column values: {describe_value(value)}"
        try:
            _fit([value], schema)
        except Exception as row_error:
            expected = f" (expected schema: {schema.to_string(show_schema_metadata=False)!s})" if schema else ""
            return f"row {describe_value(value)} does not fit the output schema: {row_error}{expected}"
    return f"rows do not fit the output schema: {error}"


def unify_output_schemas(schemas: list[pa.Schema], samples: list[dict[str, Any] | None] | None = None) -> pa.Schema:
    """The schema the output of several actors shares; a clear error names a column they disagree on."""
    try:
        return pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
        types: dict[str, dict[str, int]] = {}
        for i, schema in enumerate(schemas):
            for field in schema:
                types.setdefault(field.name, {}).setdefault(str(field.type), i)
        for name, kinds in types.items():
            non_null = {k: i for k, i in kinds.items() if k != "null"}
            if len(non_null) > 1:
                (a, i), (b, j) = list(non_null.items())[:2]
                rows = ""
                if samples is not None:
                    rows = f" (rows {describe_value(samples[i])} and {describe_value(samples[j])})"
                raise SchemaError(
                    f"column {name!r} holds {a} in one instance's output and {b} in another's{rows}; "
                    "a column needs one type (integers widen to bigint and double, as in Spark)"
                ) from error
        raise SchemaError(f"the outputs of the job's instances do not share a schema: {error}") from error


def conform_table(table: pa.Table, target: pa.Schema, *, fill_missing: bool = False) -> pa.Table:
    """``table``'s columns of ``target``, in its order and types; only timestamps may lose digits.

    A column of ``target`` that ``table`` lacks is an error, or with ``fill_missing`` a column of
    nulls (one instance's output may lack a key that only another instance's rows had).
    """
    missing = [name for name in target.names if name not in table.column_names]
    if missing and not fill_missing:
        raise SchemaError(f"table must have columns {target.names}, got {table.column_names} (missing {missing})")
    columns = []
    for field in target:
        if field.name not in table.column_names:
            columns.append(pa.nulls(table.num_rows, field.type))
            continue
        column = table.column(field.name)
        if column.type == field.type:
            columns.append(column)
            continue
        try:
            # Only timestamp precision may be dropped (ns -> us); other casts must be exact.
            safe = not pa.types.is_timestamp(field.type)
            columns.append(pc.cast(column, field.type, safe=safe))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
            raise SchemaError(
                f"column {field.name!r} must be castable to {field.type}, got {column.type}: "
                f"{error}"
            ) from error
    return pa.Table.from_arrays(columns, schema=target)


def string_for_null(data_type: pa.DataType) -> pa.DataType:
    """``data_type`` with string wherever it has Arrow's null type (Spark's void, which Parquet cannot hold)."""
    if pa.types.is_null(data_type):
        return pa.string()
    if pa.types.is_struct(data_type):
        return pa.struct([f.with_type(string_for_null(f.type)) for f in data_type])
    if pa.types.is_map(data_type):
        return pa.map_(string_for_null(data_type.key_type), string_for_null(data_type.item_type))
    if pa.types.is_large_list(data_type):
        return pa.large_list(data_type.value_field.with_type(string_for_null(data_type.value_type)))
    if pa.types.is_list(data_type):
        return pa.list_(data_type.value_field.with_type(string_for_null(data_type.value_type)))
    return data_type


def has_null_type(data_type: pa.DataType) -> bool:
    """Whether ``data_type`` is, or holds, Arrow's null type."""
    if pa.types.is_null(data_type):
        return True
    return any(has_null_type(data_type.field(i).type) for i in range(data_type.num_fields))


def ipc_bytes(tables: list[pa.Table]) -> bytes:
    """One Arrow IPC stream of ``tables`` (which share a schema)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, tables[0].schema) as writer:
        for table in tables:
            writer.write_table(table)
    return sink.getvalue().to_pybytes()
