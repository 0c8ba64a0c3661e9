"""Rows <-> Arrow batches: exact types back, timestamps beside the table, clear errors (no Ray needed)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actorflow.actors.arrow_rows import RowBatch, SchemaTracker, column_values, conform_table, rows_to_batch, table_to_rows
from actorflow.operators import SchemaError
from tests.properties import examples

UTC = dt.timezone.utc


def test_rows_round_trip_with_timestamps_beside_the_table():
    batch = rows_to_batch([{"a": 1, "b": "x"}, {"a": 2, "b": None}], [10, None])
    assert batch.table.column_names == ["a", "b"] and batch.timestamps.to_pylist() == [10, None]
    assert list(table_to_rows(batch)) == [({"a": 1, "b": "x"}, 10), ({"a": 2, "b": None}, None)]


def test_a_user_column_named_like_an_internal_one_is_just_a_column():
    rows = [{"__ts": 5, "value": "v", "error": "e"}]
    batch = rows_to_batch(rows, [99])
    assert list(table_to_rows(batch)) == [(rows[0], 99)]


def test_keys_that_only_later_rows_have_are_kept():
    batch = rows_to_batch([{"a": 1}, {"a": 2, "late": "x"}], [None, None])
    assert [v for v, _ in table_to_rows(batch)] == [{"a": 1, "late": None}, {"a": 2, "late": "x"}]


def test_rows_of_one_length_with_other_keys_keep_every_key():
    # Same number of keys as the first row, but not the same keys: no column may be lost.
    batch = rows_to_batch([{"a": 1, "b": 2}, {"a": 3, "c": 4}], [None, None])
    assert [v for v, _ in table_to_rows(batch)] == [{"a": 1, "b": 2, "c": None}, {"a": 3, "b": None, "c": 4}]


def test_a_batch_of_only_empty_dicts_is_an_error_not_rows_that_vanish():
    with pytest.raises(SchemaError, match="2 records are empty dicts, and no record of their batch has a column"):
        rows_to_batch([{}, {}], [None, None])


@given(st.lists(st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.integers(-5, 5), max_size=4),
                min_size=1, max_size=12).filter(lambda rows: any(rows)))
@settings(max_examples=examples(200), deadline=None)
def test_each_key_of_each_row_becomes_a_column_in_first_seen_order(rows):
    names = list(dict.fromkeys(k for row in rows for k in row))
    table = SchemaTracker().table(rows)
    assert table.column_names == names
    assert table.to_pylist() == [{k: row.get(k) for k in names} for row in rows]


def test_bare_values_round_trip():
    batch = rows_to_batch([1, 2, 3], [None, None, None])
    assert [v for v, _ in table_to_rows(batch)] == [1, 2, 3]


def test_a_row_that_does_not_fit_the_output_schema_is_named():
    schema = pa.schema([("user", pa.int64()), ("segment", pa.string())])
    with pytest.raises(SchemaError) as info:
        rows_to_batch([{"user": 1, "segment": "a"}, {"user": "seven", "segment": "b"}], [None, None], schema)
    assert "{'user': 'seven', 'segment': 'b'}" in str(info.value) and "does not fit the output schema" in str(info.value)


MAP = pa.map_(pa.string(), pa.int32())
STRUCT = pa.struct([("a", pa.int32()), ("b", pa.list_(pa.float32()))])


@pytest.mark.parametrize(
    "input_type, value",
    [
        (pa.int8(), 7),  # tinyint stays tinyint, not bigint
        (pa.int16(), -300),  # smallint
        (pa.int32(), 2**31 - 1),  # int
        (pa.float32(), 1.5),  # float stays float, not double
        (pa.decimal128(38, 18), Decimal("12.345678901234567890")),  # not decimal(21,18)
        (pa.decimal128(10, 2), Decimal("-0.05")),
        (pa.timestamp("us"), dt.datetime(2024, 1, 2, 3, 4, 5, 678901)),  # timestamp_ntz stays naive
        (pa.timestamp("us", tz="UTC"), dt.datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)),
        (pa.date32(), dt.date(2024, 2, 29)),
        (pa.binary(), b"\x00\xff"),
        (pa.bool_(), True),
        (STRUCT, {"a": 1, "b": [0.5, None]}),  # nested fields keep their types
        (pa.list_(pa.int16()), [1, None, 3]),
        (MAP, [("k", 1), ("j", None)]),  # maps come back from Arrow as (key, value) pairs
        (pa.map_(pa.string(), STRUCT), [("k", {"a": 2, "b": []})]),
    ],
    ids=lambda x: str(x)[:30],
)
def test_an_input_column_comes_back_with_exactly_its_type(input_type, value):
    hint = pa.schema([("c", input_type), ("n", pa.int64())])
    rows = [{"c": value, "n": 1}, {"c": None, "n": 2}]
    table = SchemaTracker(hint).table(rows)
    assert table.schema.field("c").type == input_type
    assert table.column("c").to_pylist() == [value, None]


def test_a_map_column_given_as_a_dict_keeps_its_type_and_entries():
    table = SchemaTracker(pa.schema([("m", MAP)])).table([{"m": {"x": 1, "y": 2}}])
    assert table.schema.field("m").type == MAP and table.column("m").to_pylist() == [[("x", 1), ("y", 2)]]


def test_a_float_in_an_int_map_is_an_error_not_a_truncation():
    with pytest.raises(SchemaError, match=r"column 'm' must hold map<string, int32>.*1\.5"):
        SchemaTracker(pa.schema([("m", MAP)])).table([{"m": {"x": 1.5}}])


def test_a_value_that_no_longer_fits_the_input_type_widens_as_spark_would():
    # The function replaced an int column with bigger numbers: bigint, not an overflow error.
    tracker = SchemaTracker(pa.schema([("n", pa.int32())]))
    assert tracker.table([{"n": 2**40}]).schema.field("n").type == pa.int64()


def test_a_float_never_lands_truncated_in_an_int_column():
    tracker = SchemaTracker(pa.schema([("n", pa.int64())]))
    table = tracker.table([{"n": 1.5}])
    assert table.schema.field("n").type == pa.float64() and table.column("n").to_pylist() == [1.5]


def test_a_column_the_function_changed_to_another_type_takes_the_new_type():
    tracker = SchemaTracker(pa.schema([("user", pa.int64())]))
    assert tracker.table([{"user": "u-1"}]).schema.field("user").type == pa.string()


def test_new_columns_are_inferred_as_spark_would_and_naive_datetimes_read_as_utc():
    table = SchemaTracker().table([{"i": 1, "f": 0.5, "s": "x", "t": dt.datetime(2024, 1, 1)}])
    assert table.schema.types == [pa.int64(), pa.float64(), pa.string(), pa.timestamp("us", tz="UTC")]


def test_ints_then_floats_across_batches_widen_to_double():
    tracker = SchemaTracker()
    assert tracker.table([{"x": 1}]).schema.field("x").type == pa.int64()
    assert tracker.table([{"x": 2.5}]).schema.field("x").type == pa.float64()


def test_mixed_types_in_one_batch_name_the_column_both_types_and_rows():
    with pytest.raises(SchemaError) as info:
        SchemaTracker().table([{"id": 1, "x": 1}, {"id": 2, "x": "s1"}])
    message = str(info.value)
    assert "column 'x' holds int in row {'id': 1, 'x': 1} and str in row {'id': 2, 'x': 's1'}" in message


def test_mixed_types_across_batches_name_the_column_both_types_and_a_row():
    tracker = SchemaTracker()
    tracker.table([{"id": 1, "x": 1}])
    with pytest.raises(SchemaError) as info:
        tracker.table([{"id": 2, "x": "s1"}])
    assert "column 'x' holds int64 in earlier rows and string in row {'id': 2, 'x': 's1'}" in str(info.value)


def test_a_column_of_nulls_first_takes_the_type_of_later_values():
    tracker = SchemaTracker()
    tracker.table([{"x": None}])
    assert tracker.table([{"x": "late"}]).schema.field("x").type == pa.string()


def test_conform_fills_a_column_this_part_never_had_with_nulls_only_when_asked():
    target = pa.schema([("a", pa.int64()), ("b", pa.string())])
    out = conform_table(pa.table({"a": [1, 2]}), target, fill_missing=True)
    assert out.schema == target and out.column("b").to_pylist() == [None, None]
    with pytest.raises(SchemaError, match=r"missing \['b'\]"):
        conform_table(pa.table({"a": [1, 2]}), target)


def test_a_row_batch_slices_its_timestamps_with_its_rows():
    batch = RowBatch(pa.table({"a": [1, 2, 3]}), pa.array([10, 20, 30], pa.int64())).slice(1, 2)
    assert list(table_to_rows(batch)) == [({"a": 2}, 20), ({"a": 3}, 30)]


def test_a_float_for_an_int_of_the_declared_output_schema_is_an_error_not_a_truncation():
    schema = pa.schema([("user", pa.int64())])
    with pytest.raises(SchemaError, match=r"row \{'user': 1\.5\} does not fit the output schema"):
        rows_to_batch([{"user": 1}, {"user": 1.5}], [None, None], schema)


# -- column_values: pyarrow's own values, built faster ---------------------------------------------

_ZONES = [None, "UTC", "Etc/UTC", "America/New_York", "Europe/London", "Asia/Kolkata", "+05:30", "-08:00"]
# Around the epoch, the DST changes of 2023 (2023-03-12 and 2023-11-05 in New York), and near the
# ends of datetime's range.
_DST_FALL_BACK_NY_US = 1_699_162_200_000_000  # 2023-11-05 05:30 UTC = 01:30 EDT, then 01:30 EST


def _same(got: list, want: list) -> bool:
    return len(got) == len(want) and all(
        (g is None and w is None)
        or (type(g) is type(w) and g == w and repr(g) == repr(w) and getattr(g, "tzinfo", None) == getattr(w, "tzinfo", None))
        for g, w in zip(got, want)
    )


def _assert_like_pyarrow(column: pa.Array | pa.ChunkedArray) -> None:
    """column_values gives what to_pylist gives, or raises what it raises."""
    try:
        want = column.to_pylist()
    except Exception as error:  # noqa: BLE001 - out of datetime's range, say
        with pytest.raises(type(error)):
            column_values(column)
    else:
        assert _same(column_values(column), want)


@given(
    ticks=st.lists(st.one_of(st.none(), st.integers(-10**11, 10**11), st.integers(-3 * 10**6, 3 * 10**6)), max_size=40),
    zone=st.sampled_from(_ZONES),
    unit=st.sampled_from(["s", "ms", "us"]),
)
@settings(max_examples=examples(200), deadline=None)
def test_timestamps_convert_to_exactly_what_pyarrow_gives(ticks, zone, unit):
    scale = {"s": 1, "ms": 1_000, "us": 1_000_000}[unit]
    around_dst = [_DST_FALL_BACK_NY_US * scale // 1_000_000 + t * scale for t in (-3600, -1, 0, 1, 1800, 3600)]
    column = pa.array(ticks + around_dst, pa.timestamp(unit, tz=zone))
    _assert_like_pyarrow(column)
    _assert_like_pyarrow(pa.chunked_array([column.slice(0, 3), column.slice(3)], column.type))


_DATETIME_ZONES = [UTC, "UTC", "Etc/UTC", "Europe/Berlin", dt.timezone(dt.timedelta(hours=-8)), None]


@given(
    micros=st.lists(st.one_of(st.none(), st.integers(-10**16, 10**16)), min_size=1, max_size=30),
    zones=st.lists(st.sampled_from(_DATETIME_ZONES), min_size=1, max_size=2),
    declared=st.sampled_from([pa.timestamp("us", tz="UTC"), pa.timestamp("us")]),
)
@settings(max_examples=examples(300), deadline=None)
def test_datetimes_come_back_as_pyarrow_converts_them_in_any_zone(micros, zones, declared):
    from zoneinfo import ZoneInfo

    values = []
    for i, m in enumerate(micros):
        zone = zones[i % len(zones)]
        moment = dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=m) if m is not None else None
        if moment is not None:
            moment = moment.replace(tzinfo=None) if zone is None else moment.astimezone(
                ZoneInfo(zone) if isinstance(zone, str) else zone)
        values.append(moment)
    tracker = SchemaTracker(pa.schema([("t", declared)]))
    try:
        want = pa.array(values).cast(declared)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        with pytest.raises(SchemaError):
            tracker.table([{"t": v} for v in values])
        return
    got = tracker.table([{"t": v} for v in values]).column("t")
    assert got.type == declared and got.to_pylist() == want.to_pylist()


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
def test_timestamps_at_the_ends_of_the_range_behave_as_in_pyarrow(unit):
    per_s = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[unit]
    lo = int((dt.datetime(1, 1, 1) - dt.datetime(1970, 1, 1)).total_seconds()) * per_s
    hi = int((dt.datetime(9999, 12, 31, 23, 59, 59) - dt.datetime(1970, 1, 1)).total_seconds()) * per_s
    for values in ([lo, hi, None] if unit != "ns" else [0, 1_500, None], [lo - per_s * 86_400 * 400] if unit != "ns" else [2**62]):
        for zone in (None, "UTC", "America/New_York"):
            _assert_like_pyarrow(pa.array(values, pa.timestamp(unit, tz=zone)))


@given(st.lists(st.one_of(st.none(), st.integers(-719_162, 2_932_896)), max_size=40))
@settings(max_examples=examples(100), deadline=None)
def test_dates_convert_to_exactly_what_pyarrow_gives(days):
    _assert_like_pyarrow(pa.array(days, pa.date32()))


def test_rows_of_a_table_are_what_to_pylist_gives_duplicate_names_included():
    table = pa.table({
        "id": [1, None], "ts": pa.array([1_700_000_000_123_456, None], pa.timestamp("us", tz="UTC")),
        "day": pa.array([19_000, None], pa.date32()), "s": ["a", None],
    })
    doubled = pa.Table.from_arrays([table.column(0), table.column(3)], names=["x", "x"])
    for t in (table, doubled):
        got = [v for v, _ in table_to_rows(RowBatch(t, None))]
        assert got == t.to_pylist() and _same([r.get("ts") for r in got], [r.get("ts") for r in t.to_pylist()])


@pytest.mark.parametrize("origins", [(3, 7, 100), [("a", i) for i in range(6)], None])
def test_filtering_and_slicing_keep_each_rows_origin(origins):
    batch = RowBatch(pa.table({"k": [0, 1, 0, 1, 1, 0]}), pa.array([10, 11, 12, 13, 14, 15], pa.int64()), origins)
    whole = batch.origin_list()
    mask = pa.array([True, False, True, False, True, True])
    picked = batch.filter(mask)
    assert picked.table.column("k").to_pylist() == [0, 0, 1, 0] and picked.timestamps.to_pylist() == [10, 12, 14, 15]
    want = None if whole is None else [o for o, m in zip(whole, mask.to_pylist()) if m]
    assert picked.origin_list() == want
    # Picked rows stay picked through a slice and a second filter, as a channel may cut them.
    again = picked.slice(1, 3).filter(pa.array([True, False, True]))
    assert again.origin_list() == (None if want is None else [want[1], want[3]])
    if isinstance(origins, tuple):
        assert isinstance(picked.origins[2], pa.Array)  # no Python object per row on the way


_WINDOW_OUTPUT = pa.table({
    "user": pa.array([3, 4, None], pa.int32()),
    "name": pa.array(["a", None, "c"], pa.large_string()),
    "window_start": pa.array([0, 60_000, 120_000], pa.timestamp("ms", tz="UTC")),
    # An aggregate of a group with no value is null, the first row's too.
    "first_seen": pa.array([None, 1_500, 7], pa.timestamp("s", tz="Europe/Berlin")),
    "last_seen": pa.array([None, None, 1_000_000], pa.timestamp("us")),
    "n": pa.array([1, 2, 3], pa.int64()),
    "low": pa.array([1.5, None, -2.0], pa.float32()),
    "small": pa.array([1, 2, None], pa.uint8()),
    "total": pa.array([Decimal("1.50"), Decimal("-3.25"), None], pa.decimal128(38, 2)),
    "ok": pa.array([True, None, False]),
})


@pytest.mark.parametrize("hint", [None, pa.schema([("user", pa.int32()), ("name", pa.string())])])
def test_an_arrow_table_takes_the_types_its_rows_would_take_through_python(hint):
    through_python = SchemaTracker(hint).table(_WINDOW_OUTPUT.to_pylist())
    as_arrow = SchemaTracker(hint).table_of_arrow(_WINDOW_OUTPUT)
    assert as_arrow.schema == through_python.schema
    assert as_arrow.equals(through_python)


def test_an_arrow_table_after_row_batches_keeps_and_widens_their_types_as_rows_would():
    rows, arrow = SchemaTracker(), SchemaTracker()
    first = [{"n": 1.5, "low": 2}]
    rows.table(first), arrow.table(first)
    later = pa.table({"n": pa.array([7], pa.int32()), "low": pa.array([0.25], pa.float32())})
    assert arrow.table_of_arrow(later).equals(rows.table(later.to_pylist()))  # n stays double, low widens to double
    with pytest.raises(SchemaError, match=r"column 'low' holds double in earlier rows and string"):
        arrow.table_of_arrow(pa.table({"n": [1.0], "low": ["x"]}))
