"""One epoch number, one set of rows, in every target, forever (core, in-memory targets).

* a write is a replay of another only if the state recorded the same identity for
  the epoch (a stream's query and batch, a batch write's txnAppId, version and driving
  query), never by the number alone: otherwise it is refused, loudly;
* a fresh epoch is above every number ever used, also one a forced resolve gave up;
* the consistent cut never names an epoch that is still being written.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from txsink.config import load_pipeline
from txsink.coordinator import Coordinator, EpochOutcome
from txsink.cut import consistent_cut
from txsink.errors import StateError
from txsink.faults import AFTER_FIRST_COMMIT, POINTS, FaultInjector, FaultRule, InjectedFault
from txsink.group import TargetGroup, write_group
from txsink.model import Committable, DeliveryGuarantee
from txsink.state import DirectoryStateStore, EpochState, WriteId

from .conftest import Env, expected_ids
from .test_group import GroupEnv

WAIT_S = 30.0


class _PausingStore(DirectoryStateStore):
    """A state store that runs ``pause`` once, right after its first ``states()`` read."""

    def __init__(self, path: Path, pause: Callable[[], None]) -> None:
        super().__init__(path)
        self._pause: Callable[[], None] | None = pause

    def states(self) -> dict[int, EpochState]:
        out = super().states()
        pause, self._pause = self._pause, None
        if pause is not None:
            pause()
        return out


def _wait(event: threading.Event, what: str) -> None:
    assert event.wait(WAIT_S), f"timed out waiting for {what}"


@pytest.mark.promise("cut-below-unfinished", "cli")
def test_the_cut_never_names_an_epoch_a_stream_is_still_committing(env: Env) -> None:
    """A reader's cut taken while epoch 1 is committed one participant after the other
    (the state read before the decision, the target after its first commit) named
    epoch 1: a reader resuming after it never saw the other participants' rows."""
    coord = env.coordinator()
    coord.start()
    coord.commit_epoch(0, env.prepare_epoch(0))
    state_read, partly, cut_done = threading.Event(), threading.Event(), threading.Event()

    def after_first_commit(point: str, epoch: int | None) -> None:
        if point == AFTER_FIRST_COMMIT and epoch == 1:
            partly.set()
            _wait(cut_done, "the cut")

    coord.faults = FaultInjector(callback=after_first_commit)
    found: list[int] = []

    def read_cut() -> None:
        def pause() -> None:
            state_read.set()
            _wait(partly, "epoch 1 to be committed in part")

        try:
            found.append(consistent_cut(env.backend, _PausingStore(env.state_dir, pause),
                                        "unit-sink").cut)
        finally:
            cut_done.set()

    reader = threading.Thread(target=read_cut)
    reader.start()
    _wait(state_read, "the cut's first read of the state")
    coord.commit_epoch(1, env.prepare_epoch(1))
    reader.join(WAIT_S)
    assert found == [0], "the cut named an epoch only part of whose participants are committed"
    assert consistent_cut(env.backend, env.store(), "unit-sink").cut == 1


@pytest.mark.promise("cut-below-unfinished", "cli")
def test_the_cut_never_passes_a_grouped_write_still_in_flight(tmp_path: Path) -> None:
    """Two batch writes of a group: the later one committed in every target while the
    earlier one is still preparing. The cut named the later epoch, so readers skipped
    the earlier one for good."""
    genv = GroupEnv(tmp_path)
    coord = genv.coordinator(owner="driver")
    coord.start()
    coord.commit_epoch(0, genv.prepare(0))
    state_read, both_written = threading.Event(), threading.Event()
    found: list[int] = []

    def read_cut() -> None:
        def pause() -> None:
            state_read.set()
            _wait(both_written, "the two writes")

        group = genv.group()
        try:
            found.append(consistent_cut(group, _PausingStore(genv.state_dir, pause),
                                        "orders").cut)
        finally:
            group.close()

    reader = threading.Thread(target=read_cut)
    reader.start()
    _wait(state_read, "the cut's first read of the state")
    first, second = coord.reserve_epoch(), coord.reserve_epoch()
    assert (first, second) == (1, 2)
    coord.commit_epoch(second, genv.prepare(second))  # the first is still preparing
    both_written.set()
    reader.join(WAIT_S)
    assert found == [0], "the cut passed an epoch that no target holds yet"
    coord.commit_epoch(first, genv.prepare(first))
    group = genv.group()
    try:
        assert consistent_cut(group, genv.store(), "orders").cut == 2
    finally:
        group.close()


