"""``enrich()``: a Spark DataFrame in, each row enriched by an external call, a DataFrame out.

>>> async def segment(row):                                   # doctest: +SKIP
...     async with http.get(f"{url}/user/{row['user_id']}") as r:
...         return {"segment": (await r.json())["segment"]}
>>> enriched = enrich(clicks, segment, capacity=200, timeout_ms=2_000)   # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import weakref
from typing import TYPE_CHECKING, Any, Callable, Literal, cast

import pyarrow as pa

from actorflow.cluster.checkpoints.coordinator import check_overwrite
from actorflow.cluster.datastream import check_int
from actorflow.cluster.progress import current_progress, reports_progress
from actorflow.operators.arrow_batch import ArrowBatchFunction
from actorflow.operators.async_attempt import CopyInputs
from actorflow.operators.async_function import CoroutineFunction, awaitable_hint, reject_async_generator
from actorflow.operators.errors import ConfigurationError, ResultTypeError, describe_value
from actorflow.operators.retry import RetryStrategy
from actorflow.operators.service import AdaptiveCapacity, Service, slots_of

from .interrupts import interruptible
from .session import check_dataframe
from .streaming import StreamingRun
from .streams import SparkDataStream, from_spark, to_arrow_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["enrich", "enrich_async", "enrich_stream"]


@reports_progress
def enrich(
    df: "DataFrame",
    fn: Callable[[dict[str, Any]], Any] | Callable[[list[dict[str, Any]]], Any] | ArrowBatchFunction,
    *,
    output_schema: Any = None,
    ordered: bool | Literal["key"] = True,
    order_key: Any = None,
    capacity: int | Literal["auto"] | AdaptiveCapacity = 100,
    timeout_ms: int | None = 30_000,
    retry: RetryStrategy | None = None,
    fallback: dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    parallelism: int | None = None,
    on_error: Literal["fail", "dead_letter"] = "fail",
    progress: bool = True,
    job_name: str | None = None,
    queue_capacity: int | None = None,
    batch_size: int | None = None,
    batch_timeout_ms: int | None = None,
    checkpoint_interval_ms: int | None | Literal["auto"] = "auto",
    checkpoint_dir: str | None = None,
    resume_from: str | None = None,
    overwrite: bool = False,
    object_reuse: bool = True,
    service: Service | None = None,
    idempotency_key: str | None = None,
) -> "DataFrame | tuple[DataFrame, DataFrame]":
    """Enrich every row of ``df`` with ``fn(row) -> dict`` and return the enriched DataFrame.

    ``fn`` gets each row as a dict and returns a dict of new (or replaced) columns; the output
    row is the input row updated with it. It may be an ``async def`` (run as coroutines on the
    operator actors, ``capacity`` in flight per instance) or a plain blocking function (run in
    micro-batched Ray tasks). Async I/O guarantees hold: ``ordered`` output keeps the input
    order (``ordered=False``: completion order; ``ordered="key"`` with ``order_key``, a column or
    a tuple of columns: each key's rows in input order, while other keys' rows overtake a slow
    one); a request that passes ``timeout_ms`` gets ``fallback`` (a dict or ``row -> dict``)
    or fails; ``retry`` retries failures. ``capacity`` bounds the requests in flight per
    instance; with ``ordered``, a ``queue_capacity`` above it lets finished rows wait behind a
    slow one while new requests start (by default ``default_queue_capacity``: 100 rows per
    request slot, at most 20,000, instead of Flink's ``capacity``).

    With ``on_error="fail"`` a failing row fails the job with an error that names the row; with
    ``on_error="dead_letter"`` the result is ``(enriched, dead_letters)``, the second holding
    the failed rows with ``error_type``, ``error``, ``attempts``, ``operator`` and
    ``request_key`` (each named ``dead_letter_<name>`` instead where the input has a column of
    that name); ``rerun_dead_letters`` runs them again.

    Types: the input's columns come back with exactly their Spark types; new columns are
    inferred as Spark would (int → bigint, float → double, naive datetime → timestamp in UTC).
    ``output_schema`` (a ``pyarrow.Schema``, a ``StructType`` or a DDL string) fixes the types of
    the columns it names, which may be only the new ones: the input's columns are added in front.

    With ``batch_size``, ``fn`` gets a list of up to ``batch_size`` rows (dicts) and returns a
    list of dicts, one per row, in the same order (``arrow_batch(f)`` is accepted too, for
    ``f(pa.Table) -> pa.Table``). A batch leaves when full or ``batch_timeout_ms`` after its
    first row; ``capacity`` then counts batches in flight per instance, ``timeout_ms`` is one
    deadline per batch, and the fallback, dead letters and order are still per row.

    Checkpoints: with ``checkpoint_interval_ms="auto"`` (the default), a long job (Spark's plan
    estimates at least ``AUTO_CHECKPOINT_ROWS`` rows) takes a checkpoint every
    ``AUTO_CHECKPOINT_INTERVAL_MS`` and survives the death of its actors, exactly once; a small
    one takes none, and fails if an actor dies. An int sets the interval, None turns them off.
    ``checkpoint_dir`` and ``resume_from`` are those of ``DataStream.execute``. A fresh run
    refuses the checkpoints of an earlier run of the job that did not finish (in ``checkpoint_dir``,
    for a ``job_name``), naming the ``resume_from`` that goes on from them; ``overwrite=True``
    deletes them and starts afresh.

    ``progress`` shows a bar as soon as the call starts, with its phase: ``snapshot`` (``df``
    copied into Ray's object store), ``deploy`` (the actors started), ``run`` (the rows counted
    as they get their outcome), ``collect`` and ``output`` (the result made a DataFrame). Its
    rate counts from the call's start. It ends at 100 % as ``<job> · done``, and stays so in a
    saved notebook; a call that fails leaves it where it stopped, as ``failed in <phase>``.

    ``service`` (an ``af.Service``) says how the service behind ``fn`` may be called: calls in
    flight (``capacity="auto"`` adapts them to its overload answers), a rate limit for all the
    instances, a circuit breaker; an overload answer (429, 503) is sent again after the
    service's ``Retry-After``, and pauses every call of the instance until then.

    Each row's requests carry an idempotency key (``af.current_request_key()``), the same on every
    attempt and after a restore: made from the row's place in ``df``, or the value of the column
    ``idempotency_key``, a string. Dead letters keep it (``request_key``), and
    ``rerun_dead_letters`` sends them again with it.

    ``object_reuse=True``, the default here, skips the copy the async operator would keep of each
    row it takes in: each row is made fresh from Arrow and nothing else holds it. (The function's
    own copy of its argument is ``copy_inputs``.)
    """
    service, capacity = _service_slots(capacity, service, batch_size)
    fallback_fn = _checked(fn, fallback, capacity=capacity, timeout_ms=timeout_ms, parallelism=parallelism,
                           queue_capacity=queue_capacity, batch_size=batch_size, batch_timeout_ms=batch_timeout_ms,
                           checkpoint_interval_ms=checkpoint_interval_ms)
    check_overwrite(overwrite, resume_from)
    with interruptible():  # Ctrl-C cancels the Spark jobs, without py4j tracebacks
        check_dataframe(df, "enrich()")
        # The bar shows from here: what follows reads df (its plan, then its rows) and runs the job.
        if job_name is not None:
            current_progress().name(job_name)
        current_progress().phase("snapshot")
        if checkpoint_interval_ms == "auto":
            checkpoint_interval_ms = auto_checkpoint_interval(df)
        checkpoints: dict[str, Any] = dict(
            checkpoint_interval_ms=checkpoint_interval_ms, checkpoint_dir=checkpoint_dir, resume_from=resume_from,
            overwrite=overwrite)
        stream, schema = _enriched(
            from_spark(df, parallelism=parallelism, job_name=job_name), fn, output_schema, fallback_fn, ordered=ordered,
            order_key=order_key, capacity=capacity, timeout_ms=timeout_ms, retry=retry, on_error=on_error,
            queue_capacity=queue_capacity,
            batch_size=batch_size, batch_timeout_ms=batch_timeout_ms, object_reuse=object_reuse, service=service,
            idempotency_key=idempotency_key)
        source = weakref.ref(stream.graph.source)
        try:
            return stream.to_spark(schema, dead_letters=on_error == "dead_letter", progress=progress, **checkpoints)
        finally:
            # The input's snapshot goes with the stream's source, which reference counting frees at
            # once; but a reference cycle can hold it (the frames of the first Spark schema
            # conversion in a process do), and then only a collection frees it. A collection costs
            # 0.1-0.2 s with Spark loaded, so it runs only then.
            del stream
            if source() is not None:
                gc.collect()


def enrich_stream(
    df: "DataFrame",
    fn: Callable[[dict[str, Any]], Any] | Callable[[list[dict[str, Any]]], Any] | ArrowBatchFunction,
    path: str | None = None,
    *,
    checkpoint_location: str,
    foreach_batch: Callable[[Any, int], Any] | None = None,
    output_schema: Any = None,
    ordered: bool | Literal["key"] = True,
    order_key: Any = None,
    capacity: int | Literal["auto"] | AdaptiveCapacity = 100,
    timeout_ms: int | None = 30_000,
    retry: RetryStrategy | None = None,
    fallback: dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    parallelism: int | None = None,
    on_error: Literal["fail", "dead_letter"] = "fail",
    job_name: str | None = None,
    queue_capacity: int | None = None,
    batch_size: int | None = None,
    batch_timeout_ms: int | None = None,
    processing_time: str | None = None,
    checkpoint_interval_ms: int | None = 1_000,
    object_reuse: bool = True,
    dead_letters: str | None = None,
    service: Service | None = None,
) -> StreamingRun:
    """``enrich()`` for a streaming DataFrame (``spark.readStream``): start a query that enriches
    every row of every micro-batch with ``fn`` and writes the result to Parquet files under
    ``path`` (or to ``foreach_batch(df, epoch)``), exactly once, and return its ``StreamingRun``.

    ``fn`` and the options of the enrichment are ``enrich()``'s; ``checkpoint_location``,
    ``processing_time`` and ``checkpoint_interval_ms`` are ``write_stream()``'s. One job runs for
    the query's whole life: a slow request does not hold its micro-batch back (it is saved in
    the checkpoint and its row goes out with a later one), and the same script run again with
    the same ``checkpoint_location`` resumes where the last run stopped. With
    ``on_error="dead_letter"``, the failed rows go to Parquet files under ``dead_letters``,
    published with each micro-batch's output, each row with why it failed; without a path they
    are kept under ``checkpoint_location`` until ``stop(drain=True)`` hands them over. Either way,
    ``StreamingRun.dead_letters()`` reads them.

    >>> query = enrich_stream(clicks, segment, "/data/enriched", checkpoint_location="/chk/enriched")  # doctest: +SKIP
    >>> query.await_termination()                                                                      # doctest: +SKIP
    """
    service, capacity = _service_slots(capacity, service, batch_size)
    fallback_fn = _checked(fn, fallback, capacity=capacity, timeout_ms=timeout_ms, parallelism=parallelism,
                           queue_capacity=queue_capacity, batch_size=batch_size, batch_timeout_ms=batch_timeout_ms,
                           checkpoint_interval_ms=checkpoint_interval_ms)
    if not df.isStreaming:
        raise ConfigurationError("enrich_stream() reads a streaming DataFrame (spark.readStream); for a bounded one, "
                                 "call enrich()")
    stream, schema = _enriched(
        from_spark(df, parallelism=parallelism, job_name=job_name), fn, output_schema, fallback_fn, ordered=ordered,
        order_key=order_key, capacity=capacity, timeout_ms=timeout_ms, retry=retry, on_error=on_error,
        queue_capacity=queue_capacity,
        batch_size=batch_size, batch_timeout_ms=batch_timeout_ms, object_reuse=object_reuse, service=service)
    return stream.write_stream(path, checkpoint_location=checkpoint_location, foreach_batch=foreach_batch,
                               output_schema=schema, processing_time=processing_time,
                               checkpoint_interval_ms=checkpoint_interval_ms, dead_letters=dead_letters)


def check_order_key(order_key: Any, schema: pa.Schema, what: str = "order_key") -> None:
    """Refuse an order key (or another key: ``what``) that names a column the rows do not have,
    before any job."""
    if order_key is None or callable(order_key):
        return
    columns = [order_key] if isinstance(order_key, str) else list(order_key) if isinstance(order_key, tuple | list) else []
    missing = [c for c in columns if isinstance(c, str) and c not in schema.names]
    if missing:
        raise ConfigurationError(f"{what} names {missing[0]!r}, which is not a column of the input; its columns "
                                 f"are {schema.names}")


def check_idempotency_key(column: Any, schema: pa.Schema) -> None:
    """Refuse an ``idempotency_key`` that is not a string column of the input."""
    if column is None:
        return
    if not isinstance(column, str):
        raise ConfigurationError(f"idempotency_key must be the name of a string column, got {column!r}")
    check_order_key(column, schema, "idempotency_key")
    kind = schema.field(column).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise ConfigurationError(f"idempotency_key {column!r} must be a string column; it is {kind}")


def _service_slots(capacity: Any, service: Any, batch_size: int | None) -> tuple[Service | None, int]:
    """The ``Service`` of ``enrich()`` and the rows it holds in flight (``service.slots_of``)."""
    resolved, slots = slots_of(capacity, service)
    if resolved is not None and batch_size is not None:
        raise ConfigurationError("service= and capacity='auto' call the service one row at a time; with batch_size, "
                                 "give capacity as an int (batches in flight) and no service")
    return resolved, slots


def _checked(fn: Any, fallback: Any, **numbers: Any) -> Callable[[dict[str, Any]], Any] | None:
    """Refuse what enrich() cannot take, and make the fallback's function of a row."""
    batch_size = numbers["batch_size"]
    if isinstance(fn, ArrowBatchFunction) and batch_size is None:
        raise ConfigurationError(f"enrich() with {fn!r} needs batch_size, got batch_size=None")
    if not callable(fn) and not isinstance(fn, ArrowBatchFunction):
        raise ConfigurationError(f"enrich() needs a function of a row, got {type(fn).__name__}")
    reject_async_generator(fn, describe_value(fn), "an async def or a plain function that returns a dict of new columns"
                           if batch_size is None else "one that returns a list of one dict per row")
    _check_numbers(**numbers)
    if fallback is None:
        return None
    if isinstance(fallback, dict):
        bad = [key for key in fallback if not isinstance(key, str)]
        if bad:
            raise ConfigurationError(f"the fallback's column names must be str, got {describe_value(bad[0])} "
                                     f"({type(bad[0]).__name__}) in {describe_value(fallback)}")
        extra = dict(fallback)
        return lambda row: [{**row, **extra}]
    if callable(fallback):
        return lambda row: [{**row, **_check_dict(fallback(row), row, "fallback")}]
    raise ConfigurationError(f"fallback must be a dict or a function of a row, got {type(fallback).__name__}")


