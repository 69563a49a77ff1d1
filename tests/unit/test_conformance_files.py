"""The files backend passes the conformance kit (its "live system" is a directory)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from txsink.backend import Backend, CommitOutcome
from txsink.errors import ConfigError, FatalCommitError, ParticipantLostError
from txsink.files import backend as files_backend
from txsink.files.backend import FilesBackend
from txsink.model import Committable, TransactionContext
from txsink.testing.conformance import BackendConformance
from txsink.writer import write_participant


@pytest.mark.promise("files-replay-never-duplicates", "backend")
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


def _prepared(backend: FilesBackend, epoch: int, partitions: int) -> list[Committable]:
    return [write_participant(backend, TransactionContext("s", epoch, p),
                              [pa.record_batch({"id": pa.array([p], pa.int64())})])
            for p in range(partitions)]


def _count_syncs(monkeypatch: pytest.MonkeyPatch, fail: Path | None = None) -> list[Path]:
    """Record directory fsyncs of the files backend; ``fail`` makes that one fail."""
    real = files_backend._fsync_path
    synced: list[Path] = []

    def fsync(path: Path, *, directory: bool = False) -> None:
        if directory:
            if path == fail:
                raise OSError(5, "Input/output error")
            synced.append(path)
        real(path, directory=directory)

    monkeypatch.setattr(files_backend, "_fsync_path", fsync)
    return synced


def test_commit_all_syncs_each_directory_once_per_epoch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = FilesBackend(str(tmp_path / "out"))
    backend.commit_all(_prepared(backend, 0, 1))  # the first creates the epoch markers
    committables = _prepared(backend, 1, 16)
    synced = _count_syncs(monkeypatch)
    assert backend.commit_all(committables) == [CommitOutcome.COMMITTED] * 16
    assert synced == [backend.base, backend._epochs, backend._pending]
    assert len(list(backend.base.glob("part-0000000001-*.parquet"))) == 16
    assert backend.leftovers() == []
    # Committing again (a retry after a crash) finds every file published.
    assert backend.commit_all(committables) == [CommitOutcome.ALREADY_COMMITTED] * 16


@pytest.mark.promise("files-commit-never-overwrites", "backend")
def test_commit_all_answers_per_participant_and_completes_a_half_done_commit(
        tmp_path: Path) -> None:
    backend = FilesBackend(str(tmp_path / "out"))
    ok, half, lost, clash, done = _prepared(backend, 3, 5)
    paths = {c.partition: (backend._pending / c.payload["pending"],
                           backend.base / c.payload["final"]) for c in (half, lost, clash)}
    os.link(*paths[half.partition])  # a crash between link and unlink
    paths[lost.partition][0].unlink()  # deleted outside txsink
    paths[clash.partition][1].write_bytes(b"someone else's file")
    backend.commit(done)
    results = backend.commit_all([ok, half, lost, clash, done])
    assert results[0] is CommitOutcome.COMMITTED
    assert results[1] is CommitOutcome.COMMITTED
    assert isinstance(results[2], ParticipantLostError)
    assert isinstance(results[3], FatalCommitError)
    assert results[4] is CommitOutcome.ALREADY_COMMITTED
    assert paths[clash.partition][1].read_bytes() == b"someone else's file"
    assert [p.name for p in backend.leftovers()] == [clash.payload["pending"]]
    assert sorted(p.name for p in backend.base.glob("part-*")) == sorted(
        c.payload["final"] for c in (ok, half, clash, done))


def test_commit_all_keeps_the_pending_names_until_the_final_ones_are_synced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = FilesBackend(str(tmp_path / "out"))
    committables = _prepared(backend, 0, 3)
    _count_syncs(monkeypatch, fail=backend.base)
    results = backend.commit_all(committables)
    assert all(isinstance(r, OSError) for r in results)
    assert len(backend.leftovers()) == 3  # nothing unlinked: the retry can finish
    monkeypatch.undo()
    assert backend.commit_all(committables) == [CommitOutcome.COMMITTED] * 3
    assert backend.leftovers() == []


def test_holds_epoch_answers_from_the_epoch_markers_without_listing_the_output(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The listing grew with every file the sink ever wrote (1.8 ms per commit at 4,000
    files); an epoch's marker is one stat."""
    backend = FilesBackend(str(tmp_path / "out"))
    for epoch in range(3):
        backend.commit_all(_prepared(backend, epoch, 2))
    _prepared(backend, 3, 2)  # prepared, not committed
    real = os.listdir

    def listdir(path: Any = ".") -> list[str]:
        assert os.fspath(path) != os.fspath(backend.base), "listed the output directory"
        return real(path)

    monkeypatch.setattr(os, "listdir", listdir)
    assert [backend.holds_epoch("s", e) for e in range(5)] == [True, True, True, False,
                                                               False]
    assert not backend.holds_epoch("other", 1)


