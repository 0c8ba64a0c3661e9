"""A service's quota on Ray: one actor per job and service, which every instance that calls the
service leases its call times from and learns its pauses from (``operators.service_quota``).

The job starts the actor before its first attempt and ends it with the job, so that the quota
outlives the death of any instance: a restart's instances lease from the same schedule, and a
pause goes on. Ray restarts the actor itself if it dies; the new schedule starts ``HOLD_MS``
late, past whatever the old one handed out, and so never bursts.
"""

from __future__ import annotations

import asyncio
import threading
import time
import warnings
from concurrent.futures import Future
from typing import Any, Callable

import ray
from ray.exceptions import RayActorError

from actorflow.operators.service_quota import HOLD_MS, Lease, QuotaSchedule

__all__ = ["SERVICE_PREFIX", "RayServiceQuota", "ServiceQuotaActor"]

SERVICE_PREFIX = "service:"  # a quota actor's name: <job>/service:<service>

_WATCH_S = 30.0  # a watcher's call returns at the latest after this, and is made again
_AGAIN_S = 0.1  # a call that found the actor dead is made again after this
_GIVE_UP_S = 10.0  # ... for this long at most


def _again(since: float | None, call: Callable[..., Any], *args: Any) -> bool:
    """Make a call that found the actor dead again ``_AGAIN_S`` later, with ``since`` (when the
    first try failed) as its last argument; False once that was ``_GIVE_UP_S`` ago."""
    first = time.monotonic() if since is None else since
    if time.monotonic() - first >= _GIVE_UP_S:
        return False
    timer = threading.Timer(_AGAIN_S, call, (*args, first))
    timer.daemon = True
    timer.start()
    return True


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class ServiceQuotaActor:
    """Keeps one service's schedule and pause for a job (``<job>/service:<name>`` in the dashboard)."""

    def __init__(self, name: str, per_second: float | None) -> None:
        self.name = name
        # Started again after it died: its schedule begins past the leases the old one handed out.
        with warnings.catch_warnings():  # Ray 2.50 warns about its own use of a deprecated property here
            warnings.simplefilter("ignore")
            hold = HOLD_MS if ray.get_runtime_context().was_current_actor_reconstructed else 0
        self._schedule = QuotaSchedule(per_second, start_ms=_now_ms() + hold)
        self._changed: asyncio.Event | None = None
        self._pauses = 0

    async def lease(self, count: int) -> Lease:
        return self._schedule.lease(count, _now_ms())

    async def pause(self, until_ms: int) -> None:
        if not self._schedule.pause(until_ms):
            return
        self._pauses += 1
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def paused_after(self, known_ms: int) -> int:
        """The pause's end, once it is later than ``known_ms`` (or after ``_WATCH_S``)."""
        deadline = time.monotonic() + _WATCH_S
        while self._schedule.paused_until_ms <= known_ms:
            if self._changed is None:
                self._changed = asyncio.Event()
            try:
                await asyncio.wait_for(self._changed.wait(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                break
        return self._schedule.paused_until_ms

    async def figures(self) -> dict[str, Any]:
        return {"granted": self._schedule.granted, "pauses": self._pauses,
                "paused_until_ms": self._schedule.paused_until_ms}


class RayServiceQuota:
    """An instance's side of a ``ServiceQuotaActor`` (``operators.service_quota.ServiceQuota``):
    every call is asynchronous, and its answer comes back on a Ray thread.

    A call that fails because the actor died is made again ``_AGAIN_S`` later, while Ray starts
    it again. (Ray's own retries would say so in the console for each call in flight when the job
    ends and kills it.) After ``_GIVE_UP_S`` of that (someone killed it for good, say from the
    dashboard), a lease fails the operator with the cause, and the job restarts with a quota
    actor started anew (``cluster.job``), or fails; a watcher stops watching.
    """

    def __init__(self, handle: Any, name: str = "") -> None:
        self._handle = handle
        self._name = name
        self._known = 0
        self._on_pause: Callable[[int], None] | None = None

    def lease(
        self, count: int, now_ms: int, deliver: Callable[[Lease | BaseException], None], since: float | None = None,
    ) -> None:
        def leased(future: Future[Lease]) -> None:
            try:
                lease: Lease | BaseException = future.result()
            except RayActorError as error:
                if _again(since, self.lease, count, now_ms, deliver):
                    return
                lease = RuntimeError(f"the quota actor of service {self._name!r} is gone since {_GIVE_UP_S:g} s: {error}")
            except Exception as error:
                lease = error
            deliver(lease)

        self._handle.lease.remote(count).future().add_done_callback(leased)

    def pause(self, until_ms: int) -> None:
        self._handle.pause.remote(until_ms)

    def watch(self, on_pause: Callable[[int], None]) -> None:
        self._on_pause = on_pause
        self._poll()

    def _poll(self, since: float | None = None) -> None:
        self._handle.paused_after.remote(self._known).future().add_done_callback(
            lambda future: self._polled(future, since))

    def _polled(self, future: Future[int], since: float | None) -> None:
        try:
            until = future.result()
        except RayActorError:
            _again(since, self._poll)
            return
        if until > self._known:
            self._known = until
            assert self._on_pause is not None
            self._on_pause(until)
        self._poll()
