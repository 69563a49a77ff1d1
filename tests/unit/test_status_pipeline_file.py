"""``txsink status`` accepts the pipeline file, as ``cut`` and ``reset`` do: a new user
types the file they ran, not the checkpoint directory inside it."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from txsink.cli import main
from txsink.coordinator import Coordinator
from txsink.files.backend import FilesBackend
from txsink.model import TransactionContext
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant


def test_status_of_a_pipeline_file_reads_its_checkpoint(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, chk = tmp_path / "out", tmp_path / "chk"
    options = {"path": str(out), "format": "jsonl"}
    backend = FilesBackend.from_options(options)
    coordinator = Coordinator(backend, DirectoryStateStore(chk / "txsink"), "mine",
                              backend_options=options)
    coordinator.start()
    batch = pa.RecordBatch.from_pylist([{"id": 1}])
    coordinator.commit_epoch(0, [write_participant(
        backend, TransactionContext("mine", 0, 0, 0), [batch])])
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(f"source: {{type: rate}}\ncheckpoint: {chk}\n"
                        f"sink: {{backend: files, sink_id: mine, options: {{path: '{out}', "
                        f"format: jsonl}}}}\n")
    assert main(["status", str(pipeline), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["sink_id"] == "mine"
    assert [e["epoch"] for e in data["epochs"]] == [0]
