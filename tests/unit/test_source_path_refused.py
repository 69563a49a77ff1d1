"""A source path that does not exist is refused before Spark starts, under
``source.path``, and leaves no claimed sink directory and no state behind (Spark's own
error came after the sink had claimed its directory and the checkpoint had state)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from txsink.errors import ConfigError


@pytest.mark.parametrize("command", ["run", "validate"])
def test_a_missing_source_path_is_refused_first(command: str, tmp_path: Path) -> None:
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(
        f"source: {{type: files, format: json, path: {tmp_path}/nowhere, schema: 'id LONG'}}\n"
        f"checkpoint: {tmp_path}/chk\n"
        f"sink: {{backend: files, sink_id: mine, options: {{path: '{tmp_path}/out'}}}}\n")
    done = subprocess.run([sys.executable, "-m", "txsink.cli", command, str(pipeline)],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(
        f"txsink: config error: source.path: '{tmp_path}/nowhere' does not exist"), done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml"]


def _source(path: str) -> None:
    from txsink.config import check_source_exists, parse_pipeline

    check_source_exists(parse_pipeline({
        "source": {"type": "files", "format": "json", "path": path, "schema": "id LONG"},
        "sink": {"backend": "files", "sink_id": "s", "options": {"path": "/nowhere/out"}},
        "checkpoint": "/nowhere/chk"}))


def test_paths_spark_reads_are_not_refused(tmp_path: Path) -> None:
    """``file:/x`` (Hadoop's spelling, which Spark prints) and ``{a,b}`` alternatives
    were refused as missing: Python's glob knows neither."""
    (tmp_path / "in" / "2024").mkdir(parents=True)
    (tmp_path / "in" / "2024" / "a.json").write_text('{"id": 1}\n')
    for path in (f"file:{tmp_path}/in", f"file://{tmp_path}/in",
                 f"file://localhost{tmp_path}/in", f"{tmp_path}/in/{{2023,2024}}",
                 f"{tmp_path}/{{x,in/{{2099,2024}}}}/*.json", "hdfs:/elsewhere/x"):
        _source(path)  # no ConfigError
    for path in (f"file:{tmp_path}/nowhere", f"{tmp_path}/in/{{2022,2023}}"):
        with pytest.raises(ConfigError, match="does not exist"):
            _source(path)
