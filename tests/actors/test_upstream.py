"""The upstream workarounds (``actors.upstream``): a canary per module that fails once the upstream
behaviour relied on changes, a test per switch that it turns that one workaround off, and none of
them applied by an import."""

from __future__ import annotations

import ctypes
import inspect
import json
import mmap
import os
import subprocess
import sys
import textwrap
import tokenize
from pathlib import Path
from typing import Any

import pytest

from actorflow.actors import upstream
from actorflow.actors.upstream import WORKAROUNDS, installed_version
from actorflow.actors.upstream import ray as ray_upstream

ROOT = Path(__file__).resolve().parents[2]
PINNED = ("ray", "py4j", "cpython")  # glibc and the kernel vary by machine: their canaries check behaviour


def _python(script: str, **env: str) -> str:
    """What ``script`` prints in a new interpreter with ``env`` added to this one's."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **env}, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


# -- the registry --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(WORKAROUNDS))
def test_each_workaround_runs_on_a_verified_version_of_its_pinned_project(name):
    w = WORKAROUNDS[name]
    assert w.switch == f"ACTORFLOW_NO_{name.upper()}" and w.does and w.cost_off
    assert (ROOT / "actors" / "upstream" / f"{w.module}.py").exists()
    if w.upstream in PINNED:
        version = installed_version(w.upstream)
        assert version in w.verified, (
            f"{name} relies on {w.upstream} {', '.join(w.verified)}; {version} is installed: check its canary "
            f"in this file, then add {version} to WORKAROUNDS[{name!r}].verified")


def test_each_switch_is_named_in_the_module_that_honours_it():
    for w in WORKAROUNDS.values():
        assert w.switch in (ROOT / "actors" / "upstream" / f"{w.module}.py").read_text(), w.name


def test_the_internals_page_lists_every_switch():
    page = (ROOT / "docs" / "internals" / "index.md").read_text()
    table = page[page.index("## Every workaround"):]
    table = table[:table.index("\n#")]
    listed = {line.split("`")[1] for line in table.splitlines() if line.startswith("| `")}
    assert listed == {w.switch.removeprefix("ACTORFLOW_NO_") for w in WORKAROUNDS.values()}


def test_a_switch_reads_one_or_any_word_but_zero_as_off(monkeypatch):
    monkeypatch.setenv("ACTORFLOW_NO_MALLOPT", "0")
    assert upstream.enabled("mallopt")
    monkeypatch.setenv("ACTORFLOW_NO_MALLOPT", "1")
    assert not upstream.enabled("mallopt") and upstream.enabled("huge_pages")
    with pytest.raises(KeyError, match="no workaround 'malloc'"):
        upstream.enabled("malloc")


def test_a_failure_is_one_warning_naming_the_workaround_its_switch_and_the_version(caplog):
    upstream._warned.discard("huge_pages")
    upstream.failed("huge_pages", "prctl said no")
    upstream.failed("huge_pages", "prctl said no again")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    assert "'huge_pages'" in warnings[0] and "ACTORFLOW_NO_HUGE_PAGES=1" in warnings[0]
    assert f"linux {installed_version('linux')}" in warnings[0] and "prctl said no" in warnings[0]


def test_nothing_is_patched_or_tuned_by_importing_actorflow():
    out = _python("""
        import ctypes, gc, sys
        import actorflow, actorflow.actors, actorflow.cluster, actorflow.spark_bridge, actorflow.actors.upstream
        import actorflow.actors.heap, actorflow.actors.store_pages, actorflow.actors.operator_actor
        from py4j.clientserver import ThreadLocalConnectionFinalizer as F
        print("py4j", F.__del__.__module__, hasattr(F, "_actorflow_owner_pid"))
        print("gc", gc.get_freeze_count(), gc.get_threshold() == (700, 10, 10))
        print("thp", ctypes.CDLL(None).prctl(42, 0, 0, 0, 0))
        print("echo", "ray._private.event.event_logger" in sys.modules)
        import actorflow.actors.upstream as u
        print("started", u.start("driver"), F.__del__.__module__)
    """)
    assert out.splitlines() == ["py4j py4j.clientserver False", "gc 0 True", "thp 0", "echo False",
                                "started ['py4j_fork', 'echo_imports'] actorflow.actors.upstream.py4j"]


# -- ray -----------------------------------------------------------------------------------------------


def test_canary_ray_raylet_serves_prestart_workers_with_the_request_fields_sent():
    from ray.core.generated import node_manager_pb2

    method = node_manager_pb2.DESCRIPTOR.services_by_name["NodeManagerService"].methods_by_name.get("PrestartWorkers")
    assert method is not None, f"ray {installed_version('ray')}: the raylet has no PrestartWorkers"
    assert method.input_type.name == "PrestartWorkersRequest"
    fields = {f.name: f.type for f in method.input_type.fields}
    sent = ["language", "job_id", "runtime_env_info", "keep_alive_duration_secs", "num_workers"]
    assert sorted(fields) == sorted(sent), f"ray {installed_version('ray')}: PrestartWorkersRequest has {fields}"
    assert inspect.signature(ray_upstream.request_workers)  # the call builds exactly those fields
    source = inspect.getsource(ray_upstream.request_workers)
    assert all(f"{name}=" in source for name in sent)


def test_canary_ray_names_its_idle_and_starting_workers_as_the_scan_expects():
    import ray._private.ray_constants as constants
    import ray._private.workers

    assert constants.WORKER_PROCESS_TYPE_IDLE_WORKER == "ray::IDLE", installed_version("ray")
    scripts = Path(ray._private.workers.__file__).parent
    assert (scripts / "default_worker.py").exists() and (scripts / "setup_worker.py").exists()
    assert ray_upstream.idle_or_starting(["ray::IDLE"]) and ray_upstream.idle_or_starting(
        [sys.executable, str(scripts / "default_worker.py")])
    assert not ray_upstream.idle_or_starting(["ray::OperatorActor.push"])


def test_canary_ray_core_worker_has_the_private_methods_read():
    from ray._raylet import CoreWorker

    for method in ("get_current_runtime_env", "get_owner_address"):
        assert hasattr(CoreWorker, method), f"ray {installed_version('ray')}: CoreWorker has no {method}"


def test_canary_ray_raylet_knows_the_idle_worker_setting():
    import ray._raylet

    assert b"idle_worker_killing_time_threshold_ms" in Path(ray._raylet.__file__).read_bytes(), installed_version("ray")


def test_canary_ray_wraps_an_actors_private_methods_with_their_originals_as_wrapped():
    import ray

    class Plain:
        def _step(self):
            return 1

        async def _later(self):
            return 2

    made = ray.remote(Plain).__ray_metadata__.modified_class
    for name in ("_step", "_later"):
        assert getattr(made, name).__wrapped__ is vars(Plain)[name], f"ray {installed_version('ray')}: {name}"


def test_canary_ray_echoes_worker_logs_through_the_handler_filtered_and_says_the_noise():
    import ray._private.worker
    import ray._raylet
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    assert '"ray_print_logs"' in inspect.getsource(ray._private.worker), installed_version("ray")
    assert callable(dispatcher.add_handler) and callable(dispatcher.remove_handler) and isinstance(dispatcher.handlers, list)
    assert b"GcsClient has no Cluster ID set" in Path(ray._raylet.__file__).read_bytes()


def test_canary_ray_prints_the_raylets_notes_through_print_to_stdstream_and_says_the_worker_pool_note():
    import ray._private.worker
    import ray._raylet

    assert "print_to_stdstream(" in inspect.getsource(ray._private.worker.listen_error_messages), installed_version("ray")
    raylet = Path(ray._raylet.__file__).parent / "core" / "src" / "ray" / "raylet" / "raylet"
    assert b" worker processes have been started on node: " in raylet.read_bytes(), installed_version("ray")


def test_canary_ray_warns_of_the_arrow_ipc_fallback_with_the_words_filtered():
    import ray._private.arrow_serialization as arrow_serialization

    assert ray_upstream.ARROW_FALLBACK in inspect.getsource(arrow_serialization), installed_version("ray")


_ECHO_SCRIPT = """
import logging, sys
import pyarrow as pa
import ray._private.worker as worker
from ray._private.arrow_serialization import _arrow_table_reduce
from actorflow.actors.upstream import ray as ray_upstream

