"""The model-based test of operations (see :mod:`tests.operations_model`) on the
directory state store: a few hundred sequences in the default run, tens of thousands
in ``tox -e operations-long``; and the counterexamples it found, as regression tests."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from txsink.cut import consistent_cut
from txsink.errors import StateError
from txsink.faults import AFTER_FIRST_COMMIT, FaultInjector, FaultRule, InjectedFault

from tests import operations_entry_points
from tests.operations_entry_points import SINK, EntryPointsModel, Op, ResettableMemory
from tests.operations_model import DirectoryOperations, settings_for

from .conftest import Env, expected_ids

TestDirectoryOperations = DirectoryOperations.TestCase
TestDirectoryOperations.settings = settings(**settings_for(300))
#: Every public entry point (data source, grouped epochs, CLI), on a sink and a group.
TestEntryPoints = EntryPointsModel.TestCase
TestEntryPoints.settings = settings(**operations_entry_points.settings_for(300))


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


# -- what the entry-points model found (issue 31) ------------------------------------------
#
# Each test drives the public entry points the way the model does (data source, grouped
# epochs, CLI) and asks for the model's oracle: the write is exact in every target, or
# it was refused loudly and wrote nothing. The strict xfails name the item of issue 31
# whose fix makes them pass; remove the mark (and the item from
# ``operations_entry_points.KNOWN_ISSUES``) when merging it. The tests of items 1, 2,
# 3 and 5 failed before the identity branch's fixes (merged here) and pass since.




def _exact_or_loud(world: EntryPointsModel, op: Op) -> None:
    """``op`` is in every target exactly, or it was refused (a TxsinkError) with none of
    its rows anywhere."""
    held = {t: sorted(i for _, _, i in world.visible(t) if i // 1000 == op.data.wid)
            for t in world.names}
    if op.state == "failed":
        assert op.error.split(":")[0] in _LOUD, f"{op.what} failed without a refusal: {op.error}"
        assert not any(held.values()), f"{op.what} was refused but wrote {held}"
        return
    assert op.state == "ok"
    for t, ids in held.items():
        assert ids == sorted(op.data.ids()), (
            f"{op.what} succeeded, but target {t} holds {len(ids)} of its "
            f"{len(op.data.ids())} rows")


_LOUD = {"StateError", "CheckpointChangedError", "ConfigError", "FencedError"}


@pytest.mark.promise("backfill-then-stream-above", "datasource")
def test_a_stream_after_a_backfill_on_one_groups_state_writes_its_batches(
        world: EntryPointsModel) -> None:
    """Found by the model: ``TargetSet.write(df)`` (a backfill) then ``write_stream(df)``
    on the same checkpoint: the stream's batch 0 ends without an error, in no target."""
    world.choose("group", "datasource")
    _exact_or_loud(world, world.run_one("backfill"))
    _exact_or_loud(world, world.run_one("stream"))


@pytest.mark.promise("batch-into-stream-refused", "datasource")
def test_a_batch_write_between_two_stream_batches_does_not_drop_the_next_batch(
        world: EntryPointsModel) -> None:
    """Found by the model, on one sink: stream batch 0, a batch write (epoch 1), then
    stream batch 1 was taken for a replay of epoch 1 and dropped. Since the fix the
    batch write on a stream's state is refused."""
    world.choose("single", "datasource")
    assert world.run_one("stream").state == "ok"
    _exact_or_loud(world, world.run_one("backfill"))  # since the fix: refused, loudly
    _exact_or_loud(world, world.run_one("stream"))


@pytest.mark.promise("app-id-one-writer", "datasource", "grouped")
@pytest.mark.parametrize("kind", ["group", "single"])
def test_foreach_batch_versions_are_not_skipped_for_a_batch_jobs_version(
        world: EntryPointsModel, kind: str) -> None:
    """Found by the model: a batch job ``epoch(spark, version=1)`` (one sink:
    ``txnAppId``/``txnVersion=1``), then the documented ``foreachBatch`` pattern with
    ``version=batch_id`` on the same sink: batches 0 and 1 are skipped as written."""
    world.choose(kind, "foreachBatch")
    assert world.run_one("grouped job", version=1).state == "ok"
    for _ in range(2):
        _exact_or_loud(world, world.run_one("stream"))


