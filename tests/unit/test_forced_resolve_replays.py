"""What an adversarial pass found in the forced resolve's kept partitions and in the
batch-write refusal beside a stream (issue 31); each test failed before its fix. Driven
through the entry-points model's harness (data source, grouped epochs, ``foreachBatch``,
CLI) on the in-memory backend. The oracle: every row once in every target, or a
refusal that names the problem and wrote nothing."""

from __future__ import annotations

import pyarrow as pa
import pytest
from txsink.cut import consistent_cut
from txsink.faults import AFTER_FIRST_COMMIT

from tests.operations_entry_points import SINK, EntryPointsModel, ResettableMemory


def _force(world: EntryPointsModel, epoch: int) -> str:
    code, text = world.cli("resolve", str(world.chk), "--epoch", str(epoch), "--abort",
                           "--force")
    assert code == 0, text
    world.new_run()  # the operator stopped the query; it is started again after
    return text


def _rows(world: EntryPointsModel, target: str, wid: int) -> list[int]:
    return sorted(i for _, _, i in world.visible(target) if i // 1000 == wid)


# Found (F1): a second forced resolve of the same foreachBatch identity overwrites
# meta.kept_writes[key] with the new epoch; the partitions the first resolve kept are
# written again
@pytest.mark.parametrize("kind", ["single", "group"])
def test_two_forced_resolves_of_one_foreach_batch_write_never_write_a_kept_partition_twice(
        world: EntryPointsModel, kind: str) -> None:
    world.choose(kind, "foreachBatch")
    parts = 3 if kind == "single" else 2
    crashed = world.run_one("stream", parts=parts, kill=AFTER_FIRST_COMMIT)
    assert crashed.state == "failed"
    _force(world, 0)  # partition 0 (of target a) kept, at epoch 0
    again = world.run_one("stream", kill=AFTER_FIRST_COMMIT)  # the replay, killed again
    assert again.state == "failed"
    # The replay is written under the epoch it replays (0): partition 1 (of target a)
    # is kept now too, beside partition 0.
    _force(world, 0)
    replay = world.run_one("stream")
    assert replay.state == "ok", replay.error
    for t in world.names:
        rows = _rows(world, t, crashed.data.wid)
        assert rows == sorted(crashed.data.ids()), f"target {t} holds {rows}"


# Found (F2): the data source stream's replay of an epoch given up by resolve --force is refused
# at every commit ('the target holds part of this epoch committed, but the state has no
# decision'): Backend.abort_orphans asks `in protected` before its up_to_epoch filter, so
# recover(up_to_epoch=N-1) refuses the replay's own participants of N; the documented
# remedy never works
@pytest.mark.promise("forced-resolve-replay-writes-rest", "datasource")
@pytest.mark.parametrize("kind", ["single", "group"])
def test_a_data_source_stream_replays_an_epoch_given_up_by_a_forced_resolve(
        world: EntryPointsModel, kind: str) -> None:
    world.choose(kind, "datasource")
    assert world.run_one("stream").state == "ok"  # epoch 0
    crashed = world.run_one("stream", parts=2, kill=AFTER_FIRST_COMMIT)  # epoch 1
    assert crashed.state == "failed"
    assert "stay visible" in _force(world, 1)
    errors = []
    for _ in range(3):  # restart the query (the documented remedy); and again
        replay = world.run_one("stream")
        if replay.state == "ok":
            break
        errors.append(replay.error)
        # what the refusal says to do next
        world.cli("resolve", str(world.chk), "--epoch", "1", "--abort")
        world.new_run()
    assert replay.state == "ok", errors[-1]
    for t in world.names:
        assert _rows(world, t, crashed.data.wid) == sorted(crashed.data.ids())
    world.exact_or_loud()


# Found (F3): a grouped foreachBatch replay after a forced resolve writes the other targets' rows
# under a new epoch, so one write is epoch 0 in target a and epoch 1 in target b; the cut
# names epoch 0, which b lacks
@pytest.mark.promise("forced-resolve-replay-writes-rest", "grouped")
@pytest.mark.parametrize("parts", [1, 2])
def test_a_grouped_foreach_batch_replay_keeps_one_epoch_number_in_every_target(
        world: EntryPointsModel, parts: int) -> None:
    world.choose("group", "foreachBatch")
    crashed = world.run_one("stream", parts=parts, kill=AFTER_FIRST_COMMIT)
    assert crashed.state == "failed"
    _force(world, 0)  # target a's partition 0 committed and kept, b's dropped
    replay = world.run_one("stream")
    assert replay.state == "ok", replay.error
    for t in world.names:  # the write is whole in each target now
        assert _rows(world, t, crashed.data.wid) == sorted(crashed.data.ids())
    epochs = {t: {e for e, _, i in world.visible(t) if i // 1000 == crashed.data.wid}
              for t in world.names}
    cut = consistent_cut(world.cut_backend(), world.store(), SINK).cut
    assert len(set(map(frozenset, epochs.values()))) == 1, (
        f"one write, different epochs per target: {epochs}; cut {cut}")
    for e in range(cut + 1):
        assert all(e in world.held(t) for t in world.names), f"cut {cut} names {e}"


# Found (F4): the kept partitions are matched by partition index only; a replay with another
# partitioning (same rows) drops the rows that moved out of the kept partition's index,
# and reports success (only a WARNING)
@pytest.mark.promise("forced-resolve-replay-partitioned-differently-refused", "datasource",
                     "grouped")
@pytest.mark.parametrize("kind", ["single", "group"])
def test_a_replay_with_another_partitioning_loses_no_row(
        world: EntryPointsModel, kind: str) -> None:
    world.choose(kind, "foreachBatch")
    crashed = world.run_one("stream", parts=2, kill=AFTER_FIRST_COMMIT)
    assert crashed.state == "failed"
    _force(world, 0)
    data = crashed.data
    every = sorted(data.ids())
    # Spark replays the same rows in one partition (a coalesce, another
    # minPartitions, a changed repartition(n) in the foreachBatch function)
    data.parts = 1
    data.batch = lambda p: pa.record_batch({"id": pa.array(every, pa.int64())})  # type: ignore[method-assign]
    replay = world.run_one("stream")
    if replay.state == "failed":  # refused loudly: fine if nothing more was written
        assert replay.error.startswith(("StateError", "CheckpointChangedError")), replay.error
        return
    for t in world.names:
        assert _rows(world, t, data.wid) == every, f"target {t}: success, but rows lost"


# Found (F5): a batch write in the stream's driver that reserves between bind_stream's
# used_in_state() and its held_by_targets() gets epoch 0 = stream_from; reserve_epoch's
# re-check passes (stream_from not written yet). The batch write commits, and the stream's
# batch 0 is refused at every restart (wedged)
@pytest.mark.parametrize("kind", ["single", "group"])
def test_a_batch_write_racing_the_streams_first_bind_never_takes_its_epoch(
        world: EntryPointsModel, kind: str) -> None:
    world.choose(kind, "datasource")
    stream, backfill = world.make_op("stream"), world.make_op("backfill")
    world.ops = [stream, backfill]
    # bind_stream reads used_in_state(), then asks the targets (highest_epoch): the
    # backfill's writer is constructed (reserves its epoch) in between
    ResettableMemory.before_highest = lambda: world.advance(backfill)
    try:
        world.advance(stream)  # planned: the stream binds the state
    finally:
        ResettableMemory.before_highest = None
    while backfill.state == "running":
        world.advance(backfill)
    while stream.state == "running":
        world.advance(stream)
    world.ops = []
    if stream.state == "failed":
        stream = world.run_one("stream")  # the query restarts
    assert stream.state == "ok", (
        f"backfill {backfill.state}; the stream's batch 0 is refused: {stream.error[:200]}")
    world.exact_or_loud()


@pytest.mark.promise("forced-resolve-kept-version-new-query-refused", "datasource", "grouped")
@pytest.mark.parametrize("kind", ["single", "group"])
def test_a_new_querys_write_of_a_kept_identity_is_refused_not_partly_dropped(
        world: EntryPointsModel, kind: str) -> None:
    """A forced resolve kept part of ``foreachBatch`` batch 0 of query q-0; then the
    stream's checkpoint is replaced (a new query, batch ids from 0 again). Its batch 0
    has the same ``app_id@version`` but other rows: taken for the replay, its rows in
    the kept partitions would be dropped. Refused instead, nothing written."""
    world.choose(kind, "foreachBatch")
    crashed = world.run_one("stream", parts=2, kill=AFTER_FIRST_COMMIT)
    assert crashed.state == "failed"
    _force(world, 0)
    before = {t: world.visible(t) for t in world.names}
    world.new_stream_checkpoint()
    other = world.run_one("stream", parts=2)
    if other.state == "ok":
        world.exact_or_loud()
        for t in world.names:
            assert _rows(world, t, other.data.wid) == sorted(other.data.ids())
        return
    assert other.error.startswith(("CheckpointChangedError", "StateError")), other.error
    assert "txnAppId of their own" in other.error or "checkpoint" in other.error
    assert {t: world.visible(t) for t in world.names} == before
