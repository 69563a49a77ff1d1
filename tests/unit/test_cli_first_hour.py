"""What a new user sees from the CLI, run as a real subprocess (no Spark needed here).

Starting over after deleting a checkpoint, ``reset``, ``--version``, capabilities in
words, "did you mean" for a backend, ``resolve`` on an epoch that does not exist,
and whether ``status`` shows the lease held or released.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from txsink.coordinator import Coordinator
from txsink.files.backend import FilesBackend
from txsink.model import TransactionContext
from txsink.spark import _proc
from txsink.state import DirectoryStateStore, new_owner_token
from txsink.writer import write_participant

SINK = "first-hour"


def txsink(*argv: str, stdin: str | None = None, cwd: Path | None = None,
           ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "txsink.cli", *argv], capture_output=True,
                          text=True, timeout=120, input=stdin if stdin is not None else "",
                          cwd=cwd)


def _pipeline(tmp_path: Path, sink_id: str = SINK, backend: str = "files") -> Path:
    f = tmp_path / "p.yaml"
    f.write_text(f"source: {{type: rate}}\ncheckpoint: {tmp_path}/chk\n"
                 f"sink: {{backend: {backend}, sink_id: {sink_id}, "
                 f"options: {{path: '{tmp_path}/out', format: jsonl}}}}\n")
    return f


def _earlier_run(tmp_path: Path, epochs: int = 2) -> FilesBackend:
    """What an earlier `txsink run` of _pipeline leaves: committed epochs, a state."""
    options = {"path": str(tmp_path / "out"), "format": "jsonl"}
    backend = FilesBackend.from_options(options)
    coordinator = Coordinator(backend, DirectoryStateStore(tmp_path / "chk" / "txsink"), SINK,
                              backend_options=options)
    coordinator.start()
    for epoch in range(epochs):
        batch = pa.RecordBatch.from_pylist([{"id": epoch}])
        committable = write_participant(backend, TransactionContext(SINK, epoch, 0, 0), [batch])
        coordinator.commit_epoch(epoch, [committable])
    # A run that ended gives its lease up (what `txsink run` does on its way out).
    assert coordinator.store.release(coordinator.lease)
    return backend


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.promise("checkpoint-deleted-with-state-refused", "cli")
def test_deleted_checkpoint_is_refused_before_spark_with_the_way_out(tmp_path: Path) -> None:
    _earlier_run(tmp_path)
    pipeline = _pipeline(tmp_path)
    shutil.rmtree(tmp_path / "chk")
    for _ in range(2):  # the refusal leaves nothing behind that changes the next answer
        proc = txsink("run", str(pipeline))
        assert proc.returncode == 1
        line = _one_line(proc.stderr)
        assert line.startswith("txsink: config error: sink.sink_id: sink 'first-hour'"), line
        assert "no longer exists (its checkpoint was deleted)" in line
        assert f"txsink reset {pipeline}" in line
        assert "new sink_id" in line
        assert "another query" not in line
        assert "spark log:" not in proc.stdout  # refused before Spark started
        assert not (tmp_path / "chk").exists()


@pytest.mark.promise("files-sink-owner", "backend")
def test_second_query_on_the_same_sink_is_told_to_use_its_own_sink_id(tmp_path: Path) -> None:
    _earlier_run(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    f = other / "p.yaml"
    f.write_text(f"source: {{type: rate}}\ncheckpoint: {other}/chk\n"
                 f"sink: {{backend: files, sink_id: {SINK}, "
                 f"options: {{path: '{tmp_path}/out', format: jsonl}}}}\n")
    proc = txsink("run", str(f))
    assert proc.returncode == 1
    line = _one_line(proc.stderr)
    assert f"belongs to another query, whose txsink state is {tmp_path}/chk/txsink" in line
    assert "txsink reset" not in line


def test_reset_deletes_output_and_checkpoint_after_confirmation(tmp_path: Path) -> None:
    _earlier_run(tmp_path)
    pipeline = _pipeline(tmp_path)
    (tmp_path / "out" / "notes.txt").write_text("not txsink's")
    # Not at a terminal and no --yes: refused, nothing deleted.
    proc = txsink("reset", str(pipeline))
    assert proc.returncode == 1
    assert "--yes" in _one_line(proc.stderr)
    assert len(list((tmp_path / "out").glob("part-*"))) == 2
    assert (tmp_path / "chk" / "txsink" / "meta.json").is_file()

    proc = txsink("reset", str(pipeline), "--yes")
    assert proc.returncode == 0, proc.stderr
    assert "deleted 2 file(s) part-*.jsonl" in proc.stdout
    assert f"deleted checkpoint {tmp_path}/chk" in proc.stdout
    # Each deletion said once, on stdout (it was repeated as a WARNING on stderr).
    assert proc.stdout.count("deleted 2 file(s) part-*.jsonl") == 1
    assert "deleted" not in proc.stderr
    assert not list((tmp_path / "out").glob("part-*"))
    assert not (tmp_path / "out" / "_txsink").exists()
    assert (tmp_path / "out" / "notes.txt").read_text() == "not txsink's"
    assert not (tmp_path / "chk").exists()
    # A fresh state can claim the sink again.
    _earlier_run(tmp_path, epochs=1)


def test_reset_after_the_format_changed_deletes_the_files_of_both_formats(
        tmp_path: Path) -> None:
    """A pipeline's files sink switched from JSON lines to Parquet (``format`` may change:
    Spark's own writer takes Parquet, docs/backends/files.md), then ``txsink reset``: it
    deleted only ``part-*.parquet`` and left the JSON-lines epochs, with the owner record
    and the markers gone, so the run from the source's start wrote those rows twice."""
    _earlier_run(tmp_path)  # two epochs in JSON lines
    options = {"path": str(tmp_path / "out"), "format": "parquet"}
    backend = FilesBackend.from_options(options)
    coordinator = Coordinator(backend, DirectoryStateStore(tmp_path / "chk" / "txsink"), SINK,
                              backend_options=options)
    coordinator.start()
    batch = pa.RecordBatch.from_pylist([{"id": 2}])
    coordinator.commit_epoch(2, [write_participant(backend, TransactionContext(SINK, 2, 0, 0),
                                                   [batch])])
    assert coordinator.store.release(coordinator.lease)
    pipeline = _pipeline(tmp_path)
    pipeline.write_text(pipeline.read_text().replace("format: jsonl", "format: parquet"))
    proc = txsink("reset", str(pipeline), "--yes")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "out").glob("part-*")) == []
    _earlier_run(tmp_path, epochs=1)  # the run from the start: each row once
    assert len(list((tmp_path / "out").glob("part-*"))) == 1


