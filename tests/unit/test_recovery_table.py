"""One test (or more) per row of the recovery table in docs/concepts.md ("Recovery").

Each would fail if the coordinator stopped taking that row's action.
"""

from __future__ import annotations

import pytest
from txsink.coordinator import EpochOutcome
from txsink.errors import FatalCommitError, ParticipantLostError
from txsink.faults import (
    AFTER_DECIDE,
    AFTER_FIRST_COMMIT,
    AFTER_MARK_COMMITTED,
    BEFORE_DECIDE,
    BEFORE_MARK_COMMITTED,
    FaultInjector,
    FaultRule,
    InjectedFault,
)
from txsink.model import Committable
from txsink.state import EpochState

from .conftest import Env, expected_ids


def crash_at(point: str, epoch: int = 0) -> FaultInjector:
    return FaultInjector([FaultRule(point, epoch, "raise")])


def crashed_epoch(env: Env, point: str) -> list[Committable]:
    """Prepare epoch 0 and let its coordinator die at ``point``; return the committables."""
    msgs = env.prepare_epoch(0)
    with pytest.raises(InjectedFault):
        env.coordinator(crash_at(point)).commit_epoch(0, msgs)
    return msgs


# Row 1: epoch DECIDED, not COMMITTED -> commit all its committables again, mark COMMITTED.


@pytest.mark.parametrize("point", [AFTER_DECIDE, AFTER_FIRST_COMMIT, BEFORE_MARK_COMMITTED])
def test_decided_epoch_is_committed_again_on_start(env: Env, point: str) -> None:
    crashed_epoch(env, point)
    assert env.store().get(0).state is EpochState.DECIDED  # type: ignore[union-attr]

    report = env.coordinator().start()

    assert report.recommitted_epochs == [0]
    assert ("recovered", (0,)) in env.recorder.calls
    assert env.ids() == expected_ids(range(1), 3)
    assert env.store().get(0).state is EpochState.COMMITTED  # type: ignore[union-attr]
    assert env.system.prepared == {}


def test_decided_epoch_met_again_is_finished_and_new_attempt_aborted(env: Env) -> None:
    """Spark replays a batch whose decision was written but not completed."""
    crashed_epoch(env, AFTER_DECIDE)
    coord = env.coordinator()
    coord.start(recover=False)
    replay = [env.prepare(0, p, attempt=1) for p in range(3)]

    assert coord.commit_epoch(0, replay) is EpochOutcome.RECOVERED
    assert env.ids() == expected_ids(range(1), 3)
    assert env.system.prepared == {}


def test_crash_before_decision_aborts_everything_as_orphans(env: Env) -> None:
    msgs = crashed_epoch(env, BEFORE_DECIDE)
    assert env.store().get(0) is None

    report = env.coordinator().start()

    assert report.recommitted_epochs == []
    assert sorted(report.aborted_orphans) == sorted(c.participant for c in msgs)
    assert env.ids() == []
    assert env.system.prepared == {}


# Row 2: epoch COMMITTED and Spark replays it -> abort the new attempt's participants.


@pytest.mark.parametrize("restart", [False, True])
def test_replay_of_committed_epoch_is_aborted(env: Env, restart: bool) -> None:
    coord = env.coordinator(crash_at(AFTER_MARK_COMMITTED) if restart else None)
    msgs = env.prepare_epoch(0)
    if restart:
        with pytest.raises(InjectedFault):
            coord.commit_epoch(0, msgs)
        coord = env.coordinator()
        coord.start()
    else:
        assert coord.commit_epoch(0, msgs) is EpochOutcome.COMMITTED
    replay = env.prepare_epoch(0)

    assert coord.commit_epoch(0, replay) is EpochOutcome.REPLAYED
    assert env.ids() == expected_ids(range(1), 3)
    assert env.system.prepared == {}
    assert ("aborted:replayed", 0) in env.recorder.calls


def test_replay_of_pruned_committed_epoch_is_aborted(env: Env) -> None:
    coord = env.coordinator(retain_epochs=1)
    for epoch in range(3):
        coord.commit_epoch(epoch, env.prepare_epoch(epoch))
    assert env.store().get(0) is None  # pruned, but the watermark remembers it

    assert coord.commit_epoch(1, env.prepare_epoch(1)) is EpochOutcome.REPLAYED
    assert env.ids() == expected_ids(range(3), 3)
    assert env.system.prepared == {}


# Row 3: prepared participants of this sink that belong to no decided epoch -> abort.


def test_orphans_from_retries_and_dead_drivers_are_aborted(env: Env) -> None:
    coord = env.coordinator()
    failed_attempt = env.prepare(0, 0, attempt=0)  # its message never reached the driver
    winners = [env.prepare(0, 0, attempt=1), env.prepare(0, 1)]
    coord.commit_epoch(0, winners)
    assert failed_attempt.participant not in env.system.prepared

    env.prepare(1, 0)  # prepared by a driver that died before deciding epoch 1
    env.coordinator().start()
    assert env.system.prepared == {}
    assert env.ids() == sorted(expected_ids(range(1), 2))


def test_orphan_scan_never_touches_decided_or_later_participants(env: Env) -> None:
    decided = crashed_epoch(env, AFTER_DECIDE)
    running = env.prepare(5, 0)  # a writer of a later epoch, still in flight
    coord = env.coordinator()
    coord.start(recover=False)
    aborted = coord._abort_orphans(up_to_epoch=4)
    assert aborted == []
    assert {c.participant for c in decided} | {running.participant} == set(env.system.prepared)


def test_abort_epoch_aborts_prepared_participants_and_orphans(env: Env) -> None:
    coord = env.coordinator()
    msgs = env.prepare_epoch(0)
    lost = env.prepare(0, 3)  # a task whose message Spark reports as None
    coord.abort_epoch(0, [*msgs, None])
    assert env.system.prepared == {}
    assert lost.participant not in env.system.prepared
    assert env.ids() == []


def test_abort_of_a_decided_epoch_keeps_its_participants(env: Env) -> None:
    msgs = crashed_epoch(env, AFTER_DECIDE)
    coord = env.coordinator()
    coord.start(recover=False)
    coord.abort_epoch(0, msgs)
    assert set(env.system.prepared) == {c.participant for c in msgs}
    coord.recover()
    assert env.ids() == expected_ids(range(1), 3)


# Row 4: a decided participant is gone when re-committing.


def test_gone_participant_that_was_committed_counts_as_committed(env: Env) -> None:
    """The commit took effect but the reply was lost (driver died right after)."""
    calls = []

    def lose_reply(c: object) -> None:
        calls.append(c)
        if len(calls) == 2:
            raise InjectedFault("backend-commit", 0)

    env.system.after_commit = lose_reply
    with pytest.raises(InjectedFault):
        env.coordinator().commit_epoch(0, env.prepare_epoch(0))
    env.system.after_commit = None

    assert env.coordinator().start().recommitted_epochs == [0]
    assert env.ids() == expected_ids(range(1), 3)


def test_gone_participant_that_was_not_committed_is_a_clear_error(env: Env) -> None:
    msgs = crashed_epoch(env, AFTER_DECIDE)
    del env.system.prepared[msgs[1].participant]  # rolled back behind txsink's back

    with pytest.raises(FatalCommitError) as info:
        env.coordinator().start()

    assert msgs[1].participant in str(info.value)
    assert isinstance(info.value.__cause__, ParticipantLostError)
    assert info.value.epoch == 0
    # The others were committed, the epoch stays DECIDED: nothing is silently dropped.
    assert env.store().get(0).state is EpochState.DECIDED  # type: ignore[union-attr]
    assert len(env.ids()) == 20
