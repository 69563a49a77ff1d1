"""The files backend's Parquet encoding: dictionary columns by cardinality, background
encoding of row groups, and no helper thread left behind."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from txsink.errors import ConfigError
from txsink.files import backend as files
from txsink.files.backend import FilesBackend
from txsink.model import TransactionContext
from txsink.writer import write_participant

N = 5000


def batches(parts: int) -> list[pa.RecordBatch]:
    out = []
    for p in range(parts):
        ids = range(p * N, (p + 1) * N)
        out.append(pa.record_batch({"id": pa.array(ids, pa.int64()),
                                    "city": [f"c{i % 20}" for i in ids],
                                    "amount": pa.array([i * 0.5 for i in ids])}))
    return out


def encodings(path: Path) -> dict[str, bool]:
    """Column -> whether its first row group is dictionary-encoded."""
    meta = pq.ParquetFile(path).metadata.row_group(0)
    return {meta.column(i).path_in_schema: any("DICTIONARY" in e
                                               for e in meta.column(i).encodings)
            for i in range(meta.num_columns)}


def write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **options: str) -> Path:
    # Small row groups, so several are encoded in the background within one file.
    monkeypatch.setattr(files, "ROW_GROUP_ROWS", 2 * N)
    backend = FilesBackend.from_options({"path": str(tmp_path / "out"), **options})
    c = write_participant(backend, TransactionContext("enc", 0, 0), batches(7))
    backend.commit(c)
    [out] = (tmp_path / "out").glob("part-*.parquet")
    return out


def test_auto_dictionary_only_on_repeating_columns(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    out = write(tmp_path, monkeypatch)
    assert encodings(out) == {"id": False, "city": True, "amount": False}
    table = pq.read_table(out)
    assert table.num_rows == 7 * N
    assert pq.ParquetFile(out).metadata.num_row_groups == 4  # 2+2+2+1 batches
    assert table.column("id").to_pylist() == list(range(7 * N))  # in order
    assert table.column("city").to_pylist()[:3] == ["c0", "c1", "c2"]


@pytest.mark.parametrize(("mode", "expected"), [("all", True), ("none", False)])
def test_dictionary_can_be_forced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str,
                                  expected: bool) -> None:
    out = write(tmp_path, monkeypatch, parquet_dictionary=mode)
    assert set(encodings(out).values()) == {expected}


def test_no_encoder_thread_outlives_its_participant(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "ROW_GROUP_ROWS", N)
    backend = FilesBackend.from_options({"path": str(tmp_path / "out")})
    txn = backend.begin_transaction(TransactionContext("enc", 0, 0))
    for b in batches(3):
        backend.write(txn, b)
    assert any(t.name.startswith("txsink-parquet-") for t in threading.enumerate())
    backend.discard(txn)
    assert not any(t.name.startswith("txsink-parquet-") for t in threading.enumerate())
    assert not list((tmp_path / "out").rglob("*.parquet"))
    write_participant(backend, TransactionContext("enc", 1, 0), batches(3))
    assert not any(t.name.startswith("txsink-parquet-") for t in threading.enumerate())


def test_an_encoding_error_fails_the_participant(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A row group that cannot be written (schema drift inside a partition) fails the
    task instead of being dropped on the helper thread."""
    monkeypatch.setattr(files, "ROW_GROUP_ROWS", N)
    backend = FilesBackend.from_options({"path": str(tmp_path / "out")})
    drifted = pa.record_batch({"id": pa.array(["not-a-number"] * N)})
    with pytest.raises(Exception, match="schema"):
        write_participant(backend, TransactionContext("enc", 0, 0), [*batches(1), drifted])
    assert not list((tmp_path / "out").rglob("*.parquet"))
    assert not any(t.name.startswith("txsink-parquet-") for t in threading.enumerate())


def test_dictionary_option_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="parquet_dictionary") as info:
        FilesBackend.from_options({"path": str(tmp_path), "parquet_dictionary": "some"})
    assert info.value.field == "parquet_dictionary"
    with pytest.raises(ConfigError, match="format=parquet only"):
        FilesBackend.from_options({"path": str(tmp_path), "format": "jsonl",
                                   "parquet_dictionary": "all"})