@pytest.mark.promise("files-sink-owner", "backend")
def test_reset_refuses_another_sinks_directory(tmp_path: Path) -> None:
    _earlier_run(tmp_path)
    proc = txsink("reset", str(_pipeline(tmp_path, sink_id="someone-else")), "--yes")
    assert proc.returncode == 1
    assert "belongs to sink 'first-hour'" in _one_line(proc.stderr)
    assert len(list((tmp_path / "out").glob("part-*"))) == 2


def test_version() -> None:
    from importlib.metadata import version

    proc = txsink("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"txsink {version('txsink')}"


def test_backends_explain_capabilities_in_words() -> None:
    proc = txsink("backends")
    assert proc.returncode == 0
    text = proc.stdout
    assert "files (package txsink " in text
    assert "the driver can finish a batch that executors wrote, also after a restart" in text
    assert "prepared batches survive a restart of the target system" in text
    assert "commit-from-any-process" not in text  # the words, not the identifiers


@pytest.mark.parametrize(("name", "hint"), [
    ("filez", "did you mean 'files'?"),
    ("postgress", "did you mean 'postgres'?"),
])
def test_typoed_backend_gets_did_you_mean(tmp_path: Path, name: str, hint: str) -> None:
    proc = txsink("validate", "--no-spark", str(_pipeline(tmp_path, backend=name)))
    assert proc.returncode == 1
    line = _one_line(proc.stderr)
    assert line.startswith("txsink: config error: sink.backend:")
    assert hint in line
    assert "pip install txsink-" not in line


@pytest.mark.promise("resolve-unknown-epoch-error", "cli")
def test_resolve_an_epoch_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    _earlier_run(tmp_path)
    for action in ("--abort", "--commit"):
        proc = txsink("resolve", str(tmp_path / "chk"), "--epoch", "7", action)
        assert proc.returncode == 1
        line = _one_line(proc.stderr)
        assert "epoch 7 of sink 'first-hour' does not exist" in line, line
        assert "committed up to 1" in line


def test_status_says_whether_the_lease_is_held_or_released(tmp_path: Path) -> None:
    _earlier_run(tmp_path)
    store = DirectoryStateStore(tmp_path / "chk" / "txsink")
    # A coordinator of this process, which is alive, but its token is no JVM token:
    # its pid could have been reused, so whether it runs cannot be told.
    store.acquire(new_owner_token())
    proc = txsink("status", str(tmp_path / "chk"), "--json")
    lease = json.loads(proc.stdout)["lease"]
    assert lease["held"] is True
    assert lease["holder_running"] is None
    # A driver JVM that is gone: held by a dead owner.
    dead = f"{socket.gethostname()}:jvm999999:12345"
    gone = store.acquire(dead)
    proc = txsink("status", str(tmp_path / "chk"))
    assert "by a driver that is gone" in proc.stdout
    assert _proc.owner_alive(dead) is False
    # Released at the end of a run.
    assert store.release(gone)
    proc = txsink("status", str(tmp_path / "chk"))
    assert "lease: released at " in proc.stdout
    assert "no query writes this sink now" in proc.stdout
    # The next owner takes a released lease, and it is held again.
    store.acquire("next")
    assert json.loads(txsink("status", str(tmp_path / "chk"), "--json").stdout)["lease"][
        "held"] is True


@pytest.mark.promise("run-server-down-one-line", "cli")
def test_a_server_that_is_down_is_one_short_line_before_spark(tmp_path: Path) -> None:
    """PostgreSQL on a dead port took 31 s and printed 10 two-line WARNINGs (each
    starting ``postgres backend: postgres backend:``) before its error."""
    import socket
    import time

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    f = tmp_path / "pg.yaml"
    f.write_text(f"source: {{type: rate}}\ncheckpoint: {tmp_path}/chk\n"
                 "sink: {backend: postgres, sink_id: down, options: "
                 f"{{dsn: 'host=127.0.0.1 port={port} dbname=postgres user=x', "
                 "table: public.t, password: pw}}\n")
    started = time.monotonic()
    proc = txsink("run", str(f), "--connect-retry", "2")
    took = time.monotonic() - started
    assert proc.returncode == 1
    line = _one_line(proc.stderr)
    assert line.startswith("txsink: server down: sink.options.dsn: postgres backend: "
                           "cannot connect to "), line
    assert "Connection refused" in line and "--connect-retry" in line, line
    assert "postgres backend: postgres backend" not in line
    assert "spark log:" not in proc.stdout  # stopped before Spark started
    assert took < 30, took
