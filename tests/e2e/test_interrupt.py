"""Ctrl-C (SIGINT) and SIGTERM of a test run stop it within 10 seconds and leave no
process and no temporary directory behind (``tests/process_guard.py``).

Two child pytest runs of ``interrupt_target.py`` (with the project's options, so in an
xdist worker, as the README's command runs), each with a private ``TMPDIR``, hold
PostgreSQL, SeaweedFS, a Spark driver in its own session, and a SparkContext in the
child pytest itself (PySpark's SIGINT handler installed). Once both are up, one gets
SIGINT and the other SIGTERM; every process that inherited the child's probe variable
must be gone within 10 seconds and the private temporary directory empty. (They run
side by side: starting Spark twice, one after the other, would double the cost.)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.spark_harness import kill_group
from tests.long_runs import long_run
from tests.process_guard import marked_processes

ROOT = Path(__file__).resolve().parents[2]
PROBE = "TXSINK_INTERRUPT_PROBE"


def _describe(pids: list[int]) -> str:
    out = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:160]
        except OSError:
            continue
        out.append(f"{pid}: {cmd.decode(errors='replace')}")
    return "\n".join(out)


@dataclass
class Child:
    sig: signal.Signals
    probe: str
    tmp: Path
    ready: Path
    proc: subprocess.Popen[str]

    def left(self) -> list[int]:
        return marked_processes(self.probe, self.tmp, variable=PROBE)


def _start(sig: signal.Signals, base: Path) -> Child:
    probe = uuid.uuid4().hex
    # Not under tmp_path: pytest makes that 0700, and PostgreSQL runs as a service user
    # when the tests run as root. Short: PostgreSQL's socket path must fit 107 bytes.
    tmp = Path(tempfile.mkdtemp(prefix="i-"))
    tmp.chmod(0o711)
    ready = base / f"ready-{sig.name}"
    ready.mkdir()
    env = {**os.environ, PROBE: probe, "TMPDIR": str(tmp), "TXSINK_INTERRUPT_READY": str(ready),
           "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("SPARK_LOCAL_DIRS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"--basetemp={base / ('basetemp-' + sig.name)}", "tests/e2e/interrupt_target.py"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    return Child(sig, probe, tmp, ready, proc)


@pytest.mark.spark
@pytest.mark.integration
def test_sigint_and_sigterm_stop_the_run_and_leave_nothing(tmp_path: Path) -> None:
    children = [_start(signal.SIGINT, tmp_path), _start(signal.SIGTERM, tmp_path)]
    try:
        # Starting Spark twice on a loaded machine takes minutes; what is measured is
        # the time from the signal on.
        deadline = time.monotonic() + 600
        for child in children:
            while not (child.ready / "ready").exists():
                assert child.proc.poll() is None, (
                    f"the child run ended early:\n{child.proc.communicate()[0][-4000:]}")
                assert time.monotonic() < deadline, "the child run never got ready"
                time.sleep(0.2)
            # The servers, the driver and its JVM, and the child's own Spark JVM.
            assert len(child.left()) >= 5, _describe(child.left())
        sent = time.monotonic()
        for child in children:
            child.proc.send_signal(child.sig)
        for child in children:
            try:
                out, _ = child.proc.communicate(timeout=max(0.1, sent + 10 - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{child.sig.name}: the run did not stop within 10 s; "
                                     f"still running:\n{_describe(child.left())}") from None
            left = child.left()
            assert not left, (f"{child.sig.name} left processes behind:\n{_describe(left)}"
                              f"\n{out[-3000:]}")
            assert child.proc.returncode in (2, 128 + child.sig), out[-3000:]
            assert sorted(p.name for p in child.tmp.iterdir()) == [], (
                f"{child.sig.name} left temporary files in its TMPDIR")
    finally:
        for child in children:
            kill_group(child.proc.pid)
            for pid in child.left():
                os.kill(pid, signal.SIGKILL)
            shutil.rmtree(child.tmp, ignore_errors=True)


def _committed(checkpoint: Path) -> bool:
    epochs = checkpoint / "txsink" / "epochs"
    return epochs.is_dir() and any("committed" in p.name for p in epochs.iterdir())


@pytest.mark.promise("run-interrupt-within-10s", "cli")
@long_run
@pytest.mark.spark
def test_txsink_run_stops_on_sigint_and_sigterm_and_leaves_nothing(tmp_path: Path) -> None:
    """``txsink run`` of the demo, once it committed a batch, gets SIGINT (one run) and
    SIGTERM (another, side by side): each ends within 10 seconds, its processes (the
    driver, its JVM, the Python workers) are gone and its TMPDIR is empty."""
    runs = []
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            probe = uuid.uuid4().hex
            tmp = Path(tempfile.mkdtemp(prefix="r-"))
            demo = tmp_path / sig.name
            env = {**os.environ, PROBE: probe, "TMPDIR": str(tmp),
                   "TXSINK_DEMO_DIR": str(demo), "PYSPARK_PYTHON": sys.executable,
                   "SPARK_LOCAL_IP": "127.0.0.1"}
            env.pop("SPARK_LOCAL_DIRS", None)
            env.pop("TXSINK_FAULTS", None)
            proc = subprocess.Popen(
                [sys.executable, "-m", "txsink.cli", "run", "examples/pipelines/demo.yaml"],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                start_new_session=True)
            runs.append(Child(sig, probe, tmp, demo, proc))
        deadline = time.monotonic() + 600
        for run in runs:
            while not _committed(run.ready / "checkpoint"):
                assert run.proc.poll() is None, run.proc.communicate()[0][-4000:]
                assert time.monotonic() < deadline, "no batch committed"
                time.sleep(0.2)
        sent = time.monotonic()
        for run in runs:
            run.proc.send_signal(run.sig)
        for run in runs:
            try:
                out, _ = run.proc.communicate(timeout=max(0.1, sent + 10 - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{run.sig.name}: txsink run did not stop within 10 s; "
                                     f"still running:\n{_describe(run.left())}") from None
            assert run.proc.returncode == 128 + run.sig, out[-3000:]
            left = run.left()
            assert not left, f"{run.sig.name} left processes:\n{_describe(left)}"
            assert sorted(p.name for p in run.tmp.iterdir()) == [], (
                f"{run.sig.name} left temporary files in its TMPDIR")
    finally:
        for run in runs:
            kill_group(run.proc.pid)
            for pid in run.left():
                os.kill(pid, signal.SIGKILL)
            shutil.rmtree(run.tmp, ignore_errors=True)


@pytest.mark.promise("run-interrupt-within-10s", "cli")
@long_run
@pytest.mark.spark
def test_txsink_run_stops_within_10s_while_a_batch_hangs_and_the_next_run_is_exact(
        tmp_path: Path) -> None:
    """SIGINT while an epoch's commit hangs (paused before its decision, as an abort or
    commit stuck under load would): Spark's query.stop() would wait for it; txsink run
    stops the driver's JVM after its bound and ends within 10 seconds, leaving nothing.
    The next run rolls the epoch back and the output is every id once."""
    probe = uuid.uuid4().hex
    tmp = Path(tempfile.mkdtemp(prefix="h-"))
    demo, pause = tmp_path / "demo", tmp_path / "pause"
    pause.mkdir()
    env = {**os.environ, PROBE: probe, "TMPDIR": str(tmp), "TXSINK_DEMO_DIR": str(demo),
           "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
           "TXSINK_FAULTS": "before-decide:pause", "TXSINK_FAULTS_PAUSE_DIR": str(pause)}
    env.pop("SPARK_LOCAL_DIRS", None)
    cmd = [sys.executable, "-m", "txsink.cli", "run", "examples/pipelines/demo.yaml"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    run = Child(signal.SIGINT, probe, tmp, demo, proc)
    try:
        deadline = time.monotonic() + 600
        while not (pause / "paused").exists():
            assert proc.poll() is None, proc.communicate()[0][-4000:]
            assert time.monotonic() < deadline, "the commit never reached its pause"
            time.sleep(0.2)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            raise AssertionError("txsink run did not stop within 10 s; still running:\n"
                                 + _describe(run.left())) from None
        assert time.monotonic() - sent < 10
        assert proc.returncode == 130, out[-3000:]
        assert "stopping Spark's JVM" in out, out[-3000:]
        assert not run.left(), f"left processes:\n{_describe(run.left())}"
        env.pop("TXSINK_FAULTS")
        again = subprocess.run([*cmd, "--max-batches", "3"], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=600)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        ids = [json.loads(line)["id"] for f in sorted((demo / "data").rglob("*.jsonl"))
               for line in f.read_text().splitlines() if line.strip()]
        assert ids and sorted(ids) == list(range(len(ids))), "ids lost or written twice"
    finally:
        kill_group(proc.pid)
        for pid in run.left():
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)