def test_the_cut_of_a_files_sink_mid_commit_stops_below_the_epoch(tmp_path: Path) -> None:
    """The same on a real target (the files backend: its epoch markers are what the cut
    reads), epoch 1 of an ordinary stream committed one participant after the other."""
    import pyarrow as pa
    from txsink.model import TransactionContext
    from txsink.plugins import get_plugins
    from txsink.writer import write_participant

    backend = get_plugins().create_backend("files", {"path": str(tmp_path / "out")})
    coord = Coordinator(backend, DirectoryStateStore(tmp_path / "state"), "files-cut",
                        faults=FaultInjector())
    coord.start()

    def prepare(epoch: int) -> list[Any]:
        return [write_participant(backend, TransactionContext("files-cut", epoch, p, 0), [
            pa.record_batch({"id": pa.array([epoch * 10 + p], pa.int64())})])
            for p in range(2)]

    coord.commit_epoch(0, prepare(0))
    state_read, partly, cut_done = threading.Event(), threading.Event(), threading.Event()

    def after_first_commit(point: str, epoch: int | None) -> None:
        if point == AFTER_FIRST_COMMIT and epoch == 1:
            partly.set()
            _wait(cut_done, "the cut")

    coord.faults = FaultInjector(callback=after_first_commit)
    found: list[int] = []

    def read_cut() -> None:
        def pause() -> None:
            state_read.set()
            _wait(partly, "epoch 1 to be committed in part")

        reader_backend = get_plugins().create_backend("files", {"path": str(tmp_path / "out")})
        try:
            found.append(consistent_cut(reader_backend, _PausingStore(tmp_path / "state", pause),
                                        "files-cut").cut)
        finally:
            reader_backend.close()
            cut_done.set()

    reader = threading.Thread(target=read_cut)
    reader.start()
    _wait(state_read, "the cut's first read of the state")
    coord.commit_epoch(1, prepare(1))
    reader.join(WAIT_S)
    backend.close()
    assert found == [0], "the cut named an epoch one of whose files is not published yet"


# -- item 1: a stream and batch writes on one state -----------------------------------------