def _enriched(
    stream: SparkDataStream, fn: Any, output_schema: Any, fallback_fn: Any, *, ordered: bool | Literal["key"],
    order_key: Any, capacity: int,
    timeout_ms: int | None, retry: RetryStrategy | None, on_error: Literal["fail", "dead_letter"],
    queue_capacity: int | None, batch_size: int | None, batch_timeout_ms: int | None, object_reuse: bool,
    service: Service | None = None, idempotency_key: str | None = None,
) -> tuple[SparkDataStream, pa.Schema | None]:
    """``stream`` with enrich()'s operator, and the output's schema from ``output_schema``."""
    schema = to_arrow_schema(output_schema)
    if schema is not None:
        given = set(schema.names)
        schema = pa.schema([f for f in stream._input_schema if f.name not in given] + list(schema))
    copy_inputs = scalar_rows_copy(stream._input_schema)
    check_order_key(order_key, stream._input_schema)
    check_idempotency_key(idempotency_key, stream._input_schema)
    if batch_size is not None:
        return stream.async_map_batch(
            _merge_batches(fn), batch_size=batch_size, batch_timeout_ms=batch_timeout_ms, ordered=ordered,
            order_key=order_key, capacity=capacity, timeout_ms=timeout_ms, retry=retry, fallback=fallback_fn, on_error=on_error,
            name="enrich", queue_capacity=queue_capacity, copy_inputs=copy_inputs, object_reuse=object_reuse,
            idempotency_key=idempotency_key,
        ), schema
    if batch_timeout_ms is not None:
        raise ConfigurationError(f"batch_timeout_ms needs batch_size, got batch_timeout_ms={batch_timeout_ms} without it")
    return stream.async_map(
        _merge_rows(cast(Callable[[dict[str, Any]], Any], fn)), ordered=ordered, order_key=order_key, capacity=capacity,
        timeout_ms=timeout_ms, retry=retry, fallback=fallback_fn, on_error=on_error, name="enrich",
        copy_inputs=copy_inputs, object_reuse=object_reuse, service=service, idempotency_key=idempotency_key,
        queue_capacity=default_queue_capacity(capacity, ordered) if queue_capacity is None else queue_capacity,
    ), schema


