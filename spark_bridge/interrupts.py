"""Ctrl-C during a call that waits on Spark: its Spark jobs are cancelled and the call raises
``KeyboardInterrupt``, without py4j's tracebacks.

PySpark's own handler of SIGINT cancels every job from inside the interrupted call, on the
connection to the JVM that call is reading: the JVM client then logs "Exception while sending
command" with a traceback or two for each call, some sixty lines before the interrupt itself.
Within ``interruptible()``, a Ctrl-C that lands inside a call to the JVM lets that call be: the jobs are
cancelled from another thread (its own connection), the call returns with Spark's error, and the
block raises ``KeyboardInterrupt`` in its place. A Ctrl-C anywhere else (waiting for Ray, in
Python) raises at once, as usual, and cancels the jobs the same way. A second Ctrl-C raises at
once wherever it lands.

Threading model: signal handlers run on the main thread; on any other thread ``interruptible``
does nothing (only the main thread gets SIGINT).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from actorflow.actors.upstream import in_a_call_to_the_jvm

__all__ = ["interruptible"]

logger = logging.getLogger(__name__)

_active = False  # an interruptible block runs on the main thread
_CANCELLED = "interrupted; this call's Spark jobs were cancelled"


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Within the block, Ctrl-C cancels this process's Spark jobs and raises ``KeyboardInterrupt``
    without interrupting a call to the JVM (see the module docstring). Blocks nest: the outermost
    one acts."""
    global _active

    if _active or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous in (signal.SIG_IGN, None):  # ignored (a background job), or set outside Python
        yield
        return
    interrupted = False

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        nonlocal interrupted
        first, interrupted = not interrupted, True
        if first:
            threading.Thread(target=_cancel_spark_jobs, name="actorflow-cancel-spark-jobs", daemon=True).start()
            if in_a_call_to_the_jvm(frame):
                return  # the call returns once its job is cancelled; the block raises then
        raise KeyboardInterrupt(_CANCELLED)

    signal.signal(signal.SIGINT, on_sigint)
    _active = True
    try:
        yield
    except Exception:
        if interrupted:
            raise KeyboardInterrupt(_CANCELLED) from None
        raise
    finally:
        _active = False
        signal.signal(signal.SIGINT, previous)
    if interrupted:
        raise KeyboardInterrupt(_CANCELLED)


def _cancel_spark_jobs() -> None:
    from pyspark import SparkContext

    context: Any = SparkContext._active_spark_context
    if context is None:
        return
    try:
        context.cancelAllJobs()
    except Exception as error:  # noqa: BLE001 - the interrupt goes on; the jobs end with the session
        logger.debug("cancelling Spark's jobs after Ctrl-C failed: %s", error)
