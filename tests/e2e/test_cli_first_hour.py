"""A new user's first hour with Spark running: each error is one line naming the field
or the next step, Spark's own output stays in its log file, interrupts end with the
same summary and the shell's 130/143, and a resumed run says so.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.spark_harness import kill_group, read_files_output
from tests.long_runs import long_run

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples/pipelines/demo.yaml"
TXSINK = [sys.executable, "-m", "txsink.cli"]
#: Lines the JVM prints on its own; none may reach the user's terminal.
JVM_NOISE = ("log4j", "NativeCodeLoader", "incubator", "WARN ", "\tat ", "Traceback")


def _env(demo_dir: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "TXSINK_DEMO_DIR": str(demo_dir), "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1", **extra}
    env.pop("TXSINK_FAULTS", None)
    env.update(extra)
    return env


def _txsink(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen([*TXSINK, *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        kill_group(proc.pid)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _interrupted_run(env: dict[str, str], sig: signal.Signals) -> tuple[int, str, str]:
    """Run the demo; once a batch with rows committed, signal the whole process group,
    as a terminal's Ctrl-C or a service manager's stop does."""
    proc = subprocess.Popen([*TXSINK, "run", str(DEMO)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("batch ") and " 0 row(s)" not in line:
                os.killpg(proc.pid, sig)
                break
        rest, stderr = proc.communicate(timeout=180)
    finally:
        kill_group(proc.pid)
    return proc.returncode, "".join(lines) + rest, stderr


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr[-3000:]
    for noise in JVM_NOISE:
        assert noise not in stderr, stderr
    return lines[0]


def _variant(tmp_path: Path, old: str, new: str) -> Path:
    text = DEMO.read_text()
    assert old in text
    f = tmp_path / "variant.yaml"
    f.write_text(text.replace(old, new))
    return f


@long_run
def test_spark_errors_name_the_field_in_validate_and_run(tmp_path: Path) -> None:
    env = _env(tmp_path / "demo")
    typo = _variant(tmp_path, "SELECT value AS id", "SELEC value AS id")
    proc = _txsink(env, "validate", str(typo))
    assert proc.returncode == 1
    line = _one_line(proc.stderr)
    assert line.startswith("txsink: config error: transform: "), line
    assert "'SELEC'" in line and "line 1" in line

    bad_option = _variant(tmp_path, "rowsPerSecond: 20", "rowsPerSecond: twenty")
    for command in ("validate", "run"):
        proc = _txsink(env, command, str(bad_option))
        assert proc.returncode == 1
        line = _one_line(proc.stderr)
        assert line.startswith("txsink: config error: source.options.rowsPerSecond: "), line
        assert "twenty" in line
    assert not read_files_output(tmp_path / "demo" / "data")

    proc = _txsink(env, "validate", str(DEMO))
    assert proc.returncode == 0, proc.stderr
    assert "output columns: id bigint, key int, amount bigint, ts string" in proc.stdout


#: Mistakes in the transform SQL and a fragment of the one line each must give.
SQL_MISTAKES = {
    "unknown column": ("SELECT valu AS id FROM source", "`valu` cannot be resolved"),
    "unknown function": ("SELECT valeu_of(value) AS id FROM source", "valeu_of"),
    "unknown table": ("SELECT value AS id FROM sourse", "`sourse` cannot be found"),
    "ambiguous column": ("SELECT value FROM source a JOIN source b ON a.value = b.value",
                         "ambiguous"),
    "type mismatch": ("SELECT value AS id FROM source WHERE timestamp - 'x' > 0",
                      "incompatible types"),
}

_SQL_FAMILY = """
import json, sys
from pyspark.sql import SparkSession
from txsink.config import load_pipeline
from txsink.errors import ConfigError
from txsink.spark.checks import build_checked_frame
from txsink.spark.console import spark_output_to
from pathlib import Path
cfg = load_pipeline(sys.argv[1])
with spark_output_to(Path(sys.argv[2])):
    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .getOrCreate())
    out = {}
    for name, sql in json.loads(sys.argv[3]).items():
        try:
            build_checked_frame(spark, cfg.__class__(**{**cfg.__dict__, "transform": sql}))
            out[name] = "no error"
        except ConfigError as exc:
            out[name] = f"{type(exc).__name__} {exc.field}: {exc}"
        except Exception as exc:
            out[name] = f"not a ConfigError: {type(exc).__name__}: {exc}"
    spark.stop()
