"""Deploy a job graph as named Ray actors, run it to the end, and collect its output.

Failure handling in this module is fail-fast: the first operator error, or the death of any
actor, stops the job, kills its actors, and raises ``JobFailedError`` with the cause.
"""

from __future__ import annotations

import functools
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import pyarrow as pa
import ray
from ray.exceptions import RayActorError, RayError, RayTaskError
from tqdm.auto import tqdm

from actors.naming import instance_name, validate_job_name
from actors.operator_actor import ChainSpec, OperatorActor
from actors.source_actor import BlockReader, SourceActor
from operators.errors import ActorflowError, JobFailedError

from .job_graph import JobGraph, SourceNode

__all__ = ["JobResult", "run_job"]

NAMESPACE = "actorflow"


@dataclass
class JobResult:
    """What a finished job produced.

    ``tables`` holds one Arrow table ``ObjectRef`` per instance of the last stage, in order;
    they are owned by the caller and outlive the job's actors.
    """

    job: str
    tables: list[Any]
    schemas: list[pa.Schema | None]
    side_outputs: dict[str, list[Any]]
    input_rows: int
    output_rows: int
    elapsed_s: float
    figures: list[dict[str, Any]] = field(default_factory=list)
    finished: Any = None

    def to_arrow(self) -> pa.Table:
        tables = [t for t in ray.get(self.tables) if t is not None]
        if not tables:
            return pa.table({})
        return pa.concat_tables(tables, promote_options="permissive")


@functools.cache
def _actor_class(cls: type) -> Any:
    # One remote class per process: each ray.remote(cls) is exported to the cluster anew, which
    # costs about 0.2 s a job (Ray disassembles the class to name it).
    return ray.remote(cls)


def _remote(cls: type, name: str, num_cpus: float, **options: Any) -> Any:
    return _actor_class(cls).options(
        name=name, namespace=NAMESPACE, num_cpus=num_cpus, max_restarts=0, lifetime=None, **options
    )


def run_job(
    graph: JobGraph,
    *,
    job_name: str | None = None,
    output_schema: pa.Schema | None = None,
    side_tags: tuple[str, ...] = ("dead_letter",),
    progress: bool = True,
    actor_num_cpus: float = 0.0,
    on_finish: Callable[[list[Any], list[pa.Schema | None]], Any] | None = None,
) -> JobResult:
    """Run ``graph`` on the connected Ray cluster until its input is exhausted.

    ``on_finish(last_stage_actors, their_schemas)`` runs after the job drained and before its
    actors go; what it returns is ``JobResult.finished``, and ``JobResult.tables`` stays empty.
    A sink uses it to have the actors write their output in the form it reads.

    The first stage reads the source itself when their parallelism matches, and the last stage
    keeps its output: a job of operators with one parallelism P runs on P actors. Otherwise
    source actors feed the first stage over rebalancing channels.
    """
    job = validate_job_name(job_name or f"job-{uuid.uuid4().hex[:8]}")
    stages = graph.stages()
    source = graph.source
    chained_source = stages[0].partitioning == "forward"
    started = time.perf_counter()
    handles: list[Any] = []
    try:
        # Create stages from the last to the first, so every actor knows its downstream. Actor
        # creation does not block: all the processes start at once.
        downstream: list[Any] | None = None
        downstream_partitioning = "forward"
        stage_actors: list[list[Any]] = []
        wiring: list[tuple[Any, list[Any] | None, bool, int]] = []
        for position in range(len(stages) - 1, -1, -1):
            stage = stages[position]
            num_inputs = source.parallelism if position == 0 else stages[position - 1].parallelism
            if stage.partitioning == "forward":
                num_inputs = 1
            actors = []
            for i in range(stage.parallelism):
                spec = ChainSpec(
                    job=job,
                    name=stage.name,
                    index=i,
                    parallelism=stage.parallelism,
                    num_inputs=num_inputs,
                    operator_factories=[n.factory for n in stage.nodes],
                    partitioning=downstream_partitioning,
                    key=None if position == len(stages) - 1 else stages[position + 1].key,
                    output_schema=output_schema if position == len(stages) - 1 else None,
                    input_schema=source.schema,
                )
                actors.append(_remote(OperatorActor, spec.instance_name, actor_num_cpus).remote(spec))
            handles.extend(actors)
            stage_actors.insert(0, actors)
            for i, actor in enumerate(actors):
                targets = None if downstream is None else (
                    [downstream[i]] if downstream_partitioning == "forward" else downstream)
                wiring.append((actor, targets, position == 0 and chained_source, i))
            downstream = actors
            downstream_partitioning = stage.partitioning

        # The processes start while the input is prepared.
        splits = graph.splits()
        connects = [
            actor.connect.remote(targets, _reader(source, splits[i]) if reads_source else None)
            for actor, targets, reads_source, i in wiring
        ]
        first = stage_actors[0]
        sources: list[Any] = []
        if not chained_source:
            for i in range(source.parallelism):
                name = instance_name(job, source.name, i, source.parallelism)
                handle = _remote(SourceActor, name, actor_num_cpus).remote(
                    job, source.name, i, source.parallelism, _reader(source, splits[i]),
                    key=stages[0].key if stages[0].partitioning == "hash" else None)
                connects.append(handle.connect.remote(first, i))
                sources.append(handle)
            handles.extend(sources)
        ray.get(connects)
        ray.get([a.start.remote() for actors in stage_actors for a in actors])

        runs = [s.run.remote() for s in sources]
        waits = [a.wait.remote() for actors in stage_actors for a in actors]
        _await_job(job, runs + waits, first, [a for actors in stage_actors for a in actors], source.total_rows,
                   progress)
        figures = ray.get(runs + waits)
        last = stage_actors[-1]
        # With a hook, the hook takes the output in its own form; the tables are not made too.
        tables = [a.take_table.remote() for a in last] if on_finish is None else []
        schemas = ray.get([a.output_schema.remote() for a in last])
        side = {tag: [v for values in ray.get([a.take_side.remote(tag) for actors in stage_actors for a in actors])
                      for v in values] for tag in side_tags}
        finished = on_finish(last, schemas) if on_finish is not None else None
        ray.wait(tables, num_returns=len(tables), fetch_local=False)
        output_rows = sum(f["records_out"] for f in ray.get([a.stats.remote() for a in last]))
        return JobResult(job, tables, schemas, side, source.total_rows, output_rows, time.perf_counter() - started,
                         figures, finished)
    except RayError as error:  # an actor died, or a call into one failed, outside the wait
        raise _job_failure(job, error) from _cause(error)
    finally:
        for handle in handles:
            ray.kill(handle, no_restart=True)


