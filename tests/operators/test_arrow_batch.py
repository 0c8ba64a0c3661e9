"""Vectorised batch functions: rows to a table, the result table merged back row by row."""

from __future__ import annotations

import doctest
import importlib
import inspect

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from actorflow.operators import DEAD_LETTER, ConfigurationError, OperatorHarness, Record, arrow_batch, async_wait_batch


def test_docstring_examples():
    # The package's arrow_batch is the function; the module is found by its full name.
    result = doctest.testmod(importlib.import_module("actorflow.operators.arrow_batch"))
    assert result.attempted > 0 and result.failed == 0


def _double(table: pa.Table) -> pa.Table:
    return pa.table({"double": pc.multiply(table["x"], 2)})


async def _async_double(table: pa.Table) -> pa.Table:
    return _double(table)


@pytest.mark.parametrize("fn", [_double, _async_double], ids=["blocking", "async"])
def test_result_columns_are_merged_into_each_row_in_order(fn):
    rows_fn = arrow_batch(fn).rows_function()
    h = OperatorHarness(async_wait_batch(_as_async(rows_fn), batch_size=3))
    for i in range(7):
        h.process_element({"x": i, "name": f"r{i}"}, timestamp_ms=i)
    h.end_input()
    h.run_until_idle()
    assert h.output == [Record({"x": i, "name": f"r{i}", "double": 2 * i}, i) for i in range(7)]


def test_a_result_column_replaces_the_input_column_of_the_same_name():
    rows_fn = arrow_batch(lambda t: t.set_column(0, "x", pc.add(t["x"], 100))).rows_function()
    assert rows_fn([{"x": 1, "y": "a"}]) == [[{"x": 101, "y": "a"}]]


@pytest.mark.parametrize(
    "result, message",
    [
        # one row short
        (pa.table({"double": [1]}), "returned 1 rows for a batch of 2; expected one row per input row"),
        # not a table
        ([{"double": 1}, {"double": 2}], "must return a pyarrow.Table, got list"),
    ],
)
def test_a_result_of_the_wrong_shape_dead_letters_every_record_of_the_batch(result, message):
    rows_fn = arrow_batch(lambda t: result).rows_function()
    h = OperatorHarness(async_wait_batch(_as_async(rows_fn), batch_size=2, on_error="dead_letter"))
    h.process_element({"x": 1}, timestamp_ms=1)
    h.process_element({"x": 2}, timestamp_ms=2)
    h.run_until_idle()
    letters = h.side_outputs[DEAD_LETTER]
    assert [d.value for d in letters] == [{"x": 1}, {"x": 2}]
    assert all(d.error_type == "ResultTypeError" and message in d.error for d in letters)


def test_a_row_that_is_not_a_dict_is_a_result_type_error():
    with pytest.raises(TypeError, match="needs dict rows; row 1 of the batch is a int"):
        arrow_batch(_double).rows_function()([{"x": 1}, 2])


@pytest.mark.parametrize("fn", [42, "score"])
def test_arrow_batch_rejects_what_is_not_a_function(fn):
    with pytest.raises(ConfigurationError, match="arrow_batch\\(\\) needs a function of a pyarrow.Table, got"):
        arrow_batch(fn)


def test_the_async_kind_is_told_apart_from_the_blocking_one():
    assert arrow_batch(_async_double).is_coroutine and not arrow_batch(_double).is_coroutine


def _as_async(rows_fn):
    """A blocking rows function run inline, as a test stand-in for the Ray-task path."""
    if inspect.iscoroutinefunction(rows_fn.__call__):
        return rows_fn

    async def call(values):
        return rows_fn(values)

    return call
