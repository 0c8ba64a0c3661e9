"""py4j: keep PySpark's connections to its JVM alive when this process forks a child.

Verified on py4j 0.10.9.7 (``py4j.clientserver.ThreadLocalConnectionFinalizer`` with ``__init__``
and ``__del__``, as PySpark 3.5.7 ships it). Switch: ``ACTORFLOW_NO_PY4J_FORK``.

PySpark talks to its JVM through py4j's pinned-thread mode: each Python thread has its own socket,
held by a thread-local, with a finalizer that shuts the socket down when the thread's local data
goes. A child forked with a ``preexec_fn`` (``ray.init()`` starting a local cluster,
``on_spark_cluster`` starting Ray's head node) runs Python's after-fork handling, which drops the
local data of every thread but the forking one. The finalizers then run in the child and call
``shutdown()`` on sockets the child shares with its parent, so the JVM closes its end of the
parent's connections. The parent's next call on one of them fails with "Answer from Java side is
empty" or "Connection reset by peer"; py4j logs it as an ERROR with two tracebacks when it cannot
resend the call (a reply already half read, or the background thread that releases Java objects).

A private read without a switch: ``in_a_call_to_the_jvm`` tells whether a frame is inside a
call to the JVM, by its modules' names (``py4j.java_gateway``, ``py4j.clientserver``): a Ctrl-C
there must not interrupt it (``spark_bridge.interrupts``).

``guard_finalizers_across_fork`` makes those finalizers act only in the process that created
them. A child closes nothing that way; its copies of the sockets go when it execs or exits. py4j
is imported only here, when the guard is asked for: it is neither pyspark nor raydp, but this ring
does not load Spark's client on import.
"""

from __future__ import annotations

import os
from typing import Any

from . import enabled, failed

__all__ = ["MARK", "guard_finalizers_across_fork", "in_a_call_to_the_jvm"]

#: The attribute the guard sets on the finalizer's class (and on each finalizer: its process).
MARK = "_actorflow_owner_pid"


def in_a_call_to_the_jvm(frame: Any) -> bool:
    """Whether ``frame`` (a signal handler's) or a caller of it runs in py4j: a call to the JVM."""
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).startswith("py4j."):
            return True
        frame = frame.f_back
    return False


def guard_finalizers_across_fork() -> bool:
    """Guard py4j's thread-local connection finalizer against forked children (idempotent).

    Returns False where py4j is not installed, where this py4j has no such finalizer (a version
    without pinned-thread cleanup: reported once), or where ``ACTORFLOW_NO_PY4J_FORK`` is set.
    """
    if not enabled("py4j_fork"):
        return False
    try:
        import py4j.clientserver
    except ImportError:
        return False  # no Spark client here: nothing to guard
    finalizer = getattr(py4j.clientserver, "ThreadLocalConnectionFinalizer", None)
    if finalizer is None or not hasattr(finalizer, "__del__"):
        failed("py4j_fork", "py4j.clientserver has no ThreadLocalConnectionFinalizer with a __del__")
        return False
    if getattr(finalizer, MARK, None) is not None:
        return True
    created = finalizer.__init__
    finalize = finalizer.__del__
    # Finalizers made before the guard are taken to belong to the process that installs it.
    installed_in = os.getpid()

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        created(self, *args, **kwargs)
        setattr(self, MARK, os.getpid())

    def __del__(self: Any) -> None:
        if getattr(self, MARK, installed_in) == os.getpid():
            finalize(self)

    finalizer.__init__ = __init__
    finalizer.__del__ = __del__
    setattr(finalizer, MARK, installed_in)
    return True
