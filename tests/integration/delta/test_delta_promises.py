"""What docs/backends/delta.md promises about tables others maintain, on real tables:
a prepared file VACUUM deleted stops the commit naming it, a log cleaned up past an
older epoch stops instead of guessing, a partitioned table is refused at start, and a
store that lets two writers of one log version both win is refused by the preflight."""

from __future__ import annotations

import contextlib
import glob
import os
from pathlib import Path

import pyarrow as pa
import pytest
from txsink.errors import ConfigError, ParticipantLostError, StateError
from txsink.model import TransactionContext
from txsink.plugins import get_plugins
from txsink.writer import write_participant
from txsink_delta import backend as delta_module
from txsink_delta.backend import DeltaBackend

from tests.integration.conftest import S3Server
from tests.lake_tables import s3_options, table_ids

pytestmark = pytest.mark.integration
SINK = "orders"


def delta(options: dict[str, str]) -> DeltaBackend:
    backend = get_plugins().create_backend("delta", options)
    assert isinstance(backend, DeltaBackend)
    return backend


def prepare(backend: DeltaBackend, epoch: int, ids: range):  # type: ignore[no-untyped-def]
    batch = pa.record_batch({"id": pa.array(list(ids), pa.int64())})
    return write_participant(backend, TransactionContext(SINK, epoch, 0, 0), [batch])


@pytest.mark.promise("delta-vacuumed-file-stops", "backend")
def test_a_prepared_file_vacuum_deleted_stops_the_commit_naming_it(tmp_path: Path) -> None:
    """A pipeline down longer than the retention with a decided epoch: VACUUM deletes the
    epoch's files (no log entry names them). The commit stops naming the file, every
    time; nothing of the epoch is added."""
    table = tmp_path / "table"
    backend = delta({"path": str(table)})
    backend.commit(prepare(backend, 0, range(10)))
    decided = prepare(backend, 1, range(10, 20))
    files = [f["path"] for f in decided.payload["files"]]
    for f in files:
        os.unlink(table / f)  # what VACUUM does with files no log entry names
    for _ in range(2):
        with pytest.raises(ParticipantLostError) as err:
            backend.commit(decided)
        assert files[0] in str(err.value)
    assert sorted(table_ids(backend)) == list(range(10))


@pytest.mark.promise("delta-log-cleanup-stops", "backend")
def test_an_epoch_older_than_the_cleaned_log_stops_instead_of_guessing(tmp_path: Path) -> None:
    """A state restored from an old backup asks the table about epoch 1 again; log
    cleanup removed the entries that would tell: the backend says so, never guesses
    'not there' (the epoch's rows would be added twice) or 'there'."""
    from deltalake import DeltaTable

    table = tmp_path / "table"
    backend = delta({"path": str(table)})
    for epoch in range(8):
        backend.commit(prepare(backend, epoch, range(epoch * 10, epoch * 10 + 3)))
    DeltaTable(str(table)).create_checkpoint()
    for name in sorted(glob.glob(str(table / "_delta_log" / "0000*.json")))[:4]:
        os.unlink(name)  # delta.logRetentionDuration cleaned the oldest entries
    again = delta({"path": str(table)})
    restored = prepare(again, 1, range(10, 13))  # the restored decision's participant
    with pytest.raises(StateError, match="no longer reaches back to epoch 1"):
        again.commit(restored)
    assert len(table_ids(again)) == 24  # nothing added twice


@pytest.mark.promise("delta-partitioned-refused", "backend")
def test_a_partitioned_table_is_refused_at_start(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    table = tmp_path / "table"
    write_deltalake(str(table), pa.table({"id": pa.array([1], pa.int64()),
                                          "day": pa.array(["d"], pa.string())}),
                    partition_by=["day"])
    with pytest.raises(ConfigError, match=r"partition columns \(day") as err:
        delta({"path": str(table)}).preflight(SINK)
    assert err.value.field == "path"
    assert not (table / "txsink").exists()


@pytest.mark.promise("delta-conditional-put-probed", "backend")
def test_a_store_letting_two_writers_of_one_log_version_win_is_refused(
        s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The preflight's probe on the real store, with the second writer's commit let
    through as a store ignoring ``If-None-Match`` would (delta-rs speaks S3 itself: its
    condition cannot be stripped on the way as boto3's can): refused, naming
    ``endpoint_url``, and the probe's scratch table is gone."""
    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError

    monkeypatch.setattr(delta_module, "_CONDITIONAL_PUT_PROVEN", set())
    real = DeltaTable.create_write_transaction

    def both_win(self: DeltaTable, *args: object, **kwargs: object) -> None:
        # the store took the second PUT of the version too
        with contextlib.suppress(CommitFailedError):
            real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(DeltaTable, "create_write_transaction", both_win)
    backend = delta(s3_options("delta", s3_server, tmp_path))
    with pytest.raises(ConfigError, match="does not honour conditional writes") as err:
        backend.preflight(SINK)
    assert err.value.field == "endpoint_url"
    prefix = backend.path.removeprefix(f"s3://{s3_server.bucket}/")
    assert not [k for k in s3_server.keys(prefix) if "_probe-" in k]


@pytest.mark.promise("delta-protocol-versions-refused", "backend")
@pytest.mark.parametrize(("reader", "writer"), [
    (4, 7),
    (1, 8)])
def test_a_protocol_version_above_what_txsink_writes_is_refused_naming_it(
        tmp_path: Path, reader: int, writer: int) -> None:
    from tests.integration.delta.test_delta_real_tables import metadata, write_log

    table = tmp_path / "t"
    proto: dict[str, object] = {"minReaderVersion": reader, "minWriterVersion": writer}
    if writer == 7:
        proto["writerFeatures"] = []
    write_log(table, 0, {"protocol": proto}, metadata())
    with pytest.raises(ConfigError) as err:
        delta({"path": str(table)}).preflight(SINK)
    assert err.value.field == "path"
    assert str(reader if reader > 3 else writer) in str(err.value)
    assert not (table / "txsink").exists()


@pytest.mark.promise("delta-missing-not-null-column-refused", "backend")
def test_a_not_null_column_the_epochs_files_lack_is_refused_naming_it(tmp_path: Path) -> None:
    """A nullable column the files lack reads as null; a NOT NULL one would hold nulls:
    refused before the decision, naming it, nothing committed."""
    from tests.integration.delta.test_delta_real_tables import (
        ID_FIELD,
        metadata,
        prepared,
        protocol,
        write_log,
    )

    table = tmp_path / "t"
    note = {"name": "note", "type": "string", "nullable": False, "metadata": {}}
    write_log(table, 0, protocol(1, 2), metadata(fields=[ID_FIELD, note]))
    backend = delta({"path": str(table)})
    backend.preflight(SINK)
    committables = prepared(backend, 0, [1, 2], sink=SINK)
    with pytest.raises(ConfigError, match="note") as err:
        backend.check_prepared(committables)
    assert "NOT NULL" in str(err.value)
    assert table_ids(backend) == []