async def enrich_async(
    df: "DataFrame",
    fn: Callable[[dict[str, Any]], Any] | Callable[[list[dict[str, Any]]], Any] | ArrowBatchFunction,
    **options: Any,
) -> "DataFrame | tuple[DataFrame, DataFrame]":
    """``enrich()`` for code that already runs an event loop: a notebook's cells, a server.

    Takes the arguments of ``enrich()`` and returns what it returns. The job runs in a worker
    thread, so the caller's loop goes on meanwhile (Jupyter's loop keeps the progress bar and
    other cells' tasks alive). Cancelling the await does not stop the job: it runs to its end
    in that thread. ``last_job()`` then has the job's figures.

    >>> enriched = await enrich_async(clicks, segment, capacity=200)   # doctest: +SKIP
    """
    return await asyncio.to_thread(enrich, df, fn, **options)


#: ``enrich()`` takes checkpoints on its own from this many input rows, this often.
AUTO_CHECKPOINT_ROWS = 1_000_000
AUTO_CHECKPOINT_INTERVAL_MS = 10_000
_BYTES_PER_ROW_GUESS = 100


def auto_checkpoint_interval(df: "DataFrame") -> int | None:
    """The checkpoint interval of ``enrich(checkpoint_interval_ms="auto")``: on for a long job.

    Counting the rows would run the query; Spark's optimizer estimates them for free (its row
    count when it knows one, else its size estimate at ``_BYTES_PER_ROW_GUESS`` bytes a row).
    """
    try:
        stats = df._jdf.queryExecution().optimizedPlan().stats()
        count = stats.rowCount()
        if count.isDefined():
            rows = int(str(count.get()))
        else:
            size = int(str(stats.sizeInBytes()))
            if size >= 2**62:  # Spark's "unknown" (Long.MaxValue)
                return None
            rows = size // _BYTES_PER_ROW_GUESS
    except Exception:  # noqa: BLE001 - no estimate: treat the job as small
        return None
    return AUTO_CHECKPOINT_INTERVAL_MS if rows >= AUTO_CHECKPOINT_ROWS else None


