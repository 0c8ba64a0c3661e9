"""mypy over the one import package, ``actorflow``, as it is installed.

mypy cannot follow setuptools' ``package-dir`` mapping, so this lays the package out as the wheel
does, in links under ``build/typecheck/``: the facade's files and one link per ring folder. Run it
with ``python -m tests.typecheck`` (``make check`` does).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RINGS = ("operators", "actors", "cluster", "spark_bridge")


def lay_out(into: Path) -> Path:
    """``into``/actorflow, the package as installed, made of links to the repository's files."""
    package = into / "actorflow"
    shutil.rmtree(into, ignore_errors=True)
    package.mkdir(parents=True)
    for path in (ROOT / "actorflow").iterdir():
        if path.suffix in (".py", ".typed"):
            (package / path.name).symlink_to(path)
    for ring in RINGS:
        (package / ring).symlink_to(ROOT / ring, target_is_directory=True)
    return package


def main() -> int:
    tree = ROOT / "build" / "typecheck"
    lay_out(tree)
    config = ROOT / "pyproject.toml"
    return subprocess.call([sys.executable, "-m", "mypy", "--config-file", str(config), "-p", "actorflow"], cwd=tree)


if __name__ == "__main__":
    sys.exit(main())
