"""Reusable helpers for Spark end-to-end tests of txsink (any backend).

The crash tests need a Spark driver that can be SIGKILLed at a protocol point and
restarted from the same checkpoint, so the driver runs in a subprocess started by
:func:`run_driver`. This file is both the helper library and that driver script.

Typical use (see ``test_files_exactly_once.py``)::

    expected = make_input(tmp / "in", files=4, rows_per_file=300)
    run = run_driver(DriverSpec(input_dir=tmp / "in", checkpoint=tmp / "chk",
                                sink_id="t1", options={"path": str(out)}),
                     faults="after-decide@2:kill")
    run.check_killed("after-decide@2")       # died at the fault point
    run_driver(spec).check()                 # restart: same checkpoint, runs to the end
    assert summarize(read_files_output(out)) == expected

How the driver works:

* Input is a directory of JSON-lines files, one micro-batch per file
  (``maxFilesPerTrigger=1``) with trigger ``availableNow``: the query processes
  every file and then ends by itself, so a recovery run ends cleanly, without a
  stop in the middle of a batch. Rows are ``id`` (unique), ``key``, ``amount``;
  :func:`make_input` returns the per-key count and checksums to compare against.
* Each batch is repartitioned into ``partitions`` (default 2) so every epoch has
  several participants (needed for the ``after-first-commit`` point).
* A fault spec (``TXSINK_FAULTS`` grammar, :mod:`txsink.faults`) makes the
  coordinator SIGKILL ``-pgid``: the whole driver process group (driver Python, its
  JVM and every Python worker) dies at once, like a lost driver machine. The driver
  runs in its own session, and the helper kills that group again when the run
  ends, so no process is left behind even when a test fails.
* Spark's local mode gets ``local[2,4]`` (tasks are retried up to 4 times), the
  UI off, ``127.0.0.1`` only, and the running interpreter for the Python workers.

Backend engineers: pass ``backend=`` and ``options=`` (secrets too: they go to the
subprocess only) and read your system's output yourself; :func:`summarize` works
on any iterable of row dicts with ``key``/``id``/``amount``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: ``{key: (rows, sum of id, sum of amount)}``: equal summaries = same multiset of rows
#: for these generated inputs (ids are unique, so any duplicate or loss changes it).
Summary = dict[int, tuple[int, int, int]]

SCHEMA = "id LONG, key INT, amount LONG"



def local_spark(app: str, **conf: str) -> Iterator[Any]:
    """A ``local[2]`` session with txsink registered, for a module-scoped ``spark``
    fixture (``yield from local_spark(...)``); the JVM ends with it."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession
    from txsink.spark import register

    from tests.e2e.test_kafka_source_spark import _stop_jvm

    builder = (SparkSession.builder.master("local[2]").appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.host", "127.0.0.1"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()
        _stop_jvm()


def make_input(directory: Path, *, files: int = 4, rows_per_file: int = 300,
               keys: int = 7) -> Summary:
    """Write ``files`` JSON-lines files of deterministic rows; return their summary."""
    directory.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, int]] = []
    for f in range(files):
        chunk = [{"id": i, "key": i % keys, "amount": (i * 37) % 1000}
                 for i in range(f * rows_per_file, (f + 1) * rows_per_file)]
        rows.extend(chunk)
        path = directory / f"input-{f:04d}.json"
        path.write_text("".join(json.dumps(r) + "\n" for r in chunk))
        # File sources order files by modification time: keep it strictly increasing.
        os.utime(path, (1_700_000_000 + f, 1_700_000_000 + f))
    return summarize(rows)


def summarize(rows: Iterable[Mapping[str, Any]]) -> Summary:
    out: dict[int, list[int]] = {}
    for r in rows:
        acc = out.setdefault(int(r["key"]), [0, 0, 0])
        acc[0] += 1
        acc[1] += int(r["id"])
        acc[2] += int(r["amount"])
    return {k: (v[0], v[1], v[2]) for k, v in sorted(out.items())}


def read_files_output(path: Path) -> list[dict[str, Any]]:
    """Rows of every committed file of the files backend (``_``-prefixed paths skipped)."""
    rows: list[dict[str, Any]] = []
    for f in sorted(path.iterdir()):
        if f.name.startswith(("_", ".")) or not f.is_file():
            continue
        if f.suffix == ".jsonl":
            rows.extend(json.loads(line) for line in f.read_text().splitlines() if line)
        elif f.suffix == ".parquet":
            import pyarrow.parquet as pq

            rows.extend(pq.read_table(f).to_pylist())
    return rows


