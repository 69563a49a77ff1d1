"""The gate: what every data path checks before an epoch is decided, in one place.

Four data paths write epochs: the Spark data source (``format("txsink")``), grouped
writes in ``foreachBatch`` (:func:`txsink.spark.epoch`), Spark's own Parquet writer (the
native path: files, Delta, Iceberg) and Real-time Mode. A check one path makes and
another skips is how rows got lost or doubled, so each path's adapter only translates
its events into calls of this module; none of them decides on its own. The gate asks
four questions:

**Identity** -- is this write a replay, and of which query?

* A micro-batch of a stream is (Spark's query id, batch id); its epoch is the state's
  ``stream_from`` + batch id, whichever path writes it (:meth:`Gate.start_stream`,
  :meth:`Gate.open_stream_batch`). A replaced checkpoint (a new query id) is refused
  (:class:`~txsink.errors.CheckpointChangedError`); a restored one replays the batch
  it logged last, which is skipped when the targets hold it, and plans the later ones
  anew: a batch whose offset log entry is not the one its epoch was written from is
  refused (:meth:`Gate.refuse_replanned`).
* A batch write reserves a fresh epoch; one with an identity (``txnAppId`` /
  ``version``) committed before is skipped, but only when the same driver wrote it: the
  same streaming query, or no stream for both (:meth:`Gate.committed_before`).
* A batch write never takes the state from a stream that writes through it
  (:meth:`Gate.start_batch`).

**Durability** -- everything the decision relies on is durable before the decision.
A backend returns a committable only once its data is durable (``pre_commit``,
``committable_for_directory``); the gate records participants only through the state
store's durable writes (:meth:`Gate.record`), and the decision is the next durable
write after them.

**Completeness** -- what is decided is what the tasks wrote. Every task of a data-source
write sends a committable or the epoch is not decided; for Spark's own writer, the rows
its tasks reported must be the rows the driver found (:meth:`Gate.check_reported`):
files written where the driver does not look (a node-local path on a cluster, a
non-local ``fs.defaultFS``) are refused, never committed in part.

**The empty epoch** -- a target without rows in an epoch takes part with an empty
participant (:meth:`Gate.with_empty_participants`), so every target records every epoch
and the consistent cut passes it.

Real-time Mode has no epochs: its targets keep source positions in the transactions
that write the rows. Its adapter asks the gate for identity all the same: whether the
stored positions are this run's (:func:`position_refusal`: the source topic by its id,
the destination by the check micro-batch sinks use), and, for every stream path,
whether a target writes a topic the stream reads (:func:`feedback_refusal`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from txsink.backend import Backend
from txsink.coordinator import Coordinator, EpochOutcome, record_prepared
from txsink.coordinator.identity import STREAM, kept
from txsink.errors import CheckpointChangedError, ConfigError, StateError
from txsink.group import TargetGroup, write_group
from txsink.model import Committable
from txsink.realtime.positions import SourcePartition, StoredPosition
from txsink.realtime.source import SourceTopics
from txsink.state import EpochRecord, EpochState, WriteId

log = logging.getLogger(__name__)

#: The attempt number of the empty participants the driver prepares itself.
DRIVER_ATTEMPT = 999_999_999
#: A stream writing through grouped writes from a driver on another host (whether it
#: runs cannot be told from here) is taken for stopped this long after its last batch.
STREAM_QUIET_S = 600.0


@dataclass(frozen=True)
class Opened:
    """What the gate answered for one write about to run.

    ``epoch``: the epoch it writes (-1 when skipped before one was reserved).
    ``skip``: why nothing of it is written (a replay), else None.
    """

    epoch: int
    skip: str | None = None


class Gate:
    """The checks every data path makes, around one sink's :class:`Coordinator`."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator

    @property
    def sink_id(self) -> str:
        return self.coordinator.sink_id

    # -- identity: streams ------------------------------------------------------------------

    def start_stream(self, query_id: str | None, *, recover: bool = True) -> None:
        """A stream's run: take the lease, bind the state to the query (the first time:
        fix ``stream_from``), refuse a replaced checkpoint, and recover."""
        self.coordinator.start(recover=recover, query_id=query_id, stream=True)

    def open_stream_batch(self, batch_id: int, query_id: str | None, owner: str, *,
                          legacy_app_id: str | None = None,
                          source: str | None = None) -> Opened:
        """Open micro-batch ``batch_id`` of a stream whose targets are written by
        separate jobs (the native path): its epoch is reserved for it, or the batch is a
        replay and nothing of it is written.

        ``legacy_app_id``: the app id under which an earlier release wrote this stream's
        batches as versioned batch writes (reserved epochs, version = batch id); a batch
        whose version it committed is a replay of it. Versions no stream drove (batch
        jobs' ``version=N``, a backfill) are no stream's batches: the stream goes on.

        ``source``: the digest of the batch's offsets in Spark's offset log
        (:func:`txsink.spark.queries.batch_source`), when known: a batch whose number
        the state or the targets hold with other offsets is refused, never skipped
        (:meth:`refuse_replanned`).
        """
        c = self.coordinator
        replayed = None
        if legacy_app_id is not None and c.write_query(legacy_app_id) is not None:
            write = WriteId(legacy_app_id, batch_id, query_id)
            # Asked before the start binds the state to this query: versions another
            # query wrote, or wrote from other offsets (Spark's plan anew after a
            # restored checkpoint), refuse it, and a refused batch must leave the state
            # bound as it was, or the refusal's way out (that query's checkpoint put
            # back) would be refused in turn.
            if self.committed_before(write, query_id, source=source):
                replayed = write
        self.start_stream(query_id)
        epoch = c.stream_epoch(batch_id)
        if replayed is not None:
            return Opened(epoch, f"batch {batch_id} of the query was committed as "
                                 f"version {batch_id} of {legacy_app_id!r} before")
        record = c.store.get(epoch)
        stranger = c.epochs.stranger(epoch, record) if (
            record is None or record.state is not EpochState.RESERVED
            or record.origin != STREAM) else None
        if stranger is not None:
            raise StateError(
                f"sink={self.sink_id} epoch={epoch}: micro-batch {batch_id} of the streaming "
                f"query {query_id or '(id unknown)'} is epoch {epoch}, which this sink's "
                f"state records for {stranger}: an epoch number holds one set of rows, so "
                "the batch is not taken for a replay of it. Nothing of it was written. "
                "Write batch jobs and the stream under separate sink_ids and checkpoints",
                sink_id=self.sink_id, epoch=epoch)
        self.refuse_replanned(epoch, batch_id, source, record)
        if record is not None and record.state is EpochState.COMMITTED:
            return Opened(epoch, "committed before (Spark replays a batch it did not log)")
        if record is not None and record.state is EpochState.DECIDED:
            # start() recovered it; a record still DECIDED failed to commit, and said so.
            raise StateError(f"sink={self.sink_id} epoch={epoch}: the epoch is DECIDED and "
                             "could not be committed; `txsink status` shows why",
                             sink_id=self.sink_id, epoch=epoch)
        if record is not None:  # RESERVED: this run's earlier attempt at the batch
            self.coordinator.abort_epoch(epoch, list(record.committables))
        meta = c.store.read_meta() or c.cached_meta
        if kept(meta, epoch):
            pass  # a forced resolve kept part of it: the decision writes only the rest
        elif record is None and epoch <= c.watermark():
            return Opened(epoch, "committed before (Spark replays a batch it did not log)")
        elif self._held_by_targets(epoch, batch_id):
            return Opened(epoch, "held by the targets already, although the state does "
                                 "not know it (the checkpoint was restored from an older "
                                 "copy)")
        reservation = EpochRecord(epoch, EpochState.RESERVED, (), time.time(), owner=owner,
                                  origin=STREAM, query_id=query_id, source=source)
        if not c.store.put_new(c.lease, reservation):
            raise StateError(f"sink={self.sink_id} epoch={epoch}: micro-batch {batch_id} is "
                             "being written by another run at the same time; two runs of "
                             "one query must never write at once", sink_id=self.sink_id,
                             epoch=epoch)
        return Opened(epoch)

    def _held_by_targets(self, epoch: int, batch_id: int) -> bool:
        """Whether the targets hold ``epoch`` (a replay after a restored checkpoint);
        a group some of whose targets hold it and some not is refused."""
        c = self.coordinator
        if c.group is None:
            return c.backend.holds_epoch(c.sink_id, epoch)
        held = c.group.held_by(epoch)
        if not any(held.values()):
            return False
        if all(held.values()):
            return True
        have = ", ".join(n for n, h in held.items() if h)
        lack = ", ".join(n for n, h in held.items() if not h)
        raise StateError(
            f"sink={self.sink_id} epoch={epoch}: target(s) {have} already hold epoch {epoch} "
            f"(micro-batch {batch_id}), which the txsink state at {c.store.location} does "
            f"not know, and target(s) {lack} do not: the state is older than the targets "
            "(restored from a backup?) and lost this epoch's decision while it was being "
            "committed. Nothing was written. Restore the newest state: its next start "
            "finishes the epoch in every target", sink_id=self.sink_id, epoch=epoch)

    def refuse_replanned(self, epoch: int, batch_id: int, source: str | None,
                         record: EpochRecord | None) -> None:
        """Refuse micro-batch ``batch_id`` (epoch ``epoch``) when the epoch was written
        from another offset log entry than ``source``'s: Spark planned it anew after its
        checkpoint was restored from an older copy, over the records that arrived since,
        not those the targets hold under that number. Skipped as a replay, the records
        beyond the old batch would be lost; written, those of the old batch would be there
        twice.

        What the epoch was written from: its state record's, else (a state that went
        back with the checkpoint, or pruned the record) the targets' note, asked only
        of targets that hold the epoch. Unknown on either side (a checkpoint txsink
        cannot read, an epoch an older release wrote, a target that keeps no note): not
        refused, the batch number decides as before."""
        if source is None:
            return
        c = self.coordinator
        known: str | None = None
        where = f"the txsink state at {c.store.location}"
        if record is not None and record.state in (EpochState.COMMITTED,
                                                   EpochState.DECIDED):
            known = record.source
        elif record is None or record.state is EpochState.RESERVED:
            # The note first: most targets keep none, and holds_epoch may cost a query.
            note = c.backend.epoch_source(c.sink_id, epoch)
            if note is not None and note != source and c.backend.holds_epoch(c.sink_id,
                                                                             epoch):
                known, where = note, "the targets"
        if known is None or known == source:
            return
        raise CheckpointChangedError(
            f"sink={self.sink_id} epoch={epoch}: Spark planned micro-batch {batch_id} anew: "
            f"its offset log entry is not the one of the batch {batch_id} that {where} "
            f"hold(s) as epoch {epoch}. The checkpoint was restored from an older copy, and "
            "Spark plans the batches after that copy over the records that arrived since. "
            "Skipped as a replay, records beyond the old batch would be lost; written, the "
            "old batch's records would be there twice. Nothing of it was written. Restore "
            "the checkpoint's newest copy (the one the targets were written with), and the "
            "stream goes on from there exactly once; if it is lost, start the query on a "
            "new checkpoint and sink_id whose starting offsets follow the last records the "
            "targets hold",
            sink_id=self.sink_id, epoch=epoch)

    # -- identity: batch writes -------------------------------------------------------------

    def start_batch(self, holder_alive: Callable[[str], bool | None] | None = None, *,
                    write: WriteId | None = None, query_id: str | None = None) -> None:
        """A batch write's run: refused on a state a stream writes through (before the
        lease, which would fence the stream's driver), then recovery.

        ``holder_alive``: tells whether the driver holding the state's lease still runs
        (True, False, None: cannot tell). Given, a write from another driver than a
        stream's that writes the state through ``foreachBatch`` grouped writes (and so
        takes no stream binding) is refused too while that stream runs: taking the lease
        would stop it (:meth:`_refuse_beside_running_stream`). ``write`` and ``query_id``:
        this write's identity and driving stream, when known: the stream's own writes,
        from a driver that took its place, are never refused."""
        if holder_alive is not None:
            self._refuse_beside_running_stream(holder_alive, write, query_id)
        self.coordinator.start(recover=True, batch=True)

    def _refuse_beside_running_stream(self, holder_alive: Callable[[str], bool | None],
                                      write: WriteId | None, query_id: str | None) -> None:
        c = self.coordinator
        info = c.store.lease_info()
        holder = str(info.get("owner") or "")
        if not holder or holder == c.owner or info.get("released_at") is not None:
            return
        alive = holder_alive(holder)
        if alive is False:
            return  # its driver is gone: the lease is taken over
        newest = max((r for r in c.store.records().values()
                      if r.write is not None and r.write.query_id),
                     key=lambda r: r.epoch, default=None)
        if newest is None:
            return  # the holder writes no stream's batches (two batch jobs at once)
        assert newest.write is not None
        if (write is not None and write.app_id == newest.write.app_id) or (
                query_id is not None and query_id == newest.write.query_id):
            # The stream's own writes, from a driver that took its place (its driver
            # died, possibly on another host, while the lease still names it; or a batch
            # job ran while it was stopped): it takes the lease, as any newer run of a
            # query does, and a run of it still going elsewhere is fenced at its next
            # step. A replaced checkpoint with the same app id is refused by the version
            # check.
            if alive:
                log.warning("sink=%s: the streaming query %s runs again from the driver "
                            "%s; the lease holder %s still runs and is fenced at its next "
                            "write", self.sink_id, query_id or newest.write.query_id,
                            c.owner, holder)
            return
        age = time.time() - (newest.committed_at or newest.decided_at)
        if alive is None and age > STREAM_QUIET_S:
            log.warning("sink=%s: the lease is held by %s, which wrote batches of the "
                        "streaming query %s, the last one %.0f s ago: taken for stopped, this "
                        "write takes the lease over (if that stream still runs, its next "
                        "batch is refused)", self.sink_id, holder, newest.write.query_id, age)
            return
        where = ("it runs on this host" if alive else
                 f"on another host, its last batch committed {age:.0f} s ago")
        raise StateError(
            f"sink={self.sink_id}: the streaming query {newest.write.query_id} writes this "
            "sink's state through foreachBatch writes with an identity (grouped writes "
            "with a version, or txnAppId/txnVersion) from the driver "
            f"{holder}, which holds the state's lease ({where}); a batch write from this "
            f"driver ({c.owner}) would take the lease over and stop that stream. Nothing "
            "was written. Run this write in the stream's own driver (its writes share the "
            "lease), or once the stream has stopped (a stream on another host is taken for "
            f"stopped {STREAM_QUIET_S / 60:.0f} minutes after its last batch), or under "
            "its own sink_id and state_location", sink_id=self.sink_id)

    def committed_before(self, write: WriteId | None, query_id: str | None, *,
                         source: str | None = None) -> bool:
        """Whether ``write`` was committed before and is skipped.

        Only by the same driver: versions of one app id written by another streaming
        query (a deleted or replaced checkpoint numbers batches from 0 again), or by batch
        jobs when a stream drives this one, are refused, never taken for replays; so is
        a version committed from other offsets than ``source``'s, the driving micro-batch's
        (:meth:`refuse_replanned`)."""
        if write is None:
            return False
        c = self.coordinator
        if c.committed_write(write) is None:
            return False
        c.check_write_query(dataclasses.replace(write, query_id=query_id))
        self._refuse_replanned_write(write, source)
        return True

    def _refuse_replanned_write(self, write: WriteId, source: str | None) -> None:
        """Refuse a committed ``write`` Spark drives again from another offset log entry
        than the one its version was written from."""
        if source is None:
            return
        done = next((r for r in self.coordinator.store.records().values()
                     if r.write is not None and r.write.app_id == write.app_id
                     and r.write.version == write.version
                     and r.state is not EpochState.RESERVED), None)
        if done is not None:
            self.refuse_replanned(done.epoch, write.version, source, done)

    def open_write(self, write: WriteId | None, query_id: str | None, *,
                   query_known: bool = True,
                   holder_alive: Callable[[str], bool | None] | None = None,
                   source: str | None = None) -> Opened:
        """Open a batch write: skipped when its identity was committed before by the same
        driver, else a fresh epoch reserved for it.

        ``query_known``: whether ``query_id`` says which stream drives the write (the data
        source learns it only from its tasks: its skip is confirmed at commit,
        :meth:`committed_before`). ``source``: the digest of the driving micro-batch's
        offsets, when known: a version committed from other offsets is refused, not
        skipped (:meth:`refuse_replanned`)."""
        c = self.coordinator
        if write is not None and query_known:
            # Another writer's versions of this app id: refused before the lease is
            # taken (which would stop that writer) and before anything is written.
            c.check_write_query(dataclasses.replace(write, query_id=query_id))
        self.start_batch(holder_alive, write=write,
                         query_id=query_id if query_known else None)
        if write is not None:
            self._refuse_behind_targets(write)
        if write is not None and c.committed_write(write) is not None:
            if query_known:
                c.check_write_query(dataclasses.replace(write, query_id=query_id))
            self._refuse_replanned_write(write, source)
            log.warning("sink=%s: write %s is already committed; skipping it, nothing is "
                        "written", self.sink_id, write)
            return Opened(-1, "committed already")
        return Opened(c.reserve_epoch(write))

    def _refuse_behind_targets(self, write: WriteId) -> None:
        """A versioned write on a state that knows fewer epochs than its targets hold:
        the state (or the checkpoint holding it) was restored from an older copy, and the
        versions written since are recorded nowhere it can read. A replayed version would
        be taken for a new write and its rows written twice: refused. (A micro-batch of
        a stream is recognised by its epoch number instead: :meth:`open_stream_batch`.)"""
        c = self.coordinator
        known = c.epochs.used_in_state()
        if known < 0:
            # A state that used no epoch yet: a new query's (on a sink id its old owner
            # released, whose epochs the targets hold); its writes are above them. A
            # state that used some and knows fewer than the targets hold is older than
            # them, whether or not it saw this app id (a copy taken before its first
            # version knows none of them).
            return
        held = c.epochs.held_by_targets()
        if held <= known:
            return
        raise StateError(
            f"sink={self.sink_id}: the targets hold epochs up to {held}, but the txsink state "
            f"at {c.store.location} knows epochs up to {known} only: the state (or the "
            "checkpoint holding it) was restored from an older copy. The versions of "
            f"{write.app_id!r} written since are not recorded in it, so write {write} "
            "cannot be told from a replay of one of them and would be written twice. "
            "Nothing was written. Put the newest state back; or write on under a new "
            "sink_id and output (a stream's own micro-batches, through write_stream, are "
            "recognised by the targets themselves)", sink_id=self.sink_id)

    # -- durability ---------------------------------------------------------------------------

    def record(self, owner: str, epoch: int, committables: Sequence[Committable],
               query_id: str | None) -> None:
        """Add durable participants to the reserved epoch (the state's write is synced);
        nothing is recorded that its backend did not make durable first."""
        record_prepared(self.coordinator.store, owner, epoch, committables, query_id)

    # -- completeness -------------------------------------------------------------------------

    def check_reported(self, epoch: int, committables: Sequence[Committable],
                       reported_rows: int | None, *, where: str) -> None:
        """Refuse participants whose files hold other rows than Spark's tasks reported
        writing (``reported_rows``; None: not known, nothing to compare).

        ``committables``: what the driver found for one target's write. ``where``: the
        directory as Spark was given it. Raised before they are recorded: their files
        are deleted, nothing of the epoch is decided."""
        found = sum(c.rows for c in committables)
        if reported_rows is None or reported_rows == found:
            return
        files = sum(len(c.payload.get("files") or ()) or 1 for c in committables)
        raise StateError(
            f"sink={self.sink_id} epoch={epoch}: Spark's tasks reported writing "
            f"{reported_rows} row(s) into {where}, but the driver finds {found} "
            f"row(s) there in {files} file(s): the executors' files are not where the "
            "driver looks. Seen with a node-local path on a cluster (give every node the "
            "same shared path), and with a path Spark resolved on another file system than "
            "the driver's (a non-local fs.defaultFS such as HDFS or dbfs:, with a "
            "/dbfs/... path): give the target a path every executor and the driver reach "
            "alike. Nothing of this epoch was decided; the files found were deleted",
            sink_id=self.sink_id, epoch=epoch)

    # -- the empty epoch ----------------------------------------------------------------------

    def with_empty_participants(self, epoch: int, prepared: Sequence[Committable]
                                ) -> list[Committable]:
        """``prepared`` and an empty participant for each target of the group that got
        none (no rows for it in this epoch, or no write of it): every target records
        every epoch of a group, which the consistent cut reads."""
        group = self.coordinator.group
        out = list(prepared)
        if group is None:
            return out  # a single sink: its epoch_committed marks an epoch without files
        missing = [n for n in group.members if n not in {c.target for c in prepared}]
        if missing:
            part = TargetGroup(group.group_id, [group.members[n] for n in missing])
            # An attempt number of the driver's own: no Spark task attempt uses it.
            out += write_group(part, epoch, 0, DRIVER_ATTEMPT, [])
        return out

    # -- the decision -------------------------------------------------------------------------

    def decide(self, epoch: int, committables: Sequence[Committable | None], *,
               write_query: str | None = None, source: str | None = None,
               batch_id: int | None = None) -> EpochOutcome:
        """Decide and commit ``epoch`` (the coordinator's decision: validates every
        participant, recognises replays, then the durable decision record).

        ``source``: the digest of the micro-batch's offsets (``batch_id``), kept in the
        decision and noted in the targets. A write that reserved no epoch (the data
        source's micro-batch, whose replay finds the epoch decided or committed) is
        checked here against what the epoch was written from
        (:meth:`refuse_replanned`); refused, its participants are rolled back. A
        reserved one was checked when it opened."""
        c = self.coordinator
        if source is not None:
            record = c.store.get(epoch)
            if record is None or record.state is not EpochState.RESERVED:
                try:
                    self.refuse_replanned(epoch, epoch if batch_id is None else batch_id,
                                          source, record)
                except CheckpointChangedError:
                    for p in committables:
                        if p is not None:
                            c.backend.abort(p)
                    raise
            if record is None or record.state is EpochState.RESERVED:
                c.backend.note_epoch_source(c.sink_id, epoch, source)
        return c.commit_epoch(epoch, committables, write_query=write_query, source=source)

    def reserved(self, epoch: int) -> EpochRecord:
        """The reservation of ``epoch`` with what was recorded in it, or a refusal."""
        record = self.coordinator.store.get(epoch)
        if record is None or record.state is not EpochState.RESERVED:
            raise StateError(
                f"sink={self.sink_id} epoch={epoch}: the epoch's reservation is gone (a newer "
                "run took it over?); nothing of it is committed", sink_id=self.sink_id,
                epoch=epoch)
        return record


