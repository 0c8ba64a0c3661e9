"""The rings' rules, checked on the source: one import package, dependencies that point inward, and a
pure ring 1. (``make check`` type-checks and lints, outside pytest; CI runs it.)"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RINGS = ["operators", "actors", "cluster", "spark_bridge"]
# What each ring may import of actorflow: dependencies point inward, and no ring imports the facade.
ALLOWED = {
    "operators": set(),
    "actors": {"operators"},
    "cluster": {"operators", "actors"},
    "spark_bridge": {"operators", "actors", "cluster"},
}
THIRD_PARTY_FORBIDDEN = {
    "operators": {"ray", "pyspark", "raydp"},
    "actors": {"pyspark", "raydp"},
    "cluster": {"pyspark", "raydp"},
    "spark_bridge": set(),
}


def _imports(path: Path) -> set[str]:
    """The absolute modules a file imports (relative imports stay inside their own ring)."""
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            if node.module == "actorflow":
                names |= {f"actorflow.{a.name}" for a in node.names}
    return names


def _python_files() -> list[Path]:
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / line for line in tracked.stdout.split()]


def _ring_files(ring: str) -> list[Path]:
    return sorted((ROOT / ring).rglob("*.py"))


@pytest.mark.parametrize("ring", RINGS)
def test_each_ring_imports_only_the_rings_inside_it_and_never_the_facade(ring):
    wrong = {}
    for path in _ring_files(ring):
        for name in _imports(path):
            top, _, rest = name.partition(".")
            if top in THIRD_PARTY_FORBIDDEN[ring]:
                wrong[str(path.relative_to(ROOT))] = name
            elif top == "actorflow" and rest.split(".")[0] not in ALLOWED[ring] | {ring}:
                wrong[str(path.relative_to(ROOT))] = name
    assert not wrong, f"{ring}/ may import {sorted(ALLOWED[ring])} of actorflow, got {wrong}"


def test_no_module_imports_a_ring_by_its_bare_name():
    bare = re.compile(r"^\s*(?:>>>\s+|\.\.\.\s+)?(?:from|import)\s+(operators|actors|cluster|spark_bridge)\b", re.M)
    users_own = ROOT / "tests" / "facade" / "shadowing_project"  # a user's project: its own operators and cluster
    found = [str(p.relative_to(ROOT)) for p in _python_files()
             if users_own not in p.parents and bare.search(p.read_text())]
    readme = (ROOT / "README.md").read_text()
    notebook = "".join(
        "".join(cell["source"]) for cell in json.loads((ROOT / "examples" / "enrichment.ipynb").read_text())["cells"]
    )
    pages = [(str(p.relative_to(ROOT)), p.read_text()) for p in sorted((ROOT / "docs").rglob("*.md"))]
    found += [name for name, text in (("README.md", readme), ("enrichment.ipynb", notebook), *pages) if bare.search(text)]
    assert not found, f"import the rings as actorflow.<ring>: {found}"


def test_the_distribution_installs_one_import_package():
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert {p.split(".")[0] for p in config["packages"]} == {"actorflow"}
    assert config["package-dir"] == {"actorflow": "actorflow", **{f"actorflow.{r}": r for r in RINGS}}


@pytest.mark.parametrize("path", _ring_files("operators"), ids=lambda p: str(p.relative_to(ROOT / "operators")))
def test_ring1_reads_no_wall_clock_outside_the_clock_module(path):
    if path.name == "clock.py":
        return
    calls = {
        f"{node.func.value.id}.{node.func.attr}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
    }
    assert not calls & {"time.time", "time.time_ns", "time.monotonic", "time.sleep", "datetime.now", "datetime.utcnow"}


def test_importing_actorflow_or_ring1_loads_neither_ray_nor_spark():
    code = ("import sys, actorflow, actorflow.operators, actorflow.testing, actorflow.windows; "
            "print(sorted(m for m in ('ray', 'pyspark', 'raydp') if m in sys.modules))")
    shown = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == "[]"
