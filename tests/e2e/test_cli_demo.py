"""The README's first command: the embedded demo pipeline runs with only Python and Java."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.spark_harness import kill_group, leftover_files, read_files_output
from tests.long_runs import long_run

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TXSINK = [sys.executable, "-m", "txsink.cli"]


def _txsink_run(pipeline: str, env: dict[str, str], *args: str) -> str:
    proc = subprocess.Popen(
        [*TXSINK, "run", str(REPO / "examples/pipelines" / pipeline), *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        kill_group(proc.pid)  # the JVM and Python workers, whatever happened
    assert proc.returncode == 0, stdout + stderr[-4000:]
    return stdout


@long_run
def test_demo_pipelines_run_and_commit_exactly_once(tmp_path: Path) -> None:
    env = {**os.environ, "TXSINK_DEMO_DIR": str(tmp_path / "demo"),
           "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("TXSINK_FAULTS", None)
    stdout = _txsink_run("demo.yaml", env, "--max-batches", "3")
    assert "batch 1: " in stdout
    assert "sample of " in stdout  # it shows what it wrote
    assert "done (--max-batches 3 reached): committed epochs 0-" in stdout

    data = tmp_path / "demo" / "data"
    rows = read_files_output(data)
    assert rows, "the demo wrote nothing"
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids))
    # The rate source numbers rows 0, 1, 2, ...: committed epochs hold a gap-free prefix.
    assert sorted(ids) == list(range(len(ids)))
    assert {r["key"] for r in rows} <= set(range(5))
    # A bounded run normally stops between batches; under heavy load it may stop one
    # mid-way, whose participants are aborted by the next start - never a committed one.
    committed_top = max(int(p.name.split("-")[1]) for p in data.glob("part-*"))
    for leftover in leftover_files(data):
        assert int(leftover.rsplit("-e", 1)[1].split("-")[0]) > committed_top, leftover

    status = subprocess.run([*TXSINK, "status", str(tmp_path / "demo" / "checkpoint"),
                             "--json"], env=env, capture_output=True, text=True, timeout=60,
                            check=True)
    state = json.loads(status.stdout)
    assert state["sink_id"] == "demo"
    assert state["in_doubt"] == []
    assert all(p["epoch"] > committed_top for p in state["prepared_undecided"])
    assert sum(e["rows"] for e in state["epochs"]) == len(rows)

    # A directory of JSON files (the demo's output) -> SQL -> Parquet, until all is read.
    stdout = _txsink_run("files-to-parquet.yaml", env)
    assert "done (query finished)" in stdout
    parquet = tmp_path / "demo" / "parquet"
    copied = read_files_output(parquet)
    assert sorted(r["id"] for r in copied) == sorted(i for i in ids if i > 0)
    assert leftover_files(parquet) == []

    # A batch write in TOML: those Parquet files -> GROUP BY -> JSON lines, one epoch.
    stdout = _txsink_run("parquet-batch.toml", env)
    assert "done (batch write finished): committed epoch 0" in stdout
    totals = read_files_output(tmp_path / "demo" / "totals")
    assert {r["key"]: r["rows"] for r in totals} == {
        k: sum(1 for r in copied if r["key"] == k) for k in {r["key"] for r in copied}}
    assert sum(r["amount"] for r in totals) == sum(r["amount"] for r in copied)
