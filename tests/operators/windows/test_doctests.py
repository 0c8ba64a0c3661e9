"""The runnable examples in the docstrings of the window and watermark modules stay true."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "actorflow.operators.watermarks",
    "actorflow.operators.windows",
    "actorflow.operators.windows.assigners",
    "actorflow.operators.windows.evictors",
    "actorflow.operators.windows.functions",
    "actorflow.operators.windows.merging",
    "actorflow.operators.windows.records",
    "actorflow.operators.windows.triggers",
    "actorflow.operators.windows.vectorised",
    "actorflow.operators.windows.window_operator",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
