"""The user's side of async I/O: ``AsyncFunction`` and ``ResultFuture``.

A user function starts a request in ``async_invoke(value, result_future)`` and completes the
future later, from any thread or coroutine, with a list of results or an exception. A plain
``async def f(value) -> list`` is accepted too (``as_async_function`` wraps it), and so is an
``AsyncFunction`` whose ``async_invoke`` is an ``async def`` (PyFlink's shape).

>>> class Double(AsyncFunction):
...     def async_invoke(self, value, result_future):
...         result_future.complete([value * 2])
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

from .errors import AsyncTimeoutError, ConfigurationError, ResultTypeError, describe_value
from .request_keys import RequestKey, call_in_request, key_text

__all__ = [
    "AsyncFunction",
    "AwaitedAsyncFunction",
    "CoroutineFunction",
    "FallbackOnTimeout",
    "ResultFuture",
    "as_async_function",
    "awaitable_hint",
    "reject_async_generator",
    "results_error",
]


class ResultFuture:
    """The completion handle of one request. The first completion wins; later ones are ignored.

    ``idempotency_key`` is the key of the request's record (the same on every attempt and after a
    restore; see ``request_keys``); a batch's future has ``idempotency_keys``, one per record.

    Threading model: ``complete`` and ``complete_exceptionally`` may be called from any thread;
    the outcome is delivered to the operator as a mail.
    """

    __slots__ = ("_token", "_deliver", "_cancel_hooks", "_idempotency_key", "_idempotency_keys")

    def __init__(
        self,
        deliver: Callable[[Sequence[Any] | None, BaseException | None], None],
        idempotency_key: RequestKey | None = None,
        idempotency_keys: Sequence[RequestKey] | None = None,
    ) -> None:
        # Completing takes the single token; list.pop() is atomic, so of two racing threads
        # exactly one wins, without the cost of a lock per request.
        self._token = [True]
        self._deliver = deliver
        self._cancel_hooks: list[Callable[[], None]] | None = None
        self._idempotency_key = idempotency_key
        self._idempotency_keys = None if idempotency_keys is None else tuple(idempotency_keys)

    @property
    def done(self) -> bool:
        return not self._token

    @property
    def idempotency_key(self) -> str | None:
        """The idempotency key of the record this request serves; None for a batch."""
        key = self._idempotency_key
        return None if key is None else key_text(key)

    @property
    def idempotency_keys(self) -> list[str] | None:
        """The idempotency keys of the records of the batch this request serves, in order; None
        for a single record."""
        return None if self._idempotency_keys is None else [key_text(k) for k in self._idempotency_keys]

    def complete(self, results: Sequence[Any]) -> None:
        """Complete with a list (or tuple) of results; an empty list means "no output"."""
        error = results_error(results)
        if error is not None:
            self.complete_exceptionally(error)
            return
        if self._claim():
            self._deliver(list(results), None)

    def complete_exceptionally(self, error: BaseException) -> None:
        if not isinstance(error, BaseException):
            error = ResultTypeError(f"complete_exceptionally() needs an exception, got {type(error).__name__}")
        if self._claim():
            self._deliver(None, error)

    def settle(self, result: Any, error: BaseException | None) -> None:
        """``complete_exceptionally(error)`` if there is an error, else ``complete(result)``.

        The shape of a coroutine runner's ``on_done``, so that a coroutine can report to its
        future directly.
        """
        if error is not None:
            self.complete_exceptionally(error)
        else:
            self.complete(result)

    def call_in_request(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` with this future's idempotency key (or keys) as the current request's."""
        return call_in_request(self._idempotency_key, self._idempotency_keys, fn, *args)

    def add_cancel_hook(self, hook: Callable[[], Any]) -> None:
        """Called when the operator abandons this attempt (its deadline passed)."""
        if self._cancel_hooks is None:
            self._cancel_hooks = []
        self._cancel_hooks.append(hook)

    def abandon(self) -> None:
        """Stop listening for this attempt, and cancel the work behind it if possible."""
        self._claim()
        hooks, self._cancel_hooks = self._cancel_hooks, None
        for hook in hooks or ():
            hook()

    def _claim(self) -> bool:
        try:
            self._token.pop()
            return True
        except IndexError:
            return False


def results_error(results: Any, what: str = "ResultFuture.complete()") -> ResultTypeError | None:
    """The error of a request's results that are not a list (or tuple) of results; else None.

    ``what`` gave them: the argument of ``ResultFuture.complete()``, or what a coroutine returned.
    """
    if isinstance(results, (str, bytes, dict)) or not isinstance(results, (list, tuple)):
        return ResultTypeError(
            f"{what} needs a list of results, got {type(results).__name__}: {describe_value(results)}"
            f"{awaitable_hint(results)}"
        )
    return None


