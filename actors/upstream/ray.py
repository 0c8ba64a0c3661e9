"""Ray: what actorflow relies on that Ray 2.50 does not promise, and every access to ``ray._private``.

Verified on Ray 2.50.1. The rest of actorflow calls these functions instead of touching Ray's
private modules; ``tests/actors/test_upstream.py`` holds a canary for each.

- ``prestart_workers`` (switch ``ACTORFLOW_NO_PRESTART_WORKERS``): ``request_workers`` sends the
  raylet's own ``NodeManagerService.PrestartWorkers`` over gRPC (``PrestartWorkersRequest``:
  ``language``, ``job_id``, ``runtime_env_info``, ``keep_alive_duration_secs``, ``num_workers``),
  which Ray's Python API does not expose; ``job_workers`` scans this machine's processes for a
  job's workers (``RAY_JOB_ID`` in their environment), and ``idle_or_starting`` tells an idle one
  (``ray::IDLE``) or one still starting (``setup_worker.py``, ``default_worker.py``) apart. The
  policy (how many, when) is ``cluster.warm_workers``'s.
- ``idle_worker_keep`` (``ACTORFLOW_NO_IDLE_WORKER_KEEP``): ``system_config()``, the
  ``_system_config`` of a local Ray: an idle worker beyond the soft limit lives a minute, not a second.
- ``tracing_shims`` (``ACTORFLOW_NO_TRACING_SHIMS``): ``bind_private_methods`` unwraps the wrappers
  (``__wrapped__``) that ``ray.util.tracing.tracing_helper._inject_tracing_into_class`` puts around
  every method of an actor's class.
- ``console_filter`` (``ACTORFLOW_NO_CONSOLE_FILTER``): ``filter_log_echo`` wraps the handler
  ``ray_print_logs`` of ``ray._private.ray_logging.global_worker_stdstream_dispatcher``;
  ``stderr_of_children_filtered`` filters fd 2 of the JVMs Spark starts. Both drop Ray's native
  client's "GcsClient has no Cluster ID set" lines (``NOISE``). ``filter_log_echo`` also wraps
  ``ray._private.worker.print_to_stdstream``, through which ``listen_error_messages`` prints the
  raylet's notes, dropping "N PYTHON worker processes have been started" (``WORKER_POOL_NOTE``):
  actorflow starts and keeps those workers on purpose (``cluster.warm_workers``).
  ``quiet_arrow_fallback`` turns the warning with a traceback that
  ``ray._private.arrow_serialization`` logs when a table with a map or list-of-struct column
  falls back to Arrow IPC (``ARROW_FALLBACK``) into a debug line: the result is right.
- ``echo_imports`` (``ACTORFLOW_NO_ECHO_IMPORTS``): ``import_for_log_echo`` imports, before
  ``ray.init``, the modules the log echo thread imports at its first lines: a main thread importing
  Ray's State API at that moment shares part of their import chain, and two threads in one chain
  can meet a half-initialised module ("cannot import name 'DictCount' ... partially initialized").
- Private reads without a switch (actorflow needs them): ``current_runtime_env``,
  ``owner_addresses``, ``dashboard_address``, ``DESERIALIZATION_MODULES``, and ``raylet_pid``
  (the raylet's ``--node_id`` flag and its workers' ``RAY_RAYLET_PID``), which tells this Ray's
  workers from another's on the same machine: job ids repeat across Ray instances.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from . import enabled, failed

__all__ = [
    "DESERIALIZATION_MODULES", "NOISE", "RayProcess", "bind_private_methods", "current_runtime_env",
    "dashboard_address", "filter_log_echo", "idle_or_starting", "import_for_log_echo", "job_workers",
    "owner_addresses", "quiet_arrow_fallback", "raylet_pid", "request_workers", "starting_script",
    "stderr_of_children_filtered", "system_config",
]

# -- prestart_workers ---------------------------------------------------------------------------------


def request_workers(address: str, job_id: bytes, serialized_runtime_env: str, count: int, keep_alive_s: int) -> None:
    """Ask the raylet at ``address`` to start ``count`` Python workers for Ray job ``job_id`` in
    that runtime environment, kept idle ``keep_alive_s``; raises what gRPC raises."""
    import grpc
    from ray.core.generated import common_pb2, node_manager_pb2, node_manager_pb2_grpc, runtime_environment_pb2

    # A channel per request, closed at once: one left open until the raylet stops at exit
    # makes gRPC log a GOAWAY line on the user's console.
    with grpc.insecure_channel(address) as channel:
        node_manager_pb2_grpc.NodeManagerServiceStub(channel).PrestartWorkers(
            node_manager_pb2.PrestartWorkersRequest(
                language=common_pb2.PYTHON,
                job_id=job_id,
                runtime_env_info=runtime_environment_pb2.RuntimeEnvInfo(serialized_runtime_env=serialized_runtime_env),
                keep_alive_duration_secs=keep_alive_s,
                num_workers=count,
            ),
            timeout=2,
        )


class RayProcess(NamedTuple):
    """A process of a Ray job on this machine."""

    pid: int
    cmdline: list[str]
    env: dict[str, str]
    created: float  # when its process started, in seconds since the epoch


def job_workers(job: str, node_id: str | None = None) -> Iterator[RayProcess]:
    """Each process of Ray job ``job`` (hex) on this machine: Ray sets ``RAY_JOB_ID`` in its workers.

    Job ids repeat across Ray instances (each one's first driver is job ``01000000``): with
    ``node_id`` (this driver's node), only the workers of that node's raylet, whose pid Ray sets
    in them as ``RAY_RAYLET_PID``, and none of another Ray on the same machine.
    """
    import psutil

    raylet = None if node_id is None else raylet_pid(node_id)
    for process in psutil.process_iter(["cmdline", "environ", "create_time"]):
        cmdline, env, created = process.info["cmdline"], process.info["environ"], process.info["create_time"]
        if cmdline and env and env.get("RAY_JOB_ID") == job and (raylet is None or env.get("RAY_RAYLET_PID") == str(raylet)):
            yield RayProcess(process.pid, cmdline, env, created)


@functools.cache
def raylet_pid(node_id: str) -> int | None:
    """The pid of node ``node_id``'s raylet on this machine (its command line names its node), or
    None: not on this machine, or Ray no longer passes ``--node_id``."""
    import psutil

    flag = f"--node_id={node_id}"
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"]
        if cmdline and cmdline[0].endswith("/raylet") and flag in cmdline:
            return int(process.pid)
    return None


def starting_script(cmdline: list[str]) -> str | None:
    """The script a worker process that is not up yet runs (``setup_worker.py``, which sets up
    its runtime environment, then ``default_worker.py``); None for any other process.

    A worker names itself ``ray::IDLE`` once it is up, ``ray::<task or actor>`` once busy.

    >>> starting_script(["python", "/x/ray/_private/workers/default_worker.py", "--node-ip-address=1"])
    'default_worker.py'
    """
    if cmdline[0].startswith("ray::"):
        return None
    return next((name for part in cmdline[:3] for name in ("setup_worker.py", "default_worker.py") if part.endswith(name)),
                None)


def idle_or_starting(cmdline: list[str]) -> bool:
    """Whether a worker is idle (``ray::IDLE``) or up soon; one still setting up its runtime
    environment does not carry that environment yet, so only ``default_worker.py`` counts."""
    return cmdline[0].startswith("ray::IDLE") or starting_script(cmdline) == "default_worker.py"


def current_runtime_env() -> str:
    """This process's runtime environment as Ray serialised it (the core worker's)."""
    import ray

    return ray._private.worker.global_worker.core_worker.get_current_runtime_env()  # type: ignore[attr-defined, no-any-return]


# -- idle_worker_keep ---------------------------------------------------------------------------------

#: How long a local Ray keeps an idle worker beyond its soft limit; Ray's default is 1,000 ms.
IDLE_WORKER_KEEP_MS = 60_000


def system_config() -> dict[str, Any] | None:
    """The ``_system_config`` for ``ray.init`` of a local Ray, or None where the switch is set."""
    if not enabled("idle_worker_keep"):
        return None
    return {"idle_worker_killing_time_threshold_ms": IDLE_WORKER_KEEP_MS}


# -- tracing_shims ------------------------------------------------------------------------------------


def bind_private_methods(actor: Any) -> int:
    """Bind each private method of ``actor``'s class (``_name``, not ``__name__``) to the instance
    as the function it was before Ray wrapped it; returns how many. A method Ray did not wrap is
    left as it is, and so is every one where ``ACTORFLOW_NO_TRACING_SHIMS`` is set.

    Ray wraps every method of a class it makes into an actor in a function that looks for a
    tracing context: a Python frame and a check on every call. Remote calls go through the class,
    so they keep their shims; only private methods, which no caller reaches through Ray, are bound.
    """
    if not enabled("tracing_shims"):
        return 0
    bound = 0
    for name, member in inspect.getmembers(type(actor), inspect.isfunction):
        if name.startswith("_") and not name.startswith("__"):
            original = getattr(member, "__wrapped__", None)
            if original is not None:
                setattr(actor, name, original.__get__(actor))
                bound += 1
    return bound


# -- console_filter -----------------------------------------------------------------------------------

NOISE = re.compile(r"gcs_client\.cc:\d+: GcsClient has no Cluster ID set")
"""Lines of Ray's native client that say nothing to a user: every JVM of Spark on Ray connects
through it before Ray's logging is set up there, so it logs at INFO to stderr, twice per JVM."""

WORKER_POOL_NOTE = re.compile(r"PYTHON worker processes have been started on node")
"""The raylet's note that a node runs many workers: actorflow prestarts them on purpose."""

ARROW_FALLBACK = "Failed to complete optimized serialization of Arrow Table"
"""What Ray logs, with a traceback, where a column's type takes Arrow IPC instead of its zero-copy
reducer (a map, a list of structs): slower, and right."""

_ECHO_HANDLER = "ray_print_logs"  # the name under which ray.init registers its log echo


class _EchoFilter:
    def __init__(self, echo: Callable[[dict[str, Any]], None]) -> None:
        self.echo = echo

    def __call__(self, batch: dict[str, Any]) -> None:
        lines = [line for line in batch.get("lines", ()) if not NOISE.search(line)]
        if lines:
            self.echo({**batch, "lines": lines})


class _StdstreamFilter:
    def __init__(self, print_to_stdstream: Callable[..., None]) -> None:
        self.print_to_stdstream = print_to_stdstream

    def __call__(self, data: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        lines = [line for line in data.get("lines", ()) if not (NOISE.search(line) or WORKER_POOL_NOTE.search(line))]
        if lines:
            self.print_to_stdstream({**data, "lines": lines}, *args, **kwargs)


def filter_log_echo() -> bool:
    """Filter the lines that Ray echoes from its workers' logs and its raylets' notes to this
    driver (idempotent); True if the echo is filtered now. Reported once where Ray registers no
    echo under that name."""
    if not enabled("console_filter"):
        return False
    try:
        import ray._private.worker as worker
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

        if not isinstance(worker.print_to_stdstream, _StdstreamFilter):
            worker.print_to_stdstream = _StdstreamFilter(worker.print_to_stdstream)

        handlers = list(dispatcher.handlers)
        filtered = False
        for name, handler in handlers:
            if name == _ECHO_HANDLER:
                if not isinstance(handler, _EchoFilter):
                    dispatcher.remove_handler(name)
                    dispatcher.add_handler(name, _EchoFilter(handler))
                filtered = True
    except Exception as error:  # noqa: BLE001 - the console shows two more lines per JVM
        failed("console_filter", error)
        return False
    return filtered


class _ArrowFallbackNote(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and str(record.msg).startswith(ARROW_FALLBACK):
            record.levelno, record.levelname, record.exc_info, record.exc_text = logging.DEBUG, "DEBUG", None, None
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def quiet_arrow_fallback() -> None:
    """Make Ray's warning that a table falls back to Arrow IPC a debug line, in this process
    (idempotent): where Ray pickles a table with a map or list-of-struct column."""
    if not enabled("console_filter"):
        return
    arrow_logger = logging.getLogger("ray._private.arrow_serialization")
    if not any(isinstance(f, _ArrowFallbackNote) for f in arrow_logger.filters):
        arrow_logger.addFilter(_ArrowFallbackNote())


@contextlib.contextmanager
def stderr_of_children_filtered() -> Iterator[threading.Thread | None]:
    """Give the child processes started inside a filtered stderr, for as long as they live.

    For the duration of the block, file descriptor 2 is a pipe that a daemon thread copies to the
    real stderr, line by line, without the lines of :data:`NOISE`. The children keep the pipe, so
    the filter lasts until the last of them ends; this process gets its own stderr back at once.
    Yields the copying thread (None where stderr is no file descriptor to redirect, or where
    ``ACTORFLOW_NO_CONSOLE_FILTER`` is set).
    """
    if not enabled("console_filter"):
        yield None
        return
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


# -- echo_imports -------------------------------------------------------------------------------------

#: What the log echo thread imports at its first batch of lines.
LOG_ECHO_MODULES = ("ray._private.event.event_logger", "ray.autoscaler.v2.utils")


def import_for_log_echo() -> bool:
    """Import ``LOG_ECHO_MODULES`` now, before ``ray.init`` starts the echo thread; True if done."""
    if not enabled("echo_imports"):
        return False
    try:
        for module in LOG_ECHO_MODULES:
            importlib.import_module(module)
    except ImportError as error:
        failed("echo_imports", error)
        return False
    return True


# -- private reads --------------------------------------------------------------------------------


#: What Ray imports when it first deserializes in a worker (an actor's own arguments, then a
#: batch): about 30 ms, mostly pydantic. A prepared worker imports them before a job needs them.
DESERIALIZATION_MODULES = ("ray._common.pydantic_compat", "ray._private.arrow_serialization", "ray.experimental.channel")


def owner_addresses(refs: list[Any]) -> list[Any]:
    """The serialized address of each object's owner (the core worker's), as RayDP's JVM path
    needs them to read the objects."""
    import ray

    core_worker = ray._private.worker.global_worker.core_worker  # type: ignore[attr-defined]
    return [core_worker.get_owner_address(ref) for ref in refs]


def dashboard_address() -> bytes | None:
    """The address the connected cluster's dashboard noted in the GCS, or None if it has none."""
    from ray._private import ray_constants
    from ray.experimental import internal_kv

    return internal_kv._internal_kv_get(  # type: ignore[no-any-return]
        ray_constants.DASHBOARD_ADDRESS, namespace=ray_constants.KV_NAMESPACE_DASHBOARD)
