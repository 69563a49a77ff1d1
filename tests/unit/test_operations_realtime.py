"""The model-based test of Real-time Mode (see :mod:`tests.operations_realtime`): a few
hundred sequences in the default run, thousands in ``tox -e operations-long``; and the
counterexamples it found, as regression tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import settings

from tests.operations_realtime import RealtimeModel, settings_for

TestRealtime = RealtimeModel.TestCase
TestRealtime.settings = settings(**settings_for(300))


@pytest.fixture
def rt() -> Iterator[RealtimeModel]:
    model = RealtimeModel()
    model.strict = True
    yield model
    model.teardown()


@pytest.mark.parametrize("kind", ["single", "group"])
def test_a_recreated_source_topics_records_land_once_or_the_start_is_refused(
        rt: RealtimeModel, kind: str) -> None:
    """Found by the model (issue 39 item 15, fixed since by keying positions by topic
    id): records at offsets 0-1 written; the source topic is deleted and created again
    (offsets from 0, a new topic id); Spark refuses its checkpoint (the offsets went
    backwards) and the query starts on a new one from the earliest offsets. The target's
    positions, of the old topic, skipped the new records: lost, silently. Now the start
    is refused naming the topic; the model deletes that topic's positions and starts on a
    new checkpoint, as the refusal says, and every new record lands once."""
    rt.choose(kind, 1)
    rt.batch_runs(grow=2, per_record=True, kill=None)
    rt.topic_recreated()


@pytest.mark.promise("realtime-reset-fences-old-run", "realtime")
def test_a_zombie_task_during_a_start_over_is_fenced(rt: RealtimeModel) -> None:
    """Found by the model (a group, one source partition): a batch's driver is killed
    while one task has not read its first record yet (it starts at offset 2; the targets
    hold offsets 0-1); the operator starts over as docs/realtime.md says (``txsink
    reset``, which deletes the positions and the checkpoint, then the targets emptied, then
    a run from the earliest offsets: "a task of a dead driver that still writes is fenced
    by the reset"). While the new run is under way (it committed offset 0), the dead
    driver's task goes on: nothing fenced it (it held no session), so it claims the source
    partition (fencing the new run), writes its record at offset 2 and stores position 2.
    The new run fails, runs again, finds position 2 and skips offset 1: lost. Now the
    run's generation, drawn when the driver prepared the targets, is older than the one
    the reset recorded: the task's claim is refused (FencedError) before it fences or
    writes anything, and the new run lands every record once."""
    rt.choose("group", 1)
    rt.start_over(zombie_meanwhile=False)
    rt.start_over(zombie_meanwhile=False)
    rt.batch_runs(grow=1, per_record=False, kill=0)
    rt.start_over(zombie_meanwhile=True)


def test_a_targets_positions_deleted_with_its_rows_kept_are_not_written_twice(
        rt: RealtimeModel) -> None:
    """Found by the model: a group ran; target a's positions are deleted (its rows kept).
    The start is refused (a holds no position where b does) and names the way out:
    a new checkpoint from the earliest offsets. Followed literally, a receives every
    record again: each twice. The oracle: every record once in every target, or a way
    out that keeps it so (empty the target as well, or a refusal that says so). The
    refusal now says to delete the rows it kept first."""
    rt.choose("group", 1)
    rt.batch_runs(grow=2, per_record=True, kill=None)
    rt.positions_deleted("a", emptied=False)


def test_a_start_over_with_a_zombie_fenced_and_a_group_caught_up(rt: RealtimeModel) -> None:
    """The model's other paths, held: a driver killed mid-batch (a zombie goes on while
    the next run's batch is under way, and is fenced), a checkpoint deleted (from latest,
    then earliest), a target's positions and rows deleted and caught up from earliest."""
    rt.choose("group", 2)
    rt.batch_runs(grow=2, per_record=True, kill=3)
    rt.zombie_goes_on(records=2, meanwhile=True)
    rt.checkpoint_deleted(earliest=False)
    rt.checkpoint_deleted(earliest=True)
    rt.positions_deleted("b", emptied=True)
    rt.start_over(zombie_meanwhile=False)
