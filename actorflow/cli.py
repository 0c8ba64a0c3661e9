"""The console command ``actorflow``: run a pipeline, watch running jobs, list checkpoints, run the demo.

::

    actorflow run examples.pipelines:tagged_users          # a DataStream, or a function returning one
    actorflow run my_jobs:enrich --address 10.0.0.5:6379      # on an existing Ray cluster
    actorflow status --address auto --watch 2                 # every operator instance, refreshed
    actorflow demo                                            # what `make demo` runs
    actorflow checkpoints /tmp/checkpoints                    # retained checkpoints of every job
    actorflow chaos --kills 10 --every 2s examples.enrich_clicks:pipeline   # exactly once, under kills

The usual mistakes (a module that cannot be imported, an object that is no pipeline, Ray that
cannot be reached, no Java for Spark) end with one line that says what to do, and exit code 2.
A job that fails ends with its ``JobFailedError`` and exit code 1.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import re
import socket
import sys
import time
import uuid
from typing import Any

import click

__all__ = ["main"]

NAMESPACE = "actorflow"


class _Usage(click.ClickException):
    """A mistake of the caller's: one line, exit code 2, no traceback."""

    exit_code = 2


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """actorflow: Flink's streaming core on Ray actors, from and to Spark DataFrames."""


@main.command()
@click.argument("target", metavar="MODULE:PIPELINE")
@click.option("--address", default=None, help="an existing Ray cluster (host:port or 'auto'); default: a local Ray")
@click.option("--progress/--no-progress", default=True, show_default=True)
@click.option("--checkpoint-dir", default=None, help="take checkpoints here (a path or pyarrow.fs URI) and recover from failures")
@click.option("--checkpoint-interval", "interval", default="5s", show_default=True,
              help="time between checkpoints, with --checkpoint-dir or --resume-from")
@click.option("--resume-from", default=None, help="start from the latest checkpoint of an earlier run (its job directory)")
@click.option("--output", default=None, metavar="PATH", help="write the output as Parquet to this new directory "
              "(a path or pyarrow.fs URI); with checkpoints, only what the job's checkpoints committed")
@click.option("--overwrite", is_flag=True, help="with --checkpoint-dir: delete the checkpoints of an earlier run of the "
              "job that did not finish, and start afresh")
@click.option("--side-outputs", default=None, metavar="DIR", help="a streaming pipeline's dead letters and side outputs "
              "(late data) as Parquet streams, each under DIR/<tag>")
def run(target: str, address: str | None, progress: bool, checkpoint_dir: str | None, interval: str,
        resume_from: str | None, output: str | None, overwrite: bool, side_outputs: str | None) -> None:
    """Run the pipeline MODULE:PIPELINE (a DataStream, or a function that returns one) to its end.

    Ctrl-C stops it, and names its last complete checkpoint and the command that resumes from it.
    """
    found = _find_pipeline(target)  # import errors first, before Ray starts
    settings: dict[str, Any] = {}
    if overwrite and (checkpoint_dir is None or resume_from is not None):
        raise _Usage("--overwrite goes with --checkpoint-dir, for a fresh run; it cannot go with --resume-from"
                     if resume_from is not None else "--overwrite goes with --checkpoint-dir")
    if checkpoint_dir is not None or resume_from is not None:
        settings["checkpoint_interval_ms"] = max(10, int(_duration_s(interval) * 1000))
        settings["checkpoint_dir"] = checkpoint_dir
    if resume_from is not None:
        _check_job_directory(resume_from, getattr(found, "job_name", None))
        settings["resume_from"] = resume_from
    _connect(address)
    stream = _as_stream(target, found)
    from actorflow.operators.errors import JobFailedError
    from actorflow.spark_bridge.streams import SparkDataStream

    if getattr(stream, "_streaming_df", None) is not None:
        _run_stream(target, stream, output, checkpoint_dir, resume_from, interval, side_outputs)
        return
    if side_outputs is not None:
        raise _Usage("--side-outputs goes with a streaming pipeline; a bounded one's dead letters and side outputs "
                     "are in its result (to_spark(dead_letters=True), get_side_output)")
    if output is not None:
        _check_output(output)

    resume = None
    if resume_from is not None:
        resume = _resume_job(target, stream, resume_from)
    elif checkpoint_dir is not None:
        if stream.job_name is None:  # named here, so that an interrupted run can name its checkpoints
            stream.job_name = f"job-{uuid.uuid4().hex[:8]}"
        resume = _fresh_job(stream.job_name, checkpoint_dir, overwrite)
    started = time.perf_counter()
    try:
        if isinstance(stream, SparkDataStream):
            out: Any = stream.to_spark(progress=progress, **settings)  # one DataFrame: no dead letters were asked for
            rows = out.count()
            click.echo(f"{target}: {rows:,} rows out, as a Spark DataFrame of {out.columns}")
            if output is not None and resume is None:
                out.write.parquet(output)  # Spark's own commit: _SUCCESS once every file is in place
                click.echo(f"output: {rows:,} rows as Parquet in {output} (written by Spark)")
            elif output is not None:
                _write_output(output, resume, stream.last_result)
        else:
            result = stream.execute(progress=progress, **settings)
            click.echo(f"{target}: job {result.job!r}, {result.input_rows:,} records in, "
                       f"{result.output_rows:,} records out"
                       + (f", {result.restarts} restarts" if result.restarts else ""))
            if output is not None:
                _write_output(output, resume, result)
    except JobFailedError as error:
        raise click.ClickException(str(error)) from error
    except KeyboardInterrupt:
        _interrupted(target, stream.job_name, resume, interval, address)
    import ray

    click.echo(f"finished in {time.perf_counter() - started:.1f} s on the Ray cluster at "
               f"{ray.get_runtime_context().gcs_address}")