def _reader(source: SourceNode, blocks: list[Any]) -> BlockReader:
    return BlockReader(
        blocks,
        batch_size=source.batch_size,
        timestamp_column=source.timestamp_column,
        out_of_orderness_ms=source.out_of_orderness_ms,
        idleness_ms=source.idleness_ms,
    )


def _await_job(
    job: str, refs: list[Any], first_stage: list[Any], operators: list[Any], total_rows: int, progress: bool
) -> None:
    """Wait for the job, failing fast; the bar counts input records that have an outcome.

    A record is done once the first stage has emitted its outcome (or filtered it out). The
    bar also shows the requests in flight in every stage and the age of the oldest, so that a
    stuck call is visible even when every record has been read.
    """
    pending = list(refs)
    bar = tqdm(total=total_rows, unit="rec", desc=job, delay=2.0, disable=not progress, leave=False)
    polled = 0.0
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=0.1)
            for ref in ready:
                try:
                    ray.get(ref)
                except RayError as error:
                    raise _job_failure(job, error) from _cause(error)
            if progress and not bar.disable and pending and time.monotonic() - polled >= 0.5:
                polled = time.monotonic()
                try:
                    figures = ray.get([a.record_progress.remote() for a in operators])
                except RayError as error:  # an actor died between two polls
                    raise _job_failure(job, error) from _cause(error)
                first = figures[: len(first_stage)]
                bar.update(min(total_rows, sum(f["done"] for f in first)) - bar.n)
                oldest = max((f["oldest_ms"] for f in figures if f["oldest_ms"] is not None), default=None)
                bar.set_postfix_str(
                    f"in flight {sum(f['in_flight'] for f in figures)}"
                    + ("" if oldest is None else f", oldest {oldest / 1000:.1f}s"),
                    refresh=False,
                )
        bar.update(total_rows - bar.n)
    finally:
        bar.close()


def _cause(error: BaseException) -> BaseException:
    if isinstance(error, RayTaskError):
        cause = error.cause if getattr(error, "cause", None) is not None else error
        return cause
    return error


def _job_failure(job: str, error: BaseException) -> JobFailedError:
    cause = _cause(error)
    if isinstance(cause, RayActorError):
        return JobFailedError(f"job {job!r} failed: an actor died: {cause}")
    if isinstance(cause, ActorflowError):
        return JobFailedError(f"job {job!r} failed: {cause}")
    return JobFailedError(f"job {job!r} failed: {type(cause).__name__}: {cause}")
