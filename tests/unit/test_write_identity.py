"""Core rules behind issue 13, on the in-memory backend: reserved epochs, write
identities, fenced owners, checkpoint identity, epochs the target already holds."""

from __future__ import annotations

import shutil

import pytest
from txsink.coordinator import Coordinator, EpochOutcome, RetryPolicy
from txsink.errors import FencedError, StateError
from txsink.faults import FaultInjector
from txsink.model import DeliveryGuarantee
from txsink.state import DirectoryStateStore, EpochState, Lease, SinkMeta, WriteId

from .conftest import SINK, Env, expected_ids


def test_concurrent_batch_writes_reserve_distinct_epochs_and_both_commit(env: Env) -> None:
    a, b = env.coordinator(owner="driver"), env.coordinator(owner="driver")
    a.start()
    b.start()
    ea, eb = a.reserve_epoch(), b.reserve_epoch()
    assert ea != eb
    msgs_a, msgs_b = env.prepare_epoch(ea), env.prepare_epoch(eb)
    # The later epoch commits first; its orphan scan must leave the earlier one alone.
    assert b.commit_epoch(eb, msgs_b) is EpochOutcome.COMMITTED
    assert a.commit_epoch(ea, msgs_a) is EpochOutcome.COMMITTED
    assert env.ids() == expected_ids(range(2), 3)


