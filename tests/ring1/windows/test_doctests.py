"""The runnable examples in the docstrings of the window and watermark modules stay true."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "operators.watermarks",
    "operators.windows",
    "operators.windows.assigners",
    "operators.windows.evictors",
    "operators.windows.functions",
    "operators.windows.merging",
    "operators.windows.records",
    "operators.windows.triggers",
    "operators.windows.vectorised",
    "operators.windows.window_operator",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
