"""Pages made when the site is built (mkdocs-gen-files), from what they describe, so they cannot go stale:

- ``reference/metrics.md`` from the metrics an operator instance exports (``actors/metrics.py``);
- ``reference/errors.md`` from the exception classes under ``ActorflowError``;
- ``performance.md`` and its plots from the benchmarks' latest results (``benchmarks/results/*.json``).
"""

from __future__ import annotations

import ast
import inspect
import io
import json
from pathlib import Path
from typing import Any

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def first_paragraph(text: str | None) -> str:
    return " ".join((inspect.cleandoc(text or "").split("\n\n") or [""])[0].split())


# --- metrics -----------------------------------------------------------------------------------


def metrics_page() -> str:
    from actorflow.actors import metrics

    lines = [
        "# Metrics",
        "",
        "Every operator instance exports these through Ray's metrics agent, about once a second. Ray adds",
        "the `ray_` prefix: `actorflow_records_in_total` is `ray_actorflow_records_in_total` in Prometheus",
        "and in the Ray dashboard's Grafana panels. Each series has the tags "
        + ", ".join(f"`{t}`" for t in metrics._TAG_KEYS) + " (the instance's index).",
        "Counters are published at zero when an instance starts, so a dashboard shows each series before",
        "its first event. [Observability](../guides/observability.md) shows where to watch them.",
        "",
        "## Counters",
        "",
        "| Prometheus name | What it counts |",
        "|---|---|",
    ]
    lines += [f"| `ray_actorflow_{name}_total` | {text} |" for name, text in metrics._COUNTERS.items()]
    lines += ["", "## Gauges", "", "| Prometheus name | What it shows |", "|---|---|"]
    lines += [f"| `ray_actorflow_{name}` | {text} |" for name, text in metrics._GAUGES.items()]
    return "\n".join(lines) + "\n"


# --- errors ------------------------------------------------------------------------------------


def errors_page() -> str:
    from actorflow import errors

    classes = {name: getattr(errors, name) for name in errors.__all__}
    names = {cls: name for name, cls in classes.items()}

    def branch(cls: type, depth: int) -> list[str]:
        bases = [b.__name__ for b in cls.__bases__ if b not in names and b is not Exception]
        also = f" (also a `{'`, `'.join(bases)}`)" if bases else ""
        out = [f"{'    ' * depth}- **`{names[cls]}`**{also}: {first_paragraph(cls.__doc__)}"]
        for sub in sorted((c for c in cls.__subclasses__() if c in names), key=lambda c: names[c]):
            out += branch(sub, depth + 1)
        return out

    lines = [
        "# Errors",
        "",
        "Every error actorflow raises derives from `ActorflowError`, and each can be imported from",
        "`af.errors` (`import actorflow as af`). An error that is also a built-in one (`ValueError`,",
        "`TimeoutError`, `TypeError`) says so, so that `except ValueError` catches it too.",
        "",
    ]
    lines += branch(errors.ActorflowError, 0)
    lines += [
        "",
        "A record's error (`RecordError` and below) names the operator instance and the record. A job's",
        "failure is a `JobFailedError` whose `__cause__` is the operator's error; an exception that cannot",
        "cross a process boundary arrives as a `ForeignError` holding its type, message and traceback.",
        "With `on_error=\"dead_letter\"` a record's error goes to the dead letters instead, with its",
        "`error_type`, `error`, `attempts`, `operator` and `request_key` (the idempotency key of its",
        "requests, which `rerun_dead_letters` sends it again with).",
    ]
    return "\n".join(lines) + "\n"


# --- performance -------------------------------------------------------------------------------


def flatten(figures: dict[str, Any], prefix: str = "") -> dict[str, float | int | str | bool]:
    """The scalar figures of a benchmark's JSON, nested names joined by dots; nulls and lists of
    scalars left out. A list of objects is flattened item by item, each named by its ``profile``
    (and ``capacity``) where it has one, else by its position.

    >>> flatten({"a": 1, "b": {"c": 2.5}, "rows": [{"profile": "skewed", "capacity": 64, "x": 3}], "ids": [1, 2]})
    {'a': 1, 'b.c': 2.5, 'rows[skewed C=64].profile': 'skewed', 'rows[skewed C=64].capacity': 64, 'rows[skewed C=64].x': 3}
    """
    flat: dict[str, float | int | str | bool] = {}
    for key, value in figures.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        elif isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            for i, item in enumerate(value):
                label = f"{item['profile']} C={item['capacity']}" if "profile" in item and "capacity" in item else str(i)
                flat.update(flatten(item, f"{name}[{label}]."))
        elif isinstance(value, bool | int | float | str):
            flat[name] = value
    return flat


