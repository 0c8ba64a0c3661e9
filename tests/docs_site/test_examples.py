"""Every code block of the README and the docs site runs in a test, or says it is an illustration."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from tests.docs import ROOT, blocks, doc_example, pages

TESTS = ROOT / "tests"


def _claims() -> tuple[set[str], list[tuple[str, str]]]:
    """What the tests run: the pages run whole (``run_page``), and the blocks taken one by one."""
    whole: set[str] = set()
    single: list[tuple[str, str]] = []
    for path in TESTS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name | ast.Attribute):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
            texts = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if name == "run_page" and texts:
                whole.add(texts[0])
            elif name == "doc_example" and len(texts) == 2:
                single.append((texts[0], texts[1]))
            elif name == "readme_example" and texts:
                single.append(("README.md", texts[0]))
    return whole, single


def test_every_code_block_runs_in_a_test_unless_it_is_an_illustration():
    whole, single = _claims()
    for page in whole:
        assert (ROOT / page).is_file(), f"a test runs {page}, which does not exist"
    claimed: set[tuple[str, int]] = set()
    for page, containing in single:
        doc_example(page, containing)  # exactly one block matches
        claimed.update((page, b.line) for b in blocks(page) if b.runs and containing in b.code)
    unrun = [f"{b.page}:{b.line} ({b.language})" for page in pages() for b in blocks(page)
             if b.runs and page not in whole and (page, b.line) not in claimed]
    assert not unrun, ("these code blocks run in no test; run them (tests/docs.py: run_page, doc_example) "
                       "or mark them <!-- illustration -->:\n  " + "\n  ".join(unrun))


def test_the_count_of_executed_examples(capsys):
    whole, single = _claims()
    counts: Counter[str] = Counter()
    for page in pages():
        for b in blocks(page):
            if b.runs and (page in whole or any(p == page and c in b.code for p, c in single)):
                counts["executed"] += 1
            elif b.language in ("python", "bash"):
                counts["illustrations"] += 1
    with capsys.disabled():
        print(f"\ndoc examples: {counts['executed']} executed in tests, {counts['illustrations']} illustrations")
    assert counts["executed"] > 0


def test_a_fence_language_is_one_a_reader_can_tell():
    # A block without a language renders as plain text and is never run: name what it is.
    unnamed = [f"{b.page}:{b.line}" for page in pages() for b in blocks(page) if not b.language]
    assert not unnamed, "code blocks without a language: " + ", ".join(unnamed)


def test_illustration_marks_stand_right_before_a_block():
    for page in pages():
        lines = Path(ROOT / page).read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if line.strip() == "<!-- illustration -->":
                after = lines[i + 1].lstrip() if i + 1 < len(lines) else ""
                assert after.startswith("```"), f"{page}:{i + 1}: an illustration mark with no block after it"