logging.basicConfig(stream=sys.stderr, level=logging.INFO)
ray_upstream.filter_log_echo()
ray_upstream.quiet_arrow_fallback()
note = "WARNING: 9 PYTHON worker processes have been started on node: 01ab with address: 127.0.0.1."
worker.print_to_stdstream({"lines": [note], "pid": "raylet", "is_err": False}, ignore_prefix=False)
worker.print_to_stdstream({"lines": ["a user's line"], "pid": "raylet", "is_err": False}, ignore_prefix=False)
# A column type Ray's zero-copy reducer refuses, so that it falls back to Arrow IPC and warns.
union = pa.UnionArray.from_dense(pa.array([0, 1], type=pa.int8()), pa.array([0, 0], type=pa.int32()),
                                 [pa.array([1]), pa.array(["a"])])
table = pa.table({"u": union, "id": [1, 2]})
reconstruct, args = _arrow_table_reduce(table)
assert reconstruct(*args).equals(table)
"""


@pytest.mark.parametrize("off", [False, True])
def test_switch_console_filter_lets_the_worker_pool_note_and_the_arrow_fallback_traceback_through(off):
    # A process of its own: the filters stay in the process that set them. Ray raises instead of
    # falling back where it sees pytest's variable (for types other than dense unions).
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    if off:
        env["ACTORFLOW_NO_CONSOLE_FILTER"] = "1"
    done = subprocess.run([sys.executable, "-c", _ECHO_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "a user's line" in done.stdout, done.stdout
    assert ("PYTHON worker processes have been started" in done.stdout) is off, done.stdout
    assert (ray_upstream.ARROW_FALLBACK in done.stderr) is off, done.stderr
    assert ("Traceback" in done.stderr) is off, done.stderr


def test_canary_py4j_calls_the_jvm_from_modules_named_py4j_and_pyspark_cancels_jobs_on_sigint():
    import pyspark.context
    from py4j import clientserver, java_gateway

    from actorflow.actors.upstream.py4j import in_a_call_to_the_jvm

    assert java_gateway.JavaMember.__call__.__module__ == "py4j.java_gateway", installed_version("py4j")
    assert clientserver.ClientServerConnection.send_command.__module__ == "py4j.clientserver", installed_version("py4j")
    source = inspect.getsource(pyspark.context.SparkContext)
    assert "signal.signal(signal.SIGINT" in source and "cancelAllJobs()" in source, installed_version("pyspark")
    assert not in_a_call_to_the_jvm(inspect.currentframe())


def test_ensure_ray_filters_the_raylets_notes_without_spark(ray_session, monkeypatch):
    import ray._private.worker as worker

    from actorflow.spark_bridge import ensure_ray

    original = worker.print_to_stdstream
    while isinstance(original, ray_upstream._StdstreamFilter):
        original = original.print_to_stdstream
    monkeypatch.setattr(worker, "print_to_stdstream", original)  # as a pipeline that never started Spark has it
    ensure_ray()
    assert isinstance(worker.print_to_stdstream, ray_upstream._StdstreamFilter)


def test_canary_ray_private_modules_imported_and_constants_read_exist():
    import importlib

    from ray._private import ray_constants

    for module in (*ray_upstream.LOG_ECHO_MODULES, *ray_upstream.DESERIALIZATION_MODULES):
        importlib.import_module(module)
    assert isinstance(ray_constants.DASHBOARD_ADDRESS, str) and ray_constants.KV_NAMESPACE_DASHBOARD


def test_the_private_reads_answer_in_a_live_driver(ray_session):
    import ray

    assert isinstance(ray_upstream.current_runtime_env(), str)
    [address] = ray_upstream.owner_addresses([ray.put(1)])
    assert isinstance(address, bytes) and address
    assert ray_upstream.dashboard_address() is None or isinstance(ray_upstream.dashboard_address(), bytes)


def test_canary_ray_raylet_names_its_node_and_its_workers_carry_its_pid(ray_session):
    import os

    import ray

    @ray.remote(num_cpus=0.01)
    def where():
        return os.environ.get("RAY_RAYLET_PID"), os.environ.get("RAY_JOB_ID")

    raylet = ray_upstream.raylet_pid(ray.get_runtime_context().get_node_id())
    assert raylet is not None, f"ray {installed_version('ray')}: no raylet process has --node_id=<this node>"
    pid, job = ray.get(where.remote())
    assert pid == str(raylet) and job == ray.get_runtime_context().get_job_id(), installed_version("ray")
    workers = list(ray_upstream.job_workers(job, ray.get_runtime_context().get_node_id()))
    assert workers and all(w.env["RAY_RAYLET_PID"] == str(raylet) for w in workers)
    assert ray_upstream.raylet_pid("0" * 56) is None


def test_switch_tracing_shims_leaves_rays_wrappers_in_place(monkeypatch):
    import ray

    class Actor:
        def _step(self):
            return 1

    made = ray.remote(Actor).__ray_metadata__.modified_class
    bound = object.__new__(made)
    assert ray_upstream.bind_private_methods(bound) == 1 and bound._step.__func__ is vars(Actor)["_step"]
    monkeypatch.setenv("ACTORFLOW_NO_TRACING_SHIMS", "1")
    left = object.__new__(made)
    assert ray_upstream.bind_private_methods(left) == 0 and left._step.__func__ is made._step
    assert left._step() == 1


NOISE_LINE = "[2026-11-27 17:08:50,035 I 1 2] gcs_client.cc:92: GcsClient has no Cluster ID set, and won't fetch."


@pytest.mark.parametrize("off", [False, True])
def test_switch_console_filter_lets_the_noise_through(off, monkeypatch):
    if off:
        monkeypatch.setenv("ACTORFLOW_NO_CONSOLE_FILTER", "1")
    read_end, write_end = os.pipe()
    saved = os.dup(2)
    os.dup2(write_end, 2)
    try:
        with ray_upstream.stderr_of_children_filtered() as copier:
            child = subprocess.Popen([sys.executable, "-c", f"import sys; print({NOISE_LINE!r}, 'x', file=sys.stderr)"])
    finally:
        os.dup2(saved, 2)
        os.close(write_end)
        os.close(saved)
    child.wait(30)
    if copier is not None:
        copier.join(10)
    with os.fdopen(read_end, "rb") as seen:
        assert ("GcsClient" in seen.read().decode()) is off
    assert (copier is None) is off


def test_switch_idle_worker_keep_leaves_rays_config(monkeypatch):
    assert ray_upstream.system_config() == {"idle_worker_killing_time_threshold_ms": 60_000}
    monkeypatch.setenv("ACTORFLOW_NO_IDLE_WORKER_KEEP", "1")
    assert ray_upstream.system_config() is None


def test_switch_prestart_workers_asks_the_raylet_for_nothing(ray_session, monkeypatch):
    from actorflow.cluster import warm_workers

    monkeypatch.setenv("ACTORFLOW_NO_PRESTART_WORKERS", "1")
    assert warm_workers.prestart_task_workers(2, settle_s=0) is None
    assert warm_workers.prestart_workers(2, settle_s=0) is None


@pytest.mark.parametrize("off", [False, True])
def test_switch_echo_imports_leaves_the_log_echo_modules_unimported(off):
    out = _python("""
        import sys
        from actorflow.actors import upstream
        print(upstream.start("driver"), "ray._private.event.event_logger" in sys.modules)
    """, **({"ACTORFLOW_NO_ECHO_IMPORTS": "1"} if off else {}))
    assert ("echo_imports" in out, out.split()[-1]) == (not off, str(not off))


# -- cpython -------------------------------------------------------------------------------------------


def test_canary_cpython_gc_freeze_moves_what_exists_to_the_permanent_generation():
    out = _python("""
        import gc
        before = gc.get_freeze_count()
        gc.freeze()
        print(before, gc.get_freeze_count() > 1000)
        gc.unfreeze()
        gc.set_threshold(50_000, 50, 100)
        print(gc.get_threshold())
    """)
    assert out.splitlines() == ["0 True", "(50000, 50, 100)"], installed_version("cpython")


@pytest.mark.parametrize("off", [False, True])
def test_switch_gc_freeze_leaves_a_workers_objects_to_the_collector(off):
    out = _python("""
        import gc
        from actorflow.actors import upstream
        from actorflow.actors.upstream import cpython
        print(upstream.start("worker"), gc.get_freeze_count() > 0, cpython.relax_collector(), gc.get_threshold())
    """, **({"ACTORFLOW_NO_GC_FREEZE": "1"} if off else {}))
    expected = "[] False False (700, 10, 10)" if off else "['gc_freeze'] True True (50000, 50, 100)"
    assert out.strip() == expected


# -- glibc ---------------------------------------------------------------------------------------------

_MMAPPED_BLOCKS = """
    import ctypes
    from actorflow.actors.heap import keep_freed_memory
    libc = ctypes.CDLL(None)
    class Mallinfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc.mallinfo2.restype = Mallinfo2
    libc.malloc.restype = ctypes.c_void_p
    took = keep_freed_memory()
    before = libc.mallinfo2().hblks
    block = libc.malloc(8 << 20)  # above glibc's default threshold (128 KiB), below the one set (32 MiB)
    print(took, libc.mallinfo2().hblks - before)
    libc.free(ctypes.c_void_p(block))
