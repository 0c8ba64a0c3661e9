"""A standalone Spark cluster on 127.0.0.1: a master and one worker, for trying ``on_spark_cluster``.

>>> with standalone_spark_cluster(cores=4) as cluster:            # doctest: +SKIP
...     spark = SparkSession.builder.master(cluster.url).getOrCreate()

The master and the worker are the scripts of the installed pyspark (``spark-class``), started in
process groups of their own, with this interpreter's ``bin/`` on their ``PATH`` and as
``PYSPARK_PYTHON``: the executors' Python workers start Ray's worker nodes with ``ray start`` and
run actorflow. Leaving the block stops both and deletes their directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .session import SparkSessionError

__all__ = ["StandaloneSpark", "standalone_spark_cluster"]


@dataclass(frozen=True)
class StandaloneSpark:
    """A running master and worker: ``url`` for ``SparkSession.builder.master``; ``env`` the
    environment they run with (a driver started as a subprocess wants the same);
    ``work`` their directory (logs, the worker's files), short enough for Ray's socket paths."""

    url: str
    work: Path
    env: dict[str, str]


@contextlib.contextmanager
def standalone_spark_cluster(*, cores: int = 4, memory: str = "3g", start_timeout_s: float = 90) -> Iterator[StandaloneSpark]:
    """Start a master and a worker of ``cores`` and ``memory`` on 127.0.0.1; stop them afterwards."""
    if shutil.which("java") is None:
        raise SparkSessionError("a standalone Spark cluster needs a JDK 17 'java' on PATH (e.g. apt-get install openjdk-17-jdk-headless)")
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    work = Path(tempfile.mkdtemp(prefix="afsc-"))  # short: Ray's socket paths may live under it
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(work / "logs"),
        "SPARK_WORKER_DIR": str(work / "work"),
    }
    spark_class = str(spark_home / "bin" / "spark-class")
    port = _free_port()
    started: list[subprocess.Popen[bytes]] = []
    try:
        master = _launch(work / "master.log", env, [
            spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(port), "--webui-port", str(_free_port())])
        started.append(master)
        _wait_for_line(work / "master.log", "I have been elected leader", master, start_timeout_s)
        url = f"spark://127.0.0.1:{port}"
        worker = _launch(work / "worker.log", env, [
            spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
            "--cores", str(cores), "--memory", memory, "--webui-port", str(_free_port()),
            "--work-dir", str(work / "work")])
        started.append(worker)
        _wait_for_line(work / "worker.log", "Successfully registered with master", worker, start_timeout_s)
        yield StandaloneSpark(url, work, env)
    finally:
        for process in reversed(started):
            _stop(process)
        shutil.rmtree(work, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(log: Path, env: dict[str, str], command: list[str]) -> "subprocess.Popen[bytes]":
    with log.open("w") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for_line(log: Path, text: str, process: "subprocess.Popen[bytes]", timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        if process.poll() is not None:
            break
        time.sleep(0.3)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    raise SparkSessionError(f"the standalone Spark {log.stem} did not start (its log never said {text!r}):\n{tail}")


def _stop(process: "subprocess.Popen[bytes]") -> None:
    for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
