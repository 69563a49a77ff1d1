"""A restored (older) state never commits an epoch twice; a restarting server is waited for.

* Restored state: the coordinator's state is copied (a backup), more epochs are
  committed, the backup is put back and epochs it does not know are replayed. The
  per-epoch manifests show S3 already holds them: the replays are aborted, every
  row stays once, no upload is left.
* Restart: with SeaweedFS down, preflight waits for it to come back (logged,
  bounded) instead of failing with a configuration error.
"""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path

import pytest
from txsink.coordinator import Coordinator, EpochOutcome
from txsink.errors import StateError
from txsink.faults import AFTER_FIRST_COMMIT, FaultInjector, FaultRule, InjectedFault
from txsink.model import Committable, TransactionContext
from txsink.plugins import build_plugins, get_plugins
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant
from txsink_s3.backend import S3Backend

from .conftest import S3Server
from .test_s3_backend import batch

pytestmark = [pytest.mark.integration]

SINK = "restore-sink"
ROWS = 200


def prepare(backend: S3Backend, epoch: int, partition: int, attempt: int = 0) -> Committable:
    start = (epoch * 2 + partition) * ROWS
    return write_participant(backend, TransactionContext(SINK, epoch, partition, attempt),
                             iter([batch(range(start, start + ROWS))]))


def test_restored_state_does_not_commit_an_epoch_s3_already_holds(
    s3_server: S3Server, prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    backend = get_plugins().create_backend("s3", s3_server.options(prefix))
    assert isinstance(backend, S3Backend)
    state, backup = tmp_path / "state", tmp_path / "backup"
    base = backend.base(SINK) + "/"
    try:
        backend.preflight(SINK)
        coord = Coordinator(backend, DirectoryStateStore(state), SINK, plugins=build_plugins())
        coord.start()
        coord.commit_epoch(0, [prepare(backend, 0, p) for p in range(2)])
        shutil.copytree(state, backup)
        for epoch in (1, 2):
            coord.commit_epoch(epoch, [prepare(backend, epoch, p) for p in range(2)])
        want = list(range(3 * 2 * ROWS))
        assert sorted(s3_server.read_ids(base)) == want

        shutil.rmtree(state)
        shutil.copytree(backup, state)
        restored = Coordinator(backend, DirectoryStateStore(state), SINK,
                               plugins=build_plugins())
        restored.start()
        for epoch in (1, 2):
            replay = [prepare(backend, epoch, p, attempt=5) for p in range(2)]
            assert restored.commit_epoch(epoch, replay) is EpochOutcome.REPLAYED
        assert "already holds this epoch" in caplog.text
        assert sorted(s3_server.read_ids(base)) == want
        assert s3_server.uploads(base) == []

        # A batch write is given an epoch above every one the target holds, though the
        # restored state knows epoch 0 only: no number means two sets of rows.
        epoch = restored.reserve_epoch()
        assert epoch == 3
        assert restored.commit_epoch(epoch, [prepare(backend, epoch, 0, attempt=9)]) is \
            EpochOutcome.COMMITTED
        ids = s3_server.read_ids(base)
        assert len(ids) == len(set(ids)) > len(want) and set(want) <= set(ids)
        assert s3_server.uploads(base) == []
    finally:
        backend.close()


def test_a_state_restored_while_an_epoch_was_half_committed_stops(
        s3_server: S3Server, prefix: str, tmp_path: Path) -> None:
    """The state's copy was taken before epoch 1's decision, whose commit then completed
    one upload of two and stopped (no manifest yet). The restored state has no decision
    for epoch 1 and the target holds part of it: the start stops (``has no decision for
    it``) instead of aborting the other upload, after which the replay wrote epoch 1
    again beside the object already completed (its rows twice under ``epoch=1/``). The
    remedy of docs/operations.md (the newest state put back) finishes the epoch."""
    backend = get_plugins().create_backend("s3", s3_server.options(prefix))
    assert isinstance(backend, S3Backend)
    state, backup, newest = tmp_path / "state", tmp_path / "backup", tmp_path / "newest"
    base = backend.base(SINK) + "/"
    try:
        backend.preflight(SINK)
        crash = FaultInjector([FaultRule(AFTER_FIRST_COMMIT, 1, "raise")])
        coord = Coordinator(backend, DirectoryStateStore(state), SINK,
                            plugins=build_plugins(), faults=crash)
        coord.start()
        coord.commit_epoch(0, [prepare(backend, 0, p) for p in range(2)])
        shutil.copytree(state, backup)
        with pytest.raises(InjectedFault):
            coord.commit_epoch(1, [prepare(backend, 1, p) for p in range(2)])
        assert len(s3_server.uploads(base)) == 1  # one completed, one still prepared
        shutil.copytree(state, newest)
        shutil.rmtree(state)
        shutil.copytree(backup, state)

        restored = Coordinator(backend, DirectoryStateStore(state), SINK,
                               plugins=build_plugins())
        with pytest.raises(StateError, match="has no decision for it"):
            restored.start()
        assert len(s3_server.uploads(base)) == 1, "the rest of the epoch was aborted"

        shutil.rmtree(state)
        shutil.copytree(newest, state)
        Coordinator(backend, DirectoryStateStore(state), SINK,
                    plugins=build_plugins()).start()
        assert sorted(s3_server.read_ids(base)) == list(range(2 * 2 * ROWS))
        assert backend.holds_epoch(SINK, 1)
        assert s3_server.uploads(base) == []
    finally:
        backend.close()


@pytest.mark.fault
@pytest.mark.slow
def test_preflight_waits_for_a_restarting_server(
    s3_server: S3Server, prefix: str, caplog: pytest.LogCaptureFixture,
) -> None:
    server = s3_server.require_local()
    caplog.set_level(logging.WARNING, logger="txsink_s3")
    backend = get_plugins().create_backend(
        "s3", s3_server.options(prefix, max_attempts="1", connect_timeout="1",
                                connect_retry_s="120"))
    errors: list[BaseException] = []

    def start_later() -> None:
        try:
            server.start()
        except BaseException as exc:  # reported below
            errors.append(exc)

    server.kill()
    up = threading.Timer(1.0, start_later)
    up.start()
    try:
        backend.preflight(SINK)
    finally:
        up.join()
        backend.close()
    assert errors == []
    assert "retrying in" in caplog.text


def test_manifests_stay_bounded_and_holds_epoch_stays_right(
        s3_server: S3Server, prefix: str, tmp_path: Path) -> None:
    """Months of epochs: one manifest per epoch grew without end (soak issue). Beyond
    manifest_retention_epochs they are pruned; an older epoch is still held (its data)."""
    backend = get_plugins().create_backend(
        "s3", s3_server.options(prefix, format="jsonl", manifest_retention_epochs="100"))
    assert isinstance(backend, S3Backend)
    backend.preflight(SINK)
    coord = Coordinator(backend, DirectoryStateStore(tmp_path / "state"), SINK,
                        plugins=build_plugins())
    coord.start()
    try:
        for epoch in range(305):
            c = write_participant(backend, TransactionContext(SINK, epoch, 0),
                                  iter([batch(range(epoch, epoch + 1))]))
            assert coord.commit_epoch(epoch, [c]) is EpochOutcome.COMMITTED
        manifests = s3_server.keys(f"{backend.base(SINK)}/_txsink/manifests/")
        assert 100 <= len(manifests) <= 200, len(manifests)
        assert backend.holds_epoch(SINK, 7)  # manifest pruned: its data says so
        assert backend.holds_epoch(SINK, 300)
        assert not backend.holds_epoch(SINK, 305)
    finally:
        backend.close()