@pytest.mark.promise("given-up-epoch-never-reused", "grouped")
def test_an_epoch_number_given_up_by_a_forced_resolve_is_never_reused(
        world: EntryPointsModel) -> None:
    """The model's operations as item 3 tells it: a grouped write is killed with target
    a committed and b not;
    ``txsink resolve --epoch N --abort --force`` keeps a's rows; the next batch write
    gets epoch N again, so N holds two writes' rows in a and another's in b."""
    world.choose("group", "datasource")
    crashed = world.run_one("grouped", kill=AFTER_FIRST_COMMIT)
    assert crashed.state == "failed"
    code, text = world.cli("resolve", str(world.chk), "--epoch", "0", "--abort", "--force")
    assert code == 0, text
    later = world.run_one("backfill")
    _exact_or_loud(world, later)  # today: a's part is taken for the kept one, and dropped
    at_0 = {t: {i // 1000 for e, _, i in world.visible(t) if e == 0} for t in world.names}
    assert at_0 == {"a": {crashed.data.wid}, "b": set()}, f"epoch 0 now holds {at_0}"


@pytest.mark.parametrize("names", [("a",), ("a", "c")], ids=["removed", "renamed"])
def test_reset_after_a_target_changed_in_the_file_resets_every_target_or_none(
        world: EntryPointsModel, names: tuple[str, ...]) -> None:
    """Found by the model: ``txsink reset`` with target b removed from (or renamed in)
    the pipeline file deletes target a's output and the state, says it started over,
    and leaves b's rows, which no state knows any more."""
    world.choose("group", "datasource")
    assert world.run_one("stream").state == "ok"
    world.write_pipeline(names)
    code, text = world.cli("reset", str(world.pipeline), "--yes", "--force")
    held = {t: len(world.visible(t)) for t in world.names}
    if code == 0:
        assert not any(held.values()), f"reset said it started over: {text}; left {held}"
    else:
        assert all(held.values()) and world.records(), f"refused ({text}) but deleted {held}"


def _cut_around(world: EntryPointsModel, race: Any) -> int:
    """``txsink cut``'s computation, with ``race`` run after it read the state and
    before it asks the targets (what a write in flight does to a reader)."""
    ResettableMemory.before_highest = race
    try:
        return consistent_cut(world.cut_backend(), world.store(), SINK).cut
    finally:
        ResettableMemory.before_highest = None


@pytest.mark.promise("cut-below-unfinished", "cli")
def test_a_cut_read_while_a_stream_batch_commits_never_names_it_in_part(
        world: EntryPointsModel) -> None:
    """The model's cut read around a write's steps: the cut reads the state
    (nothing unfinished), the stream's batch 1 (two partitions) is decided and one
    participant committed when the driver dies, then the cut asks the target, which
    shows epoch 1: the cut names it with half its rows; recovery adds the rest later,
    below the cut the reader already took."""
    world.choose("single", "datasource")
    assert world.run_one("stream").state == "ok"
    op = world.make_op("stream", parts=2)
    world.ops = [op]
    with world.faults(AFTER_FIRST_COMMIT, None, None):
        world.advance(op)  # planned
        world.advance(op)  # prepared
        cut = _cut_around(world, lambda: world.advance(op))  # decided, half committed
    assert op.state == "failed"
    rows = sorted(i for e, _, i in world.visible(SINK) if e == 1)
    assert cut < 1 or rows == sorted(op.data.ids()), f"cut {cut} names epoch 1 with rows {rows}"


def test_a_cut_read_while_two_grouped_writes_are_in_flight_never_passes_either(
        world: EntryPointsModel) -> None:
    """The model's cut read around two grouped writes: the cut reads the state; grouped
    write A reserves epoch 1;
    grouped write B reserves epoch 2 and commits in both targets; the cut asks the
    targets (both hold 2) and names 2; then A commits epoch 1, below the cut: a
    reader resuming after it never sees A's rows."""
    world.choose("group", "datasource")
    assert world.run_one("grouped").state == "ok"
    a, b = world.make_op("grouped"), world.make_op("grouped")
    world.ops = [a, b]

    def race() -> None:
        world.advance(a)  # A reserved
        while b.state == "running":
            world.advance(b)

    cut = _cut_around(world, race)
    while a.state == "running":
        world.advance(a)
    assert a.state == b.state == "ok"
    epoch_a = {e for e, _, i in world.visible("a") if i // 1000 == a.data.wid}
    assert min(epoch_a) > cut, f"cut {cut} was read before A's epoch {epoch_a} committed"


def test_a_backfill_started_while_a_stream_batch_is_in_flight_leaves_the_batch_alone(
        world: EntryPointsModel) -> None:
    """Found by the long model run: a backfill, then the stream (bound above it), then a
    second backfill started in the same driver while the stream's next batch was
    prepared. The backfill's start ran recovery before it was refused; its orphan scan
    aborted the stream's prepared participants, whose commit then found their rows
    gone. A batch write beside a stream is refused before recovery and the lease."""
    world.choose("group", "datasource")
    _exact_or_loud(world, world.run_one("backfill"))
    world.restart_query()  # the query starts: the stream binds above the backfill
    stream, backfill = world.make_op("stream"), world.make_op("backfill")
    world.ops = [stream, backfill]
    world.advance(stream)  # planned
    world.advance(stream)  # prepared in both targets
    lease = world.store().lease_info()
    world.advance(backfill)
    assert backfill.state == "failed" and "StateError" in backfill.error, backfill.error
    assert world.store().lease_info() == lease, "the refused backfill took the lease"
    while stream.state == "running":
        world.advance(stream)
    _exact_or_loud(world, stream)


@pytest.mark.promise("forced-resolve-replay-writes-rest", "datasource", "grouped")
@pytest.mark.parametrize("kind", ["group", "single"])
def test_a_foreach_batch_replay_after_a_forced_resolve_skips_the_kept_partitions(
        world: EntryPointsModel, kind: str) -> None:
    """Found by the 20,000-sequence model run: ``foreachBatch`` with ``version=batch_id``,
    the driver killed after the first participant committed, then
    ``txsink resolve --epoch 0 --abort --force`` (that participant stays visible). Spark
    replays batch 0; its identity gets a new epoch, so the kept partitions, recorded under
    the old one, were not found: the kept rows were written a second time."""
    world.choose(kind, "foreachBatch")
    crashed = world.run_one("stream", parts=2 if kind == "single" else 1,
                   kill=AFTER_FIRST_COMMIT)
    assert crashed.state == "failed"
    code, text = world.cli("resolve", str(world.chk), "--epoch", "0", "--abort", "--force")
    assert code == 0, text
    assert "stay visible" in text
    replay = world.run_one("stream")
    assert replay.state == "ok", replay.error
    for t in world.names:
        ids = sorted(i for _, _, i in world.visible(t))
        assert ids == sorted(crashed.data.ids()), f"target {t} holds {ids}"
    world.exact_or_loud()


class _Script:
    """The draws of one recorded model step, in order (hypothesis's ``data`` stand-in)."""

    def __init__(self, *values: Any) -> None:
        self.values = list(values)

    def draw(self, strategy: Any, label: str | None = None) -> Any:
        return self.values.pop(0)


def test_a_stream_start_failing_after_its_first_state_write_is_not_taken_for_an_old_stream(
        world: EntryPointsModel) -> None:
    """Found by the 20,000-sequence model run: a stream's first start wrote the query id,
    then failed (a store error) before it wrote where its epochs start. The next start
    took the state for an older release's stream (epochs = batch ids) although a batch
    write had committed epoch 1 meanwhile; batch 0 became epoch 0, below the committed
    watermark, and was dropped as a replay. The query id is written with stream_from."""
    world.choose("group", "datasource")
    # a backfill reserves epoch 0 and its driver dies before anything else
    EntryPointsModel.writes(world, _Script("backfill", 0, 1, False, False, False, [0], None,
                                           1, None, None, None))
    # a backfill and the stream at once; the 4th state write fails after it took effect
    # (the stream's first one)
    EntryPointsModel.writes(world, _Script("backfill", 0, 1, False, False, True, "stream", 0,
                                           1, [0, 1], None, None, None, None, (4, True)))
    world.stream_runs(1)  # the oracle: the batch's rows are in every target
    world.exact_or_loud()


@pytest.mark.promise("cut-only-grows", "cli")
def test_a_cut_stays_below_an_epoch_a_forced_resolve_kept_in_part(
        world: EntryPointsModel) -> None:
    """Found by the 20,000-sequence model run: stream batch 1 (two partitions) is killed
    after its first commit; ``resolve --epoch 1 --abort --force`` keeps that partition
    and gives the epoch up. The cut then named epoch 1, and the replay's other partition
    landed below a cut a reader had already taken: the reader never saw those rows. An
    epoch given up in part is unfinished until its replay."""
    world.choose("single", "datasource")
    EntryPointsModel.writes(world, _Script("stream", 0, 1, False, False, False, [], None,
                                           None, None, None, None))
    EntryPointsModel.writes(world, _Script("stream", 0, 2, True, False, False, [], None,
                                           None, AFTER_FIRST_COMMIT, None, None))
    world.resolve(_Script(1), "--force")  # type: ignore[arg-type]
    cut = consistent_cut(world.cut_backend(), world.store(), SINK)
    assert cut.cut == 0 and cut.unfinished is not None and cut.unfinished[0] == 1, cut
    # the replay, with a cut read before it: the model checks the reader's rows stay put
    EntryPointsModel.writes(world, _Script("stream", 0, 2, False, False, False, [], (0, 0),
                                           None, None, None, None))
    world.exact_or_loud()
    assert consistent_cut(world.cut_backend(), world.store(), SINK).cut == 1