"""


def test_canary_glibc_mallopt_takes_the_thresholds():
    libc = ctypes.CDLL(None)
    assert hasattr(libc, "mallopt") and hasattr(libc, "mallinfo2"), installed_version("glibc")
    assert _python(_MMAPPED_BLOCKS).strip() == "True 0"  # the block came from the heap, not an mmap


def test_switch_mallopt_leaves_a_large_block_to_its_own_mmap():
    assert _python(_MMAPPED_BLOCKS, ACTORFLOW_NO_MALLOPT="1").strip() == "False 1"


# -- linux ---------------------------------------------------------------------------------------------


def test_canary_linux_offers_transparent_huge_pages_and_a_process_switch():
    from actorflow.actors.upstream import linux

    text = Path(linux.THP_FILE).read_text()
    assert set(text.replace("[", "").replace("]", "").split()) >= set(linux.THP_MODES), text
    assert linux.thp_mode() in linux.THP_MODES
    out = _python("""
        import ctypes
        prctl = ctypes.CDLL(None).prctl
        print(prctl(42, 0, 0, 0, 0), prctl(41, 1, 0, 0, 0), prctl(42, 0, 0, 0, 0))
    """)
    assert out.split() == ["0", "0", "1"], installed_version("linux")


@pytest.mark.parametrize("off", [False, True])
def test_switch_huge_pages_leaves_the_process_its_huge_pages(off):
    out = _python("""
        import ctypes
        from actorflow.actors.heap import for_whole_batches
        for_whole_batches()
        print(ctypes.CDLL(None).prctl(42, 0, 0, 0, 0))
    """, **({"ACTORFLOW_NO_HUGE_PAGES": "1"} if off else {}))
    assert out.strip() == ("0" if off else "1")


def _store_like_mapping(tmp_name: str) -> tuple[mmap.mmap, int]:
    """A shared mapping of a file in /dev/shm named like the object store's, its pages touched."""
    path = Path("/dev/shm") / tmp_name
    size = 8 << 20
    with open(path, "w+b") as f:
        f.truncate(size)
        mapping = mmap.mmap(f.fileno(), size)
    path.unlink()
    mapping[:] = b"\x07" * size
    return mapping, size


