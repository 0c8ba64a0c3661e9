"""Chaos tooling: kill a running job's actors, and check that its output is still exact.

>>> monkey = ChaosMonkey("clicks", every_s=2.0, max_kills=10)     # doctest: +SKIP
>>> with monkey:                                                   # doctest: +SKIP
...     result = stream.execute(checkpoint_interval_ms=1_000)
>>> compare_outputs(expected, result.to_arrow(), key="click_id")   # doctest: +SKIP
{'lost': 0, 'duplicated': 0, 'unexpected': 0, ...}

- ``kill_actor(job, operator)`` kills one operator instance of a running job, now.
- ``kill_node(job)`` kills a whole worker node that holds instances of the job, now: its raylet,
  and with it every actor and object on the node. Never the node of the driver, where the job's
  coordinator runs, nor the cluster's head node.
- ``ChaosMonkey`` kills a random instance every ``every_s`` seconds, at most ``max_kills`` times,
  from a thread of its own; ``moment=`` has each kill happen at a named point inside the actor
  instead (``MOMENTS``): the actor is armed and ends its own process when it gets there.
- ``compare_outputs`` compares two outputs row by row, grouped by a key column.

Only operator and source actors are killed, never the job's checkpoint coordinator.
"""

from __future__ import annotations

import io
import logging
import os
import random
import re
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import pyarrow as pa
import ray
from ray.exceptions import RayActorError

from actorflow.actors.operator_actor import end_node
from actorflow.actors.service_quota import SERVICE_PREFIX
from actorflow.operators.errors import ConfigurationError

from .checkpoints.coordinator import COORDINATOR

__all__ = [
    "MOMENTS", "ChaosMonkey", "ChaosReport", "compare_outputs", "kill_actor", "kill_driver_at", "kill_node", "live_instances",
]

NAMESPACE = "actorflow"

_log = logging.getLogger(__name__)

#: Where an armed actor ends its process (see ``OperatorActor.arm_chaos``).
MOMENTS = {
    "snapshot": "while it takes a checkpoint's snapshot, before the state is written",
    "queue_full": "while its async queue is full and input waits for room",
    "retry_wait": "while a record waits for its retry",
    "completion": "between an async result's completion and its emission",
    "window_fire": "while a window fires, before its results are sent on",
}


def live_instances(job: str | None = None) -> list[str]:
    """The names of the job's (every job's, if None) live operator and source actors, not
    the checkpoint coordinators nor the services' quota actors (which Ray restarts itself).

    Asks the cluster's GCS for its named actors (whose names go with them when they die) rather
    than the state API, which needs the dashboard and can answer for another cluster on the
    same machine.
    """
    named = ray.util.list_named_actors(all_namespaces=True)
    return sorted(a["name"] for a in named if a["namespace"] == NAMESPACE and "[" in a["name"]
                  and (job is None or a["name"].startswith(f"{job}/"))
                  and not a["name"].partition("/")[2].startswith((f"{COORDINATOR}[", SERVICE_PREFIX)))


def attempt_of(name: str) -> int:
    """The attempt an instance belongs to: ``clicks/enrich[0/2]@3`` -> 3, no suffix -> 0."""
    head, at, number = name.rpartition("@")
    return int(number) if at and head.endswith("]") and number.isdigit() else 0


def kill_actor(job: str, operator: str | None = None, *, rng: random.Random | None = None) -> str | None:
    """Kill one live instance of ``job``'s newest attempt whose name holds ``operator`` (any, if
    None); returns its name, or None if there was none to kill.

    Instances of an older attempt, still being torn down after a failure, are left alone: killing
    one would cost no restart of its own."""
    killed = _kill(job, operator, rng or random.Random(), None)
    return killed[0] if killed else None