def _run_stream(target: str, stream: Any, output: str | None, checkpoint_dir: str | None, resume_from: str | None,
                interval: str, side_outputs: str | None) -> None:
    """A pipeline of a streaming DataFrame: its query runs until Ctrl-C, SIGTERM or ``actorflow
    stop JOB``, then stops with a final checkpoint; the same command run again resumes from it."""
    import signal

    if output is None or checkpoint_dir is None or resume_from is not None:
        raise _Usage(f"{target} reads a streaming DataFrame: run it with --output PATH (its Parquet files) and "
                     "--checkpoint-dir DIR (its checkpoint location; the same command run again resumes from it)")
    sides = {} if side_outputs is None else {
        tag: f"{side_outputs.rstrip('/')}/{tag}" for tag in ("dead_letter", *stream.graph.side_tags)}
    query = stream.write_stream(output, checkpoint_location=checkpoint_dir,
                                checkpoint_interval_ms=max(10, int(_duration_s(interval) * 1000)), side_outputs=sides)
    import ray

    click.echo(f"{target}: streaming job {query.name!r} runs on the Ray cluster at "
               f"{ray.get_runtime_context().gcs_address}; Ctrl-C, SIGTERM or `actorflow stop {query.name}` "
               "stops it with a final checkpoint", err=True)

    def terminate(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        while query.is_active:
            query.await_termination(0.5)
    except KeyboardInterrupt:
        pass  # the usual way to stop a stream: not an error
    except Exception as error:  # noqa: BLE001 - the job's failure, said in one line
        raise click.ClickException(str(error)) from error
    finally:
        signal.signal(signal.SIGTERM, previous)
    query.stop()
    last = query.last_progress
    epoch = "" if last is None else f" after epoch {last['epoch']}"
    beside = "" if side_outputs is None else f", dead letters and side outputs in {side_outputs}"
    click.echo(f"stopped: job {query.name!r} stopped{epoch} with a final checkpoint in {checkpoint_dir}; "
               f"output in {output}{beside}. Run the same command to resume.")


@main.command()
@click.argument("job")
@click.option("--address", default="auto", show_default=True, help="the Ray cluster the job runs on")
def stop(job: str, address: str) -> None:
    """Stop the streaming job JOB, as Ctrl-C in its shell would: with a final checkpoint."""
    _connect(address, join_only=True)
    import ray

    from actorflow.cluster.checkpoints.coordinator import COORDINATOR
    from actorflow.actors.naming import instance_name

    try:
        coordinator = ray.get_actor(instance_name(job, COORDINATOR, 0, 1), namespace=NAMESPACE)
    except ValueError:
        raise _Usage(f"no job {job!r} runs on the Ray cluster at {ray.get_runtime_context().gcs_address}") from None
    ray.get(coordinator.request_stop.remote())
    click.echo(f"asked job {job!r} to stop; it takes a final checkpoint, and its driver ends")


def _check_output(path: str) -> None:
    import pyarrow.fs as pafs

    try:
        filesystem, where = pafs.FileSystem.from_uri(path)
    except (ValueError, OSError):
        filesystem, where = pafs.LocalFileSystem(), os.path.abspath(path)
    info = filesystem.get_file_info(where)
    if info.type == pafs.FileType.File or (
            info.type == pafs.FileType.Directory and filesystem.get_file_info(pafs.FileSelector(where))):
        raise _Usage(f"--output {path} exists; give a new directory (the output is never written over another)")


def _write_output(path: str, checkpoints: tuple[Any, str] | None, result: Any) -> None:
    """The job's output as Parquet in ``path``: with checkpoints, what they committed, epoch by
    epoch (``TwoPhaseOutput.export_parquet``); without, the output the job returned."""
    import ray

    from actorflow.cluster.checkpoints.sink import TwoPhaseOutput, export_tables

    if checkpoints is not None:
        rows, files = TwoPhaseOutput(checkpoints[0]).export_parquet(path, len(result.tables))
    else:
        rows, files = export_tables(path, ray.get(result.tables))
    click.echo(f"output: {rows:,} rows in {files} Parquet file{'s' if files != 1 else ''} in {path}")


def _fresh_job(job: str, checkpoint_dir: str, overwrite: bool) -> tuple[Any, str]:
    """The storage of a fresh run's checkpoints, and the directory to resume it from. It starts
    afresh as ``run_job`` starts it (``overwrite=True`` there), before the job, so that the
    refusal of an earlier run's checkpoints speaks the command's words."""
    from actorflow.cluster.checkpoints import UnfinishedRunError

    storage = _storage(checkpoint_dir, job)
    where = f"{checkpoint_dir.rstrip('/')}/{job}"
    try:
        storage.start_afresh(where, overwrite=overwrite)
    except UnfinishedRunError as earlier:
        raise _Usage(earlier.advice(f"--resume-from {where}", "--overwrite")) from None
    return storage, where


def _resume_job(target: str, stream: Any, resume_from: str) -> tuple[Any, str]:
    where = resume_from.rstrip("/")
    root, _, name = where.rpartition("/")
    if stream.job_name is not None and stream.job_name != name:
        raise _Usage(f"--resume-from {resume_from} holds the checkpoints of job {name!r}, but {target} is job "
                     f"{stream.job_name!r}; pass its directory, {root}/{stream.job_name}")
    return _storage(root, name), where


def _storage(directory: str, job: str) -> Any:
    from actorflow.cluster.checkpoints import CheckpointStorage

    return CheckpointStorage(directory, job=job)


def _interrupted(target: str, job: str | None, checkpoints: tuple[Any, str] | None, interval: str,
                 address: str | None) -> None:
    """Ctrl-C: say so, with the last complete checkpoint and the command that resumes from it; exit 130.

    The driver leaves Ray first, so that what Ray's core worker logs as it goes (at times a C++
    "bad optional access" after a Ctrl-C) comes before these lines, not after them.
    """
    import datetime

    import ray

    if ray.is_initialized():
        ray.shutdown()
    say = functools.partial(click.echo, err=True)
    if checkpoints is None:
        say(f"interrupted: job {job or target!r} stopped; it took no checkpoints, so a new run starts from the "
            "beginning (with --checkpoint-dir it could resume)")
        sys.exit(130)
    storage, where = checkpoints
    latest = storage.latest()
    if latest is None:
        say(f"interrupted: job {job!r} stopped before its first complete checkpoint; a new run starts from the beginning")
        sys.exit(130)
    at = datetime.datetime.fromtimestamp(latest.metadata["completed_at_ms"] / 1000, tz=datetime.timezone.utc)
    command = " ".join(["actorflow run", target, "--resume-from", where, "--checkpoint-interval", interval]
                       + (["--address", address] if address is not None else []))
    say(f"interrupted: job {job or storage.job!r} stopped; its last complete checkpoint is chk-{latest.checkpoint_id} "
        f"({at:%Y-%m-%d %H:%M:%S} UTC) in {where}")
    say(f"resume with: {command}")
    sys.exit(130)


@main.command()
@click.option("--address", default="auto", show_default=True, help="the Ray cluster whose jobs to show")
@click.option("--watch", type=float, default=None, metavar="SECONDS", help="refresh every SECONDS until interrupted")
@click.option("--epoch-ms", is_flag=True, help="show watermarks as epoch milliseconds, not as ISO-8601 UTC times")
def status(address: str, watch: float | None, epoch_ms: bool) -> None:
    """Every running operator instance: records in and out, requests in flight, watermark.

    With --watch, a job that stops running is shown below the table, ended or died (and how),
    and a cluster that goes away ends the watch, rather than leaving its last table on screen.
    """
    _connect(address, join_only=True)
    import ray

    gcs = ray.get_runtime_context().gcs_address
    seen: set[str] = set()  # the jobs this watch has seen running
    gone: dict[str, str] = {}  # job -> how it stopped, as shown
    try:
        while True:
            if watch is not None and not _reachable(gcs):
                # Ray's calls would wait for a cluster that is gone (a local Ray ends with the run
                # that started it), and the last table would stay on screen as if it still ran.
                jobs = f"; its jobs {sorted(seen)} ended or died with it" if seen else ""
                click.echo(f"the Ray cluster at {gcs} is gone at {_utc_now()}{jobs}")
                sys.exit(1)
            table, running = _status_table(epoch_ms)
            seen |= running
            for job in sorted(seen):
                if job in running:
                    gone.pop(job, None)
                elif job not in gone:
                    gone[job] = f"job {job}: {_how_it_stopped(job)} (seen at {_utc_now()})"
            if watch is not None:
                click.clear()
            click.echo("\n".join([table, *gone.values()]))
            if watch is None:
                return
            time.sleep(watch)
    except KeyboardInterrupt:
        sys.exit(130)


def _reachable(gcs_address: str) -> bool:
    host, _, port = gcs_address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=3):
            return True
    except (OSError, ValueError):
        return False


