"""A model-based test of operations: what users do to a pipeline besides crashing it.

Crashes alone are covered by the crash suites; here a Hypothesis state machine mixes
them with operations, against the real coordinator, a real state store (a directory,
or the S3 store on SeaweedFS) and the in-memory target (which can be snapshotted
and restored, as a failover to a standby or a database restore does):

* run an epoch, or crash the driver at any protocol point of it (Spark replays it);
* restart the driver (a new run takes the lease over; recovery runs);
* delete the checkpoint (Spark's batch ids restart at 0 under a new query id), and
  restore a saved one;
* back up the txsink state and restore it (alone, or with the checkpoint);
* snapshot the target and fail over to a snapshot;
* start a second driver while the first one goes on (it must be fenced and change
  nothing);
* resolve an in-doubt epoch by hand (``txsink resolve --commit``);
* point the state at a store that ignores conditional writes (S3 only).

The oracle after every step: no row is ever visible twice, nothing is visible that
no decision holds, and at every quiescent point (after a successful start or epoch)
the target shows exactly the epochs decided so far, minus those a failover lost;
otherwise txsink stopped with an error that names the problem, and the model then
follows the remedy that error names (restore the checkpoint or the newest state,
``resolve --abort``, ``resolve --abort --force``) and checks the output again.
Never a third outcome.

Left out on purpose: a failover to a standby older than a forced abort (the
operator's ``--force`` already gave up that epoch's exactness); restores of a state
backup taken while an epoch was in doubt; and a state restore together with a
target failover in one sequence (two systems put back to two different points in
time). Each stops loudly or is covered alone.

The default run (``tests/unit/test_operations_model.py``) takes a few hundred
sequences; ``tox -e operations-long`` runs tens of thousands
(``TXSINK_OPERATIONS_EXAMPLES``) and prints the rules fired.

The other machines of the operations model, each with the same oracle:
:mod:`tests.operations_entry_points` (every public entry point: the data source, grouped
epochs, the CLI's resolve, reset and cut, on one sink or a group),
:mod:`tests.operations_native` (Spark's own Parquet writer into files, Delta and Iceberg:
restored and replaced checkpoints as Spark plans after them, table maintenance, a lost
catalog) and :mod:`tests.operations_realtime` (Real-time Mode: positions kept in the
target, kills and zombies, start-overs, a recreated source topic). All count their
rules in :data:`FIRED`.
"""

from __future__ import annotations

import collections
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from txsink.coordinator import Coordinator, EpochOutcome, RetryPolicy
from txsink.errors import (
    CheckpointChangedError,
    FencedError,
    ParticipantLostError,
    StateError,
)
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
from txsink.model import Committable, TransactionContext
from txsink.plugins import build_plugins
from txsink.state import EpochState, StateStore
from txsink.testing import memory
from txsink.testing.memory import MemoryBackend, MemorySystem
from txsink.writer import write_participant

SINK = "ops-model"
ROWS = 2
#: Protocol points in order; a crash at AFTER_DECIDE or later leaves a decision.
CRASH_POINTS = [BEFORE_DECIDE, AFTER_DECIDE, AFTER_FIRST_COMMIT, BEFORE_MARK_COMMITTED,
                AFTER_MARK_COMMITTED]
EXAMPLES_ENV = "TXSINK_OPERATIONS_EXAMPLES"

#: Rules fired over a whole run (the long run prints them).
FIRED: collections.Counter[str] = collections.Counter()


def _rows(epoch: int, partition: int) -> pa.RecordBatch:
    base = epoch * 1000 + partition * 100
    return pa.record_batch({"id": pa.array(range(base, base + ROWS), pa.int64())})


def _epoch_of(row_id: int) -> int:
    return row_id // 1000


