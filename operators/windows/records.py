"""Reading a record's key and event time for a window operator, with errors that name the record."""

from __future__ import annotations

from operator import index as _as_index
from typing import Any, Callable

from ..elements import Record
from ..errors import ConfigurationError, RecordError, SchemaError, UserFunctionError, describe_value

__all__ = ["event_time_of", "key_function", "key_of", "record_error"]


def key_function(key_selector: Any) -> tuple[Callable[[Any], Any], tuple[str, ...] | None]:
    """The key function of a ``key_selector`` and the columns it names (None for a callable).

    >>> select, fields = key_function(("user", "region"))
    >>> select({"user": "a", "region": 1, "x": 0}), fields
    (('a', 1), ('user', 'region'))
    """
    if isinstance(key_selector, str):
        field = key_selector
        return (lambda value: value[field]), (field,)
    if isinstance(key_selector, (tuple, list)) and key_selector and all(isinstance(f, str) for f in key_selector):
        fields = tuple(key_selector)
        return (lambda value: tuple([value[f] for f in fields])), fields
    if callable(key_selector):
        return key_selector, None
    raise ConfigurationError(
        f"key_selector must be a column name, a tuple of column names or a callable, got {key_selector!r}"
    )


def key_of(select: Callable[[Any], Any], record: Record, operator: str) -> Any:
    """The key of a record; refuses keys that cannot key a dict."""
    try:
        key = select(record.value)
    except Exception as error:
        raise record_error(operator, record, f"key_selector raised {type(error).__name__}: {error}", error)
    try:
        hash(key)
    except TypeError as error:
        raise record_error(
            operator, record,
            f"key {describe_value(key)} of type {type(key).__name__} is unhashable; a key must be hashable",
            error, RecordError,
        )
    return key


def event_time_of(record: Record, operator: str, assigner: Any) -> int:
    """A record's event time as an int; whole floats and integer-like numbers are accepted.

    >>> event_time_of(Record("x", 5.0), "op", None)
    5
    """
    ts: Any = record.timestamp_ms
    if type(ts) is int:
        return ts
    if ts is not None and not isinstance(ts, bool):
        try:
            return _as_index(ts)
        except TypeError:
            if isinstance(ts, float) and ts.is_integer():
                return int(ts)
    raise SchemaError(
        f"{operator}: record {describe_value(record.value)} has timestamp_ms={ts!r}; "
        f"an event-time window ({assigner!r}) needs an int timestamp on every record"
    )


def record_error(
    operator: str, record: Record, message: str, cause: BaseException, kind: type[RecordError] = UserFunctionError
) -> RecordError:
    """A ``RecordError`` (by default a ``UserFunctionError``) that names the operator and record."""
    error = kind(
        f"{message} on record {describe_value(record.value)} (timestamp_ms={record.timestamp_ms})",
        operator=operator,
        value=record.value,
        timestamp_ms=record.timestamp_ms,
    )
    error.__cause__ = cause
    return error
