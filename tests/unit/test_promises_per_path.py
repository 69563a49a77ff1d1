"""The docs' promises on every data path they apply to (``tests/unit/test_promise_map.py``).

Each test writes the same operations through the data source, grouped writes and
Spark's own Parquet writer (:mod:`tests.data_paths`: the real adapters, gate,
coordinator, files targets and state directory; Spark's part played), and checks the
promise on each: every row exactly once, or a refusal naming the cause that wrote
nothing. These (promise, path) pairs had no test of their own on that path; the promise
map found them.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pytest
from txsink import cli
from txsink import plugins as plugins_module
from txsink.errors import (
    ConfigError,
    FatalCommitError,
    FencedError,
    StateError,
    TxsinkError,
)
from txsink.faults import AFTER_DECIDE, AFTER_FIRST_COMMIT, BEFORE_DECIDE, InjectedFault
from txsink.files.backend import FilesBackend
from txsink.hookspecs import hookimpl
from txsink.model import Committable
from txsink.registry import BackendRegistry
from txsink.state import EpochState

from tests.data_paths import PATHS, Frame, Sink, driver, ids_of, rows

GROUPED = ("datasource", "grouped", "native")
FAULTS = "TXSINK_FAULTS"


@pytest.fixture(autouse=True)
def _one_driver(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every write runs as driver ``d1`` unless a test switches (:func:`driver`); no
    fault is armed unless a test arms one. No power loss is played here (a crash is an
    exception), so the fsyncs only cost time (about 10 ms each on these disks)."""
    monkeypatch.delenv(FAULTS, raising=False)
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    with driver("d1"):
        yield


def _state(sink: Sink) -> dict[int, EpochState]:
    return {e: r.state for e, r in sink.store().records().items()}


def _crash(sink: Sink, monkeypatch: pytest.MonkeyPatch, point: str, write: str = "stream",
           key: int = 1) -> None:
    """Write ``key`` with the driver dying (an exception) at the protocol ``point``."""
    monkeypatch.setenv(FAULTS, f"{point}:raise")
    try:
        with pytest.raises(InjectedFault):
            sink.stream(key) if write == "stream" else sink.batch(key)
    finally:
        monkeypatch.delenv(FAULTS)


def _lose(sink: Sink, name: str) -> None:
    """Target ``name``'s prepared participants vanish (rolled back behind txsink's back:
    a pending file or the staged files deleted)."""
    pending = sink.dirs[name] / "_txsink" / "pending"
    staging = sink.dirs[name] / "_txsink" / "staging"
    gone = [p for d in (pending, staging) if d.exists() for p in d.iterdir()]
    assert gone, f"target {name} holds nothing prepared"
    for p in gone:
        shutil.rmtree(p) if p.is_dir() else p.unlink()


# -- recovery: what a decision holds is never dropped, nothing undecided is shown ----------

