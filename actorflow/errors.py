"""The exceptions of actorflow, all derived from ``ActorflowError``.

>>> import actorflow as af
>>> issubclass(af.errors.ConfigurationError, af.errors.ActorflowError)
True
"""

from .operators.errors import (
    ActorflowError,
    AsyncTimeoutError,
    ConfigurationError,
    ForeignError,
    JobFailedError,
    MailboxClosedError,
    MailboxStateError,
    MailboxThreadError,
    RecordError,
    ResultTypeError,
    SchemaError,
    StateFormatError,
    UserFunctionError,
)

__all__ = [
    "ActorflowError", "AsyncTimeoutError", "ConfigurationError", "ForeignError", "JobFailedError",
    "MailboxClosedError", "MailboxStateError", "MailboxThreadError", "RecordError", "ResultTypeError",
    "SchemaError", "StateFormatError", "UserFunctionError",
]
