"""A benchmark's last line: its figures as one JSON object, also kept as the benchmark's latest results.

``benchmarks/results/<benchmark>.json`` holds the figures with the command that made them, when, at
which commit, and on what machine. ``docs/generate.py`` builds the performance page from these files.
``ACTORFLOW_BENCHMARK_RESULTS`` names another folder for them; ``-`` keeps none.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
_VERSIONS = ("ray", "raydp", "pyspark", "pyarrow")


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        model = platform.processor()
    return {
        "cpus": os.cpu_count(),
        "cpu": model,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "versions": {name: metadata.version(name) for name in _VERSIONS},
    }


def _commit() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev + ("+changes" if dirty else "")


def emit(benchmark: str, figures: dict[str, Any]) -> None:
    """Prints ``figures`` as the run's last line and keeps them, with their context, as the latest results."""
    print(json.dumps(figures), flush=True)
    folder = os.environ.get("ACTORFLOW_BENCHMARK_RESULTS", str(RESULTS))
    if folder == "-":
        return
    record = {
        "benchmark": benchmark,
        "command": " ".join(["python -m", f"benchmarks.{benchmark}", *sys.argv[1:]]),
        "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": _commit(),
        "machine": machine(),
        "figures": figures,
    }
    path = Path(folder) / f"{benchmark}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"kept as {path}", file=sys.stderr)