def awaitable_hint(value: Any) -> str:
    """What to say of a result that is a coroutine (or another awaitable) nobody will await: the
    function that returned it is not an ``async def`` itself, so it ran as a blocking one. A
    coroutine is closed here, so that Python does not also warn that it was never awaited."""
    if not inspect.isawaitable(value):
        return ""
    if inspect.iscoroutine(value):
        value.close()
    return ("; the function returned an awaitable without awaiting it (a lambda or a plain def around an "
            "async call?): declare it async def and await the call")


class AsyncFunction:
    """A request per element, completed through its ``ResultFuture``.

    ``open`` gets the operator's context (its ``coroutine_runner`` among others) once before the
    first element; ``close`` runs at the end. ``timeout`` runs when an element's deadline passes;
    by default the element fails with ``AsyncTimeoutError``. Override it to complete the future
    with a fallback instead.
    """

    def open(self, context: Any) -> None:
        pass

    def async_invoke(self, value: Any, result_future: ResultFuture) -> None:
        raise NotImplementedError

    def timeout(self, value: Any, result_future: ResultFuture) -> None:
        result_future.complete_exceptionally(
            AsyncTimeoutError(f"async request timed out for record {describe_value(value)}", value=value)
        )

    def close(self) -> None:
        pass

    def direct_coroutine(self) -> Callable[[Any], Any] | None:
        """``f`` if ``async_invoke(value, rf)`` only runs ``f(value)`` on the coroutine runner and
        completes ``rf`` with what it returns or raises; else None.

        An operator may then run ``f`` itself, without a ``ResultFuture`` per request.
        """
        return None

    def direct_finish(self) -> Callable[[Any, Any], Any] | None:
        """With ``direct_coroutine`` ``f``: ``g`` if the results are ``g(value, r)`` where ``r`` is
        what ``f(value)`` returned, or None if they are ``r`` itself.

        ``g`` gets the very ``value`` that ``f`` got; an error it raises is the attempt's, as if
        ``f`` had raised it. An operator that runs ``f`` itself calls ``g`` as soon as ``f``
        returns, without a coroutine around the two.
        """
        return None


class CoroutineFunction(AsyncFunction):
    """Runs ``async def fn(value) -> list`` on the operator's coroutine runner.

    A timeout cancels the coroutine of the abandoned attempt, so a hanging service does not keep
    a request slot.
    """

    def __init__(self, fn: Callable[[Any], Any], finish: Callable[[Any, Any], Any] | None = None) -> None:
        if not inspect.iscoroutinefunction(fn) and not inspect.iscoroutinefunction(getattr(fn, "__call__", None)):
            raise ConfigurationError(f"expected an async def function, got {describe_value(fn)}")
        if finish is not None and not callable(finish):
            raise ConfigurationError(f"finish must be callable, got {describe_value(finish)}")
        self.fn = fn
        self.finish = finish  # the results are finish(value, what fn returned), if given
        self._runner: Any = None

    def open(self, context: Any) -> None:
        runner = getattr(context, "coroutine_runner", None)
        if runner is None:
            raise ConfigurationError("an async def function needs a coroutine runner in the operator context, got none")
        self._runner = runner

    def async_invoke(self, value: Any, result_future: ResultFuture) -> None:
        coro = self.fn(value) if self.finish is None else _finished(self.fn, self.finish, value)
        result_future.add_cancel_hook(self._runner.submit(coro, result_future.settle))

    def direct_coroutine(self) -> Callable[[Any], Any] | None:
        return self.fn

    def direct_finish(self) -> Callable[[Any, Any], Any] | None:
        return self.finish


async def _finished(fn: Callable[[Any], Any], finish: Callable[[Any, Any], Any], value: Any) -> Any:
    return finish(value, await fn(value))


class FallbackOnTimeout(AsyncFunction):
    """Wraps a function so that a timeout completes with ``fallback(value)`` (a list)."""

    def __init__(self, inner: AsyncFunction, fallback: Callable[[Any], Sequence[Any]]) -> None:
        if not callable(fallback):
            raise ConfigurationError(f"fallback must be callable, got {type(fallback).__name__}")
        self.inner = as_async_function(inner)
        self.fallback = fallback

    def open(self, context: Any) -> None:
        self.inner.open(context)

    def async_invoke(self, value: Any, result_future: ResultFuture) -> None:
        self.inner.async_invoke(value, result_future)

    def timeout(self, value: Any, result_future: ResultFuture) -> None:
        result_future.complete(self.fallback(value))

    def close(self) -> None:
        self.inner.close()

    def direct_coroutine(self) -> Callable[[Any], Any] | None:
        return self.inner.direct_coroutine()

    def direct_finish(self) -> Callable[[Any, Any], Any] | None:
        return self.inner.direct_finish()


