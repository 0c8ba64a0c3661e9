"""The code blocks of the README and of the docs site, to run as they are written.

A page's code blocks are its ```python and ```bash fences. Each one runs in a test, unless the line
before it is ``<!-- illustration -->``: a fragment that shows a shape (a cluster's address, a
placeholder path) and cannot run as it stands. ``tests/docs_site/test_examples.py`` checks that every
other block of every page is run by some test, through ``run_page`` (every block of a page, in
order, in one namespace, as a reader would paste them) or ``doc_example`` (one block).

``/data/...`` and ``/chk/...`` in a block stand for a reader's own folders; ``run_page`` puts them
under the test's temporary directory.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ILLUSTRATION = "<!-- illustration -->"
CODE_LANGUAGES = ("python", "bash")

_FENCE = re.compile(r"^(?P<indent>[ ]*)```(?P<info>[^\n`]*)\n(?P<code>.*?)^(?P=indent)```[ ]*$", re.M | re.S)
_READER_PATH = re.compile(r"""(?P<quote>["'])(?P<path>/(?:data|chk)(?:/[^"'\s]*)?)(?P=quote)""")


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it starts (its first line of code, 1-based), its language, its code."""

    page: str
    line: int
    language: str
    code: str
    illustration: bool

    @property
    def runs(self) -> bool:
        return self.language in CODE_LANGUAGES and not self.illustration


def pages() -> list[str]:
    """Every page with code: the README and the docs site's Markdown, relative to the repository."""
    found = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]
    return found


def blocks(page: str) -> list[Block]:
    text = (ROOT / page).read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        indent = len(match["indent"])
        language = (match["info"].strip().split() or [""])[0].lower()
        code = "".join(line[indent:] + "\n" for line in match["code"].splitlines())
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        line = text.count("\n", 0, match.start("code")) + 1
        found.append(Block(page, line, language, code, before == ILLUSTRATION))
    return found


def doc_example(page: str, containing: str) -> str:
    """The one runnable ```python block of ``page`` whose code contains ``containing``."""
    found = [b for b in blocks(page) if b.runs and b.language == "python" and containing in b.code]
    if len(found) != 1:
        raise AssertionError(f"expected one example in {page} containing {containing!r}, found {len(found)}")
    return found[0].code


def readme_example(containing: str) -> str:
    return doc_example("README.md", containing)


def in_folder(code: str, folder: Path | str) -> str:
    """``code`` with the reader's ``/data/...`` and ``/chk/...`` paths moved under ``folder``."""
    def moved(match: re.Match[str]) -> str:
        return match["quote"] + str(Path(folder) / match["path"].lstrip("/")) + match["quote"]
    return _READER_PATH.sub(moved, code)


def run_page(page: str, namespace: dict[str, Any] | None = None, *, folder: Path | str | None = None,
             replace: dict[str, str] | None = None, env: dict[str, str] | None = None,
             timeout_s: float = 300) -> dict[str, Any]:
    """Runs every runnable block of ``page`` in order, the Python ones in one namespace, and returns it.

    ``namespace`` holds what the page takes from earlier pages (a ``spark`` session, a ``clicks``
    DataFrame). ``replace`` maps a text of the page to what the test runs instead (a service's
    address). A ```bash block runs in ``bash -e`` in ``folder``, with the project's ``.venv`` first
    on the path. An error names the page and the line of the page.
    """
    namespace = {} if namespace is None else namespace
    namespace.setdefault("__name__", "__docs__")
    ran = 0
    for block in blocks(page):
        if not block.runs:
            continue
        code = block.code
        for old, new in (replace or {}).items():
            code = code.replace(old, new)
        if folder is not None:
            code = in_folder(code, folder)
        if block.language == "python":
            # Padded so that a traceback's line number is the page's.
            exec(compile("\n" * (block.line - 1) + code, str(ROOT / page), "exec"), namespace)  # noqa: S102
        else:
            _run_bash(block, code, folder, env, timeout_s)
        ran += 1
    if not ran:
        raise AssertionError(f"{page} has no block to run")
    return namespace


def _run_bash(block: Block, code: str, folder: Path | str | None, env: dict[str, str] | None,
              timeout_s: float) -> None:
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    done = subprocess.run(["bash", "-e", "-c", code], cwd=folder or ROOT, capture_output=True, text=True,
                          timeout=timeout_s, env={**os.environ, "PATH": path, **(env or {})}, check=False)
    if done.returncode:
        raise AssertionError(f"{block.page}:{block.line}: exit {done.returncode}\n{done.stdout}\n{done.stderr}")
