"""The exceptions of actorflow, all derived from ``ActorflowError``.

>>> import actorflow as af
>>> issubclass(af.errors.ConfigurationError, af.errors.ActorflowError)
True
>>> issubclass(af.errors.UnfinishedRunError, af.errors.CheckpointError)
True

``CheckpointError``, ``UnfinishedRunError`` and ``SparkSessionError`` load on first use (their
modules bring pyarrow's filesystems and Spark's session).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .operators.errors import (
    ActorflowError,
    AsyncTimeoutError,
    CircuitOpenError,
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

_LATER = {
    "CheckpointError": "actorflow.cluster.checkpoints.storage",
    "UnfinishedRunError": "actorflow.cluster.checkpoints.storage",
    "SparkSessionError": "actorflow.spark_bridge.session",
}

__all__ = [
    "ActorflowError", "AsyncTimeoutError", "CheckpointError", "CircuitOpenError", "ConfigurationError", "ForeignError", "JobFailedError",
    "MailboxClosedError", "MailboxStateError", "MailboxThreadError", "RecordError", "ResultTypeError",
    "SchemaError", "SparkSessionError", "StateFormatError", "UnfinishedRunError", "UserFunctionError",
]

if TYPE_CHECKING:
    from .cluster.checkpoints.storage import CheckpointError, UnfinishedRunError
    from .spark_bridge.session import SparkSessionError


def __getattr__(name: str) -> Any:
    if name not in _LATER:
        raise AttributeError(f"module 'actorflow.errors' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LATER[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LATER))