#: Rows that may wait, finished, behind a slow one in ordered mode: per request slot, and in all.
_QUEUE_PER_SLOT = 100
_QUEUE_MAX_ROWS = 20_000


def scalar_rows_copy(schema: pa.Schema) -> CopyInputs:
    """How an attempt copies a row of a DataFrame with ``schema``: ``"shallow"`` (``dict()``) when
    no column is nested, since a row's values are then immutable (ints, strings, datetimes,
    decimals, bytes, ...); a deep copy otherwise.

    >>> scalar_rows_copy(pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC"))]))
    'shallow'
    >>> scalar_rows_copy(pa.schema([("id", pa.int64()), ("tags", pa.list_(pa.string()))]))
    True
    """
    return "shallow" if not any(pa.types.is_nested(f.type) for f in schema) else True


def default_queue_capacity(capacity: int, ordered: bool | Literal["key"]) -> int:
    """``enrich()``'s queue: in ordered mode (total or per key), deep enough that one slow request
    does not stall the others, bounded so that the rows waiting behind it stay a few MB.

    While the head of the queue waits, the other slots go on at ``capacity / latency``; a 1.5 s
    straggler among 20 ms calls at C = 64 lets about 4,800 rows finish behind it. Flink's default
    (the queue as deep as ``capacity``) would stop every slot after 20 ms of it.

    >>> default_queue_capacity(64, ordered=True), default_queue_capacity(1000, ordered=True)
    (6400, 20000)
    """
    if ordered is False:
        return capacity  # completion order: nothing waits behind a slow request
    return max(capacity, min(capacity * _QUEUE_PER_SLOT, _QUEUE_MAX_ROWS))


