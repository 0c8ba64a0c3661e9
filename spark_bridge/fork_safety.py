"""Keep PySpark's connections to its JVM alive when this process forks a child.

PySpark talks to its JVM through py4j's pinned-thread mode: each Python thread has its own socket,
held by a thread-local, with a finalizer that shuts the socket down when the thread's local data
goes. A child forked with a ``preexec_fn`` (``ray.init()`` starting a local cluster,
``on_spark_cluster`` starting Ray's head node) runs Python's after-fork handling, which drops the
local data of every thread but the forking one. The finalizers then run in the child and call
``shutdown()`` on sockets the child shares with its parent, so the JVM closes its end of the
parent's connections. The parent's next call on one of them fails with "Answer from Java side is
empty" or "Connection reset by peer"; py4j logs it as an ERROR with two tracebacks when it cannot
resend the call (a reply already half read, or the background thread that releases Java objects).

:func:`install` makes those finalizers act only in the process that created them. A child closes
nothing that way; its copies of the sockets go when it execs or exits.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["install"]

_MARK = "_actorflow_owner_pid"


def install() -> bool:
    """Guard py4j's thread-local connection finalizer against forked children (idempotent).

    Returns False where this py4j has no such finalizer (a version without pinned-thread cleanup).
    """
    try:
        from py4j.clientserver import ThreadLocalConnectionFinalizer
    except ImportError:
        return False
    if getattr(ThreadLocalConnectionFinalizer, _MARK, None) is not None:
        return True
    created = ThreadLocalConnectionFinalizer.__init__
    finalize = ThreadLocalConnectionFinalizer.__del__
    # Finalizers made before install() are taken to belong to the process that installs it.
    installed_in = os.getpid()

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        created(self, *args, **kwargs)
        setattr(self, _MARK, os.getpid())

    def __del__(self: Any) -> None:
        if getattr(self, _MARK, installed_in) == os.getpid():
            finalize(self)

    ThreadLocalConnectionFinalizer.__init__ = __init__  # type: ignore[method-assign]
    ThreadLocalConnectionFinalizer.__del__ = __del__  # type: ignore[method-assign]
    setattr(ThreadLocalConnectionFinalizer, _MARK, installed_in)
    return True
