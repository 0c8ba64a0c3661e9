"""Build hooks: the package's source laid out as it is installed, for mkdocstrings to read.

The repository keeps the rings beside the facade (``operators/``, ``actors/``, ...), and pyproject maps
them to ``actorflow.operators``, ``actorflow.actors``, ...; griffe reads a package from one folder.
So the build reads a copy of the sources under ``build/api-source/`` in the installed layout (griffe
follows a link to its target's folder, and would look for the rings there).
"""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / "build" / "api-source"
RINGS = ("operators", "actors", "cluster", "spark_bridge")


def on_startup(**_):
    # Before any plugin reads the configuration: mkdocstrings keeps only search paths that exist.
    shutil.rmtree(TREE, ignore_errors=True)
    package = TREE / "actorflow"
    sources = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "actorflow", package, ignore=sources)
    for ring in RINGS:
        shutil.copytree(ROOT / ring, package / ring, ignore=sources)