def _check_numbers(*, capacity: Any, timeout_ms: Any, parallelism: Any, queue_capacity: Any, batch_size: Any,
                   batch_timeout_ms: Any, checkpoint_interval_ms: Any) -> None:
    """``enrich()``'s numbers, each refused by name before any of them is used: the default queue
    depth computed from a ``capacity="10"`` would otherwise fail as a bare TypeError."""
    if batch_size is not None:  # None is the default (one row a call), never a mistake worth naming
        check_int("batch_size", batch_size, 1)
    if batch_size is None:
        check_int("capacity", capacity, 1)
    else:
        check_int("capacity (batches in flight)", capacity, 1, expected="> 0")
    check_int("timeout_ms", timeout_ms, 1, optional=True)
    check_int("parallelism", parallelism, 1, optional=True, expected="an int >= 1 (or None for one per core, up to 4)")
    check_int("batch_timeout_ms", batch_timeout_ms, 1, optional=True)
    if batch_size is None:
        check_int("queue_capacity", queue_capacity, capacity, optional=True, minimum_is="capacity")
    else:
        check_int("queue_capacity", queue_capacity, batch_size, optional=True, minimum_is="batch_size")
    if checkpoint_interval_ms != "auto":
        check_int("checkpoint_interval_ms", checkpoint_interval_ms, 10, expected="an int >= 10, None or 'auto'",
                  optional=True)


