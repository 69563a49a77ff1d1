"""What tells Spark's replay of a micro-batch from a batch it planned anew under the same
number (after a checkpoint restored from an older copy): the batch's offset log entry,
kept with the epoch in the state and noted in the targets that can keep a note."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from txsink.model import SOURCE_DIGEST_LENGTH, Committable
from txsink.plugins import get_plugins
from txsink.spark.queries import batch_source
from txsink.state import DirectoryStateStore, EpochRecord, EpochState

KAFKA = '{"orders":{"0":120,"1":98}}'
FILES = '{"logOffset":3}'


def entry(chk: Path, batch: int, *sources: str, at: int = 1_700_000_000_000) -> None:
    """An offset log entry as Spark writes it (OffsetSeqLog: version, metadata, one line
    per source)."""
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": at,
            "conf": {"spark.sql.shuffle.partitions": "2"}}
    (chk / "offsets").mkdir(parents=True, exist_ok=True)
    (chk / "offsets" / str(batch)).write_text("\n".join(["v1", json.dumps(meta), *sources]))


def test_a_replay_reads_the_same_entry_and_a_new_plan_another(tmp_path: Path) -> None:
    entry(tmp_path, 4, KAFKA)
    first = batch_source(str(tmp_path), 4)
    assert first is not None and len(first) == SOURCE_DIGEST_LENGTH
    assert batch_source(f"file://{tmp_path}/", 4) == first  # the same entry, read again
    assert batch_source(f"file:{tmp_path}", 4) == first  # as Spark resolves the path
    entry(tmp_path, 4, '{"orders":{"0":121,"1":98}}')
    assert batch_source(str(tmp_path), 4) != first  # other offsets


def test_a_file_source_planned_anew_differs_by_its_timestamp(tmp_path: Path) -> None:
    """A file source's offset is an index into its own log in the checkpoint, which went
    back with the copy: the same text for other files. The plan's timestamp tells."""
    entry(tmp_path, 1, FILES, at=1_700_000_000_000)
    old = batch_source(str(tmp_path), 1)
    entry(tmp_path, 1, FILES, at=1_700_000_060_000)
    assert batch_source(str(tmp_path), 1) != old


@pytest.mark.parametrize("case", ["no entry", "version only", "no checkpoint", "remote",
                                  "negative batch"])
def test_an_entry_that_cannot_be_read_is_unknown(tmp_path: Path, case: str) -> None:
    if case == "version only":
        (tmp_path / "offsets").mkdir()
        (tmp_path / "offsets" / "0").write_text("v1\n")
    checkpoint = {"no checkpoint": None, "remote": "s3a://bucket/chk"}.get(
        case, str(tmp_path))
    batch = -1 if case == "negative batch" else 0
    assert batch_source(checkpoint, batch) is None  # no Spark session: not read


def test_the_state_keeps_the_digest_through_the_decision(tmp_path: Path) -> None:
    store = DirectoryStateStore(tmp_path)
    lease = store.acquire("a")
    c = Committable("files", "s1", 2, 0, 0, "s1-e2-p0-a0", {"final": "x"}, rows=1)
    store.put(lease, EpochRecord(2, EpochState.DECIDED, (c,), 1.0, source="d" * 32))
    decided = store.get(2)
    assert decided is not None and decided.source == "d" * 32
    store.put(lease, decided.committed(2.0))
    committed = DirectoryStateStore(tmp_path).get(2)
    assert committed is not None and committed.source == "d" * 32


@pytest.mark.parametrize("backend", ["files", "delta"])
def test_a_target_notes_the_digest_of_each_epoch(tmp_path: Path, backend: str) -> None:
    target = get_plugins().create_backend(backend, {"path": str(tmp_path / "t")})
    assert target.epoch_source("s1", 3) is None
    target.note_epoch_source("s1", 3, "a" * 32)
    target.note_epoch_source("s1", 3, "b" * 32)  # decided again: the last one wins
    assert target.epoch_source("s1", 3) == "b" * 32
    assert target.epoch_source("s1", 4) is None
    target.note_epoch_source("s1", 5, "short")  # a note torn by a crash is no note
    assert target.epoch_source("s1", 5) is None


def test_the_files_target_prunes_its_notes_with_its_epoch_markers(tmp_path: Path) -> None:
    from txsink.files.backend import FilesBackend

    target = FilesBackend.from_options({"path": str(tmp_path)})
    for epoch in range(4):
        target.note_epoch_source("s1", epoch, "c" * 32)
    target._mark_epochs({0, 1, 2, 3})
    target._prune_markers(2)
    assert [target.epoch_source("s1", e) for e in range(4)] == [None, None] + ["c" * 32] * 2


def test_a_versioned_data_source_write_in_a_stream_without_its_checkpoint_says_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The data source's driver side cannot ask Spark where the driving stream's
    checkpoint is: without ``txnStreamCheckpoint`` a version Spark planned anew is
    skipped by its number. Said once per sink, loudly, with the option to give."""
    from txsink.spark.datasource import SinkSettings, TxsinkBatchWriter, TxsinkCommitMessage

    opts = {"backend": "files", "path": str(tmp_path / "out"), "sink_id": "warned",
            "txnAppId": "app", "txnVersion": "3",
            "state_location": str(tmp_path / "state")}
    writer = TxsinkBatchWriter.__new__(TxsinkBatchWriter)
    writer.settings = SinkSettings.parse(opts)
    in_stream = [TxsinkCommitMessage(b"", "q", batch_id=3)]
    with caplog.at_level("WARNING"):
        assert writer._source(in_stream) is None
        assert writer._source(in_stream) is None
    said = [r.getMessage() for r in caplog.records if "txnStreamCheckpoint" in r.getMessage()]
    assert len(said) == 1 and "sink=warned" in said[0]
    entry(tmp_path / "chk", 3, KAFKA)
    writer.settings = SinkSettings.parse({**opts, "txnStreamCheckpoint": str(tmp_path / "chk")})
    assert writer._source(in_stream) == batch_source(str(tmp_path / "chk"), 3)