def test_recovery_keeps_own_reservations_and_drops_those_of_a_gone_run(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    old = env.coordinator(owner="old-driver")
    old.start()
    stale = old.reserve_epoch()
    env.prepare_epoch(stale)  # the old run died after preparing
    new = env.coordinator(owner="new-driver")
    assert len(new.start().aborted_orphans) == 3
    assert stale not in env.store().records()
    assert "was never decided" in caplog.text
    mine = new.reserve_epoch()
    msgs = env.prepare_epoch(mine)
    # A second start of the same driver (the next write's planner) keeps `mine`.
    assert env.coordinator(owner="new-driver").start().aborted_orphans == []
    assert new.commit_epoch(mine, msgs) is EpochOutcome.COMMITTED
    assert env.system.prepared == {}
    assert env.ids() == expected_ids(range(mine, mine + 1), 3)


def test_write_identity_is_committed_at_most_once(env: Env) -> None:
    write = WriteId("nightly", 5)
    coord = env.coordinator(owner="d")
    coord.start()
    assert coord.committed_write(write) is None
    epoch = coord.reserve_epoch(write)
    with pytest.raises(StateError, match="already being written"):
        env.coordinator(owner="d").reserve_epoch(write)
    coord.commit_epoch(epoch, env.prepare_epoch(epoch))
    assert coord.committed_write(write) == 5
    assert coord.committed_write(WriteId("nightly", 4)) == 5
    assert coord.committed_write(WriteId("nightly", 6)) is None
    # Pruned records do not forget it: the meta keeps the version.
    coord.store.delete(coord.lease, [epoch])
    assert coord.committed_write(write) == 5


def test_fenced_owner_stays_fenced(env: Env) -> None:
    env.coordinator(owner="run-1").start()
    env.coordinator(owner="run-2").start()
    with pytest.raises(FencedError):
        env.coordinator(owner="run-1").start()
    env.coordinator(owner="run-2").start()  # the newer run goes on


def test_another_checkpoint_for_the_same_state_is_refused(env: Env) -> None:
    env.coordinator().start(query_id="q-1")
    env.coordinator().start(query_id="q-1")
    with pytest.raises(StateError, match="deleted or replaced"):
        env.coordinator().start(query_id="q-2")


def test_epoch_the_target_holds_is_not_written_twice(env: Env) -> None:
    coord = env.coordinator()
    coord.start()
    backup = env.state_dir.with_name("backup")
    shutil.copytree(env.state_dir, backup)
    coord.commit_epoch(0, env.prepare_epoch(0))
    shutil.rmtree(env.state_dir)
    shutil.copytree(backup, env.state_dir)  # the state restored from before epoch 0
    again = env.coordinator()
    again.start()
    replay = [env.prepare(0, p, attempt=1) for p in range(3)]
    assert again.commit_epoch(0, replay) is EpochOutcome.REPLAYED
    assert env.ids() == expected_ids(range(1), 3)
    assert env.system.prepared == {}
    assert all(r.state is EpochState.COMMITTED for r in env.store().records().values())


def test_foreach_batch_versions_of_another_query_are_refused_not_skipped(env: Env) -> None:
    """Operations hole 1: a reset stream checkpoint restarts batch ids at 0. Versions of
    one txnAppId count within the query that wrote them; a new query's batch 0 must
    not be taken for the old batch 0 (and silently skipped)."""
    coord = env.coordinator(owner="d")
    coord.start()
    for version in range(3):
        epoch = coord.reserve_epoch(WriteId("orders", version))
        assert coord.commit_epoch(epoch, env.prepare_epoch(epoch),
                                  write_query="q-old") is EpochOutcome.COMMITTED
    assert coord.write_query("orders") == "q-old"
    before = env.ids()
    # The same query replays batch 2: skipped as committed (same query, same version).
    coord.check_write_query(WriteId("orders", 2, "q-old"))
    # The checkpoint was reset: the new query's batch 0 looks committed by number only.
    assert coord.committed_write(WriteId("orders", 0)) == 2
    with pytest.raises(StateError, match="deleted or replaced") as err:
        coord.check_write_query(WriteId("orders", 0, "q-new"))
    assert "q-old" in str(err.value) and "new txnAppId" in str(err.value)
    # A version above the old ones from the new query is refused as well, and its
    # prepared participants are rolled back: nothing half-written stays behind.
    epoch = coord.reserve_epoch(WriteId("orders", 7))
    msgs = env.prepare_epoch(epoch)
    with pytest.raises(StateError, match="Nothing of this batch was written"):
        coord.commit_epoch(epoch, msgs, write_query="q-new")
    assert env.system.prepared == {}
    assert env.ids() == before
    assert epoch not in env.store().records()
    # The same under at_least_once, where the tasks' rows are visible already: loud.
    epoch = coord.reserve_epoch(WriteId("orders", 8))
    with pytest.raises(StateError, match="deleted or replaced"):
        coord.record_epoch(epoch, [], DeliveryGuarantee.AT_LEAST_ONCE, write_query="q-new")
    # Pruned records do not forget which query wrote the versions.
    coord.store.delete(coord.lease, list(env.store().records()))
    assert coord.write_query("orders") == "q-old"
    # A write no stream drives (a batch job) does not count in the stream's versions
    # either (issue 31): its version 9 would have the stream's batches up to 9 skipped.
    with pytest.raises(StateError, match="driven by no streaming query"):
        coord.check_write_query(WriteId("orders", 9))


def test_a_committed_version_survives_a_crash_before_it_is_remembered_and_pruning(
    env: Env,
) -> None:
    """Operations suspicion: a crash between marking an epoch COMMITTED and recording
    its write version, then pruning, let the version be written again."""
    class CrashOnMeta(DirectoryStateStore):
        armed = False

        def write_meta(self, lease: Lease, meta: SinkMeta) -> None:
            if CrashOnMeta.armed:
                CrashOnMeta.armed = False
                raise RuntimeError("driver killed")
            super().write_meta(lease, meta)

    store = CrashOnMeta(env.state_dir)
    coord = Coordinator(env.backend, store, SINK, plugins=env.plugins, faults=FaultInjector(),
                        retain_epochs=2, retry=RetryPolicy(attempts=1, sleep=lambda s: None))
    coord.start()
    epoch = coord.reserve_epoch(WriteId("nightly", 1))
    msgs = env.prepare_epoch(epoch)
    CrashOnMeta.armed = True
    with pytest.raises(RuntimeError, match="driver killed"):
        coord.commit_epoch(epoch, msgs)
    # The next run recovers, then runs on long enough to prune the old records.
    coord = Coordinator(env.backend, store, SINK, plugins=env.plugins, faults=FaultInjector(),
                        retain_epochs=2, owner="next")
    coord.start()
    for _ in range(6):
        e = coord.reserve_epoch()
        coord.commit_epoch(e, env.prepare_epoch(e))
    assert epoch not in store.records()  # pruned
    assert coord.committed_write(WriteId("nightly", 1)) == 1
    assert env.ids().count(epoch * 1_000_000) == 1


def test_the_write_identities_kept_are_bounded(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job with a new txnAppId per run grew the metadata every commit reads."""
    from txsink.coordinator import identity as coordinator_module

    monkeypatch.setattr(coordinator_module, "MAX_WRITE_IDS", 3)
    coord = env.coordinator(owner="d")
    coord.start()
    for run in range(5):
        epoch = coord.reserve_epoch(WriteId(f"job-{run}", 1))
        coord.commit_epoch(epoch, env.prepare_epoch(epoch, partitions=1))
    epoch = coord.reserve_epoch(WriteId("job-2", 2))  # job-2 again: the most recent now
    coord.commit_epoch(epoch, env.prepare_epoch(epoch, partitions=1))
    meta = env.store().read_meta()
    assert meta is not None
    assert list(meta.writes) == ["job-3", "job-4", "job-2"]
