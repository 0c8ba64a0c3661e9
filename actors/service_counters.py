"""Service counters that outlive their process: an instance's ``service_*`` counts live in a
memory-mapped file on the node (``/dev/shm`` where there is one), so that the calls an instance
made before it was killed still count. The job reads the files of its killed instances when it
ends, adds their counts to the job's figures, and removes them.

One file per job, instance (its name, with the attempt) and service:
``<root>/actorflow-counters/<job>/<instance>~<service>``, the names quoted for a file system.
"""

from __future__ import annotations

import mmap
import shutil
import tempfile
from pathlib import Path
from collections.abc import Collection
from typing import Any
from urllib.parse import quote, unquote

from actorflow.operators.service_gate import COUNTERS

__all__ = ["counters_of", "open_counters", "remove_counters"]

_SIZE = 8 * len(COUNTERS)


def _root() -> Path:
    shm = Path("/dev/shm")
    return (shm if shm.is_dir() else Path(tempfile.gettempdir())) / "actorflow-counters"


def _job_dir(job: str) -> Path:
    return _root() / quote(job, safe="")


def open_counters(job: str, instance: str, service: str) -> Any:
    """The counters of one instance's service, as doubles, zero at first."""
    folder = _job_dir(job)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{quote(instance, safe='')}~{quote(service, safe='')}"
    with open(path, "w+b") as file:
        file.truncate(_SIZE)
        mapped = mmap.mmap(file.fileno(), _SIZE)
    return memoryview(mapped).cast("d")


def counters_of(job: str, *, skip: Collection[str] = ()) -> list[dict[str, Any]]:
    """The counts of the job's instances on this node, but those named in ``skip``, as figures
    (``{"name": instance, "services": {service: {"service_calls": ...}}}``)."""
    folder = _job_dir(job)
    by_instance: dict[str, dict[str, dict[str, float]]] = {}
    for path in sorted(folder.glob("*~*")) if folder.is_dir() else []:
        instance, _, service = path.name.partition("~")
        instance, service = unquote(instance), unquote(service)
        if instance in skip:
            continue
        data = memoryview(path.read_bytes()[:_SIZE]).cast("d")
        if len(data) != len(COUNTERS):
            continue  # a file cut short: its process died while it was made, before any count
        by_instance.setdefault(instance, {})[service] = {f"service_{name}": int(data[i]) for i, name in enumerate(COUNTERS)}
    return [{"name": instance, "services": services} for instance, services in by_instance.items()]


def remove_counters(job: str) -> None:
    shutil.rmtree(_job_dir(job), ignore_errors=True)