def _kill(job: str, operator: str | None, rng: random.Random, pids: dict[int, str] | None) -> tuple[str, int | None] | None:
    """``kill_actor``; with ``pids``, the victim's process id is noted there first."""
    names = _newest_attempt([n for n in live_instances(job) if _is_of(job, n, operator)])
    if not names:
        return None
    name = rng.choice(names)
    try:
        actor = ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:  # it went meanwhile
        return None
    pid = _pid_of(actor, name, pids) if pids is not None else None
    ray.kill(actor, no_restart=True)
    return name, pid


def kill_node(job: str, *, rng: random.Random | None = None) -> str | None:
    """Kill a worker node that holds instances of ``job``'s newest attempt; returns its
    description (``"node 10.0.0.5 (3fa2c1...): clicks/enrich[0/2], clicks/window[1/2]"``), or
    None if no instance lives on a node other than the driver's and the head node.

    The node's raylet is killed (``SIGKILL``) by a task placed on that node: every worker process
    there ends with it, and its object store goes too, as when a machine dies. Ray marks the node
    dead once its health checks fail."""
    killed = _kill_node(job, rng or random.Random(), None)
    return killed[0] if killed else None


def _node_of(_actor: Any) -> tuple[str, int]:
    return ray.get_runtime_context().get_node_id(), os.getpid()


def _on_killable_nodes(job: str) -> dict[str, list[tuple[str, int]]]:
    """The live instances of ``job``'s newest attempt by the node they run on, with their
    process ids: the nodes a node kill may take."""
    names = _newest_attempt(live_instances(job))
    # Not the driver's node, whose death would end the job's driver and coordinator, nor the
    # head node, whose death ends the cluster (its GCS).
    spared = {ray.get_runtime_context().get_node_id(),
              *(n["NodeID"] for n in ray.nodes() if "node:__internal_head__" in n.get("Resources", {}))}
    on: dict[str, list[tuple[str, int]]] = {}
    for name in names:
        try:
            node, pid = ray.get(ray.get_actor(name, namespace=NAMESPACE).__ray_call__.remote(_node_of), timeout=10)
        except Exception:  # noqa: BLE001 - gone or slow: not a victim this time
            continue
        if node not in spared:
            on.setdefault(node, []).append((name, pid))
    return on


def _describe_node(node: str) -> str:
    address = next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node), "?")
    return f"node {address} ({node[:8]})"


def _kill_node(job: str, rng: random.Random, pids: dict[int, str] | None) -> tuple[str, list[str]] | None:
    on = _on_killable_nodes(job)
    if not on:
        return None
    node = rng.choice(sorted(on))
    victims = sorted(on[node])
    if pids is not None:
        pids.update({pid: name for name, pid in victims})
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    killer = ray.remote(end_node).options(
        num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False), max_retries=0)
    try:
        ray.get(killer.remote(), timeout=30)
    except ray.exceptions.RayTaskError:
        raise  # it ran and raised: its parent was no raylet, and nothing was killed
    except Exception:  # noqa: BLE001 - its worker ended with the raylet: the kill took
        pass
    return f"{_describe_node(node)}: {', '.join(name for name, _ in victims)}", [name for name, _ in victims]


def _own_pid(_actor: Any) -> int:
    return os.getpid()


def _pid_of(actor: Any, name: str, pids: dict[int, str]) -> int | None:
    try:
        pid = ray.get(actor.__ray_call__.remote(_own_pid), timeout=10)
    except Exception:  # noqa: BLE001 - gone or slow: its death is then reported in Ray's words only
        return None
    pids[pid] = name
    return pid


def _newest_attempt(names: list[str]) -> list[str]:
    newest = max((attempt_of(n) for n in names), default=0)
    return [n for n in names if attempt_of(n) == newest]


def _is_of(job: str, name: str, operator: str | None) -> bool:
    # The operator part of "<job>/<operator>[i/n]@attempt": a job's own name may hold the word.
    return operator is None or operator in name[len(job) + 1:]