class AwaitedAsyncFunction(AsyncFunction):
    """An ``AsyncFunction`` whose ``async_invoke`` (and maybe ``timeout``) is an ``async def``.

    Two shapes are accepted for each: PyFlink's ``async def async_invoke(self, value) -> list``,
    whose return value completes the request, and ``async def async_invoke(self, value,
    result_future)``, which completes the future itself (an exception it raises fails the
    request). The coroutine runs on the context's coroutine runner; a timeout cancels it.
    ``timeout`` may be an ``async def`` of either shape too, or PyFlink's plain
    ``def timeout(self, value) -> list``.
    """

    def __init__(self, inner: AsyncFunction) -> None:
        self.inner = inner
        # Typed loosely: the coroutine methods' signatures are not the base class's.
        self._inner: Any = inner
        self._invoke_is_async = inspect.iscoroutinefunction(inner.async_invoke)
        self._invoke_takes_future = _takes_future(inner.async_invoke, "async_invoke")
        self._timeout_is_async = inspect.iscoroutinefunction(inner.timeout)
        self._timeout_takes_future = _takes_future(inner.timeout, "timeout")
        self._runner: Any = None

    def open(self, context: Any) -> None:
        runner = getattr(context, "coroutine_runner", None)
        if runner is None:
            raise ConfigurationError(
                f"{type(self.inner).__name__}.async_invoke is an async def and needs a coroutine runner in the "
                "operator context, got none"
            )
        self._runner = runner
        self.inner.open(context)

    def async_invoke(self, value: Any, result_future: ResultFuture) -> None:
        if not self._invoke_is_async:
            self.inner.async_invoke(value, result_future)
            return
        if self._invoke_takes_future:
            coro = self._inner.async_invoke(value, result_future)
        else:
            coro = self._inner.async_invoke(value)
        self._await(coro, result_future, completes=not self._invoke_takes_future)

    def timeout(self, value: Any, result_future: ResultFuture) -> None:
        if not self._timeout_is_async:
            if self._timeout_takes_future:
                self.inner.timeout(value, result_future)
            else:
                # PyFlink's ``def timeout(self, value) -> list``: it returns the fallback, or raises.
                result_future.complete(self._inner.timeout(value))
        elif self._timeout_takes_future:
            self._await(self._inner.timeout(value, result_future), result_future, completes=False)
        else:
            self._await(self._inner.timeout(value), result_future, completes=True)

    def close(self) -> None:
        self.inner.close()

    def direct_coroutine(self) -> Callable[[Any], Any] | None:
        if self._invoke_is_async and not self._invoke_takes_future:
            return self._inner.async_invoke  # type: ignore[no-any-return]
        return None

    def _await(self, coro: Any, result_future: ResultFuture, *, completes: bool) -> None:
        on_done = result_future.settle if completes else errors_only(result_future)
        result_future.add_cancel_hook(self._runner.submit(coro, on_done))


def errors_only(result_future: ResultFuture) -> Callable[[Any, BaseException | None], None]:
    """An ``on_done`` for a coroutine that completes its future itself: only what it raises counts."""

    def on_done(result: Any, error: BaseException | None) -> None:
        if error is not None:
            result_future.complete_exceptionally(error)

    return on_done


def _takes_future(method: Callable[..., Any], what: str) -> bool:
    """True for ``(value, result_future)``, False for ``(value)``, from the bound method's signature."""
    try:
        params = [
            p for p in inspect.signature(method).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        return True
    if len(params) not in (1, 2):
        raise ConfigurationError(
            f"async def {what} must take (value) or (value, result_future), got {len(params)} parameters"
        )
    return len(params) == 2


def reject_async_generator(fn: Any, what: str, expected: str = "an async def that returns a list of results") -> None:
    """Fail with ``ConfigurationError`` if ``fn`` is an async generator function: it would yield
    a stream where a request has one outcome."""
    if inspect.isasyncgenfunction(fn) or inspect.isasyncgenfunction(getattr(fn, "__call__", None)):
        raise ConfigurationError(
            f"{what} is an async generator (async def with yield); expected {expected}, got an async generator"
        )


def as_async_function(fn: AsyncFunction | Callable[[Any], Any]) -> AsyncFunction:
    """Accept an ``AsyncFunction`` as is, and wrap an ``async def`` in a ``CoroutineFunction``.

    An ``AsyncFunction`` whose ``async_invoke`` is an ``async def`` is wrapped so that its
    coroutine is awaited. Async generators are rejected: a record has one outcome, not a stream.
    """
    if isinstance(fn, AsyncFunction):
        reject_async_generator(fn.async_invoke, f"{type(fn).__name__}.async_invoke")
        reject_async_generator(fn.timeout, f"{type(fn).__name__}.timeout")
        if inspect.iscoroutinefunction(fn.async_invoke) or inspect.iscoroutinefunction(fn.timeout):
            return AwaitedAsyncFunction(fn)
        return fn
    if callable(fn):
        reject_async_generator(fn, describe_value(fn))
        return CoroutineFunction(fn)
    raise ConfigurationError(f"expected an AsyncFunction or an async def function, got {type(fn).__name__}")