print(json.dumps(out))
"""


@long_run
def test_a_mistake_in_the_sql_is_one_line_naming_it(tmp_path: Path) -> None:
    """A misspelled column, function or table, an ambiguous column, a type mismatch:
    the commonest first mistakes. A logger txsink created under PySpark's own logger
    names turned each into a TypeError (``Logger._log() ... 'errorClass'``) and ~100
    lines of traceback in ``run``."""
    env = _env(tmp_path / "demo")
    typo = _variant(tmp_path, "SELECT value AS id", "SELECT valu AS id")
    for command in ("validate", "run"):
        proc = _txsink(env, command, str(typo))
        assert proc.returncode == 1
        line = _one_line(proc.stderr)
        assert line.startswith("txsink: config error: transform: "), line
        assert "`valu` cannot be resolved" in line and "`value`" in line, line
    assert not read_files_output(tmp_path / "demo" / "data")

    import json

    proc = subprocess.run(
        [sys.executable, "-c", _SQL_FAMILY, str(DEMO), str(tmp_path / "family.log"),
         json.dumps({k: sql for k, (sql, _) in SQL_MISTAKES.items()})],
        env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    answers = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, (_, fragment) in SQL_MISTAKES.items():
        answer = answers[name]
        assert answer.startswith("ConfigError transform: transform: "), (name, answer)
        assert fragment in answer, (name, answer)
        assert "\n" not in answer and "Traceback" not in answer, (name, answer)


@pytest.mark.promise("run-releases-lease", "datasource")
@pytest.mark.promise("run-error-one-line", "cli")
@long_run
def test_crash_resume_and_interrupts_print_a_summary_and_exit_status(tmp_path: Path) -> None:
    demo = tmp_path / "demo"
    # A crash mid-epoch (the driver fails before deciding epoch 1): one line that names
    # Spark's log and points at `txsink status`; the JVM's stack traces are in the log.
    proc = _txsink(_env(demo, TXSINK_FAULTS="before-decide@1:raise"), "run", str(DEMO))
    assert proc.returncode == 1
    line = _one_line(proc.stderr)
    assert line.startswith("txsink: error: the streaming query failed: "), line
    log_file = demo / "checkpoint-spark.log"
    assert f"(Spark's log: {log_file})" in line
    assert f"`txsink status {demo / 'checkpoint'}`" in line
    assert "spark log: " in proc.stdout
    logged = log_file.read_text()
    assert "NativeCodeLoader" in logged or "log4j" in logged
    assert "InjectedFault" in logged

    # Resumed and stopped by SIGTERM to the process group (a service manager's stop).
    code, stdout, stderr = _interrupted_run(_env(demo), signal.SIGTERM)
    assert code == 143, stdout + stderr
    assert f"resuming sink 'demo' at epoch 1 from {demo / 'checkpoint'}" in stdout
    assert "catch-up rows" in stdout
    assert "done (interrupted by SIGTERM): committed epoch" in stdout
    assert stderr == "", stderr

    # Ctrl-C outside a terminal: SIGINT to the process group.
    code, stdout, stderr = _interrupted_run(_env(demo), signal.SIGINT)
    assert code == 130, stdout + stderr
    assert "resuming sink 'demo'" in stdout
    assert "done (interrupted by SIGINT): committed epoch" in stdout
    assert stderr == "", stderr

    rows = read_files_output(demo / "data")
    ids = [r["id"] for r in rows]
    assert ids and sorted(ids) == list(range(len(ids)))  # nothing lost, nothing twice
    status = _txsink(_env(demo), "status", str(demo / "checkpoint"))
    assert "lease: released at " in status.stdout, status.stdout