@pytest.mark.promise("commit-failure-stops", "datasource", "grouped", "native")
@pytest.mark.promise("vanished-participant-stops", "datasource", "grouped")
@pytest.mark.promise("group-commit-failure-names-target", "datasource", "grouped", "native")
@pytest.mark.parametrize("path", PATHS)
def test_a_decided_participant_that_cannot_be_committed_stops_naming_it(
        path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver dies after epoch 1's decision; target b's participant is rolled back
    behind txsink's back. The restart stops with an error naming the target and the
    participant, and the epoch stays DECIDED for the next start: never dropped."""
    sink = Sink(path, tmp_path)
    sink.stream(0)
    _crash(sink, monkeypatch, AFTER_DECIDE)
    lost = {c.participant for c in sink.store().records()[1].committables if c.target == "b"}
    _lose(sink, "b")
    for run in ("d2", "d3"):  # every start says so, none goes on without it
        with driver(run), pytest.raises(FatalCommitError) as err:
            sink.stream(1)  # the restarted query: Spark replays the batch it did not log
        assert "target b" in str(err.value), err
        assert all(p in str(err.value) for p in lost), err
        assert _state(sink)[1] is EpochState.DECIDED
    assert sink.ids("b") == ids_of(0)


@pytest.mark.promise("decided-never-rolled-back", "datasource", "grouped", "native")
@pytest.mark.parametrize("path", PATHS)
def test_a_decided_epoch_is_never_rolled_back(path: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit fails after the decision: Spark then aborts the batch (the data
    source's ``abort``; a grouped write's block ends with the error). The decided
    participants stay prepared, and the next start commits them."""
    sink = Sink(path, tmp_path)
    _crash(sink, monkeypatch, AFTER_DECIDE, key=0)
    assert _state(sink) == {0: EpochState.DECIDED}
    assert all(sink.pending().values()), "a decided participant was rolled back"
    with driver("d2"):  # the restarted query
        sink.stream(0)  # the replay: recovery commits the decision, the replay writes nothing
        sink.stream(1)
    assert sink.every() == {n: ids_of(0) + ids_of(1) for n in sink.names}
    assert not any(sink.pending().values())


@pytest.mark.promise("group-never-shown-without-decision", "datasource", "grouped", "native")
@pytest.mark.parametrize("path", PATHS)
def test_no_target_shows_an_epoch_that_has_no_decision(path: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    sink = Sink(path, tmp_path)
    sink.stream(0)
    _crash(sink, monkeypatch, BEFORE_DECIDE)
    assert sink.every() == {n: ids_of(0) for n in sink.names}
    with driver("d2"):  # the restarted query replays the batch
        sink.stream(1)
    assert sink.every() == {n: ids_of(0) + ids_of(1) for n in sink.names}
    assert not any(sink.pending().values())


@pytest.mark.promise("stale-reservation-aborted", "datasource", "grouped", "native")
@pytest.mark.parametrize("path", PATHS)
def test_a_batch_write_of_a_run_that_is_gone_is_rolled_back_loudly(
        path: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A batch write reserved its epoch, prepared, and its driver died; the next run
    aborts what it prepared and drops the reservation, with a WARNING."""
    sink = Sink(path, tmp_path)
    frame = Frame(rows(1))
    if path == "datasource":
        from txsink.spark.datasource import TxsinkDataSource

        from tests.data_paths import SCHEMA, run_tasks

        writer = TxsinkDataSource(sink.group.options()).writer(SCHEMA, False)
        run_tasks(writer, frame.table, {})  # prepared; the driver dies before commit
    else:
        tx = sink.group.epoch(frame.sparkSession)  # type: ignore[arg-type]
        tx.__enter__()
        tx.write(frame, "a")  # type: ignore[arg-type]  # the driver dies in the block
    assert [s for s in _state(sink).values()] == [EpochState.RESERVED]
    assert sink.pending()["a"]
    with driver("d2"), caplog.at_level(logging.WARNING):
        sink.batch(2)
    assert "never decided" in caplog.text or "reservation" in caplog.text, caplog.text
    assert sink.every() == {n: ids_of(2) for n in sink.names}
    assert not any(sink.pending().values())
    assert EpochState.RESERVED not in _state(sink).values()


@pytest.mark.promise("orphans-aborted", "grouped")
def test_an_unreported_attempt_of_a_grouped_write_is_aborted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task attempt that prepared and lost (a speculative twin) leaves a participant
    no message names: aborted as an orphan, never shown."""
    sink = Sink("grouped", tmp_path)
    monkeypatch.setenv(FAULTS, "task-after-pre-commit@0:duplicate")
    sink.stream(0)
    monkeypatch.delenv(FAULTS)
    sink.stream(1)
    assert sink.every() == {n: ids_of(0) + ids_of(1) for n in sink.names}
    assert not any(sink.pending().values())


# -- fencing -------------------------------------------------------------------------------

@pytest.mark.promise("fenced-run-stops", "grouped", "native")
@pytest.mark.promise("fenced-run-changes-nothing", "datasource", "grouped", "native")
@pytest.mark.parametrize("path", PATHS)
def test_a_run_taken_over_is_fenced_and_changes_nothing(path: str, tmp_path: Path) -> None:
    sink = Sink(path, tmp_path)
    sink.stream(0)
    with driver("d2"):  # a newer run of the same query (d1 taken for gone, as after a crash)
        sink.stream(1)
    before = (sink.every(), _state(sink), sink.pending())
    for _ in range(2):  # the older run goes on: fenced at each step, for good
        with pytest.raises(FencedError):
            sink.stream(2)
    assert (sink.every(), _state(sink), sink.pending()) == before
    with driver("d2"):
        sink.stream(2)
    assert sink.every() == {n: ids_of(0) + ids_of(1) + ids_of(2) for n in sink.names}


# -- identity --------------------------------------------------------------------------------

@pytest.mark.promise("batch-into-stream-refused", "grouped")
def test_a_grouped_batch_write_into_a_streams_state_is_refused(tmp_path: Path) -> None:
    Sink("datasource", tmp_path).stream(0)
    grouped = Sink("grouped", tmp_path)
    with pytest.raises(StateError, match="a streaming query writes through this sink's state"):
        grouped.batch(7)
    assert grouped.every() == {n: ids_of(0) for n in grouped.names}
    assert not any(grouped.pending().values())


@pytest.mark.promise("backfill-beside-grouped-stream-refused", "datasource", "grouped")
@pytest.mark.parametrize("path", ["datasource", "grouped"])
def test_a_backfill_from_another_driver_beside_a_grouped_stream_is_refused(
        path: str, tmp_path: Path) -> None:
    """A stream writes through ``foreachBatch`` grouped writes (driver d1, holding the
    lease); a backfill from driver d2 would take the lease and stop it."""
    stream = Sink("grouped", tmp_path)
    with driver("d1", alive=True):
        stream.stream(0)
    backfill = Sink(path, tmp_path)
    with driver("d2"), pytest.raises(StateError, match="would take the lease over"):
        backfill.batch(7)
    with driver("d1", alive=True):
        stream.stream(1)  # the stream goes on
    assert stream.every() == {n: ids_of(0) + ids_of(1) for n in stream.names}


@pytest.mark.promise("same-identity-concurrent-refused", "datasource", "grouped")
@pytest.mark.parametrize("path", ["datasource", "grouped"])
def test_two_writes_with_one_identity_at_once_the_second_is_refused(
        path: str, tmp_path: Path) -> None:
    from txsink.spark.datasource import TxsinkDataSource

    from tests.data_paths import SCHEMA

    sink = Sink(path, tmp_path)

    def open_write() -> object:
        if path == "datasource":
            return TxsinkDataSource({**sink.group.options(), "txnAppId": "job",
                                     "txnVersion": "5"}).writer(SCHEMA, False)
        tx = sink.group.epoch(Frame(rows(1)).sparkSession, version=5,  # type: ignore[arg-type]
                              app_id="job")
        return tx.__enter__()

    open_write()
    with pytest.raises(StateError, match="already being written"):
        open_write()


@pytest.mark.promise("versioned-write-skipped", "grouped", "native")
@pytest.mark.parametrize("path", ["grouped", "native"])
def test_a_version_committed_before_is_skipped_loudly(path: str, tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    sink = Sink(path, tmp_path)
    sink.batch(1, version=3)
    with caplog.at_level(logging.WARNING):
        sink.batch(1, version=3)  # the re-run of a job that succeeded
    assert "committed already" in caplog.text and "nothing is written" in caplog.text
    assert sink.every() == {n: ids_of(1) for n in sink.names}


@pytest.mark.promise("app-id-one-writer", "native")
def test_a_jobs_version_and_a_streams_batch_id_under_one_app_id_are_refused(
        tmp_path: Path) -> None:
    sink = Sink("native", tmp_path)
    sink.batch(1, version=0)  # a batch job's version 0
    with pytest.raises(StateError, match="written by batch jobs no stream drives"):
        sink.batch(2, version=0, query="q-1")  # foreachBatch with version=batch_id
    assert sink.every() == {n: ids_of(1) for n in sink.names}
    assert not any(sink.pending().values())


@pytest.mark.promise("checkpoint-deleted-with-state-refused", "datasource", "grouped")
@pytest.mark.parametrize("path", ["datasource", "grouped"])
def test_a_checkpoint_deleted_with_its_state_is_refused_by_the_targets(
        path: str, tmp_path: Path) -> None:
    sink = Sink(path, tmp_path)
    sink.stream(0)
    shutil.rmtree(sink.chk)
    with pytest.raises(ConfigError, match=r"sink_id|owner|another query"):
        sink.stream(0, query="q-2")  # the source read again from its start
    assert sink.every() == {n: ids_of(0) for n in sink.names}
    assert not any(sink.pending().values())


@pytest.mark.promise("state-bound-to-sink", "datasource", "grouped", "native")
@pytest.mark.parametrize("path", PATHS)
def test_a_checkpoint_pointed_at_another_sink_id_is_refused(path: str, tmp_path: Path) -> None:
    Sink(path, tmp_path).stream(0)
    other = Sink(path, tmp_path, sink_id="other", paths={"a": tmp_path / "oa",
                                                         "b": tmp_path / "ob"})
    with pytest.raises(TxsinkError, match=r"paths|sink"):
        other.stream(1)
    assert other.every() == {"a": [], "b": []}


@pytest.mark.promise("given-up-epoch-never-reused", "datasource", "native")
@pytest.mark.parametrize("path", ["datasource", "native"])
def test_an_epoch_a_forced_resolve_gave_up_is_never_allocated_again(
        path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    sink = Sink(path, tmp_path)
    sink.batch(0)
    _crash(sink, monkeypatch, AFTER_FIRST_COMMIT, write="batch", key=1)  # epoch 1: a only
    assert cli.main(["resolve", str(sink.chk), "--epoch", "1", "--abort", "--force"]) == 0
    capsys.readouterr()
    with driver("d2"):  # the job runs again, in a new driver
        sink.batch(2)
    records = sink.store().records()
    assert 1 not in records or records[1].state is not EpochState.COMMITTED
    newest = max(records)
    assert newest > 1, f"the next write took epoch {newest}"
    assert sink.ids("b") == ids_of(0) + ids_of(2)


# -- a restored state -----------------------------------------------------------------------

def _backup(sink: Sink, name: str = "backup") -> Path:
    copy = sink.tmp / name
    shutil.copytree(sink.state_dir, copy)
    return copy


def _restore(sink: Sink, copy: Path) -> None:
    shutil.rmtree(sink.state_dir)
    shutil.copytree(copy, sink.state_dir)


@pytest.mark.promise("restored-state-replay-aborted", "datasource")
def test_a_streams_replay_on_a_restored_state_is_aborted_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sink = Sink("datasource", tmp_path)
    sink.stream(0)
    copy = _backup(sink)
    sink.stream(1)
    sink.stream(2)
    _restore(sink, copy)
    with caplog.at_level(logging.WARNING):
        sink.stream(1)  # Spark replays what its (restored) checkpoint did not log
        sink.stream(2)
    assert "already holds this epoch" in caplog.text, caplog.text
    sink.stream(3)
    assert sink.every() == {n: ids_of(0) + ids_of(1) + ids_of(2) + ids_of(3)
                            for n in sink.names}


@pytest.mark.promise("restored-state-versioned-write-refused", "datasource", "grouped")
@pytest.mark.parametrize("path", ["datasource", "grouped"])
def test_a_versioned_write_on_a_restored_state_is_refused(path: str, tmp_path: Path) -> None:
    sink = Sink(path, tmp_path)
    sink.batch(0, version=0)
    copy = _backup(sink)
    sink.batch(1, version=1)
    _restore(sink, copy)
    with pytest.raises(StateError, match="restored from an older copy"):
        sink.batch(1, version=1)  # the job's re-run: cannot be told from a new write
    assert sink.every() == {n: ids_of(0) + ids_of(1) for n in sink.names}
    assert not any(sink.pending().values())


@pytest.mark.promise("restored-state-batch-write-fails", "datasource", "grouped", "native")
@pytest.mark.parametrize("path", PATHS)
def test_a_batch_write_on_a_restored_state_never_goes_into_an_epoch_a_target_holds(
        path: str, tmp_path: Path) -> None:
    """Without an identity a batch write is a new write: it gets an epoch above every
    one a target holds (or is refused), never one of them, so no epoch holds two
    writes' rows."""
    sink = Sink(path, tmp_path)
    sink.batch(0)
    copy = _backup(sink)
    sink.batch(1)
    _restore(sink, copy)
    try:
        sink.batch(2)
    except StateError:
        assert sink.every() == {n: ids_of(0) + ids_of(1) for n in sink.names}
        return
    assert sink.every() == {n: ids_of(0) + ids_of(1) + ids_of(2) for n in sink.names}
    assert max(sink.store().records()) >= 2


@pytest.mark.promise("restored-state-half-committed-stops", "datasource", "grouped", "native")
@pytest.mark.parametrize("path", PATHS)
def test_a_state_restored_while_an_epoch_was_half_committed_stops(
        path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy was taken before epoch 1's decision, which then committed in target a
    only: the restored state has no decision for the rest, which it must not abort."""
    sink = Sink(path, tmp_path)
    sink.stream(0)
    copy = _backup(sink)
    _crash(sink, monkeypatch, AFTER_FIRST_COMMIT)
    newest = _backup(sink, "newest")
    _restore(sink, copy)
    with driver("d2"), pytest.raises(StateError, match=r"has no decision for it|do not"):
        sink.stream(1)
    assert sink.pending()["b"], "the rest of the epoch was aborted"
    _restore(sink, newest)  # the remedy: the newest state finishes the epoch
    with driver("d3"):
        sink.stream(1)
        sink.stream(2)
    assert sink.every() == {n: ids_of(0) + ids_of(1) + ids_of(2) for n in sink.names}


# -- what a group refuses --------------------------------------------------------------------

class _Refusing(FilesBackend):
    """A files target whose ``check_prepared`` refuses every participant (as a table
    whose schema the files do not fit)."""

    name = "files-refusing"

    def check_prepared(self, committables: Sequence[Committable]) -> None:
        raise ConfigError("the target cannot take these rows", field="refusing")


class _RefusingPlugin:
    @hookimpl
    def txsink_register_backends(self, registry: BackendRegistry) -> None:
        registry.add(_Refusing)


@pytest.fixture
def refusing_backend() -> Iterator[None]:
    saved = plugins_module._cached
    plugins_module._cached = plugins_module.build_plugins(
        extra_plugins=[("files-refusing", _RefusingPlugin())])
    try:
        yield
    finally:
        plugins_module._cached = saved


@pytest.mark.promise("check-prepared-refusal-aborts-epoch", "datasource", "grouped", "native")
@pytest.mark.parametrize("path", PATHS)
def test_a_target_refusing_its_participants_before_the_decision_aborts_every_target(
        path: str, tmp_path: Path, refusing_backend: None) -> None:
    sink = Sink(path, tmp_path, backends={"b": "files-refusing"})
    with pytest.raises(ConfigError, match="cannot take these rows"):
        sink.stream(0)
    assert sink.every() == {"a": [], "b": []}
    assert not any(sink.pending().values())
    assert EpochState.DECIDED not in _state(sink).values()


@pytest.mark.promise("aborted-batch-write-raises", "datasource", "grouped", "native")
@pytest.mark.parametrize("path", PATHS)
def test_a_batch_write_whose_data_is_aborted_raises(path: str, tmp_path: Path,
                                                    refusing_backend: None) -> None:
    """The tasks prepared; the decision is refused (a target cannot take the rows), the
    data aborted: the write raises, it never returns as if written."""
    sink = Sink(path, tmp_path, backends={"b": "files-refusing"})
    with pytest.raises(ConfigError, match="cannot take these rows"):
        sink.batch(0)
    assert sink.every() == {"a": [], "b": []}
    assert not any(sink.pending().values())


@pytest.mark.promise("group-claim-checked-before-claimed", "datasource", "grouped", "native")
@pytest.mark.promise("group-refusal-before-anything", "native")
@pytest.mark.parametrize("path", PATHS)
def test_a_target_of_another_query_leaves_the_other_targets_unclaimed(
        path: str, tmp_path: Path) -> None:
    FilesBackend(str(tmp_path / "b")).claim_sink("paths--b", "state-0", "/elsewhere")
    sink = Sink(path, tmp_path)
    with pytest.raises(ConfigError, match=r"another query|belongs"):
        sink.stream(0)
    assert not (tmp_path / "a").exists(), "target a was claimed by the refused run"
    assert not (sink.chk / "txsink" / "meta.json").exists()


@pytest.mark.promise("group-target-moved-refused", "datasource", "grouped", "native")
@pytest.mark.parametrize("path", PATHS)
def test_a_target_moved_under_its_name_is_refused(path: str, tmp_path: Path) -> None:
    Sink(path, tmp_path).stream(0)
    moved = Sink(path, tmp_path, paths={"b": tmp_path / "b2"})
    with pytest.raises(ConfigError, match="moved"):
        moved.stream(1)
    assert moved.every() == {"a": ids_of(0), "b": []}
    assert not (tmp_path / "b2").exists()


@pytest.mark.promise("group-targets-changed-refused", "native")
def test_a_native_group_with_other_targets_is_refused(tmp_path: Path) -> None:
    Sink("native", tmp_path).stream(0)
    changed = Sink("native", tmp_path, names=("a", "c"))
    with pytest.raises(ConfigError, match=r"missing here: b; new here: c"):
        changed.stream(1)
    assert not (tmp_path / "c").exists()
    assert changed.ids("a") == ids_of(0)


@pytest.mark.promise("group-two-files-targets-one-path-refused", "datasource", "grouped",
                     "native")
@pytest.mark.parametrize("path", PATHS)
def test_two_targets_in_one_directory_through_a_link_are_refused(path: str,
                                                                   tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "a")
    sink = Sink(path, tmp_path, paths={"b": tmp_path / "link"})
    with pytest.raises(ConfigError, match="both write to the directory"):
        sink.stream(0)
    assert list((tmp_path / "a").iterdir()) == []


@pytest.mark.promise("group-duplicate-columns-refused", "datasource", "grouped", "native")
@pytest.mark.parametrize("path", PATHS)
def test_rows_with_a_column_twice_are_refused(path: str, tmp_path: Path) -> None:
    sink = Sink(path, tmp_path)
    twice = pa.Table.from_arrays([pa.array([1, 2], pa.int64()), pa.array([3, 4], pa.int64())],
                                 names=["id", "ID"])
    with pytest.raises(ConfigError, match="twice"):
        sink.batch(0, table=twice)
    assert sink.every() == {"a": [], "b": []}


@pytest.mark.promise("group-epoch-column-clash-refused", "native")
def test_a_native_targets_epoch_column_named_like_a_rows_column_is_refused(
        tmp_path: Path) -> None:
    sink = Sink("native", tmp_path, extra={"b": {"epoch_column": "value"}})
    with pytest.raises(ConfigError, match="already have a column 'value'"):
        sink.stream(0)
    assert sink.every() == {"a": [], "b": []}


@pytest.mark.promise("options-validated-before-data", "grouped", "native")
@pytest.mark.parametrize("path", ["grouped", "native"])
def test_a_misspelled_target_option_is_refused_naming_it(path: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        Sink(path, tmp_path, extra={"b": {"compresion": "zstd"}})
    assert "compresion" in str(err.value) and "targets[b]" in str(err.value)
    assert not list(tmp_path.iterdir())


@pytest.mark.promise("grouped-unwritten-target-empty", "grouped")
def test_a_target_the_block_did_not_write_records_the_epoch(tmp_path: Path) -> None:
    from txsink.cut import consistent_cut
    from txsink.group import TargetGroup

    sink = Sink("grouped", tmp_path)
    frame = Frame(rows(0))
    with sink.group.epoch(frame.sparkSession) as tx:  # type: ignore[arg-type]
        tx.write(frame, "a")  # type: ignore[arg-type]
    assert sink.every() == {"a": ids_of(0), "b": []}
    group = TargetGroup.from_specs(sink.sink_id, sink.group.specs)
    try:
        cut = consistent_cut(group, sink.store(), sink.sink_id)
    finally:
        group.close()
    assert cut.cut == 0 and set(cut.targets.values()) == {0}


@pytest.mark.promise("realtime-set-refuses-microbatch-calls", "grouped")
def test_a_real_time_set_refuses_grouped_writes(tmp_path: Path) -> None:
    import txsink.spark as ts

    rt = ts.targets("rt", [ts.target("t", "postgres", dsn="host=db", table="public.t")],
                    checkpoint_location=str(tmp_path / "chk"), realtime=True)
    with pytest.raises(ConfigError, match="built for Real-time Mode"):
        rt.epoch(None)  # type: ignore[arg-type]
    assert not (tmp_path / "chk").exists()


# -- the data source's own promises ---------------------------------------------------------

@pytest.mark.promise("group-at-least-once-refused", "datasource")
def test_a_group_through_the_data_source_refuses_at_least_once(tmp_path: Path) -> None:
    from txsink.spark.datasource import TxsinkDataSource

    from tests.data_paths import SCHEMA

    sink = Sink("datasource", tmp_path)
    with pytest.raises(ConfigError, match=r"exactly.once"):
        TxsinkDataSource({**sink.group.options(), "guarantee": "at_least_once"}).writer(
            SCHEMA, False)
    assert not list(tmp_path.glob("*/_txsink"))


@pytest.mark.promise("at-least-once-replay-warns", "datasource")
def test_an_at_least_once_replay_says_which_rows_readers_see_twice(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sink = Sink("datasource", tmp_path, single=True, ds_options={"guarantee": "at_least_once"})
    sink.stream(0)
    with caplog.at_level(logging.WARNING):
        sink.stream(0)  # Spark replays the batch it did not log
    assert sink.ids() == sorted(ids_of(0) * 2)
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("epoch=0" in m and str(len(ids_of(0))) in m for m in warned), warned


@pytest.mark.promise("unversioned-replay-warns", "datasource")
def test_a_foreach_batch_write_without_identity_warns_that_a_replay_writes_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sink = Sink("datasource", tmp_path, single=True)
    with caplog.at_level(logging.WARNING):
        sink.batch(0, query="q-1", batch=4)  # df.write inside foreachBatch, batch 4
    assert "without a write identity" in caplog.text and "written again" in caplog.text
    sink.batch(0, query="q-1", batch=4)  # Spark's replay of batch 4: written again
    assert sink.ids() == sorted(ids_of(0) * 2)


# -- the CLI -----------------------------------------------------------------------------------

@pytest.mark.promise("resolve-abort-committed-refused", "cli")
def test_resolve_abort_of_a_committed_epoch_is_refused(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    sink = Sink("datasource", tmp_path)
    sink.stream(0)
    before = (sink.every(), _state(sink))
    assert cli.main(["resolve", str(sink.chk), "--epoch", "0", "--abort"]) == 1
    assert "committed" in capsys.readouterr().err
    assert (sink.every(), _state(sink)) == before


@pytest.mark.promise("validate-writes-nothing", "cli")
def test_validate_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(f"""
source: {{type: rate}}
sink: {{backend: files, sink_id: v, options: {{path: {tmp_path / 'out'}, format: jsonl}}}}
checkpoint: {tmp_path / 'chk'}
""")
    assert cli.main(["validate", "--no-spark", str(pipeline)]) == 0
    assert "ok" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml"]


@pytest.mark.promise("backends-lists-broken-plugins", "cli")
def test_backends_lists_a_plugin_that_failed_to_load_with_the_reason(
        capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import EntryPoint, entry_points

    saved = plugins_module._cached
    broken = EntryPoint("nosuch", "txsink_no_such_module_x", "txsink")
    plugins_module._cached = plugins_module.build_plugins(
        [*entry_points(group="txsink"), broken])
    try:
        assert cli.main(["backends"]) == 0
    finally:
        plugins_module._cached = saved
    out = capsys.readouterr().out
    assert "broken plugin 'nosuch'" in out and "txsink_no_such_module_x" in out
    assert any(line.startswith("files ") for line in out.splitlines())


# -- found by writing these tests (issue 39) ---------------------------------------------

@pytest.mark.promise("state-write-full-disk", "datasource", "grouped", "native")
@pytest.mark.parametrize("path", PATHS)
def test_a_decision_the_full_state_disk_refused_is_decided_again_when_spark_replays(
        path: str, tmp_path: Path) -> None:
    """The decision's state write fails (ENOSPC): nothing is committed; Spark replays
    the batch (the query started again, here in the same driver) and it is written
    once. (Grouped writes kept the epoch reserved and its participants prepared, so
    the replay was refused at every try until the driver restarted.)"""
    import errno
    from unittest import mock

    from txsink.state import DirectoryStateStore

    real_put = DirectoryStateStore.put
    failed: list[int] = []

    def put(self: DirectoryStateStore, lease: object, record: object) -> None:
        if getattr(record, "state", None) is EpochState.DECIDED and not failed:
            failed.append(1)
            raise OSError(errno.ENOSPC, "No space left on device", str(self.root))
        real_put(self, lease, record)  # type: ignore[arg-type]

    sink = Sink(path, tmp_path)
    with driver("d1", alive=True):
        sink.stream(0)
        with (mock.patch.object(DirectoryStateStore, "put", put),
              pytest.raises(OSError, match="No space left")):
            sink.stream(1)
        assert failed and sink.every() == {n: ids_of(0) for n in sink.names}
        sink.stream(1)  # Spark's replay of the batch
    assert sink.every() == {n: ids_of(0) + ids_of(1) for n in sink.names}
    assert not any(sink.pending().values())


@pytest.mark.promise("grouped-stream-restart-takes-over", "grouped", "native")
@pytest.mark.promise("fenced-run-stops", "datasource", "grouped", "native")
@pytest.mark.parametrize("path", PATHS)
def test_of_two_runs_of_one_query_the_one_that_started_last_owns_the_sink(
        path: str, tmp_path: Path) -> None:
    """The older driver still runs: the newer run of the same query (same checkpoint)
    takes the sink, the older one is fenced at its next step. (Grouped writes refused the
    newer run, as a backfill beside the stream, until the gate told them apart.)"""
    sink = Sink(path, tmp_path)
    with driver("d1", alive=True):  # the older run, still running
        sink.stream(0)
    with driver("d2"):  # the same query started on another driver
        sink.stream(1)
    with driver("d1", alive=True), pytest.raises(FencedError):
        sink.stream(2)
    assert sink.every() == {n: ids_of(0) + ids_of(1) for n in sink.names}


@pytest.mark.promise("connect-foreachbatch-reset-warns", "datasource")
def test_without_the_streams_checkpoint_a_reset_streams_batches_are_skipped_loudly(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Under Spark Connect a ``foreachBatch`` write's tasks cannot report their stream:
    without ``txnStreamCheckpoint`` its versions are a batch job's. After the stream's
    checkpoint is reset, its new batches 0, 1 look written: skipped, with a WARNING."""
    sink = Sink("datasource", tmp_path, single=True)
    sink.batch(0, version=0)  # tasks that report no stream
    sink.batch(1, version=1)
    with caplog.at_level(logging.WARNING):
        sink.batch(2, version=0)  # the reset stream's batch 0
    assert "is already committed; skipping it, nothing is written" in caplog.text
    assert sink.ids() == ids_of(0) + ids_of(1)


@pytest.mark.promise("state-bound-to-sink", "cli")
def test_run_refuses_a_checkpoint_pointed_at_another_sink_before_spark(tmp_path: Path) -> None:
    """``txsink run`` (its check before Spark starts) of a pipeline file whose sink id
    changed under an existing checkpoint."""
    from txsink.config import load_pipeline
    from txsink.plugins import get_plugins
    from txsink.spark.pipeline import check_ownership
    from txsink.state import DirectoryStateStore

    from tests.unit.test_cli_first_hour import _earlier_run, _pipeline

    _earlier_run(tmp_path)
    pipeline = _pipeline(tmp_path, sink_id="renamed")
    cfg = load_pipeline(str(pipeline))
    store = DirectoryStateStore(tmp_path / "chk" / "txsink")
    before = store.read_meta()
    with pytest.raises(ConfigError, match="first-hour"):
        check_ownership(cfg, get_plugins(), store, str(pipeline))
    assert store.read_meta() == before