def _utc_now() -> str:
    import datetime

    return f"{datetime.datetime.now(datetime.timezone.utc):%H:%M:%S} UTC"


def _watermark_text(watermark_ms: int | None, epoch_ms: bool) -> str:
    """An ISO-8601 UTC time to the millisecond (so the exact value stays readable); the raw value
    where it is no date (the end of time) or ``--epoch-ms`` asks for it."""
    import datetime

    if watermark_ms is None:
        return ""
    if not epoch_ms:
        try:
            at = datetime.datetime.fromtimestamp(watermark_ms / 1000, tz=datetime.timezone.utc)
            return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        except (OverflowError, OSError, ValueError):
            pass
    return str(watermark_ms)


@main.command()
@click.argument("directory")
@click.option("--job", default=None, help="only this job's checkpoints")
@click.option("--id", "checkpoint_id", type=int, default=None, help="show one checkpoint's tasks and their sizes")
def checkpoints(directory: str, job: str | None, checkpoint_id: int | None) -> None:
    """The retained checkpoints in DIRECTORY (a path or a pyarrow.fs URI): complete and incomplete."""
    import datetime

    import pyarrow.fs as pafs

    from actorflow.cluster.checkpoints import CheckpointStorage

    try:
        filesystem, root = pafs.FileSystem.from_uri(directory)
    except (ValueError, OSError):
        filesystem, root = pafs.LocalFileSystem(), os.path.abspath(directory)
    if filesystem.get_file_info(root).type != pafs.FileType.Directory:
        raise _Usage(f"no checkpoint directory at {directory!r}; pass the directory a job was given as its checkpoint storage")
    jobs = sorted(i.base_name for i in filesystem.get_file_info(pafs.FileSelector(root)) if i.type == pafs.FileType.Directory)
    if job is not None:
        if job not in jobs:
            raise _Usage(f"no checkpoints of job {job!r} in {directory!r}; its jobs: {jobs}")
        jobs = [job]
    if not jobs:
        click.echo(f"no checkpoints in {directory}")
        return
    storages = {name: CheckpointStorage(root, job=name, filesystem=filesystem) for name in jobs}
    ids = {name: storage.checkpoint_ids() for name, storage in storages.items()}
    if checkpoint_id is not None and not any(checkpoint_id in complete for complete in ids.values()):
        held = "; ".join(f"job {name}: {complete}" for name, complete in ids.items())
        raise _Usage(f"no complete checkpoint {checkpoint_id} in {directory!r}; the complete ones: {held}")
    for name in jobs:
        storage = storages[name]
        complete = ids[name]
        incomplete = [i for i in storage.checkpoint_ids(complete_only=False) if i not in complete]
        click.echo(f"job {name}: {len(complete)} complete" + (f", incomplete {incomplete}" if incomplete else ""))
        for i in complete:
            if checkpoint_id is not None and i != checkpoint_id:
                continue
            chk = storage.get(i)
            at = datetime.datetime.fromtimestamp(chk.metadata["completed_at_ms"] / 1000, tz=datetime.timezone.utc)
            click.echo(f"  chk-{i:<6} {at:%Y-%m-%d %H:%M:%S} UTC  {chk.size_bytes:>12,} bytes  {len(chk.tasks)} tasks")
            if checkpoint_id is not None:
                for task in chk.tasks:
                    click.echo(f"    {task:<40} {chk.metadata['tasks'][task]:>12,} bytes")