def _shared_rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssShmem:"):
            return int(line.split()[1])
    raise AssertionError("no RssShmem in /proc/self/status")


@pytest.mark.parametrize("off", [False, True])
def test_canary_linux_and_switch_store_pages_drop_the_stores_pages_from_rss_keeping_the_data(off, monkeypatch):
    from actorflow.actors.upstream.linux import StorePages

    if off:
        monkeypatch.setenv("ACTORFLOW_NO_STORE_PAGES", "1")
    mapping, size = _store_like_mapping(f"plasma-actorflow-test-{os.getpid()}-{off}")
    try:
        before = _shared_rss_kib()
        released = StorePages().release()
        dropped_kib = before - _shared_rss_kib()
        assert (released == 0) if off else (released >= 1)  # ours, and the store's where Ray runs here
        if off:
            assert dropped_kib < 1024
        else:
            assert dropped_kib >= (size >> 10) - 256, installed_version("linux")
        assert mapping[:4] == b"\x07" * 4 and mapping[-1] == 7  # a shared mapping keeps its data
    finally:
        mapping.close()


# -- py4j ----------------------------------------------------------------------------------------------


def test_canary_py4j_finalizer_drops_a_threads_connection_from_the_clients_deque():
    # In a new interpreter: this one's may have the guard in place (a driver's start).
    out = _python("""
        import inspect
        import py4j.clientserver as clientserver
        finalizer = clientserver.ThreadLocalConnectionFinalizer
        print("__init__" in vars(finalizer) and "__del__" in vars(finalizer))
        print(list(inspect.signature(finalizer.__init__).parameters))
        print("self.deque.remove(conn)" in inspect.getsource(vars(finalizer)["__del__"]))
    """)
    # The finalizer takes the connection from the client's deque, which lets it go: what a forked
    # child must not do to its parent's connections.
    assert out.splitlines() == ["True", "['self', 'connection', 'dequeue']", "True"], installed_version("py4j")


