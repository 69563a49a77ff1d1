"""`txsink cut FILE` with a target renamed in the file is refused, as `run` and `reset`
refuse it: the renamed target is another sink id, so its target said "no epoch committed
yet" and the cut was -1 over targets holding every epoch (found by the first-hour
attack, on files + PostgreSQL + Kafka after 80 committed epochs)."""

from __future__ import annotations

from pathlib import Path

import pytest
from txsink.cli import main
from txsink.config import load_pipeline
from txsink.plugins import get_plugins
from txsink.state import DirectoryStateStore


def _group(tmp_path: Path, file: str, second: str) -> Path:
    f = tmp_path / file
    f.write_text(f"""
source: {{type: rate}}
sink:
  sink_id: orders
  targets:
    - {{name: archive, backend: files, options: {{path: {tmp_path / 'a'}, format: jsonl}}}}
    - {{name: {second}, backend: files, options: {{path: {tmp_path / 'b'}, format: jsonl}}}}
checkpoint: {tmp_path / 'checkpoint'}
""")
    return f


@pytest.mark.promise("group-targets-changed-refused", "cli")
def test_cut_refuses_a_file_whose_targets_are_not_the_recorded_ones(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from txsink.spark.pipeline import check_ownership

    recorded = _group(tmp_path, "p.yaml", "totals")
    cfg = load_pipeline(str(recorded))
    check_ownership(cfg, get_plugins(), DirectoryStateStore(tmp_path / "checkpoint" / "txsink"),
                    str(recorded))
    assert main(["cut", str(recorded)]) == 0
    assert "cut: -1" in capsys.readouterr().out  # nothing written yet: right here

    renamed = _group(tmp_path, "renamed.yaml", "sums")
    assert main(["cut", str(renamed)]) == 1
    captured = capsys.readouterr()
    assert "cut:" not in captured.out
    assert captured.err.startswith("txsink: config error: sink.targets: sink 'orders': its "
                                   "targets were archive (files), totals (files)"), captured.err
    assert "missing here: totals; new here: sums" in captured.err