def _check_dict(result: Any, row: dict[str, Any], what: str) -> dict[str, Any]:
    if not isinstance(result, dict):
        raise ResultTypeError(
            f"the {what} function must return a dict of columns, got {type(result).__name__}: "
            f"{describe_value(result)} for row {describe_value(row)}{awaitable_hint(result)}",
            value=row,
        )
    _check_names(result, row, what)
    return result


def _merge_results(rows: list[dict[str, Any]], results: Any) -> list[list[dict[str, Any]]]:
    if isinstance(results, (str, bytes, dict)) or not isinstance(results, (list, tuple)) or len(results) != len(rows):
        got = f"{len(results)} items" if isinstance(results, (list, tuple)) else type(results).__name__
        raise ResultTypeError(
            f"the enrich function must return a list of one dict per row; got {got} for a batch of {len(rows)} rows, "
            f"the first {describe_value(rows[0])}"
        )
    return [_merge_row(row, result) for row, result in zip(rows, results)]


def _merge_batches(fn: Any) -> Any:
    if isinstance(fn, ArrowBatchFunction):
        return fn  # its result columns are merged into each row already
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):

        async def enrich_batch(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
            return _merge_results(rows, await fn(rows))

        return enrich_batch

    def enrich_batch_blocking(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        return _merge_results(rows, fn(rows))

    return enrich_batch_blocking


def _merge_row(row: dict[str, Any], result: Any) -> list[dict[str, Any]]:
    if not isinstance(result, dict):  # checked here, not by a call per row: _check_dict raises
        _check_dict(result, row, "enrich")
    for key in result:
        # A column name of another type would fail the whole job later, in Arrow, naming neither
        # the row nor the key (about 30 ns a row, where dict(row, **result) would cost 190).
        if type(key) is not str:
            _check_names(result, row, "enrich")
    return [{**row, **result}]


def _check_names(result: dict[Any, Any], row: dict[str, Any], what: str) -> None:
    for key in result:
        if not isinstance(key, str):
            raise ResultTypeError(
                f"the {what} function returned a column name that is not a str: {describe_value(key)} "
                f"({type(key).__name__}) in {describe_value(result)} for row {describe_value(row)}; "
                "a column name must be a str",
                value=row,
            )


def _merge_rows(fn: Callable[[dict[str, Any]], Any]) -> Any:
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):
        # The operator merges as soon as the coroutine returns, with no coroutine around it.
        return CoroutineFunction(fn, finish=_merge_row)

    def enrich_row_blocking(row: dict[str, Any]) -> list[dict[str, Any]]:
        return _merge_row(row, fn(row))

    return enrich_row_blocking
