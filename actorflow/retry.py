"""Retry strategies for async requests, and the predicates that decide what deserves another attempt.

>>> import actorflow as af
>>> af.retry.ExponentialBackoff(max_attempts=4, initial_delay_ms=10, multiplier=2.0, max_delay_ms=30).delay_ms(3)
30
"""

from .operators.retry import (
    ExponentialBackoff,
    FixedDelay,
    NoRetry,
    RetryStrategy,
    any_exception,
    empty_result,
    exception_of_type,
)

__all__ = ["ExponentialBackoff", "FixedDelay", "NoRetry", "RetryStrategy", "any_exception", "empty_result",
           "exception_of_type"]
