"""Every CLI command writing into a closed pipe stops quietly (``txsink status | head -2``).

Python ignores SIGPIPE, so the write raises BrokenPipeError: it ended in a traceback,
and a command whose last lines were still buffered printed one more from the
interpreter's flush at exit. The CLI now exits 141 (as if SIGPIPE had ended it), saying
nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from txsink import cli
from txsink.coordinator import Coordinator
from txsink.files.backend import FilesBackend
from txsink.model import TransactionContext
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant

REPO = Path(__file__).resolve().parents[2]


def _closed_pipe_run(*argv: str) -> subprocess.CompletedProcess[bytes]:
    """Run ``txsink ARGV`` with its stdout a pipe whose reader is already gone."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "txsink.cli", *argv], stdout=write_end,
                              stderr=subprocess.PIPE, timeout=120, check=False)
    finally:
        os.close(write_end)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A files sink with a few committed epochs: enough lines for `status`."""
    tmp = tmp_path_factory.mktemp("pipes")
    options = {"path": str(tmp / "out"), "format": "jsonl"}
    backend = FilesBackend.from_options(options)
    coordinator = Coordinator(backend, DirectoryStateStore(tmp / "chk" / "txsink"), "piped",
                              backend_options=options)
    coordinator.start()
    for epoch in range(5):
        batch = pa.RecordBatch.from_pylist([{"id": epoch}])
        coordinator.commit_epoch(epoch, [write_participant(
            backend, TransactionContext("piped", epoch, 0, 0), [batch])])
    return tmp / "chk"


@pytest.mark.promise("cli-reader-gone-exits-quietly", "cli")
@pytest.mark.parametrize("argv", [
    ("status", "{chk}"),
    ("status", "{chk}", "--json"),
    ("backends",),
    ("validate", "--no-spark", str(REPO / "examples/pipelines/demo.yaml")),
    ("--help",),
])
def test_a_command_whose_reader_went_away_exits_quietly(checkpoint: Path,
                                                        argv: tuple[str, ...]) -> None:
    proc = _closed_pipe_run(*(a.format(chk=checkpoint) for a in argv))
    assert proc.stderr.decode() == ""
    assert proc.returncode == cli.EXIT_BROKEN_PIPE


def test_a_broken_pipe_of_something_else_is_still_an_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A server's socket closing under a command is a real failure: not hidden."""
    def fails(args: argparse.Namespace) -> int:
        raise BrokenPipeError(32, "Broken pipe (a server's socket)")

    monkeypatch.setattr(cli, "cmd_backends", fails)
    with pytest.raises(BrokenPipeError, match="server"):
        cli.main(["backends"])
    assert not isinstance(sys.stdout, cli._StdoutWatch)  # given back
