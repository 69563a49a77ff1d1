"""The model-based test of operations (see :mod:`tests.operations_model`) on the
directory state store: a few hundred sequences in the default run, tens of thousands
in ``tox -e operations-long``; and the counterexamples it found, as regression tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import settings
from txsink.errors import StateError
from txsink.faults import AFTER_FIRST_COMMIT, FaultInjector, FaultRule, InjectedFault

from tests.operations_model import DirectoryOperations, settings_for

from .conftest import Env, expected_ids

TestDirectoryOperations = DirectoryOperations.TestCase
TestDirectoryOperations.settings = settings(**settings_for(300))


def test_a_state_restored_mid_commit_stops_instead_of_aborting_the_rest(env: Env) -> None:
    """Found by the model: the state is restored from a copy taken before an epoch's
    decision while that epoch was half committed. The restored state knows nothing of
    it; the orphan scan aborted its prepared rest, leaving the epoch half visible."""
    env.coordinator(owner="run-1").start()
    backup = env.state_dir.parent / "backup"
    shutil.copytree(env.state_dir, backup)
    crashing = env.coordinator(owner="run-1",
                               faults=FaultInjector([FaultRule(AFTER_FIRST_COMMIT, 0, "raise")]))
    with pytest.raises(InjectedFault):
        crashing.commit_epoch(0, env.prepare_epoch(0, partitions=2))
    newest = env.state_dir.parent / "newest"
    shutil.copytree(env.state_dir, newest)
    _put_back(env.state_dir, backup)
    with pytest.raises(StateError, match="has no decision for it") as err:
        env.coordinator(owner="run-2").start()
    assert "Restore the newest state" in str(err.value)
    assert len(env.system.prepared) == 1  # the rest of the epoch: neither committed nor aborted
    # The remedy: the newest state; its next start finishes the epoch.
    _put_back(env.state_dir, newest)
    env.coordinator(owner="run-3").start()
    assert env.ids() == expected_ids(range(1), 2)
    assert env.system.prepared == {}


def test_a_failed_attempt_of_a_replay_after_a_state_restore_is_loud_with_a_way_on(
        env: Env) -> None:
    """Found by the model: after a restore of an older state, Spark's replay of a held
    epoch is aborted, but a failed task attempt of it stays prepared; txsink cannot
    tell it from the rest of a lost decision, so it stops, and ``resolve --abort``
    is the way on."""
    coord = env.coordinator(owner="run-1")
    coord.start()
    backup = env.state_dir.parent / "backup"
    shutil.copytree(env.state_dir, backup)
    coord.commit_epoch(0, env.prepare_epoch(0, partitions=2))
    _put_back(env.state_dir, backup)
    replay = env.coordinator(owner="run-2")
    replay.start()
    env.prepare(0, 0, attempt=9)  # the replay's failed attempt
    replay.commit_epoch(0, env.prepare_epoch(0, partitions=2))  # held by the target
    with pytest.raises(StateError, match="resolve CHECKPOINT --epoch 0 --abort"):
        env.coordinator(owner="run-3").start()
    operator = env.coordinator(owner="operator")
    operator.start(recover=False)
    operator.abort_epoch(0, [c for c in env.backend.list_prepared("unit-sink")
                             if c.epoch == 0])
    env.coordinator(owner="run-4").start()
    assert env.ids() == expected_ids(range(1), 2)
    assert env.system.prepared == {}


def _put_back(state: Path, copy: Path) -> None:
    shutil.rmtree(state)
    shutil.copytree(copy, state)
