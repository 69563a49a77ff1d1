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


@pytest.mark.parametrize("field", ["pending", "final"])
@pytest.mark.parametrize("evil", ["../../etc/passwd", "/etc/passwd", "..", "a/../../b", ""])
def test_tampered_committable_cannot_reach_outside_the_base(tmp_path: Path, field: str,
                                                           evil: str) -> None:
    import pyarrow as pa
    from txsink.errors import StateError
    from txsink.model import Committable, TransactionContext
    from txsink.writer import write_participant

    backend = FilesBackend(str(tmp_path / "out"))
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    good = write_participant(backend, TransactionContext("s", 0, 0),
                             [pa.record_batch({"id": pa.array([1], pa.int64())})])
    bad = Committable(**{**good.__dict__, "payload": {**good.payload, field: evil}})
    with pytest.raises(StateError, match="unsafe file"):
        backend.commit(bad)
    with pytest.raises(StateError, match="unsafe file"):
        backend.abort(bad)
    assert victim.read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "victim.txt"]