def ratios(flat: dict[str, Any]) -> dict[str, float]:
    """The figures that compare two things measured in the same run (``x_vs_y``, ``…ratio``); a
    benchmark's targets are not measurements."""
    return {name: float(value) for name, value in flat.items()
            if isinstance(value, int | float) and not isinstance(value, bool) and not name.startswith("targets.")
            and ("_vs_" in name.rsplit(".", 1)[-1] or name.rsplit(".", 1)[-1].endswith("ratio"))}


def plot(title: str, values: dict[str, float]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(values)
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(names) + 1.2), dpi=100)
    bars = ax.barh(names, [values[n] for n in names], color="#3f51b5")
    ax.axvline(1.0, color="#888", linewidth=1, linestyle="--")
    ax.bar_label(bars, fmt="%.2f", padding=3, fontsize=8)
    ax.invert_yaxis()
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("ratio (1.0: even)")
    ax.tick_params(axis="y", labelsize=8)
    ax.margins(x=0.15)
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png")
    plt.close(fig)
    return out.getvalue()


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return f"`{value}`"


def performance_page(results: list[dict[str, Any]]) -> tuple[str, dict[str, bytes]]:
    lines = [
        "# Performance",
        "",
        "Each benchmark's latest results, read from `benchmarks/results/<benchmark>.json` when this site",
        "was built. A benchmark measures its baselines (Spark, Ray Data, pandas, a bare asyncio loop) in the",
        "same run as actorflow, on the same machine, and writes that file when it ends: run",
        "`python -m benchmarks.<name>` to measure again, then rebuild the site. A plot shows the run's",
        "ratios, each against its baseline of the same run (1.0 is even). Each section says the command,",
        "the machine, when it ran and at which commit. [Contributing](contributing.md) lists the benchmarks.",
        "",
    ]
    images: dict[str, bytes] = {}
    if not results:
        lines.append("No benchmark has kept its results yet.")
    for record in results:
        name = record["benchmark"]
        source = (ROOT / "benchmarks" / f"{name}.py").read_text(encoding="utf-8")
        machine = record["machine"]
        versions = ", ".join(f"{k} {v}" for k, v in machine.get("versions", {}).items())
        lines += [
            f"## {name}",
            "",
            first_paragraph(ast.get_docstring(ast.parse(source))),
            "",
            f"- **Command:** `{record['command']}`",
            f"- **Ran:** {record['finished']} at commit `{record['commit']}`",
            f"- **Machine:** {machine['cpus']} CPUs ({machine['cpu']}), {machine['memory_gib']} GiB, "
            f"{machine['system']}, Python {machine['python']}; {versions}",
            "",
        ]
        flat = flatten(record["figures"])
        compared = ratios(flat)
        if compared:
            images[f"performance/{name}.png"] = plot(f"{name}: ratios within one run", compared)
            lines += [f"![{name}: each ratio against its baseline of the same run](performance/{name}.png)", ""]
        lines += ["| figure | value |", "|---|---|"]
        lines += [f"| `{key}` | {_value(value)} |" for key, value in flat.items()]
        lines.append("")
    return "\n".join(lines) + "\n", images


def load_results(folder: Path = RESULTS) -> list[dict[str, Any]]:
    return [json.loads(path.read_text(encoding="utf-8")) for path in sorted(folder.glob("*.json"))]


def main() -> None:
    for name, text in (("reference/metrics.md", metrics_page()), ("reference/errors.md", errors_page())):
        with mkdocs_gen_files.open(name, "w") as page:
            page.write(text)
    text, images = performance_page(load_results())
    with mkdocs_gen_files.open("performance.md", "w") as page:
        page.write(text)
    for name, data in images.items():
        with mkdocs_gen_files.open(name, "wb") as image:
            image.write(data)


# mkdocs-gen-files runs this file with runpy.run_path; a test imports it as docs.generate.
if __name__ == "<run_path>":
    main()
