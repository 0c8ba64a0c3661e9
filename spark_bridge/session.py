"""Start, reuse and stop Spark on Ray through RayDP.

One process holds at most one RayDP Spark session. ``spark_session()`` starts it on first use and
returns the same session afterwards; ``stop_spark()`` ends it. The session is configured so that
RayDP works on JDK 17 and Spark's Python workers run the interpreter of this process.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from actorflow.actors import upstream
from actorflow.actors.upstream import ray as ray_upstream
from actorflow.cluster.warm_workers import prestart_task_workers
from actorflow.operators.errors import ActorflowError, ConfigurationError, SchemaError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "JVM_OPTIONS",
    "SparkSessionError",
    "check_dataframe",
    "ensure_ray",
    "spark_session",
    "stop_spark",
]

logger = logging.getLogger(__name__)

# JDK 17 closes these packages to reflection, and Spark, Arrow and RayDP reach into them. Spark
# adds most of them to its own JVMs, but not to RayDP's app master, and not all of them.
_ADD_OPENS_PACKAGES = (
    "java.lang",
    "java.lang.invoke",
    "java.io",
    "java.net",
    "java.nio",
    "java.math",
    "java.text",
    "java.util",
    "java.util.concurrent",
    "java.util.concurrent.atomic",
    "sun.nio.ch",
    "sun.nio.cs",
    "sun.security.action",
    "sun.util.calendar",
)

JVM_OPTIONS: str = " ".join(
    ["-XX:+IgnoreUnrecognizedVMOptions"]
    + [f"--add-opens=java.base/{package}=ALL-UNNAMED" for package in _ADD_OPENS_PACKAGES]
)
"""The JVM options given to Spark's driver, its executors and RayDP's app master."""

_JVM_OPTION_KEYS = (
    "spark.driver.extraJavaOptions",
    "spark.executor.extraJavaOptions",
    "spark.ray.raydp_app_master.extraJavaOptions",
)

# Spark 3.5 runs on JDK 8, 11 and 17; other versions may work but are not what RayDP is tested on.
_SUPPORTED_JAVA_MAJORS = (8, 11, 17)

# RayDP's master shuts down its JVMs before it exits; this bounds the wait for it.
_MASTER_STOP_TIMEOUT_S = 60.0

_lock = threading.RLock()
_session: SparkSession | None = None


class SparkSessionError(ActorflowError):
    """Spark on Ray could not be started, or its environment is unusable (no ``java``, ...)."""


def ensure_ray(address: str | None = None, *, num_cpus: int | None = None) -> None:
    """Connect this process to Ray unless it already is.

    With ``address=None`` a local Ray starts inside this process (the embedded mode); otherwise
    the process joins the cluster at ``address`` (``"auto"``, ``"10.0.0.5:6379"``, or a Ray
    Client ``"ray://host:10001"``, which ``spark_session`` cannot use: RayDP needs a driver).
    An already initialised Ray is kept as it is, whatever the arguments.

    Example::

        ensure_ray()                 # local Ray with every core of the machine
        ensure_ray(num_cpus=2)       # no effect: Ray is already up
    """
    import ray

    if num_cpus is not None and num_cpus <= 0:
        raise ConfigurationError(f"num_cpus must be > 0, got {num_cpus}")
    _prepare_process_environment()
    if ray.is_initialized():
        ray_upstream.filter_log_echo()  # a Ray this process started itself (ray.init) echoes through it too
        return

    ray.init(
        # "local": a new local Ray even where `ray start` left the address of a cluster (perhaps
        # one long gone) in /tmp/ray, which a bare ray.init() would try to join.
        address="local" if address is None else address,
        # A cluster's workers do not inherit this process's environment; the variable stops the
        # log echo loop described in _prepare_process_environment.
        # A local Ray's workers import what the actors need as they start, before a job takes
        # them (see cluster.warm_workers.prepare_worker).
        runtime_env=(
            {"worker_process_setup_hook": "actorflow.cluster.warm_workers.prepare_worker"} if address is None
            else {"env_vars": {"RAY_LOG_TO_DRIVER": "0"}}
        ),
        # Only a local Ray may be sized from here; a cluster's resources are the cluster's.
        num_cpus=num_cpus if address is None else None,
        ignore_reinit_error=True,
        logging_level=logging.WARNING,
        # Worker prints (a user's function, an operator's warnings) should reach the notebook.
        log_to_driver=True,
        # Ray ends an idle worker beyond its soft limit (one per CPU) a second after its last
        # task; a local Ray keeps it for a minute, so that the next job's blocking calls take the
        # processes of the last one's rather than start new ones (see cluster.warm_workers).
        _system_config=ray_upstream.system_config() if address is None else None,
    )
    ray_upstream.filter_log_echo()  # the echo of workers' logs and the raylet's notes (see actors.upstream.ray)


def spark_session(
    app_name: str = "actorflow",
    *,
    ray_address: str | None = None,
    num_executors: int = 1,
    executor_cores: int = 1,
    executor_memory: str = "1g",
    configs: dict[str, str] | None = None,
) -> SparkSession:
    """Return the Spark session running on Ray through RayDP, starting it if needed.

    The first call starts Ray (see ``ensure_ray``; ``ray_address`` must not be a Ray Client
    ``ray://`` address) and Spark; later calls return the running session and ignore their
    arguments. A session started by calling ``raydp.init_spark`` directly is reused too.

    Added to ``configs``: the JDK 17 ``JVM_OPTIONS`` (before any options given) and, unless
    given, the UTC session time zone (so that event times read the same on every machine),
    Arrow for pandas conversions, and no console progress bar.

    Example::

        spark = spark_session(num_executors=1, executor_memory="1g")
        spark.range(3).count()       # 3
        stop_spark()
    """
    global _session

    if num_executors <= 0:
        raise ConfigurationError(f"num_executors must be > 0, got {num_executors}")
    if executor_cores <= 0:
        raise ConfigurationError(f"executor_cores must be > 0, got {executor_cores}")
    with _lock:
        if _session is not None and _is_alive(_session):
            return _session
        _session = _shared_raydp_session()
        if _session is not None:
            _ExecutorWatch(_session).start()
            return _session
        _refuse_plain_session()
        _check_java()
        ensure_ray(ray_address)
        _check_room_beside_executors(num_executors, executor_cores)

        import raydp

        ray_upstream.filter_log_echo()
        try:
            with ray_upstream.stderr_of_children_filtered():  # Spark's driver JVM starts in here
                _session = raydp.init_spark(
                    app_name=app_name,
                    num_executors=num_executors,
                    executor_cores=executor_cores,
                    executor_memory=executor_memory,
                    configs=_spark_configs(configs),
                )
        except Exception as error:
            raise SparkSessionError(
                f"Spark on Ray did not start (app {app_name!r}, {num_executors} executor(s) of "
                f"{executor_cores} core(s) and {executor_memory}): {error}"
            ) from error
        # The first enrich() snapshots its DataFrame with two Ray tasks: their processes start now.
        prestart_task_workers()
        _ExecutorWatch(_session).start()
        return _session


def stop_spark() -> None:
    """Stop the RayDP Spark session and its executors; Ray itself keeps running.

    Calling it when no session runs does nothing.

    Example::

        spark = spark_session()
        stop_spark()
        stop_spark()                 # no effect
    """
    global _session

    with _lock:
        _session = None
        if "raydp" not in sys.modules:
            return
        import ray
        import raydp
        from pyspark.sql import SparkSession

        from .arrow_io import release_outputs

        # Results whose cache Spark never filled cannot be read once it stops: their blocks go.
        release_outputs()
        if not ray.is_initialized():
            # The executors and the master actor died with Ray; only the local JVM is left.
            active = SparkSession.getActiveSession()
            if active is not None:
                active.stop()
            _forget_raydp_context()
            return
        master_name = _master_actor_name()
        try:
            raydp.stop_spark()
        except Exception as error:  # noqa: BLE001 - stopping must not fail on half-dead parts
            # RayDP forgets the session even when a part of it was already gone.
            logger.warning("RayDP did not stop cleanly: %r", error)
        if master_name is not None:
            _wait_until_actor_gone(master_name)


# RayDP's executors register with the driver a few seconds after the session starts.
_EXECUTOR_WAIT_S = 60.0
_EXECUTOR_CLASS = "org.apache.spark.executor.RayDPExecutor"


def check_dataframe(df: "DataFrame", what: str = "from_spark()", *, streaming: bool = False) -> None:
    """Fail with one clear line if ``df`` cannot be read into Ray right now.

    Its session must be running (not stopped), and be either Spark on Ray (RayDP) with a live
    executor (without one, every Spark job of the session waits forever) or the session of a
    running ``on_spark_cluster``. It must be a batch DataFrame (unless ``streaming``), and its
    column names must be unique: its rows become dicts.
    """
    session = df.sparkSession
    context = session.sparkContext
    if getattr(context, "_jsc", None) is None:
        raise SparkSessionError(
            f"{what} got a DataFrame of a Spark session that was stopped (stop_spark() or spark.stop()); "
            "build the DataFrame again in spark_session()"
        )
    if df.isStreaming and not streaming:
        raise ConfigurationError(
            f"{what} reads a DataFrame once, as a batch, and got a streaming one (readStream); start a "
            "streaming query instead: enrich_stream(df, fn, path, checkpoint_location=...), or "
            "from_spark(df, ...)....write_stream(path, checkpoint_location=...)"
        )
    twice = [(name, count) for name, count in collections.Counter(df.columns).items() if count > 1]
    if twice:
        name, count = twice[0]
        raise SchemaError(
            f"{what}: the DataFrame has column {name!r} {count} times; a row is a dict of its columns, so each "
            "name must be unique: rename one (DataFrame.toDF(*names) or withColumnRenamed), or drop it"
        )
    master = context.master or ""
    if master.startswith("ray://"):
        _wait_for_executor(context, what)
        return
    from .spark_cluster import active_cluster

    if active_cluster(session) is None:
        raise SparkSessionError(
            f"{what} reads DataFrames of Spark on Ray (spark_bridge.spark_session()), got one of a Spark "
            f"session on {master!r}; start Ray on that cluster with on_spark_cluster(spark), or create the "
            "DataFrame in spark_session()"
        )


def _wait_for_executor(context: Any, what: str) -> None:
    import ray

    deadline = time.monotonic() + _EXECUTOR_WAIT_S
    while True:
        if _has_executor(context):
            return
        states = _executor_actor_states(ray)  # None: Ray cannot tell now; wait on
        if states is not None and not _any_live(states):
            raise SparkSessionError(
                f"{what}: Spark on Ray has no live executor ({_described(states)}), so every Spark job of this session "
                "would wait forever; call stop_spark(), then spark_session(), and build the DataFrame again"
            )
        if time.monotonic() > deadline:
            known = "the executors' states are unknown" if states is None else _described(states)
            raise SparkSessionError(
                f"{what}: no Spark executor registered within {_EXECUTOR_WAIT_S:.0f} s "
                f"({known}); is the Ray cluster out of CPUs or memory?"
            )
        time.sleep(0.2)


class _ExecutorWatch(threading.Thread):
    """Fails the running Spark jobs of a Spark-on-Ray session that lost its last executor.

    RayDP does not replace an executor that died (killed, or its node lost), and Spark waits for
    one to come back without end: a ``collect()`` of ``enrich()``'s output would hang for ever.
    Once a second, while jobs run, the watch asks whether any executor is registered; when none
    is and none of RayDP's executor actors is alive or on its way, it cancels each job with the
    reason, which Spark's error then carries ("Job 3 cancelled because ..."). It ends with the
    session. A daemon thread: a py4j call a second, and nothing more while no job runs.
    """

    INTERVAL_S = 1.0

    def __init__(self, session: SparkSession) -> None:
        super().__init__(name="actorflow-executor-watch", daemon=True)
        self._session = session

    def run(self) -> None:
        import ray

        context = self._session.sparkContext
        while _session is self._session and getattr(context, "_jsc", None) is not None and ray.is_initialized():
            try:
                self._check(context, ray)
            except Exception:  # noqa: BLE001 - the session stopped meanwhile; the loop's test ends it
                pass
            time.sleep(self.INTERVAL_S)

    def _check(self, context: Any, ray: Any) -> None:
        jobs = context.statusTracker().getActiveJobsIds()
        if not jobs or _has_executor(context):
            return
        states = _executor_actor_states(ray)
        if states is None or _any_live(states):
            return
        reason = (f"Spark on Ray lost its last executor ({_described(states)}) and RayDP starts no other, so the job would "
                  "wait for ever; call stop_spark(), then spark_session(), and build the DataFrame again")
        logger.error("actorflow: %s (cancelling Spark jobs %s)", reason, sorted(jobs))
        for job in jobs:
            context._jsc.sc().cancelJob(job, reason)


_LIVE_STATES = ("ALIVE", "PENDING_CREATION", "RESTARTING", "DEPENDENCIES_UNREADY")


def _has_executor(context: Any) -> bool:
    return len(context._jsc.sc().statusTracker().getExecutorInfos()) > 1  # the driver counts itself


def _any_live(states: list[tuple[str, str]]) -> bool:
    return any(state in _LIVE_STATES for _, state in states)


def _described(states: list[tuple[str, str]]) -> str:
    return ", ".join(f"{name} is {state}" for name, state in states) or "none was found"


def _executor_actor_states(ray: Any) -> list[tuple[str, str]] | None:
    """The state of each of RayDP's executor actors by name; None where Ray's state API cannot
    answer (its dashboard process did not start, as on a machine too busy to start it in time)."""
    from ray.util.state import list_actors

    context = ray.get_runtime_context()
    try:
        actors = list_actors(
            address=context.gcs_address,
            filters=[("class_name", "=", _EXECUTOR_CLASS), ("ray_namespace", "=", context.namespace)],
            limit=1000,
            raise_on_missing_output=False,
        )
    except ConnectionError as error:
        logger.debug("the state of Spark's executor actors is unknown: %s", error)
        return None
    # Names repeat across sessions of one process: a live one with the name wins over dead ones.
    states: dict[str, str] = {}
    for actor in actors:
        if states.get(actor.name) != "ALIVE":
            states[actor.name] = actor.state
    return sorted(states.items())


def _check_room_beside_executors(num_executors: int, executor_cores: int) -> None:
    # RayDP's executors are Ray actors that hold their cores for the whole session. Moving a
    # DataFrame into Ray runs Ray Data tasks of 1 CPU each: with every CPU held by executors,
    # they never start, and from_spark() waits forever without a word.
    import ray

    total = ray.cluster_resources().get("CPU", 0.0)
    wanted = num_executors * executor_cores
    if wanted >= total:
        raise SparkSessionError(
            f"Spark on Ray would hold every CPU of the Ray cluster ({wanted} executor core(s) of {total:g}), "
            "and moving data between Spark and Ray needs at least one more; ask for fewer executor cores, "
            "or start Ray with more logical CPUs first (spark_bridge.ensure_ray(num_cpus=...))"
        )


def _refuse_plain_session() -> None:
    # A plain SparkSession's JVM lacks RayDP's classes; RayDP would fail with "'JavaPackage'
    # object is not callable" and leave its own half-started state for atexit to trip over.
    from pyspark import SparkContext

    active = SparkContext._active_spark_context
    if active is not None and getattr(active, "_jsc", None) is not None and not (active.master or "").startswith("ray://"):
        raise SparkSessionError(
            f"a Spark session on {active.master!r} already runs in this process, and Spark on Ray needs its own; "
            "stop it first (spark.stop()), or use that session's data through Parquet"
        )


def _prepare_process_environment() -> None:
    # Ray workers, RayDP's JVMs and Spark's Python workers inherit this process's environment.
    # Spark's Python workers must run this interpreter, or they lack pyspark; and `ray` (for
    # ray.util.spark) must be found on PATH.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # RayDP's Ray -> Spark path for blocks that are Arrow tables (ray.data.Dataset.to_spark)
    # calls ray.init() inside Spark's Python workers. Those nested drivers would print every
    # worker's log lines, their own included, which come back to them through the executor's
    # log: an echo loop that floods the notebook.
    os.environ.setdefault("RAY_LOG_TO_DRIVER", "0")
    # Ray 2.50 warns on every start that it will stop overriding CUDA_VISIBLE_DEVICES for actors
    # without GPUs; opting in to that behaviour now silences it (no actor here uses a GPU).
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    bin_dir = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", "")
    if bin_dir not in path.split(os.pathsep):
        os.environ["PATH"] = bin_dir + (os.pathsep + path if path else "")
    # The driver's workarounds (actors.upstream), before Ray forks its processes (ray.init here,
    # setup_ray_cluster in on_spark_cluster): py4j's finalizers, the log echo thread's imports.
    upstream.start("driver")


_LOG4J_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2.properties")


def _spark_configs(configs: dict[str, str] | None) -> dict[str, str]:
    merged = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.ui.showConsoleProgress": "false",
        # Without a log4j2 file of its own, RayDP's JVMs print "Reconfiguration failed: No
        # configuration found" as an ERROR, and Spark's routine warnings reach the console.
        "spark.log4j.config.file.name": _LOG4J_CONFIG,
        "spark.ray.log4j.config.file.name": _LOG4J_CONFIG,
    }
    merged.update(configs or {})
    for key in _JVM_OPTION_KEYS:
        given = merged.get(key, "").strip()
        merged[key] = f"{JVM_OPTIONS} {given}" if given else JVM_OPTIONS
    return merged


def _check_java() -> None:
    java_home = os.environ.get("JAVA_HOME")
    java = shutil.which("java")
    if java is None:
        raise SparkSessionError(
            "Spark on Ray needs a JDK 17 'java' on PATH (for example: apt-get install "
            f"openjdk-17-jdk-headless); got no 'java' on PATH={os.environ.get('PATH', '')!r}"
        )
    if java_home and not os.path.exists(os.path.join(java_home, "bin", "java")):
        raise SparkSessionError(
            f"JAVA_HOME must point to a JDK with bin/java, got JAVA_HOME={java_home!r} "
            "without one"
        )
    try:
        completed = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SparkSessionError(f"'{java} -version' must run, got {error!r}") from error
    banner = completed.stderr + completed.stdout
    match = re.search(r'version "(\d+)(?:\.(\d+))?', banner)
    if completed.returncode != 0 or match is None:
        raise SparkSessionError(
            f"'{java} -version' must print a Java version, got exit code "
            f"{completed.returncode} and {banner.strip()[:200]!r}"
        )
    major = int(match.group(1))
    if major == 1 and match.group(2):
        major = int(match.group(2))  # "1.8.0_392" is Java 8
    if major not in _SUPPORTED_JAVA_MAJORS:
        logger.warning(
            "Spark 3.5 on RayDP is tested with Java %s; found Java %d at %s",
            "/".join(map(str, _SUPPORTED_JAVA_MAJORS)),
            major,
            java,
        )


def _is_alive(session: SparkSession) -> bool:
    context = session.sparkContext
    return getattr(context, "_jsc", None) is not None


def _shared_raydp_session() -> SparkSession | None:
    # RayDP allows one Spark per process; one started by calling raydp directly is shared.
    if "raydp" not in sys.modules:
        return None
    import raydp.context
    from pyspark.sql import SparkSession

    if raydp.context._global_spark_context is None:
        return None
    active = SparkSession.getActiveSession()
    if active is not None and _is_alive(active):
        return active
    # Its session was stopped behind RayDP's back (spark.stop()); RayDP would refuse to start
    # another ("The spark environment has inited") until its own state is cleared.
    stop_spark()
    return None


def _master_actor_name() -> str | None:
    import raydp.context
    from raydp.spark.ray_cluster_master import RAYDP_SPARK_MASTER_SUFFIX

    context = raydp.context._global_spark_context
    if context is None:
        return None
    return str(context._app_name) + RAYDP_SPARK_MASTER_SUFFIX


def _wait_until_actor_gone(name: str) -> None:
    # RayDP stops its master actor without waiting for it. Until the actor is gone its name is
    # taken, and starting a session with the same app name fails with "name ... already taken".
    import ray

    deadline = time.monotonic() + _MASTER_STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name)
        except ValueError:
            return
        time.sleep(0.1)
    logger.warning(
        "RayDP's master actor %r was still alive %.0f s after stop; killing it",
        name,
        _MASTER_STOP_TIMEOUT_S,
    )
    try:
        ray.kill(ray.get_actor(name))
    except ValueError:
        pass


def _forget_raydp_context() -> None:
    import raydp.context

    with raydp.context._spark_context_lock:
        raydp.context._global_spark_context = None
