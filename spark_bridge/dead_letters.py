"""Running the dead letters of an earlier ``enrich()`` again: each once, with the idempotency key
its requests had, so that a service that de-duplicates by it recognises a request it has seen."""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any, Callable

from actorflow.cluster.side_records import DEAD_LETTER_FIELDS
from actorflow.operators.arrow_batch import ArrowBatchFunction
from actorflow.operators.errors import ConfigurationError

from .enrich import enrich
from .session import check_dataframe

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["rerun_dead_letters"]

#: The column that carries each row's key through the job, and is dropped from what comes back.
KEY_COLUMN = "__actorflow_request_key"


def rerun_dead_letters(dead_letters: "DataFrame", fn: Callable[..., Any], **options: Any) -> "DataFrame | tuple[DataFrame, DataFrame]":
    """Run the rows of ``dead_letters`` through ``fn`` again, each once, with its idempotency key.

    ``dead_letters`` is the second result of an earlier ``enrich(..., on_error="dead_letter")``,
    or those dead letters read back (from Parquet, say): the rows' own columns, then
    ``error_type``, ``error``, ``attempts``, ``operator`` and ``request_key``. The diagnostic
    columns go; each row runs through ``fn`` with the options of ``enrich()`` (``options``), and
    its requests carry the ``request_key`` of the first run (``af.current_request_key()``).
    Rows with the same key (a dead letter read twice, two runs' dead letters in one DataFrame)
    run once. What comes back is what ``enrich()`` returns: the enriched rows, and with
    ``on_error="dead_letter"`` the rows that failed again, which keep their keys.

    A dead letter without a key never reached a request (a ``SchemaError`` of ``from_spark``,
    say): it is refused, with the count, before any job.
    """
    check_dataframe(dead_letters, "rerun_dead_letters()")
    if "idempotency_key" in options:
        raise ConfigurationError("rerun_dead_letters() sends each row with the request_key of its dead letter; "
                                 "it takes no idempotency_key")
    names = _diagnostic_columns(dead_letters.columns)
    key = names[-1]
    from pyspark.sql import functions as F

    keyless = dead_letters.filter(F.col(key).isNull()).count()
    if keyless:
        raise ConfigurationError(
            f"{keyless} dead letter(s) have no {key!r}: they failed before any request was made (a SchemaError of "
            f"from_spark, for instance), so there is nothing to send again; filter them out first, e.g. "
            f"dead_letters.filter(col({key!r}).isNotNull())")
    rows = dead_letters.dropDuplicates([key]).drop(*names[:-1]).withColumnRenamed(key, KEY_COLUMN)
    result = enrich(rows, _without_key(fn, batched=options.get("batch_size") is not None),
                    idempotency_key=KEY_COLUMN, **options)
    if isinstance(result, tuple):
        return result[0].drop(KEY_COLUMN), result[1].drop(KEY_COLUMN)
    return result.drop(KEY_COLUMN)


def _diagnostic_columns(columns: list[str]) -> list[str]:
    """The dead-letter columns at the end of ``columns``, in the order of ``DEAD_LETTER_FIELDS``."""
    fields = [f.name for f in DEAD_LETTER_FIELDS]
    tail = columns[-len(fields):]
    if len(tail) == len(fields) and all(c.endswith(f) and set(c[: -len(f)].split("dead_letter_")) <= {""}
                                        for c, f in zip(tail, fields)):
        return tail
    raise ConfigurationError(
        f"rerun_dead_letters() takes the dead letters of enrich(on_error='dead_letter'): the rows' columns, then "
        f"{', '.join(fields)} (each maybe named dead_letter_<name>); this DataFrame's columns end with {tail}")


def _strip(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k != KEY_COLUMN}


def _without_key(fn: Callable[..., Any], *, batched: bool) -> Callable[..., Any]:
    """``fn`` as the user wrote it sees the rows without the key's column."""
    if isinstance(fn, ArrowBatchFunction) or not callable(fn):
        return fn  # a table's function gets the key's column too; enrich() refuses what is not callable
    strip: Callable[[Any], Any] = (lambda rows: [_strip(r) for r in rows]) if batched else _strip
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):
        @functools.wraps(fn)
        async def call_async(arg: Any) -> Any:
            return await fn(strip(arg))

        return call_async

    @functools.wraps(fn)
    def call(arg: Any) -> Any:
        return fn(strip(arg))

    return call
