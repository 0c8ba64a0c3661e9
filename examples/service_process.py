"""Run the enrichment service in a process of its own.

Under load the service answers thousands of requests per second; in the driver's process it
would share the GIL with the driver. A child process has its own interpreter and core.
"""

from __future__ import annotations

import multiprocessing as mp
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
        if not self._conn.poll(60):
            self._process.kill()
            raise RuntimeError("the enrichment service process did not start within 60 s")
        self.url = self._conn.recv()
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
