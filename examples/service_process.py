"""Run the enrichment service in a process of its own.

Under load the service answers thousands of requests per second; in the driver's process it
would share the GIL with the driver. A child process has its own interpreter and core.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
from typing import Any

from .enrich_service import EnrichmentService

__all__ = ["ServiceProcess"]


def _serve(conn: Any, kwargs: dict[str, Any]) -> None:
    service = EnrichmentService(**kwargs).start()
    try:
        conn.send(service.url)
        while True:
            command = conn.recv()
            if command == "stats":
                conn.send(service.stats())
            elif command == "stop":
                break
    finally:
        service.stop()
        conn.send("stopped")


def _why(process: Any) -> str:
    process.join(1)
    code = process.exitcode
    return "did not start within 60 s" if code is None or code == -9 else f"died before it started (exit code {code})"


def _guard_hint() -> str:
    script = getattr(sys.modules["__main__"], "__file__", None)
    if script is None:
        return ""
    return (f"; it starts with the 'spawn' method, whose child first runs {script} again: put that script's work "
            "under `if __name__ == \"__main__\":`, or the child re-runs all of it (Spark's start, this call) "
            "before it serves")


class ServiceProcess:
    """``EnrichmentService`` in a child process; same arguments, ``url``, ``stats()``, ``stop()``.

    >>> with ServiceProcess(failure_rate=0.0) as service:   # doctest: +SKIP
    ...     print(service.url)
    """

    def __init__(self, **kwargs: Any) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_serve, args=(child, kwargs), name="enrichment-service", daemon=True)
        self.url = ""

    def start(self) -> "ServiceProcess":
        self._process.start()
        # The "spawn" child first runs the parent's main script again, as a module: without an
        # ``if __name__ == "__main__":`` guard, all of its top level (Spark's start, this very
        # call) runs there before the service does, and the child dies or never answers.
        deadline = time.monotonic() + 60
        while not self._conn.poll(0.2):
            if not self._process.is_alive() or time.monotonic() > deadline:
                self._process.kill()
                raise RuntimeError(f"the enrichment service process {_why(self._process)}{_guard_hint()}")
        try:
            self.url = self._conn.recv()
        except EOFError:
            raise RuntimeError(f"the enrichment service process {_why(self._process)}{_guard_hint()}") from None
        return self

    def stats(self) -> dict[str, Any]:
        self._conn.send("stats")
        return self._conn.recv()

    def stop(self) -> None:
        if self._process.is_alive():
            self._conn.send("stop")
            if self._conn.poll(15):
                self._conn.recv()
            self._process.join(15)
            if self._process.is_alive():
                self._process.kill()

    def __enter__(self) -> "ServiceProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
