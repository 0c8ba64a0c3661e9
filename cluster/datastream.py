"""The ``DataStream`` builder: describe a pipeline, then run it on Ray actors.

>>> import pyarrow as pa
>>> async def lookup(row):
...     return [{**row, "segment": "gold"}]
>>> stream = from_arrow([pa.table({"user": [1, 2, 3]})], parallelism=1)
>>> stream = stream.async_map(lookup, capacity=10, timeout_ms=1_000)   # doctest: +SKIP
>>> stream.execute().to_arrow().num_rows                                # doctest: +SKIP
3
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from typing import Any, Callable, Literal, Sequence, TypeVar

import pyarrow as pa
import ray

from actorflow.actors.batch_task_function import batch_function_kind, make_batch_function
from actorflow.operators.arrow_batch import ArrowBatchFunction
from actorflow.operators.async_attempt import CopyInputs
from actorflow.operators.async_batch_function import AsyncBatchFunction
from actorflow.operators.channel_items import Partitioning
from actorflow.operators.async_batch_operator import AsyncBatchWaitOperator, async_wait_batch
from actorflow.operators.async_function import AsyncFunction, CoroutineFunction, FallbackOnTimeout, reject_async_generator
from actorflow.operators.async_wait_operator import AsyncWaitOperator
from actorflow.operators.errors import ConfigurationError, UserFunctionError, describe_value
from actorflow.operators.operator import FilterOperator, FlatMapOperator, MapOperator, StreamOperator
from actorflow.operators.retry import RetryStrategy
from actorflow.operators.service import AdaptiveCapacity, Service, check_breaker_fallback, slots_of

from .job import CheckpointConfig, JobResult, run_job
from .job_graph import JobGraph, OperatorNode, SourceNode
from .windowed import KeyedStream
from .warm_workers import prestart_workers, top_up_task_workers

__all__ = ["DataStream", "check_int", "from_arrow", "from_blocks"]

S = TypeVar("S", bound="DataStream")


class DataStream:
    """An immutable description of a pipeline; each call returns a new stream."""

    def __init__(self, graph: JobGraph, *, job_name: str | None = None, default_parallelism: int = 1) -> None:
        self._graph = graph
        self.job_name = job_name
        self._default_parallelism = default_parallelism

    def _with(self: S, node: OperatorNode) -> S:
        return type(self)(self._graph.with_node(node), job_name=self.job_name, default_parallelism=self._default_parallelism)

    def _parallelism(self, parallelism: int | None) -> int:
        check_int("parallelism", parallelism, 1, optional=True, expected="an int >= 1")
        return self._last_parallelism() if parallelism is None else parallelism

    def _last_parallelism(self) -> int:
        return self._graph.nodes[-1].parallelism if self._graph.nodes else self._graph.source.parallelism

    # ----------------------------------------------------------------- operators

    def map(self: S, fn: Callable[[Any], Any], *, name: str = "map", parallelism: int | None = None) -> S:
        _check_callable(fn, "map")
        return self._with(OperatorNode(name, lambda: MapOperator(fn, name), self._parallelism(parallelism)))

    def filter(self: S, fn: Callable[[Any], bool], *, name: str = "filter", parallelism: int | None = None) -> S:
        _check_callable(fn, "filter")
        return self._with(OperatorNode(name, lambda: FilterOperator(fn, name), self._parallelism(parallelism)))

    def flat_map(self: S, fn: Callable[[Any], Sequence[Any]], *, name: str = "flat_map", parallelism: int | None = None) -> S:
        _check_callable(fn, "flat_map")
        return self._with(OperatorNode(name, lambda: FlatMapOperator(fn, name), self._parallelism(parallelism)))

    def async_map(
        self: S,
        fn: AsyncFunction | Callable[[Any], Any],
        *,
        ordered: bool | Literal["key"] = True,
        order_key: Any = None,
        capacity: int | Literal["auto"] | AdaptiveCapacity = 100,
        timeout_ms: int | None = None,
        retry: RetryStrategy | None = None,
        fallback: Callable[[Any], Sequence[Any]] | None = None,
        on_error: Literal["fail", "dead_letter"] = "fail",
        parallelism: int | None = None,
        name: str = "async_map",
        max_tasks: int = 2,
        queue_capacity: int | None = None,
        copy_inputs: CopyInputs = True,
        object_reuse: bool = False,
        service: Service | None = None,
        idempotency_key: Any = None,
    ) -> S:
        """Enrich each record through ``fn``, with Flink's async I/O guarantees.

        ``fn`` is an ``async def f(value) -> list`` (run as a coroutine on the operator's actor),
        an ``AsyncFunction``, or a plain blocking ``def f(value) -> list`` (run in micro-batched
        Ray tasks). ``fallback(value) -> list`` answers for a record whose deadline passed.
        ``capacity`` bounds the requests in flight per instance; ``queue_capacity`` (default:
        ``capacity``, as in Flink) bounds the elements queued, so that in ordered mode results
        can wait behind a slow request while new requests start. ``copy_inputs`` gives each
        attempt its own copy of the record, so that a function that changes its argument
        changes neither a retry's input nor a snapshot (a blocking function's argument is
        already a copy: it reaches its Ray task serialised). ``copy_inputs="shallow"`` copies a
        dict with ``dict()`` without looking at its values: for rows of scalars only, as
        ``enrich()`` picks for a DataFrame without nested columns. ``object_reuse=True`` keeps
        each record as the operator in front handed it instead of a copy: that operator must
        not change an object it has emitted.

        ``ordered=True`` keeps the order in which the instance received its records,
        ``ordered=False`` emits in completion order, and ``ordered="key"`` keeps the order per
        ``order_key`` (a column, a tuple of columns, or a function of the record): a key's
        records leave in input order while other keys overtake them. No mode moves a record
        across a watermark.

        ``service`` (an ``af.Service``) says how the service behind ``fn`` may be called: calls
        in flight (``capacity="auto"`` adapts them to its overload answers), a rate limit shared
        by the instances, a circuit breaker; overload answers (429, 503) are sent again after
        the service's ``Retry-After``. See the guide "Services that push back".
        ``idempotency_key`` (a column, or a function of the record) gives each record's
        idempotency key, a string, instead of the one made from its origin.
        """
        kind = _function_kind(fn)
        mode = async_mode(ordered, order_key)
        # Validate now (at construction), not in the actor at the first record.
        service, capacity = slots_of(capacity, service)
        check_int("capacity", capacity, 1)
        check_breaker_fallback(service, fallback)
        check_int("timeout_ms", timeout_ms, 1, optional=True)
        check_int("queue_capacity", queue_capacity, capacity, optional=True, minimum_is="capacity")
        check_int("max_tasks", max_tasks, 1)
        AsyncWaitOperator(_Placeholder(), mode=mode, capacity=capacity, timeout_ms=timeout_ms, retry=retry,
                          on_error=on_error, queue_capacity=queue_capacity, copy_inputs=copy_inputs,
                          object_reuse=object_reuse, order_key=order_key, service=service, idempotency_key=idempotency_key)
        if fallback is not None and not callable(fallback):
            raise ConfigurationError(f"fallback must be callable, got {type(fallback).__name__}")

        def factory() -> StreamOperator:
            function: AsyncFunction
            if kind == "blocking":
                from actorflow.actors.task_function import RayTaskFunction  # only inside the actor

                function = RayTaskFunction(fn, capacity=capacity, max_tasks=max_tasks)  # type: ignore[arg-type]
            elif kind == "coroutine":
                function = CoroutineFunction(fn)  # type: ignore[arg-type]
            else:
                function = fn  # type: ignore[assignment]
            if fallback is not None:
                function = FallbackOnTimeout(function, _named_fallback(fallback))
            return AsyncWaitOperator(
                function, mode=mode, capacity=capacity, timeout_ms=timeout_ms, retry=retry,
                on_error=on_error, copy_inputs=False if kind == "blocking" else copy_inputs, name=name,
                queue_capacity=queue_capacity, object_reuse=object_reuse, order_key=order_key, service=service,
                idempotency_key=idempotency_key,
            )

        return self._with(OperatorNode(name, factory, self._parallelism(parallelism),
                                       task_workers=max_tasks if kind == "blocking" else 0, service=service))

    def async_map_batch(
        self: S,
        fn: AsyncBatchFunction | ArrowBatchFunction | Callable[[list[Any]], Any],
        *,
        batch_size: int,
        batch_timeout_ms: int | None = None,
        ordered: bool | Literal["key"] = True,
        order_key: Any = None,
        capacity: int = 4,
        timeout_ms: int | None = None,
        retry: RetryStrategy | None = None,
        fallback: Callable[[Any], Sequence[Any]] | None = None,
        on_error: Literal["fail", "dead_letter"] = "fail",
        parallelism: int | None = None,
        name: str = "async_map_batch",
        queue_capacity: int | None = None,
        copy_inputs: CopyInputs = True,
        object_reuse: bool = False,
        idempotency_key: Any = None,
    ) -> S:
        """Enrich records ``batch_size`` at a time: ``fn(values)`` returns one result list per value.

        A batch leaves when full, ``batch_timeout_ms`` after its first record, at a watermark or
        at the end of input. ``fn`` is an ``async def f(values)`` (a coroutine on the operator's
        actor), a blocking ``def f(values)`` (one Ray task per batch, awaited), an
        ``AsyncBatchFunction``, or ``arrow_batch(f)`` for ``f(pa.Table) -> pa.Table`` (the rows
        go in as one table; result columns are merged into each row). ``capacity`` bounds the
        batches in flight per instance; ``timeout_ms`` is one deadline per batch across its
        attempts, after which ``fallback(value) -> list`` answers for each of its records. Every
        record keeps its own order, timestamp and outcome (a dead letter each, for instance).
        ``object_reuse=True`` buffers each record as the operator in front handed it instead of
        a copy: that operator must not change an object it has emitted.

        >>> async def score(values):
        ...     return [[{**v, "score": len(v)}] for v in values]
        >>> stream.async_map_batch(score, batch_size=256, batch_timeout_ms=50)   # doctest: +SKIP
        """
        kind = batch_function_kind(fn)
        mode = async_mode(ordered, order_key)
        # Validate now (at construction), not in the actor at the first record.
        check_int("batch_size", batch_size, 1)
        check_int("batch_timeout_ms", batch_timeout_ms, 1, optional=True)
        check_int("capacity (batches in flight)", capacity, 1, expected="> 0")
        check_int("timeout_ms", timeout_ms, 1, optional=True)
        check_int("queue_capacity", queue_capacity, batch_size, optional=True, minimum_is="batch_size")
        AsyncBatchWaitOperator(AsyncBatchFunction(), batch_size=batch_size, batch_timeout_ms=batch_timeout_ms, mode=mode,
                               capacity=capacity, timeout_ms=timeout_ms, retry=retry, on_error=on_error,
                               queue_capacity=queue_capacity, copy_inputs=copy_inputs, object_reuse=object_reuse,
                               order_key=order_key, idempotency_key=idempotency_key)
        if fallback is not None and not callable(fallback):
            raise ConfigurationError(f"fallback must be callable, got {type(fallback).__name__}")
        # A batch that goes to a Ray task is serialised there: it is a copy already.
        copy: CopyInputs = False if kind in ("blocking", "arrow_blocking") else copy_inputs

        def factory() -> StreamOperator:
            return async_wait_batch(
                make_batch_function(fn, capacity=capacity), batch_size=batch_size, batch_timeout_ms=batch_timeout_ms,
                mode=mode, capacity=capacity, timeout_ms=timeout_ms, retry=retry,
                fallback=None if fallback is None else _named_fallback(fallback), on_error=on_error, name=name,
                queue_capacity=queue_capacity, copy_inputs=copy, object_reuse=object_reuse, order_key=order_key,
                idempotency_key=idempotency_key,
            )

        return self._with(OperatorNode(name, factory, self._parallelism(parallelism)))

    def transform(
        self: S, name: str, operator_factory: Callable[[], StreamOperator], *, parallelism: int | None = None
    ) -> S:
        """Add any ring-1 operator; ``operator_factory`` builds one instance per subtask."""
        _check_callable(operator_factory, "transform")
        return self._with(OperatorNode(name, operator_factory, self._parallelism(parallelism)))

    def key_by(self: S, key: Any, *, parallelism: int | None = None) -> "KeyedStream[S]":
        """Partition by ``key``: a column name, a tuple of them, or a function of the record.

        Every record of one key reaches the same instance of what follows (a window), from every
        upstream actor and in every run: keys route by a stable hash, never Python's ``hash()``.
        """
        return KeyedStream(self, key, self._parallelism(parallelism))

    def rebalance(self: S, parallelism: int) -> S:
        """Spread records round-robin over ``parallelism`` instances of what follows."""
        return self._with(OperatorNode("rebalance", lambda: StreamOperator(), self._parallelism(parallelism),
                                       Partitioning.REBALANCE))

    # --------------------------------------------------------------------- run

    def execute(
        self, *, output_schema: pa.Schema | None = None, progress: bool = True,
        checkpoint_interval_ms: int | None = None, checkpoint_dir: str | None = None,
        resume_from: str | None = None, max_restarts: int = 20, restart_window_s: float = 60.0,
        checkpoint_timeout_ms: int = 60_000, checkpoint_filesystem: Any = None, overwrite: bool = False,
        max_parallelism: int | None = None,
    ) -> JobResult:
        """Run the pipeline to the end of its input; the output stays in the object store.

        With ``checkpoint_interval_ms``, the job takes a checkpoint that often (in
        ``checkpoint_dir``, a path or ``pyarrow.fs`` URI), and recovers from the death of any of
        its actors, up to ``max_restarts`` within ``restart_window_s``. ``resume_from`` starts it
        from the latest checkpoint of an earlier run (its job directory, ``<checkpoint_dir>/<job>``).
        A fresh run refuses the checkpoints of an earlier run of the job that did not finish,
        naming the ``resume_from`` to go on from; ``overwrite=True`` deletes them and starts
        afresh (not with ``resume_from``). A checkpoint not complete after
        ``checkpoint_timeout_ms`` is aborted.

        ``max_parallelism`` (default 128) is the number of key groups of the job's keyed state:
        the most instances a keyed stage may have, now or when a later run resumes at another
        parallelism. It is written into every checkpoint, and a resume with another is refused.

        ``progress`` shows a bar from the call's start: its phase (``snapshot`` of a Spark input,
        ``deploy`` of the actors, ``run``, ``collect`` of the output), the input records done, and
        the rate since the start. It ends at 100 % when the call returns, or where the call failed.
        """
        self._check_ray()
        graph = self._graph if max_parallelism is None else dataclasses.replace(self._graph, max_parallelism=max_parallelism)
        result = run_job(graph, job_name=self.job_name, output_schema=output_schema, progress=progress,
                         side_tags=("dead_letter", *self._graph.side_tags),
                         checkpoint=CheckpointConfig(
                             checkpoint_interval_ms, checkpoint_dir, checkpoint_filesystem, timeout_ms=checkpoint_timeout_ms,
                             resume_from=resume_from, max_restarts=max_restarts, restart_window_s=restart_window_s,
                             overwrite=overwrite))
        # For the next job's actors, one per actor of this one, and for their Ray tasks; and for
        # the driver's own tasks, if it has used them (the snapshot of the next DataFrame).
        prestart_workers(result.actor_processes, self._graph.worker_processes)
        top_up_task_workers()
        return result

    async def execute_async(self, **options: Any) -> JobResult:
        """``execute()`` for code that already runs an event loop (a notebook's, a server's).

        Takes the arguments of ``execute()``. The job runs in a worker thread, so the caller's
        loop goes on with its other tasks meanwhile. Cancelling the await does not stop the
        job: it runs to its end in that thread.

        >>> result = await stream.execute_async(progress=False)   # doctest: +SKIP
        """
        return await asyncio.to_thread(self.execute, **options)

    @staticmethod
    def _check_ray() -> None:
        if not ray.is_initialized():
            raise ConfigurationError("Ray is not initialised; call ray.init() or spark_bridge.ensure_ray() first")

    @property
    def graph(self) -> JobGraph:
        return self._graph


class _Placeholder(AsyncFunction):
    def async_invoke(self, value: Any, result_future: Any) -> None:  # pragma: no cover - never runs
        raise NotImplementedError


def _named_fallback(fallback: Callable[[Any], Sequence[Any]]) -> Callable[[Any], Sequence[Any]]:
    # A fallback that raises fails its record like the function would; the error must say that
    # it was the fallback, not the function, that raised.
    def call(value: Any) -> Sequence[Any]:
        try:
            return fallback(value)
        except Exception as error:
            raise UserFunctionError(f"the timeout fallback raised {type(error).__name__}: {error}", value=value) from error

    return call


def async_mode(ordered: Any, order_key: Any) -> Literal["ordered", "unordered", "key_ordered"]:
    """The async operator's mode for ``ordered`` (True, False or "key"), checked with its ``order_key``.

    >>> async_mode("key", "user_id"), async_mode(False, None)
    ('key_ordered', 'unordered')
    """
    if ordered is True:
        mode: Literal["ordered", "unordered", "key_ordered"] = "ordered"
    elif ordered is False:
        mode = "unordered"
    elif ordered == "key":
        mode = "key_ordered"
    else:
        raise ConfigurationError(f"ordered must be True, False or 'key', got {ordered!r}")
    if mode == "key_ordered" and order_key is None:
        raise ConfigurationError("ordered='key' needs an order_key: a column, a tuple of columns, or a function of the record")
    if mode != "key_ordered" and order_key is not None:
        raise ConfigurationError(f"order_key is for ordered='key'; ordered is {ordered!r}")
    return mode


def check_int(name: str, value: Any, minimum: int, *, optional: bool = False, minimum_is: str = "",
              expected: str = "") -> None:
    """Refuse a numeric argument that is not an int of at least ``minimum`` (or None, if
    ``optional``), naming it: ``capacity="10"`` would otherwise fail later as a bare TypeError,
    and ``True`` is an int to Python but never a count the user meant.

    >>> check_int("capacity", "10", 1)
    Traceback (most recent call last):
    ...
    actorflow.operators.errors.ConfigurationError: capacity must be an int > 0, got '10' (a str)
    """
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        if not expected:
            expected = (f"an int >= {minimum_is} ({minimum})" if minimum_is
                        else "an int > 0" if minimum == 1 else f"an int >= {minimum}")
            expected += " or None" if optional and not minimum_is else ""
        kind = "" if type(value) is int else f" (a {type(value).__name__})"
        raise ConfigurationError(f"{name} must be {expected}, got {value!r}{kind}")


def _check_callable(fn: Any, what: str) -> None:
    if not callable(fn):
        raise ConfigurationError(f"{what}() needs a callable, got {type(fn).__name__}")


def _function_kind(fn: Any) -> str:
    if isinstance(fn, AsyncFunction):
        return "async_function"
    reject_async_generator(fn, describe_value(fn))
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):
        return "coroutine"
    if callable(fn):
        return "blocking"
    raise ConfigurationError(f"async_map() needs an async def function, an AsyncFunction or a callable, got {type(fn).__name__}")


def from_blocks(
    blocks: list[Any],
    block_rows: list[int],
    *,
    parallelism: int = 1,
    timestamp_column: str | None = None,
    out_of_orderness_ms: int = 0,
    batch_size: int = 2048,
    job_name: str | None = None,
    schema: pa.Schema | None = None,
    idleness_ms: int | None = None,
) -> DataStream:
    """A stream over Arrow blocks in the object store (``ObjectRef``s of ``pyarrow.Table``).

    ``schema`` is the blocks' schema: output columns of the same name keep its types. With
    ``timestamp_column``, watermarks trail the largest event time by ``out_of_orderness_ms``,
    and a split that waits ``idleness_ms`` for data goes idle, holding back no watermark.
    """
    if len(blocks) != len(block_rows):
        raise ConfigurationError(f"got {len(blocks)} blocks but {len(block_rows)} row counts")
    check_int("parallelism", parallelism, 1, expected="an int >= 1")
    check_int("batch_size", batch_size, 1)
    check_event_time_settings(out_of_orderness_ms, idleness_ms)
    source = SourceNode(blocks, block_rows, parallelism, timestamp_column, out_of_orderness_ms, batch_size,
                        schema=schema, idleness_ms=idleness_ms)
    return DataStream(JobGraph(source), job_name=job_name)


def from_arrow(tables: Sequence[pa.Table], **kwargs: Any) -> DataStream:
    """A stream over in-memory Arrow tables (put into the object store here)."""
    if timestamp_column := kwargs.get("timestamp_column"):
        from actorflow.actors.source_actor import event_time_ms

        for table in tables:
            event_time_ms(table, timestamp_column)  # nulls and wrong types fail here, at build time
    kwargs.setdefault("schema", tables[0].schema if tables else None)
    return from_blocks([ray.put(t) for t in tables], [t.num_rows for t in tables], **kwargs)


def check_event_time_settings(out_of_orderness_ms: int, idleness_ms: int | None) -> None:
    if isinstance(out_of_orderness_ms, bool) or not isinstance(out_of_orderness_ms, int) or out_of_orderness_ms < 0:
        raise ConfigurationError(f"out_of_orderness_ms must be an int >= 0, got {out_of_orderness_ms!r}")
    if idleness_ms is not None and (isinstance(idleness_ms, bool) or not isinstance(idleness_ms, int) or idleness_ms <= 0):
        raise ConfigurationError(f"idleness_ms must be an int > 0 or None, got {idleness_ms!r}")