def _duration_s(text: str) -> float:
    """``"2s"``, ``"500ms"``, ``"1m"`` or a plain number of seconds."""
    units = {"ms": 0.001, "s": 1.0, "m": 60.0}
    for unit in ("ms", "s", "m"):
        if text.endswith(unit):
            number, factor = text[: -len(unit)], units[unit]
            break
    else:
        number, factor = text, 1.0
    try:
        value = float(number) * factor
    except ValueError:
        raise _Usage(f"expected a duration such as 2s, 500ms or 1m, got {text!r}") from None
    if value <= 0:
        raise _Usage(f"a duration must be > 0, got {text!r}")
    return value


@main.command()
@click.argument("target", metavar="MODULE:PIPELINE")
@click.option("--kills", default=10, show_default=True, help="kill at most this many operator instances")
@click.option("--every", "every", default="2s", show_default=True, help="time between kills (2s, 500ms)")
@click.option("--first", "first", default=None, help="time to the first kill (default: --every)")
@click.option("--checkpoint-interval", "interval", default="1s", show_default=True, help="time between checkpoints")
@click.option("--moment", type=click.Choice(sorted(__import__("actorflow.cluster.chaos", fromlist=["MOMENTS"]).MOMENTS)),
              default=None, help="kill at this moment inside the actor instead of at once")
