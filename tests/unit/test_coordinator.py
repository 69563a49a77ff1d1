from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from txsink.coordinator import EpochOutcome
from txsink.errors import (
    ConfigError,
    FencedError,
    PluginError,
    RetriableCommitError,
    StateError,
)
from txsink.faults import AFTER_DECIDE, FaultInjector, FaultRule, InjectedFault
from txsink.model import Committable
from txsink.state import DirectoryStateStore, EpochState
from txsink.testing.memory import MemoryBackend

from .conftest import SINK, Env, expected_ids


def test_happy_path_commits_each_epoch_once_and_notifies_observers(env: Env) -> None:
    coord = env.coordinator()
    for epoch in range(3):
        assert coord.commit_epoch(epoch, env.prepare_epoch(epoch)) is EpochOutcome.COMMITTED
    assert env.ids() == expected_ids(range(3), 3)
    assert env.system.prepared == {}
    phases = [name for name, epoch in env.recorder.calls if epoch == 1]
    assert phases == ["prepared", "decided", "committed"]
    assert coord.watermark() == 2


def test_commit_retries_are_bounded_and_logged(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    env.system.fail_next_commits = 2
    with caplog.at_level(logging.WARNING, logger="txsink.coordinator"):
        env.coordinator().commit_epoch(0, env.prepare_epoch(0, partitions=1))
    assert env.ids() == expected_ids(range(1), 1)
    retries = [r for r in caplog.records if "commit attempt" in r.getMessage()]
    assert len(retries) == 2
    assert f"sink={SINK} epoch=0 partition=0 participant=" in retries[0].getMessage()


def test_commit_that_keeps_failing_stops_with_error_naming_participant(env: Env) -> None:
    msgs = env.prepare_epoch(0, partitions=1)
    env.system.fail_next_commits = 100
    with pytest.raises(RetriableCommitError) as info:
        env.coordinator().commit_epoch(0, msgs)
    assert info.value.participant == msgs[0].participant
    assert msgs[0].participant in str(info.value)
    assert env.store().get(0).state is EpochState.DECIDED  # type: ignore[union-attr]
    env.system.fail_next_commits = 0
    assert env.coordinator().start().recommitted_epochs == [0]
    assert env.ids() == expected_ids(range(1), 1)


def test_missing_message_refuses_to_commit(env: Env) -> None:
    msgs = env.prepare_epoch(0)
    with pytest.raises(StateError, match="sent no committable"):
        env.coordinator().commit_epoch(0, [msgs[0], None, msgs[2]])
    assert env.ids() == []
    assert env.system.prepared == {}


def test_two_committables_for_one_partition_refused(env: Env) -> None:
    a, b = env.prepare(0, 0, attempt=0), env.prepare(0, 0, attempt=1)
    with pytest.raises(StateError, match="two committables for partition 0"):
        env.coordinator().commit_epoch(0, [a, b])
    assert env.ids() == []


def test_committable_of_another_sink_is_refused(env: Env) -> None:
    good = env.prepare(0, 0)
    foreign = Committable("memory", "other-sink", 0, 1, 0, "other-sink-e0-p1-a0", {"txn": "x"})
    with pytest.raises(StateError, match="does not belong"):
        env.coordinator().commit_epoch(0, [good, foreign])
    assert env.ids() == []


def test_second_coordinator_fences_the_first(env: Env) -> None:
    first = env.coordinator(owner="run-1")
    first.commit_epoch(0, env.prepare_epoch(0))
    second = env.coordinator(owner="run-2")
    second.start()
    msgs = env.prepare_epoch(1)
    with pytest.raises(FencedError, match="took over"):
        first.commit_epoch(1, msgs)
    assert env.store().get(1) is None
    assert second.commit_epoch(1, msgs) is EpochOutcome.COMMITTED
    assert env.ids() == expected_ids(range(2), 3)


def test_same_owner_reacquires_without_fencing(env: Env) -> None:
    a = env.coordinator(owner="query-run-7")
    a.commit_epoch(0, env.prepare_epoch(0))
    b = env.coordinator(owner="query-run-7")  # another process of the same run
    b.commit_epoch(1, env.prepare_epoch(1))
    a.commit_epoch(2, env.prepare_epoch(2))
    assert env.ids() == expected_ids(range(3), 3)


def test_state_is_bound_to_one_sink_and_backend(env: Env) -> None:
    env.coordinator().start()
    from txsink.coordinator import Coordinator

    with pytest.raises(ConfigError, match="belongs to sink 'unit-sink'"):
        Coordinator(env.backend, env.store(), "another-sink", plugins=env.plugins).start()


@pytest.mark.promise("observer-hook-errors-ignored", "backend")
def test_failing_observer_does_not_change_the_outcome(env: Env,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    from txsink.hookspecs import hookimpl
    from txsink.plugins import build_plugins

    class Broken:
        @hookimpl
        def txsink_epoch_decided(self) -> None:
            raise RuntimeError("observer bug")

    env.plugins = build_plugins(entry_points=[], extra_plugins=[("broken", Broken())])
    with caplog.at_level(logging.ERROR):
        assert env.coordinator().commit_epoch(0, env.prepare_epoch(0)) is EpochOutcome.COMMITTED
    assert env.ids() == expected_ids(range(1), 3)
    assert "observer bug" in caplog.text


@pytest.mark.promise("secret-in-committable-refused", "backend")
def test_secret_in_committable_is_refused(env: Env) -> None:
    class Leaky(MemoryBackend):
        def secret_values(self) -> list[str]:
            return ["hunter2-password"]

    env.backend = Leaky(env.system_name)
    msgs = env.prepare_epoch(0, partitions=1)
    leaked = Committable(**{**msgs[0].__dict__, "payload": {**msgs[0].payload,
                                                             "dsn": "pw=hunter2-password"}})
    with pytest.raises(PluginError, match="secret") as info:
        env.coordinator().commit_epoch(0, [leaked])
    assert "hunter2" not in str(info.value)
    assert env.store().get(0) is None


def test_allocate_epoch_for_batch_writes(env: Env) -> None:
    coord = env.coordinator()
    assert coord.allocate_epoch() == 0
    coord.commit_epoch(0, env.prepare_epoch(0))
    assert coord.allocate_epoch() == 1


def test_backend_epoch_hook_runs_once_per_commit_and_again_after_a_crash(env: Env) -> None:
    from txsink.faults import BEFORE_MARK_COMMITTED, FaultInjector, FaultRule, InjectedFault

    seen: list[tuple[int, int]] = []

    class Marking(MemoryBackend):
        def epoch_committed(self, sink_id: str, epoch: int, committables: object) -> None:
            assert env.system.prepared == {}  # only after every participant committed
            seen.append((epoch, len(committables)))  # type: ignore[arg-type]

    env.backend = Marking(env.system_name)
    env.coordinator().commit_epoch(0, env.prepare_epoch(0))
    crash = FaultInjector([FaultRule(BEFORE_MARK_COMMITTED, 1, "raise")])
    with pytest.raises(InjectedFault):
        env.coordinator(crash).commit_epoch(1, env.prepare_epoch(1))
    env.coordinator().start()
    assert seen == [(0, 3), (1, 3), (1, 3)]


def test_second_query_with_the_same_sink_id_is_refused(tmp_path: object) -> None:
    from pathlib import Path

    from txsink.coordinator import Coordinator
    from txsink.files.backend import FilesBackend
    from txsink.plugins import build_plugins
    from txsink.state import DirectoryStateStore

    assert isinstance(tmp_path, Path)
    out = tmp_path / "out"
    plugins = build_plugins()
    first = Coordinator(FilesBackend(str(out)), DirectoryStateStore(tmp_path / "cp1"), "q",
                        plugins=plugins)
    first.start()
    first.start()  # the same query again (a restart): fine
    second = Coordinator(FilesBackend(str(out)), DirectoryStateStore(tmp_path / "cp2"), "q",
                         plugins=plugins)
    with pytest.raises(ConfigError, match="already written by another query") as info:
        second.start()
    assert info.value.field == "sink_id"
    assert str(tmp_path / "cp1") in str(info.value)


class _BatchingBackend(MemoryBackend):
    """Counts commit_all calls and fails chosen participants once, retriably."""

    def __init__(self, system: str, flaky: set[int]) -> None:
        super().__init__(system)
        self.calls: list[list[int]] = []
        self.flaky = set(flaky)

    def commit_all(self, committables):  # type: ignore[no-untyped-def]
        self.calls.append([c.partition for c in committables])
        results = []
        for c in committables:
            if c.partition in self.flaky:
                self.flaky.discard(c.partition)
                results.append(RetriableCommitError("flaky", sink_id=c.sink_id))
            else:
                results.append(self.commit(c))
        return results


def test_rest_of_an_epoch_goes_to_one_commit_all_and_only_failures_are_retried(
        env: Env) -> None:
    backend = _BatchingBackend(env.system_name, flaky={2, 4})
    env.backend = backend
    msgs = env.prepare_epoch(0, partitions=6)
    assert env.coordinator().commit_epoch(0, msgs) is EpochOutcome.COMMITTED
    # The first participant alone (a crash point sits after it), the other five
    # together, then only the two that failed.
    assert backend.calls == [[0], [1, 2, 3, 4, 5], [2, 4]]
    assert env.ids() == expected_ids(range(1), 6)


def test_commit_all_answering_the_wrong_number_of_results_is_a_plugin_error(
        env: Env) -> None:
    class Short(MemoryBackend):
        def commit_all(self, committables):  # type: ignore[no-untyped-def]
            return [self.commit(c) for c in committables][:1]

    env.backend = Short(env.system_name)
    msgs = env.prepare_epoch(0, partitions=3)
    with pytest.raises(PluginError, match="commit_all returned 1 result"):
        env.coordinator().commit_epoch(0, msgs)
    assert env.store().get(0).state is EpochState.DECIDED  # type: ignore[union-attr]


class _CountingStore(DirectoryStateStore):
    """Counts what a coordinator reads: whole listings of bodies, and single records."""

    def __init__(self, location: Path, log: list[str]) -> None:
        super().__init__(location)
        self.log = log

    def records(self):  # type: ignore[no-untyped-def]
        self.log.append("records")
        return super().records()

    def get(self, epoch):  # type: ignore[no-untyped-def]
        self.log.append(f"get {epoch}")
        return super().get(epoch)


def test_a_streaming_commit_reads_no_other_epochs_record(env: Env) -> None:
    """Spark builds a coordinator per epoch: with many retained epochs, starting with
    recovery and committing one epoch must not read the bodies of the others."""
    for epoch in range(30):
        env.coordinator().commit_epoch(epoch, env.prepare_epoch(epoch, partitions=2))
    reads: list[str] = []
    coord = env.coordinator()
    coord.store = _CountingStore(env.state_dir, reads)
    coord.start(recover=True, up_to_epoch=29)
    assert coord.commit_epoch(30, env.prepare_epoch(30)) is EpochOutcome.COMMITTED
    assert reads == ["get 30"]
    assert env.ids() == sorted(expected_ids(range(30), 2) + expected_ids(range(30, 31), 3))
    assert env.store().states() == dict.fromkeys(range(31), EpochState.COMMITTED)


def test_orphan_scan_reads_only_decided_and_reserved_records(env: Env) -> None:
    # Epoch 1 was decided by a run that crashed before committing its participants.
    env.coordinator().commit_epoch(0, env.prepare_epoch(0))
    crashed = env.coordinator(faults=FaultInjector([FaultRule(AFTER_DECIDE, 1, "raise")]))
    with pytest.raises(InjectedFault):
        crashed.commit_epoch(1, env.prepare_epoch(1, partitions=2))
    reserved = env.coordinator().reserve_epoch()
    assert reserved == 2
    late = env.prepare(3, 0)  # a participant above the reservation: may still be wanted
    stale = env.prepare(0, 0, attempt=1)  # a failed attempt of a committed epoch
    reads: list[str] = []
    coord = env.coordinator()
    coord.store = _CountingStore(env.state_dir, reads)
    coord.commit_epoch(4, env.prepare_epoch(4))
    decided = env.store().get(1)
    assert decided is not None and decided.state is EpochState.DECIDED
    # The decided epoch's participants are protected, the reservation bounds the
    # scan, and below it the orphan is aborted.
    assert set(env.system.prepared) == decided.participants | {late.participant}
    assert stale.participant not in env.system.prepared
    # Committed records are read only for epochs with a participant prepared in the
    # target (here the stale attempt of epoch 0): whether their decision names it
    # decides between rolling it forward and aborting it.
    assert sorted(reads) == ["get 0", "get 1", "get 4"]


@pytest.mark.parametrize("pruned", [False, True], ids=["retained", "pruned"])
def test_a_failover_to_a_standby_rolls_a_committed_epoch_forward(
    env: Env, caplog: pytest.LogCaptureFixture, pruned: bool
) -> None:
    """Operations hole 2: the target fails over to a standby that holds a committed
    epoch's PREPAREs but not its COMMITs. Those participants are named by a decision:
    the next start commits them, it never aborts them (it did, as "orphans")."""
    coord = env.coordinator(retain_epochs=2)
    coord.start()
    coord.commit_epoch(0, env.prepare_epoch(0))
    msgs = env.prepare_epoch(1)
    stale = env.prepare(1, 0, attempt=7)  # a failed attempt: an orphan, aborted anyway
    standby = env.system.snapshot()  # replicated up to the PREPAREs of epoch 1
    assert coord.commit_epoch(1, msgs) is EpochOutcome.COMMITTED
    for epoch in range(2, 8 if pruned else 3):
        coord.commit_epoch(epoch, env.prepare_epoch(epoch))
    records = env.store().records()
    assert (1 in records) is not pruned
    committed_after = [r for r in env.system.output if not r[0].startswith(f"{SINK}-e0-")
                       and not r[0].startswith(f"{SINK}-e1-")]
    env.system.restore(standby)  # the failover: epoch 1's COMMITs and everything after lost
    assert {n for n in env.system.prepared} == {c.participant for c in msgs} | {
        stale.participant}
    report = env.coordinator(owner="next-run", retain_epochs=2).start()
    assert report.aborted_orphans == [stale.participant]
    assert env.system.prepared == {}
    # Epochs 0 and 1 are visible exactly once; later ones were lost with the old primary
    # (nothing txsink can bring back: they were not prepared on the standby).
    assert env.ids() == expected_ids(range(2), 3)
    assert committed_after  # there were later epochs the standby never saw
    assert "rolled forward" in caplog.text
    assert all(r.levelname == "WARNING" for r in caplog.records if "rolled forward" in r.message)


def test_archived_names_expire_after_their_retention(env: Env) -> None:
    from txsink.decisions import ARCHIVE_CHUNK, expired_chunks

    store = env.store()
    coord = env.coordinator(retain_epochs=10, archive_retention_s=3600)
    coord.start()
    old = time.time() - 7200
    for chunk in (0, 1, 2):
        store.merge_archive(coord.lease, chunk, {
            str(chunk * ARCHIVE_CHUNK): {"at": old if chunk < 2 else time.time(),
                                         "names": [[0, 0]]}})
    assert store.archive_chunks() == [0, 1, 2]
    assert expired_chunks(store, 3600) == [0, 1]
    # The newest chunk is kept whatever its age: it may still be filling.
    assert expired_chunks(store, 1) == [0, 1]


def test_the_archive_expiry_reads_the_chunks_that_go_and_one_more(env: Env) -> None:
    """At a one-second trigger 14 days of archive are over a thousand chunks; the check
    made every 1,000 epochs must not read them all."""
    from txsink.decisions import ARCHIVE_CHUNK, expired_chunks

    store = env.store()
    coord = env.coordinator(retain_epochs=10, archive_retention_s=3600)
    coord.start()
    now = time.time()
    for chunk in range(40):
        at = now - 7200 if chunk < 3 else now - 60
        store.merge_archive(coord.lease, chunk, {str(chunk * ARCHIVE_CHUNK): {
            "at": at, "names": [[0, 0]]}})
    read: list[int] = []
    original = store.read_archive

    def counting(chunk: int) -> dict[str, object] | None:
        read.append(chunk)
        return original(chunk)

    store.read_archive = counting  # type: ignore[method-assign]
    assert expired_chunks(store, 3600) == [0, 1, 2]
    assert read == [0, 1, 2, 3]


def test_a_coordinator_fenced_during_its_orphan_scan_aborts_nothing(env: Env) -> None:
    """A fenced process mutates nothing: a newer run that takes the sink over while an
    older one scans for orphans may be deciding those very participants."""
    old = env.coordinator(owner="old-run")
    old.start()
    old.commit_epoch(0, env.prepare_epoch(0))
    newer = env.coordinator(owner="newer-run")
    msgs: list[Committable] = []

    class TakeoverWhileListing(MemoryBackend):
        def list_prepared(self, sink_id: str) -> list[Committable]:
            if not msgs:  # the newer run takes over, and its tasks prepare epoch 1
                newer.start()
                msgs.extend(env.prepare_epoch(1))
            return list(super().list_prepared(sink_id))

    old.backend = TakeoverWhileListing(env.system_name)
    with pytest.raises(FencedError):
        old.recover()
    assert set(env.system.prepared) == {c.participant for c in msgs}
    assert newer.commit_epoch(1, msgs) is EpochOutcome.COMMITTED
    assert env.ids() == expected_ids(range(2), 3)


def test_a_forced_resolve_keeps_what_was_committed_and_the_replay_writes_the_rest(
        env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    """Operations hole 4: after ``resolve --abort --force`` of a partly committed epoch,
    Spark's replay wrote the whole epoch again (the committed participant twice), and
    the resolve said every row was dropped."""
    from txsink.cli import _force_abort
    from txsink.faults import AFTER_FIRST_COMMIT

    crashing = env.coordinator(faults=FaultInjector([FaultRule(AFTER_FIRST_COMMIT, 0, "raise")]))
    msgs = env.prepare_epoch(0, partitions=2)
    with pytest.raises(InjectedFault):
        crashing.commit_epoch(0, msgs)
    lost = msgs[1]
    env.system.prepared.pop(lost.participant)  # the target lost it (a timeout)
    operator = env.coordinator(owner="operator")
    operator.start(recover=False)
    record = env.store().get(0)
    assert record is not None
    _force_abort(operator, env.backend, env.store(), record)
    said = capsys.readouterr().out
    assert "1 participant(s) (10 row(s)) were committed already and stay visible" in said
    assert "1 participant(s), 10 row(s) dropped" in said
    # Spark replays epoch 0: partition 0 is not written again, partition 1 is.
    replay = env.coordinator(owner="run-2")
    replay.start()
    again = [env.prepare(0, p, attempt=5) for p in range(2)]
    assert replay.commit_epoch(0, again) is EpochOutcome.COMMITTED
    assert env.ids() == expected_ids(range(1), 2)
    assert env.system.prepared == {}
    meta = env.store().read_meta()
    assert meta is not None and meta.kept == {}