@dataclass
class ChaosReport:
    """What a run under chaos produced, against a failure-free run."""

    lost: int
    duplicated: int
    unexpected: int
    expected_rows: int
    actual_rows: int
    kills: list[tuple[float, str]] = field(default_factory=list)  # (seconds into the run, actor)
    node_kills: list[tuple[float, str, list[str]]] = field(default_factory=list)  # (seconds, node, its instances)
    restarts: int = 0
    recoveries_s: list[float] = field(default_factory=list)
    examples: dict[str, list[Any]] = field(default_factory=dict)  # a few keys of each kind
    failures: list[str] = field(default_factory=list)  # the run's, as ChaosMonkey.explain says them

    @property
    def exact(self) -> bool:
        return self.lost == self.duplicated == self.unexpected == 0

    def summary(self) -> dict[str, Any]:
        return {
            "lost": self.lost, "duplicated": self.duplicated, "unexpected": self.unexpected,
            "expected_rows": self.expected_rows, "actual_rows": self.actual_rows,
            "kills": len(self.kills) - len(self.node_kills), "node_kills": len(self.node_kills), "restarts": self.restarts,
            "recovery_s": [round(r, 3) for r in self.recoveries_s],
        }

    def lines(self) -> list[str]:
        out = [
            f"rows: {self.actual_rows:,} out, {self.expected_rows:,} expected",
            f"lost {self.lost}, duplicated {self.duplicated}, unexpected {self.unexpected}"
            + ("  (exact)" if self.exact else ""),
            f"kills {len(self.kills) - len(self.node_kills)} actors and {len(self.node_kills)} nodes, "
            f"restarts {self.restarts}",
        ]
        by_node = {names[0]: (node, names) for _, node, names in self.node_kills}
        for at, name in self.kills:
            if name in by_node:
                node, names = by_node[name]
                out.append(f"  killed {node} at {at:.1f} s, and with it {', '.join(names)}")
            else:
                out.append(f"  killed {name} at {at:.1f} s")
        for i, failure in enumerate(self.failures, 1):
            out.append(f"  restart {i}: {failure}")
        for i, seconds in enumerate(self.recoveries_s, 1):
            out.append(f"  recovery {i}: {seconds:.2f} s")
        for kind, keys in self.examples.items():
            if keys:
                out.append(f"  {kind}, e.g. keys {keys}")
        return out


def compare_outputs(expected: pa.Table, actual: pa.Table, key: str | Sequence[str]) -> ChaosReport:
    """Compare ``actual`` with ``expected`` row by row within each key.

    ``lost``: expected rows missing from ``actual``; ``duplicated``: rows of ``expected`` that
    ``actual`` holds more often; ``unexpected``: rows of ``actual`` that ``expected`` does not
    hold at all (a changed value, or a key it does not know). Row order does not matter.
    """
    keys = [key] if isinstance(key, str) else list(key)
    for table, which in ((expected, "expected"), (actual, "actual")):
        missing = [k for k in keys if k not in table.column_names]
        if missing:
            raise ConfigurationError(f"key column(s) {missing} not in the {which} output; it has {table.column_names}")
    columns = sorted(set(expected.column_names) | set(actual.column_names))

    def rows(table: pa.Table) -> dict[Any, Counter]:
        by_key: dict[Any, Counter] = {}
        for row in table.to_pylist():
            k = tuple(_hashable(row[c]) for c in keys)
            by_key.setdefault(k, Counter())[tuple(_hashable(row.get(c)) for c in columns)] += 1
        return by_key

    want, got = rows(expected), rows(actual)
    lost = duplicated = unexpected = 0
    examples: dict[str, list[Any]] = {"lost": [], "duplicated": [], "unexpected": []}
    for k in set(want) | set(got):
        w, g = want.get(k, Counter()), got.get(k, Counter())
        for row in set(w) | set(g):
            if row in w:
                short, extra = max(0, w[row] - g[row]), max(0, g[row] - w[row])
                lost += short
                duplicated += extra
                kinds = [("lost", short), ("duplicated", extra)]
            else:
                unexpected += g[row]
                kinds = [("unexpected", g[row])]
            for kind, count in kinds:
                if count and len(examples[kind]) < 5:
                    examples[kind].append(k[0] if len(k) == 1 else k)
    return ChaosReport(lost, duplicated, unexpected, expected.num_rows, actual.num_rows, examples=examples)


