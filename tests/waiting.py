"""Helpers for ring-2 tests that watch a job while it runs: run it in the background, poll a
condition, find an actor."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import ray


def poll(check: Callable[[], Any], timeout_s: float = 120) -> Any:
    """The first truthy value of ``check()``, tried every 0.2 s; fails after ``timeout_s``."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError("condition not met in time")


def find_actor(name: str) -> Any:
    """The live actor of that name in actorflow's namespace, or None."""
    try:
        return ray.get_actor(name, namespace="actorflow")
    except ValueError:
        return None


class Background:
    """Runs ``fn()`` in a daemon thread and keeps its result or its error for the test to check,
    instead of letting the error escape the thread (a test that kills a running job's actors
    expects the job to fail)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as error:  # noqa: BLE001 - kept for the test
            self.error = error

    def join(self, timeout_s: float = 60) -> "Background":
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), f"the background job did not end within {timeout_s} s"
        return self

    def failed_with(self, kind: type[BaseException], text: str = "") -> bool:
        """The job ended, with an error of ``kind`` whose message holds ``text``."""
        self.join()
        return isinstance(self.error, kind) and text in str(self.error)