@pytest.mark.parametrize("off", [False, True])
def test_switch_py4j_fork_leaves_a_finalizer_to_act_in_a_forked_child(off):
    # A finalizer made in the parent is finalized in a child: guarded, it leaves the connection.
    out = _python("""
        import collections, os, weakref
        from actorflow.actors import upstream
        started = upstream.start("driver")
        import py4j.clientserver as cs

        connection = object.__new__(cs.ClientServerConnection)
        deque = collections.deque([connection])
        finalizer = cs.ThreadLocalConnectionFinalizer(weakref.ref(connection), deque)
        pid = os.fork()
        if pid == 0:
            del finalizer
            print("child", len(deque), flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        print("py4j_fork" in started)
    """, **({"ACTORFLOW_NO_PY4J_FORK": "1"} if off else {}))
    assert out.splitlines() == (["child 0", "False"] if off else ["child 1", "True"])


# -- every workaround off --------------------------------------------------------------------------


@pytest.mark.processes
def test_a_keyed_window_job_with_every_workaround_off_gives_the_same_output():
    switches = {w.switch: "1" for w in WORKAROUNDS.values()}
    out = _python("""
        import gc, json, time
        import pyarrow as pa
        import ray
        from actorflow.spark_bridge import ensure_ray
        from actorflow.cluster import from_arrow
        from actorflow.operators.windows import TumblingEventTimeWindows

        started = time.monotonic()
        ensure_ray(num_cpus=2)
        table = pa.table({"k": ["a", "b", "c"] * 1_000, "ts": list(range(3_000))})
        stream = from_arrow([table.slice(0, 1_500), table.slice(1_500)], timestamp_column="ts", parallelism=2,
                            batch_size=500, job_name="all-off")
        result = stream.key_by("k", parallelism=2).window(TumblingEventTimeWindows.of(1_000)).count().execute(progress=False)
        rows = sorted(tuple(r.values()) for r in result.to_arrow().to_pylist())

        @ray.remote
        def worker_state():
            import gc, os, threading
            # The worker's setup hook (cluster.warm_workers.prepare_worker) imports in a thread, then
            # starts the worker's workarounds: with them on, the collector is frozen after it.
            for thread in threading.enumerate():
                if thread.name == "actorflow imports":
                    thread.join(60)
            return [gc.get_freeze_count(), os.environ.get("ACTORFLOW_NO_GC_FREEZE")]

        config = ray._private.state.state.get_system_config()
        print(json.dumps({"rows": rows, "columns": result.to_arrow().column_names, "worker": ray.get(worker_state.remote()),
                          "idle_keep": config.get("idle_worker_killing_time_threshold_ms"),
                          "seconds": round(time.monotonic() - started, 1)}))
        ray.shutdown()
    """, **switches)
    result = json.loads(out.splitlines()[-1])
    print("every workaround off:", result["seconds"], "s")
    # Each key counted in each of the three windows of 1,000 ms: 1,000 events among three keys.
    assert result["columns"] == ["k", "window_start", "window_end", "count"]
    expected = sorted((key, start, start + 1_000, count)
                      for start in (0, 1_000, 2_000) for key, count in zip("abc", _counts(start), strict=True))
    assert [tuple(r) for r in result["rows"]] == expected
    assert result["worker"] == [0, "1"]  # a worker inherited the switches; its collector is not frozen
    assert result["idle_keep"] is None  # Ray's own setting: 60,000 with the workaround on