def _hashable(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


class ChaosMonkey:
    """Kills instances of a running job from a thread, every ``every_s`` seconds, ``max_kills``
    times at most; use it as a context manager around the run.

    The first kill comes ``first_after_s`` after the start (default ``every_s``). ``operator``
    limits the kills to instances whose name holds it. With ``moment``, each kill arms a live
    instance to end its process at that moment (see ``MOMENTS``) instead of killing it at once.
    With ``nodes``, each kill takes a whole worker node that holds instances (``kill_node``; with
    ``moment``, an instance there kills its node at that moment): ``node_kills`` lists them, and
    each costs the job one restart, as an actor's kill does.

    A kill that fails (the cluster does not answer, say) is logged as a warning with its cause the
    first time that cause appears, counted in ``failed_strikes``, and tried again; the run goes on.
    An error that ends the monkey's thread is raised again by ``__exit__``, so that a chaos run
    whose monkey died is never taken for one that survived its kills.
    """

    def __init__(
        self, job: str, *, every_s: float, max_kills: int, operator: str | None = None, moment: str | None = None,
        seed: int = 0, first_after_s: float | None = None, nodes: bool = False,
    ) -> None:
        if every_s <= 0 or max_kills < 0:
            raise ConfigurationError(f"every_s must be > 0 and max_kills >= 0, got {every_s!r} and {max_kills!r}")
        if nodes and operator is not None:
            raise ConfigurationError("nodes=True kills whole nodes, whatever runs there: it takes no operator")
        if moment is not None and moment not in MOMENTS:
            raise ConfigurationError(f"moment must be one of {sorted(MOMENTS)}, got {moment!r}")
        self.job, self.every_s, self.max_kills = job, every_s, max_kills
        self.operator, self.moment, self.nodes = operator, moment, nodes
        self.first_after_s = every_s if first_after_s is None else first_after_s
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"chaos-{job}", daemon=True)
        self.kills: list[tuple[float, str]] = []  # (seconds into the run, instance): one per restart
        #: (seconds into the run, the node, the instances on it): with ``nodes``, one per kill
        self.node_kills: list[tuple[float, str, list[str]]] = []
        self.killed_pids: dict[int, str] = {}  # process id -> instance, for the console's death notices
        self.failed_strikes: Counter[str] = Counter()  # cause -> how many kills failed with it
        self.error: BaseException | None = None
        self._started = 0.0

    def __enter__(self) -> "ChaosMonkey":
        self._started = time.monotonic()
        self._streams = (sys.stdout, sys.stderr)
        sys.stdout, sys.stderr = _ChaosNotices(sys.stdout, self), _ChaosNotices(sys.stderr, self)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        if isinstance(sys.stdout, _ChaosNotices) and sys.stdout.monkey is self:
            sys.stdout = self._streams[0]
        if isinstance(sys.stderr, _ChaosNotices) and sys.stderr.monkey is self:
            sys.stderr = self._streams[1]
        if self.failed_strikes:
            _log.warning("chaos on job %r: %d kill(s) failed and were tried again: %s", self.job,
                         sum(self.failed_strikes.values()), dict(self.failed_strikes))
        if self.error is not None and exc[0] is None:
            raise self.error

    def how(self, name: str) -> str | None:
        """How this monkey killed the instance ``name``: ``"at 3.1 s, at the moment 'snapshot'"``;
        None if it did not."""
        for at, node, names in self.node_kills:
            if name in names:
                return f"with its {node}, at {at:.1f} s"
        for at, killed in self.kills:
            if killed == name:
                return f"at {at:.1f} s" + (f", at the moment {self.moment!r}" if self.moment else "")
        return None

    def explain(self, failures: list[str]) -> list[str]:
        """``JobResult.failures`` with each failure this monkey caused said so, in place of Ray's
        words: Ray reports a process that ends at a chaos moment as a worker that died of an
        unexpected system error, perhaps the OOM killer, and would send a reader looking for a
        memory problem. ``result.failures = monkey.explain(result.failures)``."""
        explained = []
        for failure in failures:
            name = failure.partition(": ")[0]
            how = self.how(name)
            explained.append(failure if how is None else f"{name}: killed by the chaos tool {how}")
        return explained

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as error:  # noqa: BLE001 - kept for __exit__, which raises it in the caller
            _log.warning("chaos on job %r stopped: %s: %s", self.job, type(error).__name__, error)
            self.error = error

    def _loop(self) -> None:
        wait = self.first_after_s
        while len(self.kills) < self.max_kills and not self._stop.wait(wait):
            try:
                name = self._strike()
            except Exception as error:  # noqa: BLE001 - the cluster is slow under load, say: try again soon
                cause = f"{type(error).__name__}: {error}"
                if cause not in self.failed_strikes:
                    _log.warning("chaos on job %r: a kill failed (%s); trying again", self.job, cause)
                self.failed_strikes[cause] += 1
                name = None
            if name is not None:
                self.kills.append((time.monotonic() - self._started, name))
                # One kill, one restart: the next comes only once the job runs its next attempt
                # (or has ended), never into an attempt that is already failing.
                self._await_attempt_after(attempt_of(name))
            # After a miss (nothing alive yet, an actor busy starting) the next try comes sooner.
            wait = self.every_s if name is not None else min(self.every_s, 0.25)

    def _await_attempt_after(self, attempt: int) -> None:
        """Wait until the attempt after ``attempt`` has started: its instances exist and have
        started (each answers a call). A kill while their processes still start would cut the
        recovery short: it would cost a restart and measure nothing.

        Between two attempts no instance is live: the old ones are gone, the new ones not made
        yet. A job that ends instead of restarting ends the wait through ``__exit__``.
        """
        deadline = time.monotonic() + 120
        newer: list[str] = []
        while not newer and time.monotonic() < deadline and not self._stop.is_set():
            try:
                newer = [n for n in live_instances(self.job) if attempt_of(n) > attempt]
            except Exception:  # noqa: BLE001 - the GCS is slow under load: ask again
                newer = []
            if not newer:
                self._stop.wait(0.1)
        pending: list[Any] = []
        for name in newer:
            try:
                pending.append(ray.get_actor(name, namespace=NAMESPACE).__ray_ready__.remote())
            except ValueError:  # gone meanwhile: the job failed or ended
                pass
        while pending and time.monotonic() < deadline and not self._stop.is_set():
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=0.1)
            for ref in ready:
                try:
                    ray.get(ref)
                except Exception:  # noqa: BLE001 - it died: the job restarts again, or fails
                    pass

    def _strike(self) -> str | None:
        if self.nodes and self.moment is not None:
            return self._strike_node_at_moment()
        if self.nodes:
            killed_node = _kill_node(self.job, self._rng, self.killed_pids)
            if killed_node is None:
                return None
            description, names = killed_node
            self.node_kills.append((time.monotonic() - self._started, description.partition(":")[0], names))
            return names[0]
        if self.moment is None:
            killed = _kill(self.job, self.operator, self._rng, self.killed_pids)
            return killed[0] if killed else None
        names = _newest_attempt([n for n in live_instances(self.job) if _is_of(self.job, n, self.operator)
                                 and not n.startswith(f"{self.job}/source[")])
        if not names:
            return None
        name = self._rng.choice(names)
        try:
            actor = ray.get_actor(name, namespace=NAMESPACE)
            _pid_of(actor, name, self.killed_pids)
            armed = ray.get(actor.arm_chaos.remote(self.moment), timeout=10)
        except RayActorError:  # armed, and at the moment already before its answer left
            return name
        except Exception:  # noqa: BLE001 - it went meanwhile, or is slow; try again next time
            return None
        if not armed:
            return None
        return name if self._gone(name) else None

    def _gone(self, name: str) -> bool:
        """Wait until the armed instance ``name`` has ended itself (so that the next one is not
        armed too early); False if it did not within ``max(every_s, 30)`` seconds."""
        deadline = time.monotonic() + max(self.every_s, 30.0)
        while time.monotonic() < deadline and not self._stop.is_set():
            if name not in live_instances(self.job):
                return True
            time.sleep(0.1)
        return False

    def _strike_node_at_moment(self) -> str | None:
        """Arm an instance on a node that may be killed to kill its node at the moment."""
        on = _on_killable_nodes(self.job)
        candidates = [(node, name) for node, named in sorted(on.items()) for name, _ in named
                      if not name.startswith(f"{self.job}/source[")]
        if not candidates:
            return None
        node, name = self._rng.choice(candidates)
        started = time.monotonic() - self._started
        try:
            armed = ray.get(ray.get_actor(name, namespace=NAMESPACE).arm_chaos.remote(self.moment, True), timeout=10)
        except RayActorError:  # armed, and at the moment already before its answer left
            armed = True
        except Exception:  # noqa: BLE001 - it went meanwhile, or is slow; try again next time
            return None
        if not armed:
            return None
        if self._gone(name):
            names = [n for n, _ in on[node]]
            self.killed_pids.update({pid: n for n, pid in on[node]})
            self.node_kills.append((started, _describe_node(node), [name, *(n for n in names if n != name)]))
            return name
        return None


