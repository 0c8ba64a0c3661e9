"""The rings' rules, checked on the source: ring 1 stays pure, and the public packages type-check."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = ["operators", "actors", "cluster", "spark_bridge"]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", sorted((ROOT / "operators").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT / "operators")))
def test_ring1_imports_neither_ray_nor_spark_nor_outer_rings(path):
    forbidden = {"ray", "pyspark", "raydp", "actors", "cluster", "spark_bridge"}
    assert not _imports(path) & forbidden


@pytest.mark.parametrize("path", sorted((ROOT / "operators").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT / "operators")))
def test_ring1_reads_no_wall_clock_outside_the_clock_module(path):
    if path.name == "clock.py":
        return
    calls = {
        f"{node.func.value.id}.{node.func.attr}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
    }
    assert not calls & {"time.time", "time.time_ns", "time.monotonic", "time.sleep", "datetime.now", "datetime.utcnow"}


def test_ring2_does_not_import_spark():
    for path in (ROOT / "actors").glob("*.py"):
        assert not _imports(path) & {"pyspark", "raydp", "spark_bridge", "cluster"}, path


def test_mypy_passes_on_the_public_packages():
    result = subprocess.run(
        [sys.executable, "-m", "mypy", *PUBLIC], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