@click.option("--operator", default=None, help="kill only instances of this operator")
@click.option("--kill-node", "kill_node", is_flag=True,
              help="kill whole worker nodes (their raylet, actors and objects) instead of single actors")
@click.option("--key", "keys", multiple=True, help="key column(s) to compare by (default: the first column)")
@click.option("--seed", default=0, show_default=True)
@click.option("--address", default=None, help="an existing Ray cluster (host:port or 'auto'); default: a local Ray")
def chaos(target: str, kills: int, every: str, first: str | None, interval: str, moment: str | None,
          operator: str | None, kill_node: bool, keys: tuple[str, ...], seed: int, address: str | None) -> None:
    """Run MODULE:PIPELINE once without failures, then again while killing its actors; report
    what the second run lost, duplicated or made up. Exit code 1 unless the output is exact."""
    import json
    import tempfile

    import ray

    from actorflow.cluster.chaos import ChaosMonkey, compare_outputs
    from actorflow.operators.errors import JobFailedError

    every_s, first_s = _duration_s(every), _duration_s(first) if first is not None else None
    interval_ms = max(10, int(_duration_s(interval) * 1000))
    found = _find_pipeline(target)
    _connect(address)
    if kill_node and len([n for n in ray.nodes() if n["Alive"]]) < 2:
        raise _Usage("--kill-node kills worker nodes, never the driver's: it needs a Ray cluster of two nodes or more "
                     "(--address), and this one has one")
    stream = _as_stream(target, found)
    if stream.job_name is None:
        stream.job_name = f"chaos-{os.getpid()}"
    job = stream.job_name
    try:
        click.echo(f"{target}: a run without failures, for reference ...")
        started = time.perf_counter()
        expected = stream.execute(progress=False).to_arrow()
        reference_s = time.perf_counter() - started
        click.echo(f"  {expected.num_rows:,} rows in {reference_s:.1f} s")
        click.echo(f"{target}: a run under chaos: up to {kills} {'node ' if kill_node else ''}kills, every {every_s:g} s, "
                   f"checkpoints every {interval_ms} ms" + (f", at the moment {moment!r}" if moment else "") + " ...")
        with tempfile.TemporaryDirectory(prefix="actorflow-chaos-") as directory:
            started = time.perf_counter()
            with ChaosMonkey(job, every_s=every_s, max_kills=kills, operator=operator, moment=moment, seed=seed,
                             first_after_s=first_s, nodes=kill_node) as monkey:
                result = stream.execute(progress=False, checkpoint_interval_ms=interval_ms, checkpoint_dir=directory,
                                        max_restarts=max(20, 2 * kills))
            chaos_s = time.perf_counter() - started
    except JobFailedError as error:
        raise click.ClickException(str(error)) from error
    actual = result.to_arrow()
    key = list(keys) or [expected.column_names[0]]
    report = compare_outputs(expected, actual, key)
    report.kills, report.restarts, report.recoveries_s = monkey.kills, result.restarts, result.recoveries_s
    report.node_kills = monkey.node_kills
    report.failures = result.failures = monkey.explain(result.failures)
    # Ray prints its processes' log lines (a raylet's warnings) from a thread of its own, at any
    # time while connected: disconnect first, so that the report, and its JSON line last, is whole.
    ray.shutdown()
    for line in report.lines():
        click.echo(line)
    checkpoints = result.checkpoints or {}
    summary = {**report.summary(), "key": key, "reference_s": round(reference_s, 2), "chaos_s": round(chaos_s, 2),
               "checkpoints_completed": len(checkpoints.get("completed", [])),
               "checkpoint_s_p50": checkpoints.get("duration_s_p50")}
    click.echo(json.dumps(summary))
    if not report.exact:
        sys.exit(1)


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True}, add_help_option=False)
@click.pass_context
def demo(ctx: click.Context) -> None:
    """Enrich 100,000 clicks from a real HTTP service, then window them (what `make demo` runs)."""
    import shutil

    if shutil.which("java") is None:
        raise _Usage("the demo runs Spark, which needs a JDK 17 'java' on PATH (e.g. apt-get install openjdk-17-jdk-headless)")
    try:
        demo_main = importlib.import_module("examples.enrich_clicks").main
    except ModuleNotFoundError as error:
        raise _Usage(f"the demo ships with actorflow's source tree; run it from there ({error})") from error
    demo_main.main(args=ctx.args, prog_name="actorflow demo", standalone_mode=True)