def test_holds_epoch_of_output_written_before_the_markers_lists_the_directory(
        tmp_path: Path) -> None:
    backend = FilesBackend(str(tmp_path / "out"))
    backend.commit_all(_prepared(backend, 0, 2))
    shutil.rmtree(backend._epochs)  # as an older txsink left it
    backend.commit_all(_prepared(backend, 1, 2))  # markers start at epoch 1
    assert backend._epochs_since() == 1
    assert [backend.holds_epoch("s", e) for e in range(3)] == [True, True, False]


def test_holds_epoch_sees_an_epoch_whose_commit_stopped_before_its_marker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Final names synced, marker not: the pending names are still there, and so the
    epoch counts as published (a restored state must not write it again)."""
    backend = FilesBackend(str(tmp_path / "out"))
    backend.commit_all(_prepared(backend, 0, 1))
    committables = _prepared(backend, 1, 2)
    _count_syncs(monkeypatch, fail=backend._epochs)
    assert all(isinstance(r, OSError) for r in backend.commit_all(committables))
    assert len(list(backend.base.glob("part-0000000001-*"))) == 2
    (backend._epochs / "0000000001").unlink(missing_ok=True)  # lost in the crash
    assert backend.holds_epoch("s", 1)
    assert not backend.holds_epoch("s", 2)
    monkeypatch.undo()
    assert backend.commit_all(committables) == [CommitOutcome.COMMITTED] * 2
    assert backend.holds_epoch("s", 1) and backend.leftovers() == []


def test_an_at_least_once_epoch_is_held_by_the_target(tmp_path: Path) -> None:
    """Operations suspicion: epochs written under at_least_once left no epoch marker,
    so once markers existed (an exactly-once epoch before) holds_epoch said no."""
    from txsink.coordinator import Coordinator
    from txsink.model import DeliveryGuarantee
    from txsink.state import DirectoryStateStore

    backend = FilesBackend.from_options({"path": str(tmp_path / "out"), "format": "jsonl"})
    coord = Coordinator(backend, DirectoryStateStore(tmp_path / "state"), "alo")
    coord.start()
    coord.commit_epoch(0, [write_participant(backend, TransactionContext("alo", 0, 0, 0),
                                             [pa.record_batch({"id": [1]})])])
    done = write_participant(backend, TransactionContext("alo", 1, 0, 0),
                             [pa.record_batch({"id": [2]})], DeliveryGuarantee.AT_LEAST_ONCE)
    coord.record_epoch(1, [done], DeliveryGuarantee.AT_LEAST_ONCE)
    assert backend.holds_epoch("alo", 0)
    assert backend.holds_epoch("alo", 1)
    assert not backend.holds_epoch("alo", 2)


def test_reset_without_an_owner_record_deletes_nobody_elses_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    theirs = out / "part-00000-c000.jsonl"  # what another writer put there
    theirs.write_text('{"id": 1}\n')
    backend = FilesBackend.from_options({"path": str(out), "format": "jsonl"})
    with pytest.raises(ConfigError, match="no owner record") as err:
        backend.reset_sink("mine")
    assert "nothing deleted" in str(err.value)
    assert theirs.read_text() == '{"id": 1}\n'


def test_epoch_markers_stay_bounded_and_holds_epoch_stays_right(tmp_path: Path) -> None:
    """Months of epochs: one marker file per epoch grew without end (soak issue). Beyond
    marker_retention_epochs they are pruned, and an older epoch is found by listing."""
    from txsink.coordinator import Coordinator
    from txsink.state import DirectoryStateStore

    backend = FilesBackend.from_options({"path": str(tmp_path / "out"), "format": "jsonl",
                                         "marker_retention_epochs": "50"})
    coord = Coordinator(backend, DirectoryStateStore(tmp_path / "state"), "mk")
    coord.start()
    for epoch in range(320):
        c = write_participant(backend, TransactionContext("mk", epoch, 0, 0),
                              [pa.record_batch({"id": [epoch]})])
        coord.commit_epoch(epoch, [c])
    markers = [n for n in os.listdir(tmp_path / "out" / "_txsink" / "epochs") if n.isdigit()]
    assert 50 <= len(markers) <= 50 + files_backend.MARKER_PRUNE_EVERY
    assert backend.holds_epoch("mk", 3)  # pruned marker: found by listing
    assert backend.holds_epoch("mk", 319)
    assert not backend.holds_epoch("mk", 320)
    with pytest.raises(ConfigError, match="marker_retention_epochs"):
        FilesBackend.from_options({"path": str(tmp_path / "x"), "marker_retention_epochs": "-1"})