def _counts(start: int) -> list[int]:
    keys = ["abc"[ts % 3] for ts in range(start, start + 1_000)]
    return [keys.count(k) for k in "abc"]


def _code(path: Path) -> str:
    """The names and operators of a module, joined: no comments, no strings, no docstrings."""
    with open(path, "rb") as source:
        return " ".join("".join(t.string for t in line_tokens) for line_tokens in _lines(source))


def _lines(source: Any) -> Any:
    line: list[tokenize.TokenInfo] = []
    for token in tokenize.tokenize(source.readline):
        if token.type in (tokenize.NAME, tokenize.OP):
            line.append(token)
        elif token.type in (tokenize.NEWLINE, tokenize.NL) and line:
            yield line
            line = []


@pytest.mark.parametrize("pattern", ["ray._private", "gc.freeze", "gc.set_threshold", "mallopt", "madvise",
                                     "PrestartWorkers", "_system_config={", "py4j", "prctl", "__wrapped__"])
def test_no_module_outside_actors_upstream_reaches_for_what_it_covers(pattern):
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    found = {
        path for path in tracked
        if path.split("/")[0] in ("actorflow", "actors", "cluster", "spark_bridge", "operators")
        and not path.startswith("actors/upstream/") and pattern in _code(ROOT / path)
    }
    assert found == set()
