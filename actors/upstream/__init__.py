"""Every workaround of an upstream project's behaviour, in one place: one module per project.

A workaround leans on something its project does not promise: a private module, a gRPC call of
the raylet, the attributes of a wrapper, a C library's tuning knob. An upgrade of that project can
break it silently. So each one here

- is listed in ``WORKAROUNDS``, with the versions it was verified on, what it does, and what it
  costs when it is off;
- has a switch, the environment variable ``ACTORFLOW_NO_<NAME>=1``, that turns it off
  (``enabled(name)`` reads it);
- has a canary test (``tests/actors/test_upstream.py``) that fails, naming the version, once the
  upstream behaviour it relies on changes, or the installed version of a pinned project (Ray, py4j,
  CPython's minor version) is not among those verified; for glibc and Linux, whose versions vary
  by machine, the canaries check the behaviour only;
- reports a failure once per process as a warning that names it, its switch and the installed
  version of its project (``failed``). A workaround that cannot apply costs speed, never a job,
  unless ``WORKAROUNDS[name].correctness`` says what it costs.

Nothing is patched at import time. ``start("driver")`` turns on the driver's before it starts Ray
(``spark_bridge.ensure_ray`` and ``on_spark_cluster`` call it), ``start("worker")`` a new Ray worker's (the
``worker_process_setup_hook`` of ``cluster.warm_workers``). The rest act where they are called,
each behind its switch: an actor unwraps its own methods as it starts, a whole-batch actor tunes
its heap, the console filter wraps the start of Spark's JVMs.

Modules: ``ray`` (the raylet's ``PrestartWorkers``, the scan for ``ray::IDLE`` processes,
``_system_config``, tracing shims, the log echo, and every access to ``ray._private``),
``cpython`` (the cyclic collector), ``glibc`` (``mallopt``), ``linux`` (transparent huge pages,
``madvise`` of the object store's pages), ``py4j`` (its connection finalizers across a fork).

>>> WORKAROUNDS["mallopt"].switch
'ACTORFLOW_NO_MALLOPT'
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Literal

__all__ = ["WORKAROUNDS", "Workaround", "enabled", "failed", "in_a_call_to_the_jvm", "installed_version", "start"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Workaround:
    """One workaround of an upstream project's behaviour (see the package's docstring)."""

    name: str
    module: str  # its module in this package
    upstream: str  # the distribution whose behaviour it relies on ("linux": the kernel)
    verified: tuple[str, ...]  # the versions of ``upstream`` it was verified on
    does: str
    cost_off: str  # what turning it off costs
    correctness: str = ""  # what a job loses without it; empty: speed or console only

    @property
    def switch(self) -> str:
        """The environment variable that turns it off."""
        return f"ACTORFLOW_NO_{self.name.upper()}"


_RAY = ("2.50.1",)
WORKAROUNDS: dict[str, Workaround] = {w.name: w for w in (
    Workaround("prestart_workers", "ray", "ray", _RAY,
               "asks the raylet over gRPC (PrestartWorkers) for idle workers for the next job, counting "
               "the ray::IDLE processes first",
               "each job's actors and blocking calls start new worker processes (0.3-3 s each)"),
    Workaround("idle_worker_keep", "ray", "ray", _RAY,
               "a local Ray keeps an idle worker a minute (_system_config "
               "idle_worker_killing_time_threshold_ms), not a second",
               "the next job's blocking calls start new worker processes"),
    Workaround("tracing_shims", "ray", "ray", _RAY,
               "binds an actor's private methods to itself, past Ray's tracing wrappers",
               "a Python frame and a check per call between an actor's own methods"),
    Workaround("console_filter", "ray", "ray", _RAY,
               "drops Ray's native 'GcsClient has no Cluster ID set' lines from the log echo and "
               "from fd 2 of the JVMs Spark starts, the raylet's 'N PYTHON worker processes have been "
               "started' note, and makes Ray's Arrow IPC fallback warning a debug line",
               "two harmless INFO lines per Spark JVM, a note on the workers actorflow keeps on purpose, "
               "and a 40-line traceback for each map or list-of-struct column type, on the console"),
    Workaround("echo_imports", "ray", "ray", _RAY,
               "imports the modules Ray's log echo thread imports at its first lines, before it starts",
               "a rare ImportError ('partially initialized module') in a command that imports Ray's "
               "State API as the first lines come",
               correctness="a CLI command (actorflow status) may fail with an ImportError"),
    Workaround("gc_freeze", "cpython", "cpython", ("3.11",),
               "a prepared worker collects once and freezes what its imports built",
               "an actor's first collection walks every imported object (about 40 ms)"),
    Workaround("mallopt", "glibc", "glibc", ("2.36",),
               "raises M_MMAP_THRESHOLD and M_TRIM_THRESHOLD in whole-batch actors, so freed "
               "buffers are reused",
               "a page fault per page of each batch's buffers"),
    Workaround("huge_pages", "linux", "linux", ("6.18",),
               "turns transparent huge pages off in whole-batch actors (PR_SET_THP_DISABLE)",
               "2 MiB pages zeroed at first touch: up to 40% less throughput in window stages"),
    Workaround("store_pages", "linux", "linux", ("6.18",),
               "drops an actor's page-table entries of the object store's pages (madvise MADV_DONTNEED)",
               "an actor's RSS grows with the data that passed through it (the store's memory, not its own)"),
    Workaround("py4j_fork", "py4j", "py4j", ("0.10.9.7",),
               "py4j's thread-local connection finalizers act only in the process that made them",
               "after Ray forks a child, the driver's calls to its JVM fail once and are resent, "
               "with ERROR tracebacks",
               correctness="a py4j call that cannot be resent (a reply half read) fails"),
)}

_warned: set[str] = set()
_lock = threading.Lock()


def enabled(name: str) -> bool:
    """Whether workaround ``name`` is on: unless ``ACTORFLOW_NO_<NAME>`` is set to anything but
    ``""`` or ``"0"``.

    >>> enabled("mallopt") in (True, False)
    True
    """
    if name not in WORKAROUNDS:
        raise KeyError(f"no workaround {name!r}; expected one of {sorted(WORKAROUNDS)}")
    return os.environ.get(WORKAROUNDS[name].switch, "") in ("", "0")


def installed_version(upstream: str) -> str:
    """The installed version of ``upstream`` (a distribution, or "cpython", "glibc", "linux")."""
    import platform

    if upstream == "cpython":
        return ".".join(platform.python_version_tuple()[:2])
    if upstream == "glibc":
        return platform.libc_ver()[1] or "none"
    if upstream == "linux":
        return ".".join(platform.release().split(".")[:2]) if platform.system() == "Linux" else "none"
    try:
        return metadata.version(upstream)
    except metadata.PackageNotFoundError:
        return "none"


def failed(name: str, error: BaseException | str) -> None:
    """Report that workaround ``name`` could not apply: a warning, once per process."""
    with _lock:
        if name in _warned:
            return
        _warned.add(name)
    w = WORKAROUNDS[name]
    version = installed_version(w.upstream)
    verified = "" if version in w.verified else f", not among those verified ({', '.join(w.verified)})"
    consequence = f"; {w.correctness}" if w.correctness else ""
    _log.warning("actorflow's workaround %r (actors.upstream.%s) failed with %s %s%s: %s. It costs: %s%s. "
                 "%s=1 turns it off.", name, w.module, w.upstream, version, verified, error, w.cost_off,
                 consequence, w.switch)


def in_a_call_to_the_jvm(frame: Any) -> bool:
    """Whether ``frame`` (a signal handler's) or a caller of it runs in PySpark's JVM client (a
    private read of its module names: ``py4j.in_a_call_to_the_jvm``)."""
    from . import py4j

    return py4j.in_a_call_to_the_jvm(frame)


def start(where: Literal["driver", "worker"]) -> list[str]:
    """Turn on this process's workarounds; the names of those that took (idempotent).

    ``"driver"``: before it starts Ray, which forks (py4j's finalizers, the log echo's imports).
    ``"worker"``: in a Ray worker once it has imported what the actors need (freezes the collector).
    """
    started = []
    if where == "driver":
        from . import py4j, ray

        if py4j.guard_finalizers_across_fork():
            started.append("py4j_fork")
        if ray.import_for_log_echo():
            started.append("echo_imports")
    elif where == "worker":
        from . import cpython

        if cpython.freeze_what_is_built():
            started.append("gc_freeze")
    else:
        raise ValueError(f"where must be 'driver' or 'worker', got {where!r}")
    return started
