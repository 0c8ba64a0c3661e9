"""Deploy a job graph as named Ray actors, run it to the end, and collect its output.

Failure handling in this module is fail-fast: the first operator error, or the death of any
actor, stops the job, kills its actors, and raises ``JobFailedError`` with the cause.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import ray
from ray.exceptions import RayActorError, RayError, RayTaskError
from tqdm.auto import tqdm

from actors.naming import instance_name, validate_job_name
from actors.operator_actor import ChainSpec, OperatorActor
from actors.sink_actor import SinkActor
from actors.source_actor import SourceActor
from operators.errors import ActorflowError, JobFailedError

from .job_graph import JobGraph

__all__ = ["JobResult", "run_job"]

NAMESPACE = "actorflow"


@dataclass
class JobResult:
    """What a finished job produced.

    ``tables`` holds one Arrow table ``ObjectRef`` per sink channel, in order; they are owned
    by the caller and outlive the job's actors.
    """

    job: str
    tables: list[Any]
    schemas: list[pa.Schema | None]
    side_outputs: dict[str, list[Any]]
    input_rows: int
    output_rows: int
    elapsed_s: float
    figures: list[dict[str, Any]] = field(default_factory=list)

    def to_arrow(self) -> pa.Table:
        tables = [t for t in ray.get(self.tables) if t is not None]
        if not tables:
            return pa.table({})
        return pa.concat_tables(tables, promote_options="permissive")


def _remote(cls: type, name: str, num_cpus: float, **options: Any) -> Any:
    return ray.remote(cls).options(
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
) -> JobResult:
    """Run ``graph`` on the connected Ray cluster until its input is exhausted."""
    job = validate_job_name(job_name or f"job-{uuid.uuid4().hex[:8]}")
    stages = graph.stages()
    source = graph.source
    started = time.perf_counter()
    handles: list[Any] = []
    try:
        last = stages[-1]
        sink = _remote(SinkActor, instance_name(job, "sink", 0, 1), actor_num_cpus).remote(
            instance_name(job, "sink", 0, 1), last.parallelism,
            sum(s.parallelism for s in stages),
        )
        handles.append(sink)
        # Create stages from the last to the first, so every actor knows its downstream.
        downstream: list[Any] = [sink]
        downstream_partitioning = "rebalance" if last.parallelism > 1 else "forward"
        side_base = last.parallelism
        stage_actors: list[list[Any]] = []
        connects = []
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
                )
                actor = _remote(OperatorActor, spec.instance_name, actor_num_cpus).remote(spec)
                targets = [downstream[i]] if downstream_partitioning == "forward" else downstream
                side_channel = side_base + sum(s.parallelism for s in stages[:position]) + i
                connects.append(actor.connect.remote(targets, sink, side_channel))
                actors.append(actor)
            handles.extend(actors)
            stage_actors.insert(0, actors)
            downstream = actors
            downstream_partitioning = stage.partitioning
        ray.get(connects)
        ray.get([a.start.remote() for actors in stage_actors for a in actors])

        first = stage_actors[0]
        sources = []
        for i, blocks in enumerate(source.split()):
            handle = _remote(SourceActor, instance_name(job, source.name, i, source.parallelism), actor_num_cpus).remote(
                job, source.name, i, source.parallelism, blocks,
                batch_size=source.batch_size,
                timestamp_column=source.timestamp_column,
                out_of_orderness_ms=source.out_of_orderness_ms,
            )
            targets = [first[i]] if stages[0].partitioning == "forward" else first
            channel = 0 if stages[0].partitioning == "forward" else i
            ray.get(handle.connect.remote(targets, channel))
            sources.append(handle)
        handles.extend(sources)

        waits = [s.run.remote() for s in sources] + [a.wait.remote() for actors in stage_actors for a in actors]
        done_ref = sink.wait_done.remote()
        _await_job(job, waits + [done_ref], sources, source.total_rows, progress)
        figures = ray.get(waits)
        output_rows = ray.get(done_ref)
        tables = [sink.take_table.remote(c) for c in range(last.parallelism)]
        schemas = ray.get(sink.schemas.remote())
        side = {tag: ray.get(sink.take_side.remote(tag)) for tag in side_tags}
        ray.wait(tables, num_returns=len(tables), fetch_local=False)
        return JobResult(job, tables, schemas, side, source.total_rows, output_rows, time.perf_counter() - started, figures)
    finally:
        for handle in handles:
            ray.kill(handle, no_restart=True)


def _await_job(job: str, refs: list[Any], sources: list[Any], total_rows: int, progress: bool) -> None:
    pending = list(refs)
    bar = tqdm(total=total_rows, unit="rec", desc=job, delay=2.0, disable=not progress, leave=False)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=0.1)
            for ref in ready:
                try:
                    ray.get(ref)
                except RayError as error:
                    raise _job_failure(job, error) from _cause(error)
            if progress and not bar.disable:
                read = sum(ray.get([s.progress.remote() for s in sources]))
                bar.update(read - bar.n)
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