def leftover_files(path: Path) -> list[str]:
    """In-progress, pending and staged (native path) files of the files backend (must be
    none after recovery)."""
    meta = path / "_txsink"
    return sorted(str(p.relative_to(path)) for d in ("inprogress", "pending", "staging")
                  if (meta / d).is_dir() for p in (meta / d).iterdir())


@dataclass
class DriverSpec:
    """What one driver subprocess runs."""

    input_dir: Path
    #: The query's checkpoint, given as the ``checkpointLocation`` option; None to
    #: leave it to ``spark.sql.streaming.checkpointLocation`` (in ``conf``) and the
    #: query's name (``query_name``), as a session-wide setting does.
    checkpoint: Path | None
    sink_id: str
    options: dict[str, str] = field(default_factory=dict)
    backend: str = "files"
    partitions: int = 2
    master: str = "local[2,4]"
    conf: dict[str, str] = field(default_factory=dict)
    #: After the stream ends, also batch-write the input with ``write.format("txsink")``
    #: to ``{"sink_id", "checkpoint", **options}`` (same backend).
    batch_write: dict[str, str] | None = None
    #: SQL expressions the input rows go through before the sink (``selectExpr``),
    #: e.g. Kafka's ``key``/``value`` columns.
    select: list[str] | None = None
    #: Read a stream source instead of the JSON files: ``{"format": ..., "options":
    #: {...}, "register": "module:function"}`` (the function registers the format
    #: with the session, for Python data sources).
    source: dict[str, Any] | None = None
    #: ``queryName`` of the stream (names its checkpoint under a session-wide location).
    query_name: str | None = None


@dataclass
class DriverRun:
    returncode: int
    output: str
    elapsed_s: float

    @property
    def killed(self) -> bool:
        """The driver died of SIGKILL (a fault point fired)."""
        return self.returncode == -signal.SIGKILL

    def check(self) -> DriverRun:
        """Raise with the driver's output unless it ran to the end."""
        if self.returncode != 0 or "TXSINK-DRIVER-DONE" not in self.output:
            raise AssertionError(f"driver failed (exit {self.returncode}):\n"
                                 f"{self.output[-6000:]}")
        return self

    def check_killed(self, fault: str) -> DriverRun:
        """Raise with the driver's output unless it died of SIGKILL at ``fault``."""
        if not self.killed:
            raise AssertionError(f"expected SIGKILL at {fault} (exit {self.returncode}):\n"
                                 f"{self.output[-4000:]}")
        return self


def start_driver(spec: DriverSpec, *, faults: str | None = None,
                 env: Mapping[str, str] | None = None,
                 cwd: Path | None = None) -> subprocess.Popen[str]:
    """Start the driver in the background; the caller must :func:`kill_group` its pid.

    ``cwd`` is the driver's working directory (default: this process's).
    """
    child_env = dict(os.environ if env is None else env)
    child_env.pop("TXSINK_FAULTS", None)
    if faults:
        child_env["TXSINK_FAULTS"] = faults
    child_env.setdefault("PYSPARK_PYTHON", sys.executable)
    child_env["SPARK_LOCAL_IP"] = "127.0.0.1"
    payload = json.dumps({
        "input_dir": str(spec.input_dir),
        "checkpoint": None if spec.checkpoint is None else str(spec.checkpoint),
        "query_name": spec.query_name,
        "sink_id": spec.sink_id, "options": spec.options, "backend": spec.backend,
        "partitions": spec.partitions, "master": spec.master, "conf": spec.conf,
        "batch_write": spec.batch_write, "select": spec.select, "source": spec.source,
    })
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "drive", payload], env=child_env, cwd=cwd,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def wait_for_pause(proc: subprocess.Popen[str], directory: Path,
                   timeout_s: float = 480) -> None:
    """Wait until a driver started with a ``pause`` fault (``TXSINK_FAULTS_PAUSE_DIR`` =
    ``directory``) reached it; fail with its output if it died or never got there."""
    from tests.timeouts import scaled  # here: this file also runs as the driver script

    timeout_s = scaled(timeout_s)
    deadline = time.monotonic() + timeout_s
    while not (directory / "paused").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            kill_group(proc.pid)
            out, _ = proc.communicate()
            raise AssertionError(f"the driver did not reach its pause point in {timeout_s}s "
                                 f"(exit {proc.returncode}):\n{out[-4000:]}")
        time.sleep(0.2)


