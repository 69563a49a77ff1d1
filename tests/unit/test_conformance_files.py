"""The files backend passes the conformance kit (its "live system" is a directory)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from txsink.backend import Backend
from txsink.files.backend import FilesBackend
from txsink.testing.conformance import BackendConformance


class TestFilesParquetConformance(BackendConformance):
    backend_name = "files"

    @pytest.fixture
    def backend_options(self, tmp_path: Path) -> Mapping[str, str]:
        return {"path": str(tmp_path / "out"), "format": "parquet"}

    def read_ids(self, backend: Backend, sink_id: str) -> list[int]:
        assert isinstance(backend, FilesBackend)
        files = sorted(str(p) for p in backend.base.glob("part-*.parquet"))
        if not files:
            return []
        return [int(i) for i in ds.dataset(files, format="parquet").to_table(
            columns=["id"]).column("id").to_pylist()]

    def test_no_leftover_files_after_suite_steps(self, backend: Backend, sink_id: str) -> None:
        assert isinstance(backend, FilesBackend)
        c = self.prepare(backend, sink_id, 0, 0, range(5))
        assert [p.name for p in backend.leftovers()] == [f"{c.participant}.parquet"]
        backend.commit(c)
        assert backend.leftovers() == []


class TestFilesJsonLinesConformance(BackendConformance):
    backend_name = "files"
    large_partition_bytes = 24 * 1024 * 1024
    batch_rows = 20_000

    @pytest.fixture
    def backend_options(self, tmp_path: Path) -> Mapping[str, str]:
        return {"path": str(tmp_path / "out"), "format": "jsonl"}

    def read_ids(self, backend: Backend, sink_id: str) -> list[int]:
        import json

        assert isinstance(backend, FilesBackend)
        return [json.loads(line)["id"] for p in sorted(backend.base.glob("part-*.jsonl"))
                for line in p.read_text().splitlines()]
