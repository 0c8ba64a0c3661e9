"""Retry strategies for async requests.

A strategy says whether an attempt's outcome deserves another attempt, and how long to wait
before it. Delays depend only on the element's own attempt count, never on other elements.
``max_attempts`` counts every attempt, the first one included.

>>> s = ExponentialBackoff(max_attempts=4, initial_delay_ms=10, multiplier=2.0, max_delay_ms=30)
>>> [s.delay_ms(n) for n in (1, 2, 3)]
[10, 20, 30]
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from .errors import ConfigurationError

__all__ = [
    "ExponentialBackoff",
    "FixedDelay",
    "NoRetry",
    "RetryStrategy",
    "any_exception",
    "empty_result",
    "exception_of_type",
]

ResultPredicate = Callable[[Sequence[Any]], bool]
ExceptionPredicate = Callable[[BaseException], bool]


def empty_result(results: Sequence[Any]) -> bool:
    """Retry when an attempt returned no results."""
    return len(results) == 0


def any_exception(error: BaseException) -> bool:
    """Retry on every exception."""
    return True


def exception_of_type(*types: type[BaseException]) -> ExceptionPredicate:
    """Retry on exceptions of the given types (and their subclasses).

    >>> exception_of_type(ConnectionError)(ConnectionResetError())
    True
    """
    if not types:
        raise ConfigurationError("exception_of_type() needs at least one exception type, got none")

    def predicate(error: BaseException) -> bool:
        return isinstance(error, types)

    predicate.__name__ = "exception_of_type(" + ", ".join(t.__name__ for t in types) + ")"
    return predicate


class RetryStrategy:
    """When to retry and how long to wait.

    ``retry_on_result`` looks at the results of a successful attempt; ``retry_on_exception`` at
    the error of a failed one. An attempt that ran into the element's deadline is never retried.
    """

    def __init__(
        self,
        max_attempts: int,
        *,
        retry_on_result: ResultPredicate | None = None,
        retry_on_exception: ExceptionPredicate | None = any_exception,
    ) -> None:
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be an int >= 1 (the first attempt counts), got {max_attempts!r}")
        if retry_on_result is None and retry_on_exception is None and not isinstance(self, NoRetry):
            raise ConfigurationError(
                f"{type(self).__name__} needs retry_on_result or retry_on_exception, got neither "
                "(it would never retry; use NoRetry() for that)"
            )
        for what, predicate in (("retry_on_result", retry_on_result), ("retry_on_exception", retry_on_exception)):
            if predicate is not None and not callable(predicate):
                raise ConfigurationError(f"{what} must be callable or None, got {type(predicate).__name__}")
        self.max_attempts = max_attempts
        self.retry_on_result = retry_on_result
        self.retry_on_exception = retry_on_exception

    def can_retry(self, attempts_made: int) -> bool:
        return attempts_made < self.max_attempts

    def should_retry(self, results: Sequence[Any] | None, error: BaseException | None) -> bool:
        if error is not None:
            return self.retry_on_exception is not None and bool(self.retry_on_exception(error))
        return self.retry_on_result is not None and bool(self.retry_on_result(results or ()))

    def delay_ms(self, attempts_made: int) -> int:
        """The wait before attempt ``attempts_made + 1``."""
        raise NotImplementedError

    def _predicates_repr(self) -> str:
        return (
            f"retry_on_result={_name(self.retry_on_result)}, retry_on_exception={_name(self.retry_on_exception)}"
        )


def _name(predicate: Callable[..., Any] | None) -> str:
    if predicate is None:
        return "None"
    return str(getattr(predicate, "__name__", None) or repr(predicate))


class NoRetry(RetryStrategy):
    """One attempt, whatever happens."""

    def __init__(self) -> None:
        super().__init__(1, retry_on_result=None, retry_on_exception=None)

    def delay_ms(self, attempts_made: int) -> int:
        return 0

    def __repr__(self) -> str:
        return "NoRetry()"


class FixedDelay(RetryStrategy):
    """Up to ``max_attempts`` attempts, ``delay_ms`` apart."""

    def __init__(
        self,
        max_attempts: int,
        delay_ms: int,
        *,
        retry_on_result: ResultPredicate | None = None,
        retry_on_exception: ExceptionPredicate | None = any_exception,
    ) -> None:
        super().__init__(max_attempts, retry_on_result=retry_on_result, retry_on_exception=retry_on_exception)
        if not isinstance(delay_ms, int) or delay_ms < 0:
            raise ConfigurationError(f"delay_ms must be an int >= 0, got {delay_ms!r}")
        self._delay_ms = delay_ms

    def delay_ms(self, attempts_made: int) -> int:
        return self._delay_ms

    def __repr__(self) -> str:
        return f"FixedDelay(max_attempts={self.max_attempts}, delay_ms={self._delay_ms}, {self._predicates_repr()})"


class ExponentialBackoff(RetryStrategy):
    """Up to ``max_attempts`` attempts; the n-th wait is ``initial * multiplier**(n-1)``, capped."""

    def __init__(
        self,
        max_attempts: int,
        initial_delay_ms: int,
        multiplier: float = 2.0,
        max_delay_ms: int | None = None,
        *,
        retry_on_result: ResultPredicate | None = None,
        retry_on_exception: ExceptionPredicate | None = any_exception,
    ) -> None:
        super().__init__(max_attempts, retry_on_result=retry_on_result, retry_on_exception=retry_on_exception)
        if not isinstance(initial_delay_ms, int) or initial_delay_ms < 0:
            raise ConfigurationError(f"initial_delay_ms must be an int >= 0, got {initial_delay_ms!r}")
        if multiplier < 1.0:
            raise ConfigurationError(f"multiplier must be >= 1.0, got {multiplier!r}")
        if max_delay_ms is not None and max_delay_ms < initial_delay_ms:
            raise ConfigurationError(
                f"max_delay_ms must be >= initial_delay_ms ({initial_delay_ms}), got {max_delay_ms!r}"
            )
        self.initial_delay_ms = initial_delay_ms
        self.multiplier = multiplier
        self.max_delay_ms = max_delay_ms

    def delay_ms(self, attempts_made: int) -> int:
        delay = self.initial_delay_ms * self.multiplier ** max(0, attempts_made - 1)
        if self.max_delay_ms is not None:
            delay = min(delay, self.max_delay_ms)
        return int(delay)

    def __repr__(self) -> str:
        return (
            f"ExponentialBackoff(max_attempts={self.max_attempts}, initial_delay_ms={self.initial_delay_ms}, "
            f"multiplier={self.multiplier}, max_delay_ms={self.max_delay_ms}, {self._predicates_repr()})"
        )
