"""Keep a known, harmless line of Ray's native client off the user's console.

Every JVM of Spark on Ray (Spark's driver, RayDP's app master, the executors) connects to Ray
through Ray's C++ client before Ray's logging is set up in it, so the client logs at INFO to
stderr whatever ``RAY_BACKEND_LOG_LEVEL`` says: "GcsClient has no Cluster ID set, and won't fetch
from GCS", twice per JVM. Two paths carry those lines to the console: the driver JVM writes to
this process's stderr, and the other JVMs' lines come back through Ray's echo of worker logs.
Each path gets a filter that drops those lines and passes every other line unchanged.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["NOISE", "drop_noise_from_ray_log_echo", "stderr_of_children_filtered"]

NOISE = re.compile(r"gcs_client\.cc:\d+: GcsClient has no Cluster ID set")
"""Lines that say nothing to a user of actorflow, whichever process prints them."""

_ECHO_HANDLER = "ray_print_logs"  # the name under which ray.init registers its log echo


class _EchoFilter:
    def __init__(self, echo: Callable[[dict[str, Any]], None]) -> None:
        self.echo = echo

    def __call__(self, batch: dict[str, Any]) -> None:
        lines = [line for line in batch.get("lines", ()) if not NOISE.search(line)]
        if lines:
            self.echo({**batch, "lines": lines})


def drop_noise_from_ray_log_echo() -> None:
    """Filter the lines that Ray echoes from its workers' logs to this driver (idempotent)."""
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    for name, handler in list(dispatcher.handlers):
        if name == _ECHO_HANDLER and not isinstance(handler, _EchoFilter):
            dispatcher.remove_handler(name)
            dispatcher.add_handler(name, _EchoFilter(handler))


@contextlib.contextmanager
def stderr_of_children_filtered() -> Iterator[threading.Thread | None]:
    """Give the child processes started inside a filtered stderr, for as long as they live.

    For the duration of the block, file descriptor 2 is a pipe that a daemon thread copies to the
    real stderr, line by line, without the lines of :data:`NOISE`. The children keep the pipe, so
    the filter lasts until the last of them ends; this process gets its own stderr back at once.
    Yields the copying thread (None where stderr is no file descriptor to redirect).
    """
    try:
        sys.stderr.flush()
        real = os.dup(2)
    except (OSError, ValueError):
        yield None
        return
    read_end, write_end = os.pipe()
    copier = threading.Thread(target=_copy_lines, args=(read_end, real), name="actorflow-stderr-filter", daemon=True)
    copier.start()
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield copier
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        os.dup2(real, 2)


def _copy_lines(read_end: int, real: int) -> None:
    with os.fdopen(read_end, "rb") as lines, os.fdopen(real, "wb", buffering=0) as out:
        for line in lines:
            if not NOISE.search(line.decode(errors="replace")):
                out.write(line)
