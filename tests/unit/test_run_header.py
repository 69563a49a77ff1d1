"""``txsink run``'s first lines: a group's header fits a terminal (one short line per
target), and the run says it is starting Spark before the long silent wait."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from txsink.config import parse_pipeline


def _group(tmp_path: Path) -> Any:
    targets = [{"name": n, "backend": "files",
                "options": {"path": str(tmp_path / ("a-rather-long-directory-name-" * 4) / n),
                            "format": "jsonl"}}
               for n in ("events", "totals", "archive", "audit")]
    return parse_pipeline({"source": {"type": "rate"}, "checkpoint": str(tmp_path / "chk"),
                           "sink": {"sink_id": "grp", "targets": targets}})


def test_a_groups_header_is_one_short_line_per_target(tmp_path: Path) -> None:
    lines = _group(tmp_path).header_lines()
    assert len(lines) == 5
    assert [line.split(":")[0] for line in lines[1:]] == [
        "  target events", "  target totals", "  target archive", "  target audit"]
    assert all(len(line) <= 100 for line in lines[1:]), lines
    assert "one decision per epoch over 4 targets" in lines[0]


def test_run_says_it_starts_spark_before_waiting_for_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pyspark", reason="txsink run needs PySpark")
    from txsink.spark import pipeline

    said: list[str] = []

    def build_session(cfg: Any) -> Any:
        said.append("<Spark starting>")
        raise RuntimeError("no Spark in a unit test")

    monkeypatch.setattr(pipeline, "build_session", build_session)
    cfg = parse_pipeline({"source": {"type": "rate"}, "checkpoint": str(tmp_path / "chk"),
                          "sink": {"backend": "files", "sink_id": "s",
                                   "options": {"path": str(tmp_path / "out")}}})
    with pytest.raises(RuntimeError, match="no Spark"):
        pipeline.run_pipeline(cfg, out=said.append, log_path=tmp_path / "spark.log")
    starting = [n for n, line in enumerate(said) if line.startswith("starting Spark (")]
    assert starting and said[starting[0] + 1] == "<Spark starting>", said
