"""Helpers for ring-2 tests that watch a job while it runs: poll a condition, find an actor."""

from __future__ import annotations

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
