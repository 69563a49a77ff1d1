"""The native path's gate on Spark itself, through ``txsink run`` (issue 39, items 3, 4
and 14): a group of Parquet files targets streamed by Spark's own writer, with a batch
whose rows the transform filters out and a target whose ``where`` matches nothing.

Before: the empty epoch failed after the decision (``min() arg is an empty sequence``)
and stayed DECIDED at every restart; a stream that ended normally left its lease held
(its driver's token differed from the workers'), and ``txsink status`` said it
crashed. tests/unit/test_gate_native.py has the fast cases without a JVM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.spark_harness import kill_group, leftover_files, read_files_output

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TXSINK = [sys.executable, "-m", "txsink.cli"]


def _pipeline(tmp_path: Path) -> Path:
    text = f"""
name: gate-native
source:
  type: files
  format: json
  path: {tmp_path / "in"}
  schema: "id LONG, amount LONG"
  options:
    maxFilesPerTrigger: 1
transform: SELECT id, amount FROM source WHERE amount > 0
sink:
  sink_id: gate-native
  targets:
    - name: all
      backend: files
      options:
        path: {tmp_path / "all"}
    - name: big
      backend: files
      where: amount > 1000
      options:
        path: {tmp_path / "big"}
checkpoint: {tmp_path / "chk"}
trigger:
  available_now: true
spark:
  master: local[2]
  conf:
    spark.ui.enabled: false
"""
    path = tmp_path / "gate.yaml"
    path.write_text(text)
    return path


def test_empty_batches_commit_and_a_stream_that_ends_releases_its_lease(
        tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    files = {  # one micro-batch each (maxFilesPerTrigger: 1)
        "0.json": [(i, 5) for i in range(0, 50)],
        "1.json": [(i, -1) for i in range(50, 80)],  # the transform keeps none
        "2.json": [(i, 2000) for i in range(80, 90)],  # the only rows of target big
    }
    for name, rows in files.items():
        (tmp_path / "in" / name).write_text(
            "".join(json.dumps({"id": i, "amount": a}) + "\n" for i, a in rows))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("TXSINK_FAULTS", None)
    proc = subprocess.Popen([*TXSINK, "run", str(_pipeline(tmp_path))], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        kill_group(proc.pid)
    assert proc.returncode == 0, stdout + stderr[-4000:]
    assert "done (query finished)" in stdout, stdout
    assert sorted(r["id"] for r in read_files_output(tmp_path / "all")) == [
        *range(0, 50), *range(80, 90)]
    assert sorted(r["id"] for r in read_files_output(tmp_path / "big")) == list(range(80, 90))
    assert leftover_files(tmp_path / "all") == leftover_files(tmp_path / "big") == []

    status = subprocess.run([*TXSINK, "status", str(tmp_path / "chk"), "--json"], env=env,
                            capture_output=True, text=True, timeout=60, check=True)
    state = json.loads(status.stdout)
    assert state["in_doubt"] == [], state
    assert [e["state"] for e in state["epochs"]] == ["committed"] * 3, state["epochs"]
    assert state["lease"]["held"] is False, state["lease"]
