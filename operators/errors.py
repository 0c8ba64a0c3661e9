"""The exceptions of actorflow.

Every error the project raises derives from ``ActorflowError``::

    ActorflowError
    ├── ConfigurationError        (also a ValueError) a bad argument, caught at construction
    ├── MailboxStateError         an operation the mailbox's lifecycle state does not allow
    │   └── MailboxClosedError    put() after quiesce()/close()
    ├── MailboxThreadError        a mailbox-thread-only method called from another thread
    ├── RecordError               one record could not be processed; names the operator and record
    │   ├── AsyncTimeoutError     an async request ran past its deadline
    │   ├── CircuitOpenError      a record not sent: its service's circuit breaker was open
    │   ├── UserFunctionError     a user function raised
    │   └── ResultTypeError       a user function returned something of the wrong type or shape
    ├── SchemaError               data that does not match the declared schema (null event time, ...)
    ├── ForeignError              stands in for an exception that cannot be pickled
    ├── StateFormatError          a snapshot this release cannot restore (its format version, or pre-rename)
    └── JobFailedError            a job stopped because one of its operators failed

Messages say what was wrong, what was expected, and what was got.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ActorflowError",
    "AsyncTimeoutError",
    "CircuitOpenError",
    "ConfigurationError",
    "ForeignError",
    "JobFailedError",
    "MailboxClosedError",
    "MailboxStateError",
    "MailboxThreadError",
    "RecordError",
    "ResultTypeError",
    "SchemaError",
    "StateFormatError",
    "UserFunctionError",
    "describe_value",
    "portable",
]


def describe_value(value: Any, limit: int = 200) -> str:
    """A bounded ``repr`` for error messages, so a huge record cannot flood a log."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ActorflowError(Exception):
    """The base of every error actorflow raises."""


class ConfigurationError(ActorflowError, ValueError):
    """An argument that cannot work, rejected when the object is built."""


class MailboxStateError(ActorflowError):
    """The mailbox's lifecycle state does not allow the operation."""


class MailboxClosedError(MailboxStateError):
    """A mail was offered to a mailbox that no longer accepts mails."""


class MailboxThreadError(ActorflowError):
    """A mailbox-thread-only operation was called from another thread."""


class RecordError(ActorflowError):
    """Processing of one record failed.

    ``operator`` names the operator, ``value`` and ``timestamp_ms`` identify the record, and
    ``__cause__`` holds the original exception when there is one.
    """

    def __init__(
        self,
        message: str,
        *,
        operator: str | None = None,
        value: Any = None,
        timestamp_ms: int | None = None,
        attempts: int | None = None,
    ) -> None:
        where = f"{operator}: " if operator and not message.startswith(f"{operator}: ") else ""
        super().__init__(f"{where}{message}")
        self.operator = operator
        self.value = value
        self.timestamp_ms = timestamp_ms
        self.attempts = attempts


    def __reduce__(self) -> tuple[Any, ...]:
        # Errors cross process boundaries (Ray pickles them); keyword arguments must survive.
        return (
            _rebuild_record_error,
            (type(self), str(self), self.operator, self.value, self.timestamp_ms, self.attempts, self.__cause__),
        )


def _rebuild_record_error(
    cls: type[RecordError], message: str, operator: str | None, value: Any, timestamp_ms: int | None,
    attempts: int | None, cause: BaseException | None,
) -> RecordError:
    error = cls(message, operator=operator, value=value, timestamp_ms=timestamp_ms, attempts=attempts)
    error.__cause__ = cause
    return error


class AsyncTimeoutError(RecordError, TimeoutError):
    """An async request had no result before its deadline."""


class CircuitOpenError(RecordError):
    """A record was not sent: the circuit breaker of its service was open (``Service(breaker=...)``)."""


class UserFunctionError(RecordError):
    """A user function raised; the original exception is the ``__cause__``."""


class ResultTypeError(RecordError, TypeError):
    """A user function returned a value of the wrong type or shape."""


class SchemaError(ActorflowError, ValueError):
    """Data that does not fit the declared schema."""


class StateFormatError(ActorflowError):
    """A snapshot this release cannot restore: another format version, no version at all, or a
    checkpoint written before the package was renamed to ``actorflow``. Never half-restored."""


class ForeignError(ActorflowError):
    """Stands in for an exception that cannot cross a process boundary (it does not pickle).

    Keeps its type name, message and traceback text.
    """

    def __init__(self, type_name: str, message: str, traceback_text: str = "") -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.traceback_text = traceback_text

    def __reduce__(self) -> tuple[Any, ...]:
        return (ForeignError, (self.type_name, str(self)[len(self.type_name) + 2 :], self.traceback_text))


def portable(error: BaseException) -> BaseException:
    """``error`` itself if it survives pickling, else the same error with its unpicklable parts replaced.

    A user's exception class with a custom ``__init__`` often does not unpickle; the job must
    still report which record failed and why.
    """
    import pickle
    import traceback

    def survives(e: BaseException) -> bool:
        try:
            pickle.loads(pickle.dumps(e))
            return True
        except Exception:
            return False

    if survives(error):
        return error
    cause = error.__cause__
    if isinstance(error, RecordError) and cause is not None and not survives(cause):
        stand_in = ForeignError(
            f"{type(cause).__module__}.{type(cause).__qualname__}", str(cause),
            "".join(traceback.format_exception(cause)),
        )
        rebuilt = _rebuild_record_error(
            type(error), str(error), error.operator, error.value, error.timestamp_ms, error.attempts, stand_in
        )
        if survives(rebuilt):
            return rebuilt
        rebuilt.value = describe_value(error.value)
        if survives(rebuilt):
            return rebuilt
    return ForeignError(
        f"{type(error).__module__}.{type(error).__qualname__}", str(error), "".join(traceback.format_exception(error))
    )


class JobFailedError(ActorflowError):
    """A job stopped because an operator failed; the operator's error is the ``__cause__``."""
