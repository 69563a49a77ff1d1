"""benchmarks/report.py renders the performance page from a results directory alone:
measuring (run_all.py and the benches, each writing JSON) and reporting are apart."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def report(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    sys.modules.pop("report", None)
    import report as module

    return module


def _writer(target: str, key: str, name: str, seconds: float, vs: float | None,
            noop: float | None = None) -> dict[str, object]:
    return {"target": target, "key": key, "name": name, "guarantee": "exactly-once",
            "seconds": [seconds, seconds * 1.1], "cpu_load": [1.0, 1.5],
            "vs_builtin": vs, "vs_noop": noop}


def test_the_page_comes_from_json_results_only(tmp_path: Path, report) -> None:  # type: ignore[no-untyped-def]
    results = tmp_path / "results"
    results.mkdir()
    (results / "run.json").write_text(json.dumps({
        "info": {"date": "2026-11-24 00:00 UTC", "CPU": "2 cores"},
        "versions": {"Spark": "4.3.0"}, "rounds": 2, "quick": False,
        "command": "uvx --with tox-uv tox -e bench", "loads": [1.0, 1.5],
        "sizes": {"kafka": 1000, "files": 2000},
        "results": {
            "kafka": [_writer("kafka", "spark", "Spark Kafka sink", 2.0, None),
                      _writer("kafka", "txsink", "txsink", 1.6, 1.25)],
            "files": [_writer("files", "spark", "Spark Parquet writer", 1.0, None),
                      _writer("files", "py-noop", "no-op", 1.5, 0.66),
                      _writer("files", "txsink", "txsink", 1.8, 0.55, 0.96)]}}))
    (results / "commit.json").write_text(json.dumps([
        {"backend": "files", "participants": 128, "epoch": None, "p50_ms": 9.3,
         "p95_ms": 12.0}]))
    (results / "notes.json").write_text(json.dumps({"commit_bench": "from the test"}))
    goals = report.render(results, tmp_path / "docs")
    page = (tmp_path / "docs" / "performance.md").read_text()
    assert (tmp_path / "docs" / "performance.png").stat().st_size > 1000
    assert "| Kafka | txsink | exactly-once | 1,000 |" in page
    assert "uvx --with tox-uv tox -e bench" in page
    measures = {g.measure: g for g in goals}
    assert measures["Kafka: txsink exactly-once / Spark built-in (at-least-once)"].met()
    assert measures["files: txsink exactly-once / Spark built-in (at-least-once)"].met() is False
    assert measures["files: commit p50 per epoch, 128 participants"].value == 9.3
    assert "Why the missed targets were missed" in page
    assert "0.66 of Spark's writer" in page  # the miss note quotes the run's own figure


def test_the_multi_target_benchmark_has_its_section_and_target(tmp_path: Path, report) -> None:  # type: ignore[no-untyped-def]
    results = tmp_path / "results"
    results.mkdir()
    (results / "run.json").write_text(json.dumps({
        "info": {"date": "2026-11-24 00:00 UTC"}, "versions": {}, "rounds": 1, "quick": False,
        "command": "tox -e bench", "loads": [], "sizes": {"files": 10},
        "results": {"files": [_writer("files", "spark", "Spark Parquet writer", 1.0, None),
                              _writer("files", "txsink", "txsink", 1.2, 0.8)]}}))

    def way(label: str, rate: float, p50: float | None = None) -> dict[str, object]:
        return {"label": label, "seconds": [1.0], "records_per_s": rate,
                **({"commit_p50_ms": p50, "commit_p95_ms": p50 * 2} if p50 else {})}

    (results / "multi.json").write_text(json.dumps({
        "rows_per_epoch": 1000, "epochs": 2, "rounds": 1,
        "ways": {"group": way("group of 3", 3000.0, 40.0),
                 "grouped": way("grouped writes", 1500.0, 45.0),
                 "separate": way("3 separate", 1000.0, 90.0),
                 "builtin": way("built-in", 2000.0)},
        "ratios": {"group_vs_separate": 2.9, "group_vs_builtin": 1.4}}))
    (results / "notes.json").write_text(json.dumps({"multi_bench": "from the test"}))
    goals = report.render(results, tmp_path / "docs")
    page = (tmp_path / "docs" / "performance.md").read_text()
    assert "### One epoch across three systems (`benchmarks/multi_bench.py`)" in page
    assert "| group of 3 | 3,000 | 3.00 | 1.50 | 40 | 80 |" in page
    assert "| built-in | 2,000 | 2.00 | 1.00 | - | - |" in page
    goal = next(g for g in goals if g.source == "multi_bench")
    assert goal.value == 2.9 and goal.met()