class OperationsModel(RuleBasedStateMachine):
    """Subclasses give :meth:`new_location`, :meth:`open_store`, :meth:`copy_state`
    and :meth:`put_state_back` for one kind of state store."""

    def new_location(self) -> str:
        raise NotImplementedError

    def open_store(self, location: str) -> StateStore:
        raise NotImplementedError

    def copy_state(self) -> str:
        """A copy of the state as it is now; returns where it is."""
        raise NotImplementedError

    def put_state_back(self, copy: str) -> None:
        """Make the state what ``copy`` holds (a restore from a backup)."""
        raise NotImplementedError

    def cleanup(self) -> None:
        """Remove whatever the store kept outside ``self.tmp``."""

    # -- the world -----------------------------------------------------------------------

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="txsink-ops-"))
        self.system_name = f"ops-{uuid.uuid4().hex}"
        self.backend = MemoryBackend(self.system_name)
        self.plugins = build_plugins(entry_points=[])
        self.location = self.new_location()
        # Spark's side: the checkpoint's query id and its next batch id.
        self.query = "q-0"
        self.queries = 1
        self.spark_next = 0
        self.saved_checkpoints: list[tuple[str, int]] = []
        # txsink's side, as the model knows it.
        self.owner = "run-0"
        self.runs = 0
        self.attempts = 0
        self.bound_query: str | None = None  # the query the state is bound to
        self.parts: dict[int, int] = {}  # epoch -> partitions (a replayable source)
        #: epoch -> participant names of its durable decision.
        self.decided: dict[int, frozenset[str]] = {}
        #: Every participant any decision of an epoch ever named (a replay after a
        #: restore can decide an epoch again, with the same rows).
        self.ever_decided: dict[int, set[str]] = {}
        #: Decided epochs whose commit crashed, with the crash point (Spark replays them).
        self.unfinished: dict[int, str] = {}
        self.lost: set[int] = set()  # decided epochs a failover took away for good
        self.state_copies: list[dict[str, Any]] = []
        self.snapshots: list[MemorySystem] = []
        self.zombie: Coordinator | None = None
        # A state restore and a target failover in one sequence (two systems put back
        # to two different points in time) are left out: each alone is modelled.
        self.restored = False
        self.failed_over = False

    def teardown(self) -> None:
        memory.SYSTEMS.pop(self.system_name, None)
        self.cleanup()
        shutil.rmtree(self.tmp, ignore_errors=True)

    @property
    def system(self) -> MemorySystem:
        return memory.system(self.system_name)

    def coordinator(self, owner: str, faults: FaultInjector | None = None) -> Coordinator:
        return Coordinator(self.backend, self.open_store(self.location), SINK,
                           plugins=self.plugins, owner=owner, retain_epochs=3,
                           faults=faults or FaultInjector(),
                           retry=RetryPolicy(attempts=2, initial_backoff_s=0,
                                             sleep=lambda s: None))

    def prepare(self, epoch: int, partition: int) -> Committable:
        self.attempts += 1
        ctx = TransactionContext(SINK, epoch, partition, self.attempts)
        return write_participant(self.backend, ctx, [_rows(epoch, partition)])

    def new_run(self) -> str:
        self.runs += 1
        self.owner = f"run-{self.runs}"
        return self.owner

    def expect_refusal(self) -> bool:
        return self.bound_query is not None and self.bound_query != self.query

    def quiescent(self, *, started: bool = True) -> None:
        """After a successful start: decided epochs are visible whole, nothing else,
        and nothing left prepared (an epoch's own commit may leave a failed attempt of
        a replayed epoch to the next start: ``started=False``)."""
        self.unfinished.clear()
        visible = {_epoch_of(r["id"]) for r in self.system.rows()}
        expected = set(self.decided) - self.lost
        assert visible == expected, (
            f"visible epochs {sorted(visible)} != decided {sorted(expected)} "
            f"(lost to failovers: {sorted(self.lost)})")
        ids = sorted(r["id"] for r in self.system.rows())
        want = sorted(e * 1000 + p * 100 + i for e in expected for p in range(self.parts[e])
                      for i in range(ROWS))
        assert ids == want, f"rows {ids} != {want}"
        if started:
            assert not self.system.prepared, f"left prepared: {sorted(self.system.prepared)}"

    def start(self, coord: Coordinator) -> bool:
        """A run's start (planner): False when txsink refused, loudly, as it must."""
        try:
            coord.start(recover=True, query_id=self.query)
        except CheckpointChangedError as exc:
            assert self.expect_refusal(), f"refused without reason: {exc}"
            FIRED["loud: checkpoint changed"] += 1
            return False
        assert not self.expect_refusal(), "a reset checkpoint was not refused"
        self.bound_query = self.query
        return True

    def decide(self, epoch: int, names: frozenset[str]) -> None:
        self.decided[epoch] = names
        self.ever_decided.setdefault(epoch, set()).update(names)
        self.lost.discard(epoch)

    def restart(self, *, after_restore: bool = False) -> None:
        """A new run: its start must leave the target exact, or stop loudly."""
        if self.handled_start(self.new_run(), after_restore=after_restore):
            self.quiescent()

    def handled_start(self, owner: str, *, after_restore: bool = False) -> bool:
        """A run's start, following the documented remedy of each loud stop."""
        try:
            return self.start(self.coordinator(owner))
        except StateError as exc:
            if "has no decision for it" not in str(exc):
                raise
            # A failed attempt of a replayed epoch that the (restored) state does not
            # know, in a target that holds the epoch: txsink cannot tell it from the
            # rest of a lost decision. The error's second remedy: resolve --abort.
            epoch = int(str(exc.epoch))
            prepared = {c.participant for c in self.backend.list_prepared(SINK)
                        if c.epoch == epoch}
            if prepared & self.ever_decided.get(epoch, set()):
                # The rest of a decision the restored state lost: the caller (the
                # restore) follows the first remedy, the newest state.
                assert after_restore, f"stopped on the rest of a decision: {exc}"
                raise
            FIRED["loud: unknown epoch held by the target"] += 1
            self.resolve_abort(epoch)
            return self.handled_start(self.new_run())  # the query is started again
        except ParticipantLostError as exc:
            # A failover lost participants of an in-doubt epoch: the documented remedy
            # is `txsink resolve --epoch N --abort --force`, and Spark replays the batch.
            assert exc.epoch in self.unfinished, exc
            FIRED["loud: participant lost"] += 1
            self.force_abort(int(exc.epoch))
            return self.handled_start(self.new_run())  # the query is started again

    def resolve_abort(self, epoch: int) -> None:
        """``txsink resolve CHECKPOINT --epoch N --abort`` for an undecided epoch."""
        operator = self.coordinator(self.new_run())
        operator.start(recover=False)
        operator.abort_epoch(epoch, [c for c in self.backend.list_prepared(SINK)
                                     if c.epoch == epoch])

    def force_abort(self, epoch: int) -> None:
        operator = self.coordinator(self.new_run())
        operator.start(recover=False)
        record = operator.store.get(epoch)
        assert record is not None and record.state is EpochState.DECIDED
        for c in record.committables:
            self.backend.abort(c)
        operator.store.delete(operator.lease, [epoch])
        # A standby from before this forced abort would bring the aborted decision's
        # participants back (committed ones included): no longer a failover target.
        self.snapshots.clear()
        self.decided.pop(epoch, None)
        self.unfinished.pop(epoch, None)
        self.lost.discard(epoch)

    # -- rules ---------------------------------------------------------------------------

    @rule(partitions=st.integers(1, 3), orphan=st.booleans(),
          crash=st.none() | st.sampled_from(CRASH_POINTS))
    def run_epoch(self, partitions: int, orphan: bool, crash: str | None) -> None:
        FIRED["crash" if crash else "epoch"] += 1
        epoch = self.spark_next
        parts = self.parts.setdefault(epoch, partitions)
        # The planner recovers, tasks prepare, the committer (same run, another
        # process in Spark) decides and commits: the crash is the committer's.
        if not self.handled_start(self.owner):
            return
        self.quiescent()  # the planner's recovery ran
        faults = FaultInjector([FaultRule(crash, epoch, "raise")]) if crash else None
        coord = self.coordinator(self.owner, faults)
        msgs = [self.prepare(epoch, p) for p in range(parts)]
        if orphan:
            self.prepare(epoch, 0)  # a failed task attempt: nobody reports it
        names = frozenset(c.participant for c in msgs)
        try:
            outcome = coord.commit_epoch(epoch, msgs)
        except InjectedFault:
            assert crash is not None
            if CRASH_POINTS.index(crash) >= CRASH_POINTS.index(AFTER_DECIDE):
                if epoch not in self.decided or epoch in self.lost:
                    self.decide(epoch, names)  # a new decision (not a re-commit)
                self.unfinished[epoch] = crash
            return  # Spark did not log the batch: it replays it
        if outcome is EpochOutcome.COMMITTED:
            # Only an epoch a failover took from the target may be written again (a
            # reset checkpoint with a restored, older state: the source starts over).
            assert epoch not in self.decided or epoch in self.lost, (
                f"epoch {epoch} committed twice")
            self.decide(epoch, names)
        self.spark_next += 1
        self.quiescent(started=False)

    @rule()
    def restart_driver(self) -> None:
        FIRED["restart"] += 1
        self.restart()

    @rule()
    def reset_checkpoint(self) -> None:
        """Delete the stream's checkpoint: a new query, batch ids from 0."""
        FIRED["reset checkpoint"] += 1
        self.saved_checkpoints.append((self.query, self.spark_next))
        self.query = f"q-{self.queries}"
        self.queries += 1
        self.spark_next = 0

    @precondition(lambda self: self.saved_checkpoints)
    @rule(data=st.data())
    def restore_checkpoint(self, data: st.DataObject) -> None:
        """Put a saved checkpoint back (the remedy the refusal names)."""
        FIRED["restore checkpoint"] += 1
        self.query, self.spark_next = data.draw(st.sampled_from(self.saved_checkpoints))

    @rule()
    def back_up_state(self) -> None:
        FIRED["back up state"] += 1
        if not self.unfinished:  # a backup of a state at rest (see restore_state)
            self.state_copies.append({
                "copy": self.copy_state(), "bound": self.bound_query, "query": self.query,
                "spark_next": self.spark_next, "decided": dict(self.decided)})

    @precondition(lambda self: self.state_copies and not self.failed_over)
    @rule(data=st.data(), with_checkpoint=st.booleans())
    def restore_state(self, data: st.DataObject, with_checkpoint: bool) -> None:
        """Restore the txsink state from a backup, maybe with the checkpoint (Spark
        then replays every batch after the backup).

        Backups are of states at rest (no epoch in doubt): a backup holding a DECIDED
        epoch, restored after the target moved on, stops with the participant lost
        (loud), which ``test_operations_lease``-style unit tests cover one by one.
        A restore *while* an epoch is in doubt is modelled: the decision is forgotten.
        """
        FIRED["restore state" + (" and checkpoint" if with_checkpoint else "")] += 1
        backup = data.draw(st.sampled_from(self.state_copies))
        query = backup["query"] if with_checkpoint else self.query
        if backup["bound"] not in (None, query):
            return  # refused at the next start (a checkpoint of another query): modelled
        self.restored = True
        newest = self.copy_state()
        self.put_state_back(backup["copy"])
        bound_before = self.bound_query
        self.bound_query = backup["bound"]
        if with_checkpoint:
            self.query, self.spark_next = backup["query"], backup["spark_next"]
        # Decisions the backup lacks: those Spark replays (not logged) and of which
        # nothing is in the target are written anew by the replay; those of which the
        # target holds a part with a prepared rest must stop the start, loudly.
        visible = {_epoch_of(r["id"]) for r in self.system.rows()}
        prepared = {(x.committable.epoch, x.committable.participant)
                    for x in self.system.prepared.values()}
        partial = {e for e, name in prepared if e not in backup["decided"] and e in visible
                   and name in self.ever_decided.get(e, set())}
        may_stop = {e for e, _ in prepared if e not in backup["decided"] and e in visible}
        for e in list(self.unfinished):
            if e not in backup["decided"] and e not in visible:
                self.decided.pop(e)
                self.unfinished.pop(e)
        try:
            self.restart(after_restore=True)
        except StateError as exc:
            assert "has no decision for it" in str(exc) and exc.epoch in may_stop, exc
            FIRED["loud: state older than target"] += 1
            # The remedy the error names: restore the newest state, restart.
            self.put_state_back(newest)
            self.bound_query = bound_before
            self.restart()
            return
        assert not partial, f"epochs {sorted(partial)} half committed without a stop"

    @rule()
    def snapshot_target(self) -> None:
        """What an async standby (or a backup of the target) holds right now."""
        FIRED["snapshot target"] += 1
        self.snapshots.append(self.system.snapshot())

    @precondition(lambda self: self.snapshots and not self.restored)
    @rule(data=st.data())
    def fail_over(self, data: st.DataObject) -> None:
        """The target fails over to a standby, or is restored: later commits are lost;
        what was prepared then is prepared again, and a decision rolls it forward."""
        FIRED["fail over"] += 1
        snap = data.draw(st.sampled_from(self.snapshots))
        self.failed_over = True
        there = {name for name, _ in snap.output} | set(snap.prepared)
        self.system.restore(snap)
        for epoch in self.decided:
            if self.ever_decided[epoch] & there:
                self.lost.discard(epoch)
            elif self.unfinished.get(epoch, AFTER_MARK_COMMITTED) == AFTER_MARK_COMMITTED:
                # Committed (and so marked) after the standby's position: gone, and a
                # replay of it is aborted as committed. A decision still DECIDED stops
                # the next start instead (the participant is lost: loud).
                self.lost.add(epoch)
        self.restart()

    @rule()
    def second_driver(self) -> None:
        """Another driver takes the sink over; the old one is kept, still running."""
        FIRED["second driver"] += 1
        self.zombie = self.coordinator(self.owner)
        self.zombie.start(recover=False)
        self.restart()

    @precondition(lambda self: self.zombie is not None)
    @rule(partitions=st.integers(1, 2))
    def fenced_driver_goes_on(self, partitions: int) -> None:
        """The taken-over driver commits, recovers, aborts: all fenced, nothing changed."""
        FIRED["fenced driver goes on"] += 1
        zombie = self.zombie
        assert zombie is not None
        self.zombie = None
        epoch = self.spark_next + 500  # an epoch of its own
        msgs = [self.prepare(epoch, p) for p in range(partitions)]
        before = (sorted(self.system.prepared), [n for n, _ in self.system.output],
                  sorted(self.open_store(self.location).states().items()))
        for action in (lambda: zombie.commit_epoch(epoch, msgs), zombie.recover,
                       lambda: zombie.abort_epoch(epoch, msgs)):
            try:
                action()
            except FencedError:
                continue
            raise AssertionError("a fenced driver was not fenced")
        after = (sorted(self.system.prepared), [n for n, _ in self.system.output],
                 sorted(self.open_store(self.location).states().items()))
        assert after == before, "a fenced driver changed something"
        self.restart()  # the current run's orphan scan removes what it prepared

    @precondition(lambda self: self.unfinished and not self.expect_refusal())
    @rule()
    def resolve_by_hand(self) -> None:
        """``txsink resolve --epoch N --commit`` for every in-doubt epoch."""
        FIRED["resolve by hand"] += 1
        operator = self.coordinator(self.new_run())
        operator.start(recover=False)
        store = self.open_store(self.location)
        for epoch, state in sorted(store.states().items()):
            record = store.get(epoch)
            if state is EpochState.DECIDED and record is not None:
                try:
                    operator.commit_epoch(epoch, list(record.committables))
                except ParticipantLostError:
                    assert epoch in self.lost or epoch in self.unfinished
                    FIRED["loud: participant lost"] += 1
                    self.force_abort(epoch)
        self.restart()

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def nothing_twice_and_nothing_undecided(self) -> None:
        ids = [r["id"] for r in self.system.rows()]
        assert len(ids) == len(set(ids)), "a row is visible twice"
        visible = {_epoch_of(i) for i in ids}
        assert visible <= set(self.decided), (
            f"epochs {sorted(visible - set(self.decided))} visible without a decision")


def settings_for(default: int) -> dict[str, Any]:
    """Hypothesis settings: ``default`` sequences, or ``TXSINK_OPERATIONS_EXAMPLES``."""
    from hypothesis import HealthCheck

    return {"max_examples": int(os.environ.get(EXAMPLES_ENV, default)),
            "stateful_step_count": 25, "deadline": None,
            "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much]}


class DirectoryOperations(OperationsModel):
    """The model over the directory state store."""

    def new_location(self) -> str:
        return str(self.tmp / "state")

    def open_store(self, location: str) -> StateStore:
        from txsink.state import DirectoryStateStore

        return DirectoryStateStore(location)

    def copy_state(self) -> str:
        copy = self.tmp / f"copy-{uuid.uuid4().hex[:12]}"
        if Path(self.location).exists():
            shutil.copytree(self.location, copy)
        else:
            copy.mkdir()
        return str(copy)

    def put_state_back(self, copy: str) -> None:
        shutil.rmtree(self.location, ignore_errors=True)
        shutil.copytree(copy, self.location)


Factory = Callable[[], OperationsModel]
