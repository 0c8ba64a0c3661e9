"""``import actorflow as af``: a curated surface, loaded on first use, with the internals left out."""

from __future__ import annotations

import doctest
import importlib

import pytest

import actorflow as af

# The user's API. A name added here is a promise to users: add it on purpose.
FACADE = [
    "ActorflowError", "AdaptiveCapacity", "AsyncBatchFunction", "AsyncFunction", "CircuitBreaker", "DataStream",
    "DeadLetter", "Hedge", "JobResult", "LookupCache", "RateLimit", "ResultFuture", "Service", "ServiceOverloaded", "SparkDataStream",
    "StreamingRun",
    "__version__", "arrow_batch", "current_request_key", "current_request_keys", "enrich", "enrich_async", "enrich_stream", "ensure_ray", "errors", "from_arrow", "from_spark",
    "last_job", "on_spark_cluster", "rerun_dead_letters", "retry", "spark_session", "stop_spark", "testing", "windows",
]
INTERNALS = {"MailboxProcessor", "Suspension", "StatusWatermarkValve", "DefaultActionController", "TaskMailbox",
             "OperatorChain", "InputGate", "ChannelSender", "OperatorActor", "SourceActor"}


def test_the_facade_exports_exactly_the_curated_names():
    assert af.__all__ == FACADE


@pytest.mark.parametrize("name", FACADE)
def test_every_exported_name_resolves(name):
    assert getattr(af, name) is not None


@pytest.mark.parametrize("namespace", ["windows", "retry", "errors", "testing"])
def test_each_namespace_exports_what_it_lists_and_no_internals(namespace):
    module = importlib.import_module(f"actorflow.{namespace}")
    for name in module.__all__:
        assert getattr(module, name) is not None, name
    assert not INTERNALS & set(module.__all__)
    assert not INTERNALS & set(af.__all__)


def test_an_unknown_name_is_an_attribute_error_that_names_it():
    with pytest.raises(AttributeError, match="module 'actorflow' has no attribute 'enrichh'"):
        af.enrichh  # noqa: B018


def test_the_entry_points_are_the_rings_own_objects():
    from actorflow.operators.windows import TumblingEventTimeWindows
    from actorflow.spark_bridge.enrich import enrich

    assert af.enrich is enrich
    assert af.windows.TumblingEventTimeWindows is TumblingEventTimeWindows
    assert issubclass(af.errors.ConfigurationError, af.ActorflowError)


@pytest.mark.parametrize("module", ["actorflow.windows", "actorflow.retry", "actorflow.errors", "actorflow.testing"])
def test_the_namespaces_docstring_examples_run(module):
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted >= 1 and result.failed == 0, result
