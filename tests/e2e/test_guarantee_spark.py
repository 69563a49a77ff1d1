"""The same faults under each delivery guarantee, on the files backend in real Spark.

A task fails right after it finished its participant (Spark retries it) and the
driver is SIGKILLed after epoch 2 became durable but before Spark logged it (Spark
replays the batch). exactly_once: the output equals the input. at_least_once:
every input row is there (nothing lost) and the retried and replayed rows are
there twice; `txsink status` says what readers may see.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.e2e.spark_harness import (
    DriverSpec,
    leftover_files,
    make_input,
    read_files_output,
    run_driver,
    summarize,
)
from tests.long_runs import long_run

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.fault]

FAULTS = "task-after-pre-commit@1:raise,after-decide@2:kill"


def _run(tmp_path: Path, guarantee: str) -> tuple[Path, Path]:
    out, chk = tmp_path / guarantee / "out", tmp_path / guarantee / "chk"
    spec = DriverSpec(input_dir=tmp_path / "in", checkpoint=chk, sink_id=f"g-{guarantee[:5]}",
                      options={"path": str(out), "format": "jsonl", "guarantee": guarantee})
    run_driver(spec, faults=FAULTS).check_killed("after-decide@2")
    run_driver(spec).check()
    return out, chk


@long_run
def test_exactly_once_under_the_faults(tmp_path: Path) -> None:
    """The same faults, exactly_once: the output equals the input (the default run has
    exactly_once under Spark faults per backend in the task-failure tests)."""
    expected = make_input(tmp_path / "in", files=4, rows_per_file=200)
    out, _ = _run(tmp_path, "exactly_once")
    assert summarize(read_files_output(out)) == expected
    assert leftover_files(out) == []


@pytest.mark.promise("at-least-once-orphans-aborted", "datasource")
def test_at_least_once_under_the_faults_loses_nothing_and_says_so(tmp_path: Path) -> None:
    make_input(tmp_path / "in", files=4, rows_per_file=200)
    expected_ids = sorted(i for i in range(800))
    out, chk = _run(tmp_path, "at_least_once")
    rows = read_files_output(out)
    counts = Counter(r["id"] for r in rows)
    assert sorted(counts) == expected_ids, "at_least_once lost rows"
    twice = {i for i, n in counts.items() if n > 1}
    # Epoch 2 (ids 400-599) was replayed whole; epoch 1's failed task wrote its share
    # of ids 200-399 a second time.
    assert set(range(400, 600)) <= twice
    assert twice & set(range(200, 400))
    assert all(n <= 2 for n in counts.values())
    assert leftover_files(out) == []
    status = subprocess.run([sys.executable, "-m", "txsink.cli", "status", str(chk)],
                            capture_output=True, text=True, timeout=60, check=True)
    assert "guarantee: at least once" in status.stdout
    assert "duplicates" in status.stdout
    js = json.loads(subprocess.run(
        [sys.executable, "-m", "txsink.cli", "status", str(chk), "--json"],
        capture_output=True, text=True, timeout=60, check=True).stdout)
    assert js["guarantee"] == "at_least_once"
    assert js["in_doubt"] == []


def test_an_unsupported_guarantee_is_refused_before_spark_writes(tmp_path: Path) -> None:
    from txsink.errors import ConfigError
    from txsink.spark.datasource import SinkSettings

    with pytest.raises(ConfigError, match="'guarantee' must be one of") as info:
        SinkSettings.parse({"backend": "files", "sink_id": "g", "path": str(tmp_path),
                            "checkpointLocation": str(tmp_path / "chk"),
                            "guarantee": "twice"})
    assert info.value.field == "guarantee"
    ok = SinkSettings.parse({"backend": "files", "sink_id": "g", "path": str(tmp_path),
                             "checkpointLocation": str(tmp_path / "chk"),
                             "guarantee": "at_least_once"})
    assert ok.guarantee.value == "at_least_once"
    assert "guarantee" not in ok.backend_options