def feedback_refusal(source: SourceTopics, feeding: Sequence[tuple[str, str]], *,
                     sink_id: str) -> ConfigError | None:
    """Identity of the source, for every stream path (micro-batch and Real-time Mode):
    the refusal of a target that writes a topic the stream reads (``subscribe``, a
    ``subscribePattern`` matching it, an ``assign`` naming it, on the same brokers):
    every record it writes would be read and written again, without end. ``feeding``:
    (option field, place) of each such target, as its path judged it (``Backend.feeds``,
    ``RealtimeTargetSpec.feeds``); ``None`` when there is none."""
    if not feeding:
        return None
    where, place = feeding[0]
    return ConfigError(
        f"{where}: the target writes {place}, the topic the query reads "
        f"({source.describe()}): every record it writes would be read again and written "
        "again, without end; nothing was written. Write another topic, or read without it",
        field=where, sink_id=sink_id)


def refuse_feedback(backend: Backend, sink_id: str, source: SourceTopics, *,
                    field: str = "sink") -> None:
    """:func:`feedback_refusal` for a micro-batch sink (one backend or a group)."""
    if isinstance(backend, TargetGroup):
        feeding = [(f"targets[{m.name}].options.topic", m.backend.describe())
                   for m in backend.members.values() if m.backend.feeds(source)]
    else:
        feeding = ([(f"{field}.options.topic", backend.describe())]
                   if backend.feeds(source) else [])
    refusal = feedback_refusal(source, feeding, sink_id=sink_id)
    if refusal is not None:
        raise refusal


def position_refusal(sink_id: str, stored: Mapping[SourcePartition, StoredPosition],
                     destination: Mapping[str, str], topic_ids: Mapping[str, str],
                     ends: Callable[[str], Mapping[int, int]] | None, *,
                     field: str) -> ConfigError | None:
    """Identity in Real-time Mode, asked on the driver before any data moves: whether
    the positions a real-time target stored are this run's (the same source topic, by
    its id; the same destination, by :func:`txsink.targets.moved_target`, the check of
    every micro-batch path). Each task's claim asks the same of the position it reads
    (:func:`txsink.realtime.identity.claim_refusal`)."""
    from txsink.realtime.identity import start_identity_refusal

    return start_identity_refusal(sink_id, stored, destination, topic_ids, ends,
                                  field=field)


__all__ = ["DRIVER_ATTEMPT", "Gate", "Opened", "feedback_refusal", "position_refusal",
           "refuse_feedback"]