def _check_job_directory(path: str, job: str | None = None) -> None:
    """Refuse, before Ray starts, a ``--resume-from`` that is no job directory with a complete
    checkpoint. Given the checkpoint root (``--checkpoint-dir``) instead, name the job directory
    in it: the job's name would otherwise be taken from the root's."""
    import pyarrow.fs as pafs

    from actorflow.cluster.checkpoints import CheckpointStorage

    try:
        filesystem, where = pafs.FileSystem.from_uri(path)
    except (ValueError, OSError):
        filesystem, where = pafs.LocalFileSystem(), os.path.abspath(path)
    if filesystem.get_file_info(where).type != pafs.FileType.Directory:
        raise _Usage(f"no checkpoint directory at {path!r}; pass a job's directory, <checkpoint-dir>/<job> "
                     "(`actorflow checkpoints <checkpoint-dir>` lists them)")
    children = filesystem.get_file_info(pafs.FileSelector(where))
    if not any(i.type == pafs.FileType.Directory and i.base_name.startswith("chk-") for i in children):
        jobs = sorted(i.base_name for i in children if i.type == pafs.FileType.Directory
                      and CheckpointStorage(where, job=i.base_name, filesystem=filesystem).checkpoint_ids())
        if jobs:
            base = path.rstrip("/")
            named = [job] if job in jobs else jobs
            raise _Usage(f"{path!r} is a checkpoint directory, not a job's; pass "
                         + (f"--resume-from {base}/{named[0]}" if len(named) == 1 else
                            "the directory of the job to resume: " + ", ".join(f"{base}/{j}" for j in named)))
    selector = pafs.FileSelector(where, recursive=True)
    if not any(i.base_name == "_metadata" for i in filesystem.get_file_info(selector)):
        raise _Usage(f"{path!r} holds no complete checkpoint to resume from")


def _find_pipeline(target: str) -> Any:
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise _Usage(f"expected MODULE:PIPELINE, such as examples.pipelines:tagged_users, got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # a module beside the caller, as `python -m` would find it
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise _Usage(f"cannot import {module_name!r}: {error}; run from the directory that holds it, "
                     "or install it") from error
    try:
        found = getattr(module, attribute)
    except AttributeError as error:
        names = sorted(getattr(module, "__all__", None) or (n for n in vars(module) if not n.startswith("_")))
        raise _Usage(f"module {module_name!r} has no {attribute!r}; it has {names}") from error
    if not callable(found):
        _as_stream(target, found)  # a value that is no pipeline fails here, before Ray starts
    else:
        _check_no_arguments(target, found)
    return found


def _check_no_arguments(target: str, function: Any) -> None:
    """A pipeline function is called with no arguments, once Ray runs: one that needs some is
    refused now, before Ray starts, rather than with a traceback after."""
    from actorflow.cluster.datastream import DataStream

    if isinstance(function, DataStream):
        return
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): the call says
        return
    needed = [p.name for p in parameters if p.default is inspect.Parameter.empty
              and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    if needed:
        raise _Usage(f"{target} needs the argument(s) {', '.join(needed)}, and `actorflow run` calls it with none; "
                     "give them defaults, or point at a function that takes none")


def _as_stream(target: str, obj: Any) -> Any:
    from actorflow.cluster.datastream import DataStream

    if callable(obj) and not isinstance(obj, DataStream):
        obj = obj()  # built now that Ray runs: sources put their data into the object store
    if not isinstance(obj, DataStream):
        raise _Usage(f"{target} is a {type(obj).__name__}, expected a DataStream (from_spark(...), "
                     "from_arrow(...) and their operators), or a function that returns one")
    return obj


def _connect(address: str | None, *, join_only: bool = False) -> None:
    import ray

    from actorflow.spark_bridge.session import ensure_ray

    if address not in (None, "auto") and not address.startswith("ray://"):
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host or "127.0.0.1", int(port)), timeout=3):
                pass
        except (OSError, ValueError) as error:
            raise _Usage(f"cannot reach Ray at {address!r} ({error}); start it with `ray start --head`, "
                         "or leave --address out for a local Ray") from error
    try:
        ensure_ray(address if address is not None or not join_only else "auto")
    except ConnectionError as error:
        raise _Usage(f"no Ray cluster to join at {address or 'auto'!r}: {error}; start one with `ray start --head`, "
                     "or pass --address") from error
    if not ray.is_initialized():
        raise _Usage(f"Ray did not start at {address!r}")


