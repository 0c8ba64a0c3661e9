"""The examples in the docstrings, which the API reference shows, run as doctests."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import actorflow

from docs.doctest_blocks import fenced


def _modules() -> list[str]:
    names = ["actorflow"]
    for info in pkgutil.walk_packages(actorflow.__path__, "actorflow."):
        names.append(info.name)
    # The rings are subpackages by pyproject's mapping, each from its own folder.
    for ring in ("operators", "actors", "cluster", "spark_bridge"):
        package = importlib.import_module(f"actorflow.{ring}")
        names.append(package.__name__)
        names += [info.name for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")]
    return sorted(set(names) - {"actorflow.__main__"})


# Their examples run a job: on the shared Ray, in a test of its own.
JOBS = {"actorflow.cluster.datastream"}


def _run(names: list[str], capsys) -> None:
    ran = failed = 0
    failures = []
    for name in names:
        module = importlib.import_module(name)
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        ran += result.attempted
        if result.failed:
            failures.append(f"{name}: {result.failed} of {result.attempted}")
            failed += result.failed
    with capsys.disabled():
        print(f"\ndocstring examples: {ran} run")
    assert not failures, "docstring examples that fail: " + "; ".join(failures)
    assert ran > 0


def test_every_docstring_example_of_the_package_holds(capsys):
    _run([name for name in _modules() if name not in JOBS], capsys)


def test_the_docstring_examples_that_run_a_job_hold(ray_session, capsys):
    _run(sorted(JOBS), capsys)


def test_doctest_lines_render_as_a_console_block_and_fences_stay_as_they_are():
    assert fenced("A.\n\n>>> x = 1\n>>> x\n1\n\nB.") == "A.\n\n```pycon\n>>> x = 1\n>>> x\n1\n```\n\nB."
    assert fenced("```python\n>>> not a doctest here\n```") == "```python\n>>> not a doctest here\n```"
    assert fenced(">>> 1\n1") == "```pycon\n>>> 1\n1\n```"