def run_driver(spec: DriverSpec, *, faults: str | None = None, timeout_s: float = 240,
               env: Mapping[str, str] | None = None, cwd: Path | None = None) -> DriverRun:
    """Run the driver to its end (or its death at ``faults``); never leaves a process."""
    started = time.monotonic()
    return finish_driver(start_driver(spec, faults=faults, env=env, cwd=cwd), timeout_s,
                         started)


def finish_driver(proc: subprocess.Popen[str], timeout_s: float, started: float) -> DriverRun:
    """Wait for a driver started in its own session; kill what is left of its group.

    ``timeout_s`` is an idle machine's bound; it grows with the load (tests/timeouts.py),
    measured again after the first bound passes, up to eight times in all."""
    from tests.timeouts import scaled  # here: this file also runs as the driver script

    deadline = started + scaled(timeout_s)
    out = None
    try:
        while out is None:
            try:
                out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                # The load may have risen since the start: re-derive the bound once more.
                later = started + scaled(timeout_s)
                if later <= deadline + 1 or time.monotonic() >= started + 8 * timeout_s:
                    raise
                deadline = later
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        out, _ = proc.communicate()
        raise AssertionError(f"driver did not finish in {time.monotonic() - started:.0f}s "
                             f"({timeout_s:g}s idle, scaled by the load average):\n"
                             f"{out[-6000:]}") from None
    finally:
        kill_group(proc.pid)
    return DriverRun(proc.returncode, out, time.monotonic() - started)


def kill_group(pgid: int) -> None:
    """SIGKILL what is left of the driver's process group (JVM, Python workers)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    # Give the kernel a moment so the next run does not race the dying JVM.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.05)


# -- the driver (runs in the subprocess) -------------------------------------------------


def _drive(spec: dict[str, Any]) -> None:
    if os.environ.get("TXSINK_FAULTS"):
        # Kill the whole process group: driver, JVM and Python workers die together.
        os.environ["TXSINK_FAULTS_KILL_PID"] = str(-os.getpgrp())
    from pyspark.sql import SparkSession
    from txsink.spark import register

    builder = (SparkSession.builder.master(spec["master"]).appName("txsink-e2e")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.log.level", "WARN")
               .config("spark.sql.shuffle.partitions", str(spec["partitions"])))
    for key, value in spec["conf"].items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    source = spec.get("source")
    if source:
        if source.get("register"):
            module, _, func = source["register"].partition(":")
            getattr(importlib.import_module(module), func)(spark)
        frame = (spark.readStream.format(source["format"]).options(**source["options"])
                 .load().repartition(spec["partitions"]))
    else:
        frame = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
                 .json(spec["input_dir"]).repartition(spec["partitions"]))
    if spec.get("select"):
        frame = frame.selectExpr(*spec["select"])
    writer = (frame.writeStream.format("txsink")
              .option("backend", spec["backend"]).option("sink_id", spec["sink_id"]))
    if spec.get("checkpoint") is not None:
        writer = writer.option("checkpointLocation", spec["checkpoint"])
    if spec.get("query_name"):
        writer = writer.queryName(spec["query_name"])
    query = writer.options(**spec["options"]).trigger(availableNow=True).start()
    query.awaitTermination()
    batches = [p["batchId"] for p in query.recentProgress]
    if spec.get("batch_write"):
        opts = dict(spec["batch_write"])
        (spark.read.schema(SCHEMA).json(spec["input_dir"]).repartition(spec["partitions"])
         .write.format("txsink").mode("append")
         .option("backend", spec["backend"]).option("sink_id", opts.pop("sink_id"))
         .option("checkpointLocation", opts.pop("checkpoint")).options(**opts).save())
    spark.stop()
    print(f"TXSINK-DRIVER-DONE batches={batches}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("command", choices=["drive"])
    parser.add_argument("spec", help="JSON DriverSpec")
    args = parser.parse_args(argv)
    _drive(json.loads(args.spec))


if __name__ == "__main__":
    main()