# Ray's notice of a worker that ended at a chaos moment: its driver prints it, naming the pid.
_DEATH_NOTICE = re.compile(r"A worker died or was killed .*Worker PID: (\d+)")


class _ChaosNotices(io.TextIOBase):
    """The console while a monkey runs: Ray's notice that a worker it killed "died or was killed
    by an unexpected system error" (and "perhaps by the OOM killer") says instead that the chaos
    tool killed it; every other write passes unchanged. Ray prints the notice from its own thread
    to ``sys.stdout`` or ``sys.stderr`` as they are at the time."""

    def __init__(self, stream: Any, monkey: ChaosMonkey) -> None:
        self.stream, self.monkey = stream, monkey

    def write(self, text: str) -> int:
        match = _DEATH_NOTICE.search(text)
        pid = int(match.group(1)) if match else None
        name = self.monkey.killed_pids.get(pid) if pid is not None else None
        if name is not None:
            moment = self.monkey.moment
            how = self.monkey.how(name) or (f"at the moment {moment!r}" if moment else "just now")
            text = (f"(chaos) {name} (pid {pid}) was killed by the chaos tool {how}: not by the OOM killer "
                    "or a crash, which Ray's notice of its death cannot tell apart")
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.stream.encoding

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def kill_driver_at(moment: str, epoch: int) -> None:
    """End this driver with SIGKILL the first time its streaming job reaches ``moment`` (one of
    ``cluster.streaming.DRIVER_MOMENTS``) at an epoch at or after ``epoch``, as a crash would: no
    clean-up at all. Says so on standard output first (``dying at <moment> of epoch <n>``)."""
    import signal

    from .streaming import DRIVER_MOMENTS, StreamingJob

    if moment not in DRIVER_MOMENTS:
        raise ConfigurationError(f"moment must be one of {list(DRIVER_MOMENTS)}, got {moment!r}")

    def die(reached: str, at: int | None) -> None:
        if reached == moment and (at if at is not None else -1) >= epoch:
            print(f"dying at {moment} of epoch {at}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    StreamingJob.fault_point = staticmethod(die)