def test_a_stream_after_a_backfill_writes_every_batch_after_the_backfills_epochs(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    """A backfill (two batch writes: epochs 0 and 1), then a stream on the same state:
    its batches 0 and 1 were taken for replays of the backfill's epochs and dropped."""
    backfill = env.coordinator(owner="batch-job")
    backfill.start()
    for _ in range(2):
        epoch = backfill.reserve_epoch()
        assert backfill.commit_epoch(epoch, env.prepare_epoch(epoch)) is EpochOutcome.COMMITTED
    stream = env.coordinator(owner="stream")
    stream.start(query_id="q-1", stream=True)
    assert [stream.stream_epoch(b) for b in range(3)] == [2, 3, 4]
    assert "the stream's micro-batch b is epoch 2 + b" in caplog.text
    for batch_id in range(3):
        epoch = stream.stream_epoch(batch_id)
        assert stream.commit_epoch(epoch, env.prepare_epoch(epoch)) is EpochOutcome.COMMITTED
    # Spark replays the last batch (its commit log was not written): one copy stays.
    again = env.coordinator(owner="stream-2")
    again.start(query_id="q-1", stream=True)
    replay = [env.prepare(again.stream_epoch(2), p, attempt=1) for p in range(3)]
    assert again.commit_epoch(again.stream_epoch(2), replay) is EpochOutcome.REPLAYED
    assert env.ids() == expected_ids(range(5), 3)
    assert env.system.prepared == {}
    records = env.store().records()
    assert [records[e].origin for e in range(5)] == ["batch"] * 2 + ["stream"] * 3
    assert {records[e].query_id for e in range(2, 5)} == {"q-1"}


def test_a_batch_write_on_a_streams_state_is_refused_before_anything_is_written(
        env: Env) -> None:
    """A batch write between two runs of a stream took the number of the stream's next
    batch, which the stream then dropped as a replay."""
    stream = env.coordinator(owner="stream")
    stream.start(query_id="q-1", stream=True)
    stream.commit_epoch(0, env.prepare_epoch(0))
    job = env.coordinator(owner="batch-job")
    with pytest.raises(StateError, match="a streaming query writes through") as err:
        job.reserve_epoch()
    assert "Nothing of this batch write was written" in str(err.value)
    assert "\n" not in str(err.value)
    assert list(env.store().records()) == [0]  # no reservation left behind
    again = env.coordinator(owner="stream-2")
    again.start(query_id="q-1", stream=True)
    assert again.commit_epoch(again.stream_epoch(1), env.prepare_epoch(1)) is (
        EpochOutcome.COMMITTED)
    assert env.ids() == expected_ids(range(2), 3)


def test_a_micro_batch_never_takes_a_batch_writes_epoch_for_its_own(env: Env) -> None:
    """The number alone never makes a replay: a state whose stream ran under an older
    release (its epochs are its batch ids) got a batch write at epoch 1; the stream's
    batch 1 meets it and is refused, loudly, instead of being dropped."""
    old = env.coordinator(owner="old-release")
    old.start(query_id="q-1")  # a stream of a release that did not record stream_from
    old.commit_epoch(0, env.prepare_epoch(0))
    job = env.coordinator(owner="batch-job")
    epoch = job.reserve_epoch()
    assert epoch == 1
    job.commit_epoch(epoch, env.prepare_epoch(epoch, n=3))
    stream = env.coordinator(owner="stream")
    stream.start(query_id="q-1", stream=True)
    assert stream.stream_epoch(1) == 1
    with pytest.raises(StateError, match="records for a batch write") as err:
        stream.commit_epoch(1, [env.prepare(1, p, attempt=1) for p in range(3)])
    assert "micro-batch 1 of the streaming query q-1" in str(err.value)
    assert "were rolled back and nothing of it was written" in str(err.value)
    assert env.system.prepared == {}
    assert len(env.ids()) == 30 + 9  # batch 0 and the batch write, nothing of the batch


def test_an_at_least_once_micro_batch_on_a_batch_writes_epoch_says_its_rows_are_visible(
        env: Env) -> None:
    old = env.coordinator(owner="old-release")
    old.start(query_id="q-1")
    job = env.coordinator(owner="batch-job")
    epoch = job.reserve_epoch()
    job.commit_epoch(epoch, env.prepare_epoch(epoch))
    stream = env.coordinator(owner="stream", guarantee=DeliveryGuarantee.AT_LEAST_ONCE)
    stream.start(query_id="q-1", stream=True)
    with pytest.raises(StateError, match="they stay visible"):
        stream.record_epoch(epoch, [], DeliveryGuarantee.AT_LEAST_ONCE)


# -- item 2: versions of one txnAppId count for one writer ------------------------------------


def test_a_streams_versions_are_not_compared_with_a_batch_jobs(env: Env) -> None:
    """A batch job wrote version 1 of app id 'orders'; a foreachBatch stream then used
    version=batch_id on the same app id: its batches 0 and 1 were skipped."""
    job = env.coordinator(owner="batch-job")
    job.start()
    epoch = job.reserve_epoch(WriteId("orders", 1))
    job.commit_epoch(epoch, env.prepare_epoch(epoch))
    before = env.ids()
    stream = env.coordinator(owner="stream-driver")
    stream.start()
    # Batch 0 looks committed by its number: the skip is checked against the driver.
    assert stream.committed_write(WriteId("orders", 0)) == 1
    with pytest.raises(StateError, match="written by batch jobs no stream drives") as err:
        stream.check_write_query(WriteId("orders", 0, "q-stream"))
    assert "Give the stream's writes a txnAppId of their own" in str(err.value)
    # Batch 2 (above the job's version) is refused too, and rolled back.
    epoch = stream.reserve_epoch(WriteId("orders", 2))
    msgs = env.prepare_epoch(epoch)
    with pytest.raises(StateError, match="written by batch jobs no stream drives"):
        stream.commit_epoch(epoch, msgs, write_query="q-stream")
    assert env.system.prepared == {}
    assert env.ids() == before
    assert epoch not in env.store().records()
    # The batch job's own re-run is still recognised as written.
    job.check_write_query(WriteId("orders", 1))
    # Another app id for the stream: written.
    epoch = stream.reserve_epoch(WriteId("orders-stream", 0))
    assert stream.commit_epoch(epoch, env.prepare_epoch(epoch),
                               write_query="q-stream") is EpochOutcome.COMMITTED


# -- item 3: a number given up is never used again --------------------------------------------


def test_an_epoch_given_up_by_a_forced_resolve_is_never_allocated_again(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A grouped batch write decided epoch 0 and crashed with one participant of one
    target committed; `resolve --abort --force` gave the epoch up. The next, unrelated
    batch write got epoch 0 again, and its rows in that target's partition were
    dropped as the 'kept' part of a replay: in one target only."""
    from txsink.cli import main

    from .test_group_cli import batch, pipeline

    f = pipeline(tmp_path)
    cfg = load_pipeline(f)

    def write(crash: str | None) -> int:
        group = cfg.create_backend()
        assert isinstance(group, TargetGroup)
        faults = FaultInjector([FaultRule(crash, None, "raise")]) if crash else FaultInjector()
        coord = Coordinator(group, DirectoryStateStore(Path(cfg.checkpoint) / "txsink"),
                            cfg.sink.sink_id, faults=faults)
        try:
            coord.start()
            epoch = coord.reserve_epoch()
            msgs: list[Committable] = []
            for p in range(2):
                msgs += write_group(group, epoch, p, 7, [batch(10 + epoch, p)])
            coord.commit_epoch(epoch, msgs)
            coord.store.release(coord.lease)
            return epoch
        finally:
            group.close()

    with pytest.raises(InjectedFault):
        write(AFTER_FIRST_COMMIT)
    assert main(["resolve", str(tmp_path / "chk"), "--epoch", "0", "--abort", "--force"]) == 0
    assert "were committed already and stay visible" in capsys.readouterr().out
    assert write(None) == 1
    events = _ids(tmp_path / "events")
    totals = _ids(tmp_path / "totals")
    new = [i for p in range(2) for i in range(1100 + p * 10, 1100 + p * 10 + 3)]
    assert events == sorted([1000, 1001, 1002, *new])  # epoch 0's kept part, then all
    assert totals == sorted(i for i in new if i % 2 == 0)  # totals' where: id % 2 = 0
    meta = DirectoryStateStore(tmp_path / "chk" / "txsink").read_meta()
    assert meta is not None and meta.given_up == 0


def test_allocation_is_above_what_the_state_gave_up_and_what_a_target_holds(
        env: Env) -> None:
    coord = env.coordinator(owner="d")
    coord.start()
    epoch = coord.reserve_epoch()
    coord.abort_epoch(epoch, [])  # the write failed: its number is given up
    assert coord.reserve_epoch() == epoch + 1
    # A target holding an epoch the state does not know (the state restored from an
    # older copy): a fresh epoch is above it, not refused after preparing.
    other = env.coordinator(owner="elsewhere")
    other.start()
    held = other.reserve_epoch()
    other.commit_epoch(held, env.prepare_epoch(held))
    for e in list(env.store().records()):
        env.store().delete(other.lease, [e])
    fresh = env.coordinator(owner="fresh")
    fresh.start()
    assert fresh.reserve_epoch() == held + 1


def _ids(path: Path) -> list[int]:
    return sorted(json.loads(line)["id"] for p in path.glob("part-*")
                  for line in p.read_text().splitlines())


@pytest.mark.parametrize("point", POINTS)
def test_a_stream_after_a_backfill_crashed_at_any_point_and_replayed_is_exact(
        env: Env, point: str) -> None:
    """The streaming sink's path (``start(stream=True)``, micro-batch b at epoch
    stream_from + b) through a driver crash at each protocol point: the next run
    replays the batch, and every row is there once."""
    backfill = env.coordinator(owner="batch-job")
    backfill.start()
    epoch = backfill.reserve_epoch()
    backfill.commit_epoch(epoch, env.prepare_epoch(epoch))
    crashing = env.coordinator(FaultInjector([FaultRule(point, None, "raise")]),
                               owner="run-1")
    crashing.start(query_id="q-1", stream=True)
    first = crashing.stream_epoch(0)
    assert first == 1
    with pytest.raises(InjectedFault):
        crashing.commit_epoch(first, env.prepare_epoch(first))
    # The next run of the query: the planner recovers, Spark replays batch 0.
    again = env.coordinator(owner="run-2")
    again.start(query_id="q-1", stream=True)
    assert again.stream_epoch(0) == first
    replay = [env.prepare(first, p, attempt=1) for p in range(3)]
    assert again.commit_epoch(first, replay) in {EpochOutcome.COMMITTED,
                                                 EpochOutcome.REPLAYED,
                                                 EpochOutcome.RECOVERED}
    again.commit_epoch(again.stream_epoch(1), env.prepare_epoch(again.stream_epoch(1)))
    assert env.ids() == expected_ids(range(3), 3)
    assert env.system.prepared == {}
