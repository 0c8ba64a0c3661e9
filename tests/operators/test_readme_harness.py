"""The README's harness example runs as written and shows what its comments say."""

from __future__ import annotations

import ast
import asyncio

from actorflow.operators import DeadLetter, Watermark
from tests.readme import readme_example


async def slow_lookup(value):
    await asyncio.sleep(60)  # on the loop's own clock: only the harness's deadline ends it
    return [value]


def test_the_readme_harness_example_times_out_a_and_then_lets_the_watermark_pass():
    code = readme_example("OperatorHarness(async_wait(slow_lookup")
    # Run it statement by statement, keeping the value of each line that shows one.
    namespace = {"slow_lookup": slow_lookup}
    shown = []
    for statement in ast.parse(code).body:
        if isinstance(statement, ast.Expr) and not isinstance(statement.value, ast.Call):
            value = eval(compile(ast.Expression(statement.value), "README", "eval"), namespace)  # noqa: S307
            shown.append(list(value))  # as it is at that line: the harness appends to its lists
        else:
            exec(compile(ast.Module([statement], []), "README", "exec"), namespace)  # noqa: S102
    before, after, dead = shown
    assert before == []
    assert after == [Watermark(5)]
    assert len(dead) == 1 and isinstance(dead[0], DeadLetter)
    assert (dead[0].value, dead[0].attempts, dead[0].error_type) == ("a", 1, "AsyncTimeoutError")
