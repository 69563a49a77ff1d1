"""SIGKILL the driver at every protocol point; the restarted run must write each row once.

The driver is :mod:`tests.chaos.driver` (the protocol in real processes: forked
writers, a coordinator, an engine commit log) with the files backend.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from txsink.faults import POINTS

from tests.chaos.driver import ROWS

EPOCHS, PARTITIONS = 4, 3
ROOT = Path(__file__).resolve().parents[2]


def run(out: Path, state: Path, *, faults: str = "", kill_task: str = "",
        segment: int = 0) -> subprocess.CompletedProcess[str]:
    spec = {"backend": "files", "options": {"path": str(out)}, "sink_id": "crash-files",
            "state": str(state), "epochs": EPOCHS, "partitions": PARTITIONS, "kind": "table",
            "run": segment,
            "task_faults": {kill_task: "task-dies-after-prepare"} if kill_task else {}}
    spec_file = state.with_suffix(f".{segment}.json")
    spec_file.parent.mkdir(parents=True, exist_ok=True)
    spec_file.write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXSINK_FAULTS")}
    if faults:
        env["TXSINK_FAULTS"] = faults
    return subprocess.run([sys.executable, "-m", "tests.chaos.driver", str(spec_file)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def digest(out: Path) -> tuple[int, dict[str, str]]:
    """Row count and a checksum per key over what readers see."""
    table = ds.dataset(str(out), format="parquet").to_table()  # skips _txsink
    per_key: dict[str, list[int]] = collections.defaultdict(list)
    for row_id, key, value in zip(*(table.column(c).to_pylist() for c in ("id", "key", "value")),
                                  strict=True):
        assert value == row_id * 7
        per_key[key].append(row_id)
    return table.num_rows, {k: hashlib.sha256(repr(sorted(v)).encode()).hexdigest()
                            for k, v in per_key.items()}


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, str]]:
    base = tmp_path_factory.mktemp("clean")
    done = run(base / "out", base / "state")
    assert done.returncode == 0, done.stderr
    count, sums = digest(base / "out")
    assert count == EPOCHS * PARTITIONS * ROWS
    return count, sums


def assert_clean(out: Path) -> None:
    leftovers = [p.name for d in ("inprogress", "pending")
                 for p in (out / "_txsink" / d).iterdir()]
    assert leftovers == []


@pytest.mark.fault
@pytest.mark.parametrize("point", POINTS)
def test_driver_sigkill_at_each_point(point: str, tmp_path: Path,
                                      expected: tuple[int, dict[str, str]]) -> None:
    out, state = tmp_path / "out", tmp_path / "state"
    crashed = run(out, state, faults=f"{point}@2:kill")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    restarted = run(out, state, segment=1)
    assert restarted.returncode == 0, restarted.stderr
    assert digest(out) == expected
    assert_clean(out)


@pytest.mark.fault
def test_writer_killed_after_prepare_is_retried_and_its_orphan_aborted(
    tmp_path: Path, expected: tuple[int, dict[str, str]]
) -> None:
    out, state = tmp_path / "out", tmp_path / "state"
    done = run(out, state, kill_task="1:2")
    assert done.returncode == 0, done.stderr
    assert (state / "faults.log").read_text().split() == ["task-dies-after-prepare@1:2"]
    assert digest(out) == expected
    assert_clean(out)


@pytest.mark.fault
def test_two_crashes_in_a_row_then_restart(tmp_path: Path,
                                           expected: tuple[int, dict[str, str]]) -> None:
    out, state = tmp_path / "out", tmp_path / "state"
    assert run(out, state, faults="after-first-commit@1:kill").returncode == -signal.SIGKILL
    # The restart re-commits epoch 1, then dies again while deciding epoch 3.
    assert run(out, state, faults="after-decide@3:kill", segment=1).returncode == (
        -signal.SIGKILL)
    assert run(out, state, segment=2).returncode == 0
    assert digest(out) == expected
    assert_clean(out)