def _has_dashboard() -> bool:
    """Whether the connected cluster's dashboard (home of the State API) has noted its address.

    Asked once: the State API client asks again every 2 s for 40 s before it gives up."""
    from actorflow.actors.upstream.ray import dashboard_address

    try:
        address = dashboard_address()
    except Exception:  # noqa: BLE001 - a probe only: the State API client then tries, and says what is wrong
        return True
    return bool(address)


def _status_table(epoch_ms: bool = False) -> tuple[str, set[str]]:
    """The table of running operator instances, and the jobs that run: those with a live
    instance, or a live checkpoint coordinator (between two attempts of a restart)."""
    import ray
    from ray.util.state import list_actors

    from ray.util.state.exception import RayStateApiException

    from actorflow.cluster.chaos import live_instances

    ours: list[tuple[str, str]] | None = None
    if _has_dashboard():
        try:
            actors = list_actors(address=ray.get_runtime_context().gcs_address, filters=[("ray_namespace", "=", NAMESPACE)],
                                 limit=10_000, raise_on_missing_output=False)
            ours = sorted(((a.name, a.state) for a in actors if a.class_name == "OperatorActor" and a.state != "DEAD"))
        except (RayStateApiException, ConnectionError):
            pass
    if ours is None:
        # A cluster started without its dashboard has no State API; its GCS still knows the
        # live named actors, though not their states.
        ours = [(name, "ALIVE") for name in live_instances() if "/source[" not in name]
    named = ray.util.list_named_actors(all_namespaces=True)
    running = {a["name"].split("/", 1)[0] for a in named if a["namespace"] == NAMESPACE and "/" in a["name"]}
    running |= {name.split("/", 1)[0] for name, _ in ours}
    if not ours:
        return "no actorflow operator instances are running", running
    figures: dict[str, dict[str, Any]] = {}
    pending = {}
    for name, state in ours:
        if state == "ALIVE":
            try:
                pending[name] = ray.get_actor(name, namespace=NAMESPACE).stats.remote()
            except ValueError:  # it ended between the listing and now
                continue
    for name, ref in pending.items():
        try:
            figures[name] = ray.get(ref, timeout=5)
        except Exception:  # noqa: BLE001 - a dying actor shows with empty figures
            figures[name] = {}
    jobs = {name.split("/", 1)[0] for name, _ in ours}
    last_checkpoint = {job: _last_checkpoint(job) for job in jobs}
    streams = {job: line for job in sorted(jobs) if (line := _stream_line(job)) is not None}
    header = (f"{'operator instance':<40} {'state':<9} {'in':>10} {'out':>10} {'in flight':>9} {'watermark':>24} "
              f"{'checkpoint':>10} {'restarts':>8}")
    lines = [header, "-" * len(header)]
    for name, state in ours:
        f = figures.get(name, {})
        watermark = _watermark_text(f.get("watermark_ms"), epoch_ms)
        lines.append(
            f"{name:<40} {state:<9} {f.get('records_in', ''):>10} {f.get('records_out', ''):>10} "
            f"{f.get('in_flight_requests', ''):>9} {watermark:>24} "
            f"{last_checkpoint[name.split('/', 1)[0]]:>10} {f.get('restarts', ''):>8}"
        )
        if f:
            lines.append(f"    {_mailbox_text(name, f)}")
    lines.extend(streams.values())
    return "\n".join(lines), running


def _stream_line(job: str) -> str | None:
    """A streaming job's line under its instances (whose watermarks the table shows): its last
    epoch, how long ago that was published, its latency and checkpoint time; None for a bounded job."""
    import ray

    from actorflow.actors.naming import instance_name
    from actorflow.cluster.checkpoints.coordinator import COORDINATOR

    try:
        figures = ray.get(ray.get_actor(instance_name(job, COORDINATOR, 0, 1), namespace=NAMESPACE)
                          .stream_figures.remote(), timeout=5)
    except Exception:  # noqa: BLE001 - no coordinator (a job without checkpoints), or one that ends now
        return None
    if figures is None:
        return None
    lag_s = max(0.0, time.time() - figures["at_ms"] / 1000)
    return (f"job {job}: streaming, epoch {figures['epoch']} (checkpoint {figures['checkpoint_id']}), "
            f"{figures['rows_in']:,} rows in, {figures['rows_out']:,} out, published {lag_s:.1f} s ago; "
            f"latency {figures['latency_ms']:.0f} ms, checkpoint {figures['checkpoint_ms']:.0f} ms")


