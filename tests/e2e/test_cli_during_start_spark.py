"""The CLI beside a ``txsink run`` whose Spark is starting, with real Spark.

Before: the run gave its lease back after its ownership check and its query took it
only at its first batch, so for the whole Spark start ``txsink status`` said no query
writes the sink and ``txsink reset --yes`` deleted the output and the checkpoint of a
run that had printed "resuming ... at epoch 5". Now the run holds the lease from before
Spark starts, under the owner its query uses too; a run killed in that window leaves a
mark that reads as ended, and the next run goes on exactly.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.spark_harness import kill_group, leftover_files, read_files_output
from tests.long_runs import long_run

#: Each test starts Spark two to four times: `tox -e e2e-long` (the logic runs in the default
#: run without a JVM: tests/unit/test_cli_during_start.py).
pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples/pipelines/demo.yaml"
TXSINK = [sys.executable, "-m", "txsink.cli"]


def _env(demo: Path) -> dict[str, str]:
    env = {**os.environ, "TXSINK_DEMO_DIR": str(demo), "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1"}
    for key in ("TXSINK_FAULTS", "TXSINK_OWNER"):
        env.pop(key, None)
    return env


def _txsink(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TXSINK, *argv], env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def _start(env: dict[str, str], *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*TXSINK, "run", str(DEMO), *argv], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _until(proc: subprocess.Popen[str], prefix: str) -> list[str]:
    """The run's lines up to the first that starts with ``prefix``."""
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(prefix):
            return lines
    raise AssertionError(f"the run ended before {prefix!r}: {lines} {proc.communicate()}")


def _exact(data: Path) -> list[int]:
    """The committed ids: each once, a gap-free prefix of the rate source's numbers."""
    ids = sorted(r["id"] for r in read_files_output(data))
    assert ids == list(range(len(ids))), ids[:20]
    return ids


@pytest.mark.promise("cli-refuses-while-run-starts", "cli")
@long_run
def test_status_and_reset_while_spark_starts_see_the_run(tmp_path: Path) -> None:
    demo = tmp_path / "demo"
    env = _env(demo)
    proc = _start(env, "--max-batches", "2")
    try:
        # Printed after the ownership check, right before Spark starts (the run's lines
        # are flushed as they come).
        _until(proc, "starting Spark (")
        status = _txsink(env, "status", str(DEMO))
        reset = _txsink(env, "reset", str(DEMO), "--yes")
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        kill_group(proc.pid)
    me = f"`txsink run` pid {proc.pid} on this host"
    lease = next(ln for ln in status.stdout.splitlines() if ln.startswith("lease: "))
    assert f"by {me}, which is starting Spark or running its query" in lease, status.stdout
    assert reset.returncode == 1, reset.stdout
    assert f"is being written by {me} (starting Spark, or running its query)" in reset.stderr
    assert "nothing deleted" in reset.stderr
    assert proc.returncode == 0, stderr[-3000:]
    assert "done (--max-batches 2 reached" in stdout
    assert _exact(demo / "data")
    after = _txsink(env, "status", str(DEMO))
    assert "lease: released at " in after.stdout, after.stdout


@long_run
def test_a_run_killed_while_spark_starts_and_one_whose_reader_left_resume_exactly(
        tmp_path: Path) -> None:
    demo = tmp_path / "demo"
    env = _env(demo)
    first = _start(env, "--max-batches", "2")
    try:
        _, err = first.communicate(timeout=300)
    finally:
        kill_group(first.pid)
    assert first.returncode == 0, err[-3000:]
    before = _exact(demo / "data")

    # Killed (the whole process group, as a node failure does) while Spark starts.
    killed = _start(env, "--max-batches", "2")
    try:
        said = _until(killed, "starting Spark (")
        assert any(line.startswith("resuming sink 'demo' at epoch ") for line in said), said
    finally:
        kill_group(killed.pid)
        killed.communicate(timeout=60)
    status = _txsink(env, "status", str(DEMO))
    lease = next(ln for ln in status.stdout.splitlines() if ln.startswith("lease: "))
    assert f"by `txsink run` pid {killed.pid} on this host, which ended" in lease, lease
    assert "the next run, reset or resolve takes it over" in lease

    # The reader of the run's output goes away (`txsink run ... | head -3`).
    piped = _start(env)
    try:
        _until(piped, "batch ")
        assert piped.stdout is not None
        piped.stdout.close()
        _, err = piped.communicate(timeout=120)
    finally:
        kill_group(piped.pid)
    assert piped.returncode == 141, err[-3000:]
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    status = _txsink(env, "status", str(DEMO))
    assert "lease: released at " in status.stdout, status.stdout

    # The next run takes over, and every row is there once.
    last = _start(env, "--max-batches", "2")
    try:
        _, err = last.communicate(timeout=300)
    finally:
        kill_group(last.pid)
    assert last.returncode == 0, err[-3000:]
    after = _exact(demo / "data")
    assert len(after) > len(before)
    committed_top = max(int(p.name.split("-")[1]) for p in (demo / "data").glob("part-*"))
    for leftover in leftover_files(demo / "data"):
        assert int(leftover.rsplit("-e", 1)[1].split("-")[0]) > committed_top, leftover
