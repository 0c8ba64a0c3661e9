"""The pages the site makes when it is built: the performance page from the benchmarks' results, the
metrics and the error tree from the code."""

from __future__ import annotations

import doctest
import json

from docs import generate
from tests.docs import ROOT


def test_the_helpers_examples_hold():
    assert doctest.testmod(generate).failed == 0


def test_the_performance_page_has_a_section_a_table_and_a_plot_for_each_kept_result(tmp_path):
    record = {"benchmark": "windows", "command": "python -m benchmarks.windows --quick", "finished": "2026-12-05T04:41:50+00:00",
              "commit": "abc1234", "machine": {"cpus": 2, "cpu": "AMD EPYC", "memory_gib": 23.5, "system": "Linux 6",
                                               "python": "3.11.7", "versions": {"ray": "2.50.1"}},
              "figures": {"actorflow_rps": 143449, "end_to_end_vs_spark": 2.324, "targets": {"x_vs_y_min": 1.5}}}
    (tmp_path / "windows.json").write_text(json.dumps(record))
    text, images = generate.performance_page(generate.load_results(tmp_path))
    assert "## windows" in text and "Keyed event-time windows" in text  # the benchmark's own summary
    assert "- **Command:** `python -m benchmarks.windows --quick`" in text
    assert "2 CPUs (AMD EPYC), 23.5 GiB" in text and "commit `abc1234`" in text
    assert "| `end_to_end_vs_spark` | 2.324 |" in text and "| `actorflow_rps` | 143,449 |" in text
    assert list(images) == ["performance/windows.png"] and images["performance/windows.png"].startswith(b"\x89PNG")
    assert generate.ratios(generate.flatten(record["figures"])) == {"end_to_end_vs_spark": 2.324}  # targets aren't measured


def test_every_kept_result_is_a_benchmark_of_the_repository_with_its_context():
    results = generate.load_results()
    assert results, "no benchmark has kept its results: run one (see docs/contributing.md)"
    for record in results:
        assert (ROOT / "benchmarks" / f"{record['benchmark']}.py").is_file(), record["benchmark"]
        assert record["command"].startswith(f"python -m benchmarks.{record['benchmark']}")
        assert {"cpus", "cpu", "memory_gib", "system", "python", "versions"} <= set(record["machine"])


def test_the_metrics_and_errors_pages_list_what_the_code_defines():
    from actorflow import errors
    from actorflow.actors import metrics

    page = generate.metrics_page()
    for name in metrics._COUNTERS:
        assert f"`ray_actorflow_{name}_total`" in page
    for name in metrics._GAUGES:
        assert f"`ray_actorflow_{name}`" in page
    tree = generate.errors_page()
    for name in errors.__all__:
        assert f"**`{name}`**" in tree, name
    assert "\n        - **`UnfinishedRunError`**" in tree  # under CheckpointError, two levels down