def _mailbox_text(name: str, figures: dict[str, Any]) -> str:
    """Whether the instance's input waits and why, and its mailbox: the line under its row.

    >>> _mailbox_text("j/slow+window[0/1]", {"suspended": "async_queue_full", "mailbox_depth": 64,
    ...               "mailbox_depth_by_priority": {0: 60, 1: 4}, "oldest_mail_age_ms": 1_234})
    'suspended: async_queue_full, 64 mails (slow 60, window 4), oldest 1.2 s'
    >>> _mailbox_text("j/slow[0/1]", {"suspended": None, "mailbox_depth": 1,
    ...               "mailbox_depth_by_priority": {0: 1}, "oldest_mail_age_ms": 3})
    'running, 1 mail, oldest 3 ms'
    """
    from actorflow.operators.mailbox import MAX_PRIORITY, MIN_PRIORITY

    suspended = figures.get("suspended")
    depth = int(figures.get("mailbox_depth") or 0)
    text = ("running" if suspended is None else f"suspended: {suspended}") + f", {depth:,} mail{'s' if depth != 1 else ''}"
    by_priority = figures.get("mailbox_depth_by_priority") or {}
    if len(by_priority) > 1:
        # A mail's priority is its operator's place in the chain (<operator>+<operator> in the name).
        operators = re.sub(r"\[\d+/\d+\](@\d+)?$", "", name.split("/", 1)[-1]).split("+")
        labels = {MIN_PRIORITY: "deferred", MAX_PRIORITY: "control", **dict(enumerate(operators))}
        text += " (" + ", ".join(f"{labels.get(p, f'priority {p}')} {n:,}" for p, n in by_priority.items()) + ")"
    oldest = figures.get("oldest_mail_age_ms")
    if oldest is not None:
        text += f", oldest {oldest} ms" if oldest < 1_000 else f", oldest {oldest / 1000:.1f} s"
    return text


def _how_it_stopped(job: str) -> str:
    """Whether a job that no longer runs ended or died, from its instances' causes of death:
    the job's driver ends them (``ray.kill``) when the job is over, whether it finished or
    failed; any other cause is a death, named with its instance."""
    import ray
    from ray.util.state import list_actors

    if not _has_dashboard():
        return "ENDED or DIED: no instance of it runs any more"
    try:
        actors = list_actors(address=ray.get_runtime_context().gcs_address, detail=True, limit=10_000,
                             filters=[("ray_namespace", "=", NAMESPACE), ("state", "=", "DEAD")],
                             raise_on_missing_output=False)
    except Exception:  # noqa: BLE001 - the State API is unavailable: say what is known
        return "ENDED or DIED: no instance of it runs any more"
    causes = {}
    for actor in actors:
        if (actor.name or "").startswith(f"{job}/"):
            context = (actor.death_cause or {}).get("actor_died_error_context") or {}
            causes[actor.name] = (context.get("reason", "UNSPECIFIED"), context.get("error_message", ""))
    died = {name: cause for name, cause in causes.items() if cause[0] != "RAY_KILL"}
    if not causes:
        return "ENDED or DIED: no instance of it runs any more"
    if not died:
        return "ENDED: its driver stopped its instances (it finished, or failed and was stopped)"
    if all(reason == "OWNER_DIED" for reason, _ in died.values()):
        return "DIED: the driver that ran it is gone"
    name, (reason, message) = sorted(died.items())[0]
    return f"DIED: {name} died ({reason}): {message.splitlines()[0][:300] if message else 'no message'}"


def _last_checkpoint(job: str) -> str:
    """The id of the job's last complete checkpoint; '-' for a job without checkpoints."""
    import ray

    from actorflow.actors.naming import instance_name
    from actorflow.cluster.checkpoints.coordinator import COORDINATOR

    try:
        coordinator = ray.get_actor(instance_name(job, COORDINATOR, 0, 1), namespace=NAMESPACE)
        last = ray.get(coordinator.figures.remote(), timeout=5)["last_completed"]
    except Exception:  # noqa: BLE001 - no coordinator (no checkpoints), or it is going
        return "-"
    return "none yet" if last is None else str(last)

