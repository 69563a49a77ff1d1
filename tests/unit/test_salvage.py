"""Salvage in the coordinator: a decided participant the target aborted on its own is
prepared again, recorded in the decision, then committed; a crash at any point of it
still ends exactly once (in-memory backend; the Kafka backend is tested on a broker in
tests/integration/kafka/test_kafka_salvage.py)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from txsink.backend import CommitOutcome
from txsink.cli import main as cli_main
from txsink.coordinator import EpochOutcome
from txsink.errors import FencedError, ParticipantLostError
from txsink.faults import (
    AFTER_FIRST_COMMIT,
    AFTER_SALVAGE_PREPARE,
    SALVAGE_POINTS,
    FaultInjector,
    FaultRule,
    InjectedFault,
)
from txsink.model import is_salvage_attempt, parse_participant, salvage_attempt
from txsink.state import EpochState

from .conftest import Env, expected_ids


def crash_after_first_commit(env: Env, partitions: int = 3) -> list[str]:
    """Epoch 0 decided, its first participant committed, then the driver dies; the
    target then aborts the others on its own (the driver stayed down too long)."""
    msgs = env.prepare_epoch(0, partitions)
    with pytest.raises(InjectedFault):
        env.coordinator(FaultInjector([FaultRule(AFTER_FIRST_COMMIT, 0, "raise")])
                        ).commit_epoch(0, msgs)
    for c in msgs[1:]:
        env.system.expire(c.participant)
    return [c.participant for c in msgs[1:]]


def test_a_restart_salvages_what_the_target_aborted_and_ends_exactly_once(
        env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    lost = crash_after_first_commit(env)
    report = env.coordinator().start()
    assert report.recommitted_epochs == [0]
    assert env.ids() == expected_ids(range(1), 3)
    record = env.store().get(0)
    assert record is not None and record.state is EpochState.COMMITTED
    originals = [o for _, o in record.salvaged]
    assert originals == lost
    for replacement, _ in record.salvaged:
        ctx = parse_participant(replacement)
        assert ctx is not None and is_salvage_attempt(ctx.attempt)
        assert replacement in record.participants
    assert [c for c in env.recorder.calls if c[0] == "salvaged"] == [
        ("salvaged", (0, o, r)) for r, o in record.salvaged]
    # `txsink status` names them.
    assert cli_main(["status", str(env.state_dir)]) == 0
    out = capsys.readouterr().out
    assert "salvaged" in out
    for replacement, original in record.salvaged:
        assert f"epoch 0: {original} -> {replacement} (10 rows, committed)" in out


@pytest.mark.parametrize("point", SALVAGE_POINTS)
def test_a_crash_at_any_salvage_point_ends_exactly_once(env: Env, point: str) -> None:
    crash_after_first_commit(env)
    with pytest.raises(InjectedFault):
        env.coordinator(FaultInjector([FaultRule(point, 0, "raise")])).start()
    record = env.store().get(0)
    assert record is not None
    if point == "after-salvage-prepare":
        # Prepared and not recorded: the decision still names the originals, and the
        # replacements are orphans.
        assert record.salvaged == () and len(env.system.prepared) == 2
    else:
        assert len(record.salvaged) == 2
    env.coordinator().start()
    assert env.ids() == expected_ids(range(1), 3)
    assert env.system.prepared == {}  # the unrecorded replacements were aborted
    record = env.store().get(0)
    assert record is not None and record.state is EpochState.COMMITTED


def test_a_recorded_replacement_that_is_lost_in_turn_is_salvaged_again(env: Env) -> None:
    crash_after_first_commit(env)
    with pytest.raises(InjectedFault):
        env.coordinator(FaultInjector([FaultRule("after-salvage-record", 0, "raise")])).start()
    record = env.store().get(0)
    assert record is not None
    first = [r for r, _ in record.salvaged]
    for name in first:  # the driver stayed down past the timeout again
        env.system.expire(name)
    env.coordinator().start()
    assert env.ids() == expected_ids(range(1), 3)
    record = env.store().get(0)
    assert record is not None and record.state is EpochState.COMMITTED
    assert [o for _, o in record.salvaged][2:] == first  # chains: original -> r1 -> r2


def test_every_sequence_of_salvage_crashes_ends_exactly_once(env: Env) -> None:
    """Crash at one salvage point, let the target abort whatever is prepared, crash at
    another, and so on: every order of the points, with or without expiry between."""
    for n, sequence in enumerate(itertools.product(SALVAGE_POINTS, repeat=2)):
        sub = Env(env.state_dir.parent / f"seq{n}")
        try:
            crash_after_first_commit(sub, partitions=2)
            crashes = 0
            for point in sequence:
                try:  # (nothing left to salvage once a replacement is committed)
                    sub.coordinator(FaultInjector([FaultRule(point, 0, "raise")])).start()
                except InjectedFault:
                    crashes += 1
                for name in list(sub.system.prepared):
                    sub.system.expire(name)
            assert crashes >= 1, sequence
            sub.coordinator().start()
            assert sub.ids() == expected_ids(range(1), 2), sequence
            assert sub.system.prepared == {}, sequence
        finally:
            from txsink.testing import memory

            memory.SYSTEMS.pop(sub.system_name, None)


def test_a_participant_whose_rows_are_gone_stays_lost_and_loud_and_the_remedy_holds(
        env: Env) -> None:
    lost = crash_after_first_commit(env)
    env.system.forget(lost[0])  # retention removed its rows; the other one is kept
    with pytest.raises(ParticipantLostError) as info:
        env.coordinator().start()
    assert lost[0] in str(info.value) and "gone" in str(info.value)
    record = env.store().get(0)
    assert record is not None and record.state is EpochState.DECIDED
    # The salvageable one was salvaged and committed; the lost one stays named.
    assert [o for _, o in record.salvaged] == [lost[1]]
    assert lost[0] in record.participants
    assert len(env.ids()) == 20
    # The documented remedy: resolve --abort --force keeps the committed participant and
    # the salvaged one, and Spark's replay writes only the lost one's partition.
    from txsink.cli import _force_abort

    operator = env.coordinator(owner="operator")
    operator.start(recover=False)
    _force_abort(operator, env.backend, env.store(), record)
    replay = env.coordinator(owner="run-2")
    replay.start()
    again = [env.prepare(0, p, attempt=5) for p in range(3)]
    assert replay.commit_epoch(0, again) is EpochOutcome.COMMITTED
    assert env.ids() == expected_ids(range(1), 3)
    assert env.system.prepared == {}


def test_a_backend_without_salvage_keeps_the_loss(env: Env,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from txsink.backend import Backend

    monkeypatch.setattr(type(env.backend), "salvage", Backend.salvage)
    lost = crash_after_first_commit(env)
    with pytest.raises(ParticipantLostError):
        env.coordinator().start()
    record = env.store().get(0)
    assert record is not None and record.state is EpochState.DECIDED
    assert record.salvaged == () and set(lost) <= record.participants


@pytest.mark.promise("kafka-salvage-never-twice", "backend")
def test_a_replay_of_a_salvaged_epoch_is_not_written_twice(env: Env) -> None:
    crash_after_first_commit(env)
    coord = env.coordinator()
    coord.start()
    again = [env.prepare(0, p, attempt=5) for p in range(3)]
    assert coord.commit_epoch(0, again) is EpochOutcome.REPLAYED
    assert env.ids() == expected_ids(range(1), 3)


def test_salvage_attempts_are_unique_and_far_above_task_attempts() -> None:
    a = salvage_attempt(now=1_800_000_000.0)
    assert is_salvage_attempt(a) and not is_salvage_attempt(10**9)
    assert salvage_attempt(a, now=1_800_000_000.0) == a + 1
    assert CommitOutcome.COMMITTED.value == "committed"


@pytest.mark.parametrize("when", ["before", "while"])
def test_a_fenced_driver_leaves_no_replacement_behind(env: Env, when: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver fenced before its salvage opens no replacement; one fenced while it
    salvaged (its record of the replacements is refused) aborts those it prepared: no
    decision names them, and left open (Kafka) they hold read_committed readers back."""
    crash_after_first_commit(env)
    salvaged: list[str] = []
    real = env.backend.salvage

    def counting(c: Any, ctx: Any) -> Any:
        salvaged.append(c.participant)
        return real(c, ctx)

    monkeypatch.setattr(env.backend, "salvage", counting)
    point = AFTER_FIRST_COMMIT if when == "before" else AFTER_SALVAGE_PREPARE

    def take_over(at: str, epoch: int | None) -> None:
        if at == point:
            env.store().acquire("the-next-driver")

    with pytest.raises(FencedError):
        env.coordinator(FaultInjector(callback=take_over)).start()
    assert bool(salvaged) == (when == "while"), salvaged
    assert env.system.prepared == {}  # nothing of the fenced driver is left open
    record = env.store().get(0)
    assert record is not None and record.state is EpochState.DECIDED and record.salvaged == ()
    env.coordinator().start()
    assert env.ids() == expected_ids(range(1), 3)
