"""The driver side of the protocol: decide, commit, recover.

For each epoch the coordinator durably writes the decision (the commit point),
commits every participant with bounded retries, then marks the epoch COMMITTED.
On start, and whenever it meets an epoch it already knows, it follows the recovery
table of the design notes: re-commit decided epochs, abort replayed attempts of
committed epochs, abort orphans no decided epoch holds. A decided participant is
never aborted and never dropped: if it cannot be committed the pipeline stops with
an error naming it, and the epoch stays DECIDED for the next start.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from txsink.backend import Backend, CommitOutcome
from txsink.decisions import (
    ARCHIVE_CHUNK,
    DEFAULT_ARCHIVE_RETENTION_S,
    DecisionNames,
    archive_records,
    expired_chunks,
)
from txsink.errors import (
    CheckpointChangedError,
    CommitError,
    ConfigError,
    FatalCommitError,
    ParticipantLostError,
    PluginError,
    RetriableCommitError,
    StateError,
    TxsinkError,
)
from txsink.faults import (
    AFTER_DECIDE,
    AFTER_FIRST_COMMIT,
    AFTER_MARK_COMMITTED,
    AFTER_SALVAGE_COMMIT,
    AFTER_SALVAGE_PREPARE,
    AFTER_SALVAGE_RECORD,
    BEFORE_DECIDE,
    BEFORE_MARK_COMMITTED,
    FaultInjector,
)
from txsink.group import TargetGroup
from txsink.model import (
    Committable,
    DeliveryGuarantee,
    RecoveryReport,
    TransactionContext,
    salvage_attempt,
    validate_sink_id,
)
from txsink.plugins import Plugins, get_plugins
from txsink.redact import redact
from txsink.state import (
    EpochRecord,
    EpochState,
    Lease,
    SinkMeta,
    StateStore,
    WriteId,
    new_owner_token,
)

log = logging.getLogger(__name__)

#: Batch-write identities (``txnAppId``) whose committed version a sink remembers.
MAX_WRITE_IDS = 1000
#: Salvages of one epoch in one ``_finish``: a replacement lost again at once (its own
#: timeout expired while it was committed) is salvaged again, this many times in all.
MAX_SALVAGE_ROUNDS = 3


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff for commits of decided participants."""

    attempts: int = 5
    initial_backoff_s: float = 0.2
    max_backoff_s: float = 5.0
    sleep: Callable[[float], None] = time.sleep


class EpochOutcome(str, enum.Enum):
    #: Decided and committed now.
    COMMITTED = "committed"
    #: Already committed before (Spark replayed it): this attempt's participants aborted.
    REPLAYED = "replayed"
    #: Found DECIDED from a crashed run: its participants committed now, this attempt's aborted.
    RECOVERED = "recovered"


class Coordinator:
    """Decides and commits the epochs of one sink. Plain Python: no Spark in here.

    :param owner: identifies this coordinator run for fencing; two coordinators with
        different owners on the same state cannot both write.
    :param scan_orphans: abort orphans of epochs up to each committed epoch right
        after committing it (task retries and speculative attempts leave some).
    """

    def __init__(
        self,
        backend: Backend,
        store: StateStore,
        sink_id: str,
        *,
        backend_options: Mapping[str, str] | None = None,
        owner: str | None = None,
        plugins: Plugins | None = None,
        retry: RetryPolicy | None = None,
        retain_epochs: int = 100,
        scan_orphans: bool = True,
        faults: FaultInjector | None = None,
        guarantee: DeliveryGuarantee = DeliveryGuarantee.EXACTLY_ONCE,
        archive_retention_s: float = DEFAULT_ARCHIVE_RETENTION_S,
    ) -> None:
        self.guarantee = guarantee
        self.archive_retention_s = archive_retention_s
        self.backend = backend
        self.store = store
        self.sink_id = validate_sink_id(sink_id)
        self.owner = owner or new_owner_token()
        self.plugins = plugins if plugins is not None else get_plugins()
        self.retry = retry or RetryPolicy()
        self.retain_epochs = retain_epochs
        self.scan_orphans = scan_orphans
        self.faults = faults if faults is not None else FaultInjector.from_env()
        self._options = dict(backend_options or {})
        self._last_salvage_attempt = 0
        self._lease: Lease | None = None
        self._meta: SinkMeta | None = None
        #: The group of targets this coordinator drives, if it drives one.
        self.group = backend if isinstance(backend, TargetGroup) else None

    def _sink_ids(self) -> dict[str, str | None]:
        """The sink id of each target (``None`` for a sink with one target)."""
        if self.group is None:
            return {self.sink_id: None}
        return {m.sink_id: m.name for m in self.group.members.values()}

    def _belongs(self, c: Committable) -> bool:
        if self.group is None:
            return (c.sink_id == self.sink_id and c.backend == self.backend.name
                    and c.target is None)
        m = self.group.members.get(c.target or "")
        return m is not None and c.sink_id == m.sink_id and c.backend == m.backend.name

    def _check_targets(self, meta: SinkMeta) -> SinkMeta:
        """A group's targets are the ones its state was written with, and kept there."""
        if self.group is None:
            return meta
        now = self.group.meta_targets()
        before = {n: str(t.get("backend")) for n, t in meta.targets.items()}
        given = {n: str(t["backend"]) for n, t in now.items()}
        if meta.targets and before != given:
            def words(targets: Mapping[str, str]) -> str:
                return ", ".join(f"{n} ({b})" for n, b in targets.items())

            raise ConfigError(
                f"sink {self.sink_id!r}: its targets were {words(before)}, this run has "
                f"{words(given)}. A group's targets cannot change: recovery must reach every "
                "target an epoch was decided in. Run with the targets as they were, or "
                "write the new set of targets under a new sink_id with a new checkpoint",
                field="targets", sink_id=self.sink_id)
        if dict(meta.targets) != now:
            meta = dataclasses.replace(meta, targets=now)
            self.store.write_meta(self.lease, meta)
        return meta

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, *, recover: bool = True, up_to_epoch: int | None = None,
              query_id: str | None = None) -> RecoveryReport:
        """Take the state's lease, bind it to this sink, and (by default) recover.

        :param query_id: the identity of the engine's checkpoint (Spark's query id). The
            state remembers the first one it sees; another one means the checkpoint was
            deleted or replaced while the state was kept, and its batch numbers mean
            nothing to this state, so the start is refused.
        """
        self._lease = self.store.acquire(self.owner)
        meta = self.store.read_meta()
        if meta is not None and meta.sink_id != self.sink_id:
            raise ConfigError(
                f"the txsink state at {self.store.location} belongs to sink "
                f"{meta.sink_id!r}, not {self.sink_id!r}; use a new checkpoint location "
                "for a new sink id",
                field="sink_id",
                sink_id=self.sink_id,
            )
        if meta is not None and meta.backend != self.backend.name:
            raise ConfigError(
                f"sink {self.sink_id!r} was written with backend {meta.backend!r}, not "
                f"{self.backend.name!r}; use a new sink id and checkpoint for a new backend",
                field="backend",
                sink_id=self.sink_id,
            )
        if meta is not None and query_id and meta.query_id and meta.query_id != query_id:
            raise CheckpointChangedError(
                f"sink {self.sink_id!r}: the txsink state at {self.store.location} belongs to "
                f"the Spark query {meta.query_id}, but the checkpoint now belongs to query "
                f"{query_id}: the checkpoint was deleted or replaced while the state was "
                "kept. Spark numbers batches from 0 again, and the state would take the new "
                "batches for replays and drop them, so nothing is written. Either restore "
                "the checkpoint that belongs to this state, or start a new sink: a new "
                "sink_id with a new, empty state_location (and, for the files backend, a "
                "new path)", sink_id=self.sink_id)
        if meta is None:
            meta = SinkMeta(self.sink_id, self.backend.name,
                            self.backend.safe_options(self._options), query_id=query_id or None,
                            guarantee=self.guarantee.value,
                            targets=self.group.meta_targets() if self.group else {})
            self.store.write_meta(self._lease, meta)
        elif meta.guarantee != self.guarantee.value:
            log.warning("sink=%s: delivery guarantee changes from %s to %s from now on; "
                        "epochs written before keep what their guarantee gave readers",
                        self.sink_id, meta.guarantee, self.guarantee.value)
            meta = dataclasses.replace(meta, guarantee=self.guarantee.value)
            self.store.write_meta(self._lease, meta)
        elif query_id and meta.query_id is None:
            meta = dataclasses.replace(meta, query_id=query_id)
            self.store.write_meta(self._lease, meta)
        meta = self._check_targets(meta)
        self._meta = meta
        # Before recovery can abort anything as an orphan: make sure no other query
        # (another state) writes under this sink id.
        self.backend.claim_sink(self.sink_id, meta.state_id, self.store.location)
        self.plugins.coordinator_started(self.sink_id, self.backend.name,
                                         self.backend.participant_timeout_s())
        return self.recover(up_to_epoch=up_to_epoch) if recover else RecoveryReport()

    @property
    def lease(self) -> Lease:
        if self._lease is None:
            self.start(recover=False)
        assert self._lease is not None
        return self._lease

    def watermark(self) -> int:
        """The highest epoch known to be COMMITTED (records may have been pruned)."""
        meta = self.store.read_meta()
        best = meta.committed_watermark if meta else -1
        committed = [e for e, s in self.store.states().items() if s is EpochState.COMMITTED]
        return max([best, *committed])

    def allocate_epoch(self) -> int:
        """The next unused epoch (not reserved: see :meth:`reserve_epoch`)."""
        known = list(self.store.states())
        return max([self.watermark(), *known]) + 1

    def committed_write(self, write: WriteId) -> int | None:
        """The highest committed version of ``write.app_id`` if it is ``>= write.version``."""
        meta = self.store.read_meta()
        best = meta.writes.get(write.app_id, -1) if meta else -1
        for record in self.store.records().values():
            if (record.state is EpochState.COMMITTED and record.write is not None
                    and record.write.app_id == write.app_id):
                best = max(best, record.write.version)
        return best if best >= write.version else None

    def write_query(self, app_id: str) -> str | None:
        """The streaming query that drove the committed versions of ``app_id``, if any."""
        meta = self.store.read_meta()
        query = meta.write_queries.get(app_id) if meta else None
        if query is None:
            best = -1
            for record in self.store.records().values():
                w = record.write
                if (record.state is EpochState.COMMITTED and w is not None
                        and w.app_id == app_id and w.query_id and w.version > best):
                    best, query = w.version, w.query_id
        return query

    def check_write_query(self, write: WriteId) -> None:
        """Refuse a ``foreachBatch`` write whose versions count in another query.

        Spark numbers a stream's batches from 0 again when its checkpoint is deleted
        or replaced; with ``txnVersion=batch_id`` every new batch would look committed
        and be dropped. The query id (kept in the checkpoint) tells the two apart.
        """
        if write.query_id is None:
            return
        before = self.write_query(write.app_id)
        if before is None or before == write.query_id:
            return
        meta = self.store.read_meta()
        best = meta.writes.get(write.app_id, -1) if meta else -1
        raise CheckpointChangedError(
            f"sink={self.sink_id}: batch write {write} is driven by the streaming query "
            f"{write.query_id}, but the versions of txnAppId {write.app_id!r} (committed up "
            f"to {best}) were written by the query {before}: the stream's checkpoint was "
            "deleted or replaced, and Spark numbers its batches from 0 again, so each new "
            "batch would be taken for one already written and dropped. Nothing of this "
            "batch was written. Restore the stream's checkpoint, or give the writes a new "
            "txnAppId (one per query, e.g. derived from the checkpoint's name)",
            sink_id=self.sink_id)

    def reserve_epoch(self, write: WriteId | None = None) -> int:
        """Reserve a fresh epoch for one batch write; concurrent writes get distinct ones.

        With ``write``, a second write of the same identity in flight is refused (the
        one holding the lower epoch goes on), so one identity is committed at most once.
        """
        lease = self.lease
        while True:
            epoch = self.allocate_epoch()
            record = EpochRecord(epoch, EpochState.RESERVED, (), time.time(), write=write,
                                 owner=self.owner)
            if self.store.put_new(lease, record):
                break
        if write is not None:
            rival = self._rival(epoch, write)
            if rival is not None:
                self.store.delete(lease, [epoch])
                raise StateError(
                    f"sink={self.sink_id}: batch write {write} is already being written or "
                    f"was written (epoch {rival.epoch}, {rival.state.value}); a write "
                    "identity is written at most once, so this one writes nothing",
                    sink_id=self.sink_id, epoch=epoch)
        log.info("sink=%s epoch=%d: reserved for a batch write%s", self.sink_id, epoch,
                 f" ({write})" if write else "")
        return epoch

    def _rival(self, epoch: int, write: WriteId) -> EpochRecord | None:
        """Another record of the same write identity that wins over ``epoch``."""
        for other in sorted(self.store.records().values(), key=lambda r: r.epoch):
            if other.epoch == epoch or other.write is None:
                continue
            if other.write.app_id != write.app_id or other.write.version < write.version:
                continue
            if other.state is not EpochState.RESERVED or other.epoch < epoch:
                return other
        return None

    def recover(self, *, up_to_epoch: int | None = None) -> RecoveryReport:
        """Re-commit DECIDED epochs, then abort orphans (epochs ``<= up_to_epoch``).

        Epochs this owner reserved for batch writes still in flight keep their
        participants; reservations of other owners (a crashed or fenced run: this
        one holds the lease now) are dropped and their participants aborted.
        """
        lease = self.lease
        self.store.check(lease)  # a run taken over recovers nothing: the newer one does
        report = RecoveryReport()
        # The streaming writer recovers before every epoch it commits: read the
        # states, then only the bodies of the records recovery acts on.
        states = self.store.states()
        for epoch, state in sorted(states.items()):
            record = self.store.get(epoch) if state is EpochState.DECIDED else None
            if record is not None and record.state is EpochState.DECIDED:
                log.warning("sink=%s epoch=%d: found DECIDED but not COMMITTED; committing "
                            "its %d participant(s) again", self.sink_id, epoch,
                            len(record.committables))
                self._finish(record)
                report.recommitted_epochs.append(epoch)
        self.store.check(lease)
        reserved = [self.store.get(e) for e, s in states.items() if s is EpochState.RESERVED]
        stale = [r for r in reserved if r is not None and r.state is EpochState.RESERVED
                 and r.owner != self.owner]
        # The states listed before the re-commits serve: an epoch committed since
        # is read as such, and its participants are no longer prepared anyway.
        report.aborted_orphans = [c.participant for c in self._abort_orphans(
            up_to_epoch, states, reclaim_stale=True)]
        if stale:
            for r in stale:
                log.warning("sink=%s epoch=%d: batch write%s reserved by %s was never "
                            "decided (that run crashed or was fenced); its participants "
                            "were aborted and nothing of it is committed", self.sink_id,
                            r.epoch, f" {r.write}" if r.write else "", r.owner)
            self.store.delete(lease, [r.epoch for r in stale])
        if report:
            log.info("sink=%s recovery: re-committed epochs %s, aborted %d orphan(s)",
                     self.sink_id, report.recommitted_epochs, len(report.aborted_orphans))
        self.plugins.recovered(self.sink_id, report)
        return report

    # -- the protocol -------------------------------------------------------------------

    def commit_epoch(
        self, epoch: int, messages: Sequence[Committable | None], *,
        write_query: str | None = None,
    ) -> EpochOutcome:
        """Decide and commit ``epoch`` given every writer's committable.

        :param write_query: the streaming query driving a batch write (``foreachBatch``):
            bound to the write's identity, and checked against the query that wrote
            its earlier versions (:meth:`check_write_query`).
        """
        lease = self.lease
        committables = self._validate(epoch, messages)
        record = self.store.get(epoch)
        write: WriteId | None = None
        reserved = record is not None and record.state is EpochState.RESERVED
        if record is not None and record.state is EpochState.RESERVED:
            if record.owner != self.owner:
                self._abort_all(epoch, committables, "aborted", raise_errors=False)
                raise StateError(
                    f"sink={self.sink_id} epoch={epoch}: the epoch is reserved by another "
                    f"run ({record.owner}); this write's {len(committables)} participant(s) "
                    "were aborted and nothing was committed", sink_id=self.sink_id,
                    epoch=epoch)
            write = record.write
            if write is not None and write_query is not None:
                write = dataclasses.replace(write, query_id=write_query)
                try:
                    self.check_write_query(write)
                except StateError:
                    self._discard_reserved(epoch, committables)
                    raise
            if write is not None:
                rival = self._rival(epoch, write)
                if rival is not None:
                    self._discard_reserved(epoch, committables)
                    raise StateError(
                        f"sink={self.sink_id} epoch={epoch}: batch write {write} was written "
                        f"meanwhile by epoch {rival.epoch}; this write's "
                        f"{len(committables)} participant(s) were aborted and nothing of it "
                        "is committed", sink_id=self.sink_id, epoch=epoch)
            record = None
        if record is None and not reserved and epoch <= self.watermark():
            record_state: EpochState | None = EpochState.COMMITTED
        else:
            record_state = record.state if record else None

        if record_state is EpochState.COMMITTED:
            # Spark replays a batch whose commit it did not log: the output already
            # holds it exactly once, so everything this attempt prepared goes.
            log.info("sink=%s epoch=%d already committed; aborting %d replayed participant(s)",
                     self.sink_id, epoch, len(committables))
            self._abort_all(epoch, committables, "replayed")
            return EpochOutcome.REPLAYED

        if record is not None and record.state is EpochState.DECIDED:
            self._finish(record)
            extra = [c for c in committables if c not in record.committables]
            self._abort_all(epoch, extra, "replayed")
            return EpochOutcome.RECOVERED

        meta = self.store.read_meta() or self._meta
        kept = _kept(meta, epoch)
        if kept:
            # A forced resolve gave this epoch up with these partitions committed: they
            # stay, and the replay writes only the others.
            again = [c for c in committables if (c.target, c.partition) in kept]
            self._abort_all(epoch, again, "replayed")
            committables = [c for c in committables if (c.target, c.partition) not in kept]
            log.warning("sink=%s epoch=%d: replay of an epoch a forced resolve gave up: "
                        "partitions %s stayed committed and are not written again; %d "
                        "participant(s) of the other partitions are decided now",
                        self.sink_id, epoch, _kept_words(kept), len(committables))
        elif self.backend.holds_epoch(self.sink_id, epoch):
            return self._held_by_target(epoch, committables, reserved=reserved)

        self._check_secrets(epoch, committables)
        self.plugins.epoch_prepared(self.sink_id, epoch, committables)
        self.faults.hit(BEFORE_DECIDE, epoch)
        record = EpochRecord(epoch, EpochState.DECIDED, tuple(committables), time.time(),
                             write=write)
        self.store.put(lease, record)  # the commit point of the epoch
        log.info("sink=%s epoch=%d decided: %d participant(s), %d row(s)",
                 self.sink_id, epoch, len(committables), record.rows)
        self.plugins.epoch_decided(self.sink_id, epoch, committables)
        self.faults.hit(AFTER_DECIDE, epoch)
        self._finish(record)
        if kept and meta is not None:
            latest = self.store.read_meta() or meta
            self._meta = dataclasses.replace(
                latest, kept={e: p for e, p in latest.kept.items() if e != epoch},
                kept_targets={e: p for e, p in latest.kept_targets.items() if e != epoch})
            self.store.write_meta(lease, self._meta)
        # One listing of the states serves the orphan scan and pruning (the scan
        # writes none); only the records they act on are read.
        states = self.store.states()
        if self.scan_orphans:
            self._abort_orphans(epoch, states)
        self._prune(states)
        return EpochOutcome.COMMITTED

    def record_epoch(self, epoch: int, messages: Sequence[Committable | None],
                     guarantee: DeliveryGuarantee, *,
                     write_query: str | None = None) -> EpochOutcome:
        """Record an epoch whose tasks committed their own participants.

        Under ``at_least_once`` and ``none`` there is no decision to make: the data is
        visible already. The record is what ``txsink status``, metrics and write
        identities read. A replayed epoch was written again by its tasks: said loudly,
        since readers now see its rows twice.
        """
        lease = self.lease
        committables = [m for m in messages if m is not None]
        for c in committables:
            if c.sink_id != self.sink_id or c.epoch != epoch or c.backend != self.backend.name:
                raise StateError(f"committable {c.describe()} backend={c.backend} does not "
                                 f"belong to sink={self.sink_id} epoch={epoch}",
                                 sink_id=self.sink_id, epoch=epoch)
        rows = sum(c.rows for c in committables)
        missing = len(messages) - len(committables)
        if missing:
            log.warning("sink=%s epoch=%d: %d writer(s) sent nothing under %s; what they "
                        "committed before failing stays visible", self.sink_id, epoch,
                        missing, guarantee.value)
        record = self.store.get(epoch)
        write = record.write if record is not None else None
        if write is not None and write_query is not None:
            write = dataclasses.replace(write, query_id=write_query)
            self.check_write_query(write)  # its tasks' rows are visible already: say so
        if record is not None and record.state is EpochState.DECIDED:
            # An exactly-once run crashed after deciding this epoch: finish it first.
            self._finish(record)
            record = self.store.get(epoch)
        seen_before = (record is not None and record.state is EpochState.COMMITTED) or (
            record is None and epoch <= self.watermark())
        if seen_before:
            log.warning("sink=%s epoch=%d: Spark replayed an epoch that was written before; "
                        "under %s its tasks wrote %d row(s) again, so readers see them twice",
                        self.sink_id, epoch, guarantee.value, rows)
            return EpochOutcome.REPLAYED
        # The target's own per-epoch marker (files epoch markers, S3 manifests), as for a
        # committed exactly-once epoch: what holds_epoch and readers go by.
        self.backend.epoch_committed(self.sink_id, epoch, committables)
        now = time.time()
        if write is not None:
            self._remember_write(write)  # before the record can be pruned (see _finish)
        self.store.put(lease, EpochRecord(epoch, EpochState.COMMITTED, tuple(committables),
                                          now, now, write))
        log.info("sink=%s epoch=%d written by its tasks (%s): %d participant(s), %d row(s)",
                 self.sink_id, epoch, guarantee.value, len(committables), rows)
        # The same crash point as after an exactly-once decision: the epoch is durable
        # in the target, and Spark has not logged it yet.
        self.faults.hit(AFTER_DECIDE, epoch)
        self.plugins.epoch_committed(self.sink_id, epoch, committables, 0.0)
        states = self.store.states()
        if self.scan_orphans:
            self._abort_orphans(epoch, states)
        self._prune(states)
        return EpochOutcome.COMMITTED

    def _discard_reserved(self, epoch: int, committables: Sequence[Committable]) -> None:
        self._abort_all(epoch, committables, "aborted", raise_errors=False)
        record = self.store.get(epoch)
        if record is not None and record.state is EpochState.RESERVED:
            self.store.delete(self.lease, [epoch])

    def _held_by_target(self, epoch: int, committables: Sequence[Committable],
                        *, reserved: bool) -> EpochOutcome:
        """The target already holds an epoch the state does not know: never write it twice."""
        rows = sum(c.rows for c in committables)
        if self.group is not None:
            held = self.group.held_by(epoch)
            if not all(held.values()):
                self._discard_reserved(epoch, committables)
                have = ", ".join(n for n, h in held.items() if h)
                lack = ", ".join(n for n, h in held.items() if not h)
                raise StateError(
                    f"sink={self.sink_id} epoch={epoch}: target(s) {have} already hold epoch "
                    f"{epoch}, which the txsink state at {self.store.location} does not know, "
                    f"and target(s) {lack} do not: the state is older than the targets "
                    "(restored from a backup?) and lost this epoch's decision while it was "
                    f"being committed. This attempt's {len(committables)} participant(s) "
                    f"({rows} row(s)) were aborted and nothing was written. Restore the "
                    "newest state: its next start finishes the epoch in every target",
                    sink_id=self.sink_id, epoch=epoch)
        if reserved:
            self._discard_reserved(epoch, committables)
            raise StateError(
                f"sink={self.sink_id} epoch={epoch}: {self.backend.describe()} already holds "
                f"epoch {epoch} of this sink, which the txsink state at "
                f"{self.store.location} does not know: the state is older than the target "
                "(restored from a backup?). This batch write's participants "
                f"({rows} row(s)) were aborted and nothing was written; restore the newest "
                "state, or write into a new sink", sink_id=self.sink_id, epoch=epoch)
        log.warning(
            "sink=%s epoch=%d: %s already holds this epoch, but the txsink state at %s does "
            "not know it: the checkpoint was restored from an older backup and Spark "
            "replays an epoch that was committed before. Aborting this attempt's %d "
            "participant(s) (%d row(s)) instead of writing the epoch twice", self.sink_id,
            epoch, self.backend.describe(), self.store.location, len(committables), rows)
        self._abort_all(epoch, committables, "replayed")
        return EpochOutcome.REPLAYED

    def abort_epoch(self, epoch: int, messages: Sequence[Committable | None]) -> None:
        """Roll back an epoch that will not be committed (a task failed, or Spark aborted).

        Participants of a *decided* epoch are never aborted: they are left to recovery.
        Failed tasks send no committable, so their participants are found as orphans.
        """
        lease = self.lease
        record = self.store.get(epoch)
        protected = record.committables if record is not None else ()
        if record is not None and record.state is EpochState.DECIDED:
            log.warning("sink=%s epoch=%d: abort requested for a DECIDED epoch; its "
                        "participants stay prepared and will be committed on recovery",
                        self.sink_id, epoch)
        to_abort = [c for c in messages if c is not None and c not in protected]
        # A run taken over aborts nothing: the newer run's orphan scan does it, knowing
        # what the newer run decided meanwhile.
        self.store.check(lease)
        self._abort_all(epoch, to_abort, "aborted", raise_errors=False)
        if (record is not None and record.state is EpochState.RESERVED
                and record.owner == self.owner):
            self.store.delete(lease, [epoch])  # the batch write gave up its epoch
        try:
            self.store.check(lease)
            self._abort_orphans(epoch)
        except TxsinkError:
            raise
        except Exception:
            log.exception("sink=%s epoch=%d: orphan scan after abort failed; the next "
                          "start will retry it", self.sink_id, epoch)

    # -- internals ----------------------------------------------------------------------

    def _validate(self, epoch: int, messages: Sequence[Committable | None]) -> list[Committable]:
        committables = [m for m in messages if m is not None]
        problem = None
        if len(committables) != len(messages):
            problem = (f"{len(messages) - len(committables)} writer(s) sent no committable; "
                       "an epoch can only be committed when every writer prepared")
        seen: dict[tuple[str | None, int], Committable] = {}
        for c in committables:
            if not self._belongs(c) or c.epoch != epoch:
                problem = (f"committable {c.describe()} backend={c.backend} does not belong to "
                           f"sink={self.sink_id} epoch={epoch} backend={self.backend.name}")
            key = (c.target, c.partition)
            if key in seen:
                where = f" of target {c.target}" if c.target else ""
                problem = (f"two committables for partition {c.partition}{where}: "
                           f"{seen[key].participant} and {c.participant}")
            seen[key] = c
        if self.group is not None and committables and not problem:
            missing = [n for n in self.group.members if n not in {t for t, _ in seen}]
            if missing:
                problem = (f"no participant in target(s) {', '.join(missing)}: every target "
                           "of a group takes part in every epoch")
        if problem:
            self.abort_epoch(epoch, [c for c in committables if self._belongs(c)])
            raise StateError(f"sink={self.sink_id} epoch={epoch}: {problem}; nothing was "
                             "committed", sink_id=self.sink_id, epoch=epoch)
        return committables

    def _check_secrets(self, epoch: int, committables: Sequence[Committable]) -> None:
        # A group's committables are checked against their own target's secrets, as a
        # single target's are (another target's password may well be a bucket's name).
        owners: dict[str | None, Backend] = (
            {n: m.backend for n, m in self.group.members.items()} if self.group is not None
            else {None: self.backend})
        secrets = {n: [s for s in b.secret_values() if len(s) >= 4] for n, b in owners.items()}
        if not any(secrets.values()):
            return
        for c in committables:
            text = c.to_bytes().decode()
            if any(s in text for s in secrets.get(c.target, [])):
                self._abort_all(epoch, committables, "aborted", raise_errors=False)
                where = f" (target {c.target})" if c.target else ""
                raise PluginError(
                    f"backend {owners[c.target].name!r}{where} put a secret into the "
                    f"committable of participant {c.participant}; refusing to store it "
                    "(nothing committed)",
                    sink_id=self.sink_id, epoch=epoch, participant=c.participant)

    def _commit_one(self, c: Committable) -> CommitOutcome:
        result = self._commit_many([c])[0]
        if isinstance(result, CommitError):
            raise result
        return result

    def _commit_many(
        self, committables: Sequence[Committable]
    ) -> list[CommitOutcome | CommitError]:
        """Commit ``committables`` through :meth:`Backend.commit_all`, retrying failures.

        Retriable failures are retried together with bounded backoff; a
        :class:`FatalCommitError` (or a lost participant) is final at once.
        """
        results: list[CommitOutcome | CommitError | None] = [None] * len(committables)
        pending = list(range(len(committables)))
        delay = self.retry.initial_backoff_s
        secrets = self.backend.secret_values()
        for attempt in range(1, self.retry.attempts + 1):
            try:
                answers = self.backend.commit_all([committables[i] for i in pending])
            except Exception as exc:  # the whole call failed: every one of them did
                answers = [exc] * len(pending)
            if len(answers) != len(pending):
                raise PluginError(
                    f"backend {self.backend.name!r}: commit_all returned {len(answers)} "
                    f"result(s) for {len(pending)} participant(s)", sink_id=self.sink_id)
            retry: list[int] = []
            for i, answer in zip(pending, answers, strict=True):
                c = committables[i]
                if isinstance(answer, CommitOutcome | FatalCommitError):
                    results[i] = answer
                elif attempt == self.retry.attempts:
                    message = redact(f"{type(answer).__name__}: {answer}", secrets)
                    results[i] = RetriableCommitError(
                        f"committing {c.describe()} failed {attempt} times; last error: "
                        f"{message}", sink_id=c.sink_id, epoch=c.epoch,
                        participant=c.participant)
                else:
                    log.warning("sink=%s epoch=%d partition=%d participant=%s: commit "
                                "attempt %d/%d failed: %s; retrying in %.2fs", c.sink_id,
                                c.epoch, c.partition, c.participant, attempt,
                                self.retry.attempts,
                                redact(f"{type(answer).__name__}: {answer}", secrets), delay)
                    retry.append(i)
            if not retry:
                break
            pending = retry
            self.retry.sleep(delay)
            delay = min(delay * 2, self.retry.max_backoff_s)
        done: list[CommitOutcome | CommitError] = []
        for r in results:
            assert r is not None
            done.append(r)
        return done

    def _finish(self, record: EpochRecord) -> None:
        """Commit every participant of a DECIDED record, then mark it COMMITTED.

        The first participant is committed alone, so a crash can be injected (and
        happen) with an epoch partly committed; the rest go to the backend in one
        :meth:`Backend.commit_all` call.
        """
        started = time.monotonic()
        failures: list[CommitError] = []
        split = self.backend.first_commit_size(record.committables)
        first, rest = record.committables[:split], record.committables[split:]
        results = self._commit_many(first)
        if first and isinstance(results[0], CommitOutcome):
            self.faults.hit(AFTER_FIRST_COMMIT, record.epoch)
        if rest:
            results += self._commit_many(rest)
        if any(isinstance(r, ParticipantLostError) for r in results):
            record, results = self._salvage(record, results)
        for c, outcome in zip(record.committables, results, strict=True):
            if isinstance(outcome, CommitError):
                log.error("sink=%s epoch=%d partition=%d participant=%s: %s", c.sink_id,
                          c.epoch, c.partition, c.participant, outcome)
                failures.append(outcome)
                continue
            log.debug("sink=%s epoch=%d partition=%d participant=%s: %s", c.sink_id, c.epoch,
                      c.partition, c.participant, outcome.value)
        if failures:
            targets = {c.participant: c.target for c in record.committables}
            names = ", ".join((f"target {targets[str(f.participant)]}: "
                               if targets.get(str(f.participant)) else "") + str(f.participant)
                              for f in failures)
            error_type: type[CommitError] = (
                ParticipantLostError if any(isinstance(f, ParticipantLostError)
                                            for f in failures)
                else FatalCommitError if any(isinstance(f, FatalCommitError) for f in failures)
                else RetriableCommitError)
            after = ("nothing of it is reported committed; the first error says what was "
                     "lost and what to do" if error_type is ParticipantLostError else
                     "restarting the query commits it again")
            raise error_type(
                f"sink={self.sink_id} epoch={record.epoch}: {len(failures)} decided "
                f"participant(s) could not be committed: {names}. The epoch stays DECIDED: "
                f"{after}; `txsink status` shows it. First error: {failures[0]}",
                sink_id=self.sink_id, epoch=record.epoch, participant=failures[0].participant,
            ) from failures[0]
        self.backend.epoch_committed(self.sink_id, record.epoch, record.committables)
        self.faults.hit(BEFORE_MARK_COMMITTED, record.epoch)
        if record.write is not None:
            # Before the record turns COMMITTED, and so can be pruned: once pruned, the
            # metadata is all that says this version was written.
            self._remember_write(record.write)
        self.store.put(self.lease, record.committed())
        duration = time.monotonic() - started
        log.info("sink=%s epoch=%d committed: %d participant(s), %d row(s) in %.3fs",
                 self.sink_id, record.epoch, len(record.committables), record.rows, duration)
        self.plugins.epoch_committed(self.sink_id, record.epoch, record.committables, duration)
        self.faults.hit(AFTER_MARK_COMMITTED, record.epoch)

    def _salvage(self, record: EpochRecord, results: list[CommitOutcome | CommitError]
                 ) -> tuple[EpochRecord, list[CommitOutcome | CommitError]]:
        """Prepare the lost participants of a DECIDED record again, record the
        replacements in the decision, then commit them (:meth:`Backend.salvage`).

        The order makes every crash end exactly once: a replacement not yet recorded is
        an orphan (the next start salvages the original again and the orphan scan
        aborts it); a recorded one is committed like any decided participant, or
        salvaged in turn if it was lost too. A participant whose data is gone keeps the
        backend's :class:`ParticipantLostError`, which says why.
        """
        results = list(results)
        for _ in range(MAX_SALVAGE_ROUNDS):
            lost = [i for i, r in enumerate(results) if isinstance(r, ParticipantLostError)]
            replacements: dict[int, Committable] = {}
            for i in lost:
                c = record.committables[i]
                self._last_salvage_attempt = salvage_attempt(self._last_salvage_attempt)
                # The participant's own sink id: a group's target has its own.
                ctx = TransactionContext(c.sink_id, record.epoch, c.partition,
                                         self._last_salvage_attempt)
                try:
                    replacements[i] = self.backend.salvage(c, ctx)
                except NotImplementedError:
                    return record, results
                except CommitError as exc:
                    results[i] = exc  # gone (it says why), or not now (retriable)
                except Exception as exc:
                    results[i] = RetriableCommitError(
                        f"salvaging {c.describe()} failed: "
                        f"{redact(f'{type(exc).__name__}: {exc}', self.backend.secret_values())}",
                        sink_id=c.sink_id, epoch=c.epoch, participant=c.participant)
            if not replacements:
                break
            self.faults.hit(AFTER_SALVAGE_PREPARE, record.epoch)
            originals = {i: record.committables[i] for i in replacements}
            record = record.with_replacements(
                {originals[i].participant: r for i, r in replacements.items()})
            self.store.put(self.lease, record)  # before any replacement is committed
            for i, r in sorted(replacements.items()):
                c = originals[i]
                log.warning("sink=%s epoch=%d partition=%d participant=%s: the target aborted "
                            "this decided participant on its own; its %d row(s) were written "
                            "again as participant %s, recorded in the decision, and are "
                            "committed now (salvaged)", c.sink_id, c.epoch, c.partition,
                            c.participant, c.rows, r.participant)
                self.plugins.participant_salvaged(self.sink_id, record.epoch, c, r)
            self.faults.hit(AFTER_SALVAGE_RECORD, record.epoch)
            order = sorted(replacements)
            for i, outcome in zip(order, self._commit_many([replacements[i] for i in order]),
                                  strict=True):
                results[i] = outcome
            if all(isinstance(results[i], CommitOutcome) for i in order):
                self.faults.hit(AFTER_SALVAGE_COMMIT, record.epoch)
        return record, results

    def _abort_all(self, epoch: int, committables: Sequence[Committable], reason: str,
                   *, raise_errors: bool = True) -> None:
        if not committables:
            return
        failed: list[tuple[Committable, Exception]] = []
        for c in committables:
            try:
                self.backend.abort(c)
            except Exception as exc:
                failed.append((c, exc))
                log.error("sink=%s epoch=%d partition=%d participant=%s: abort failed: %s "
                          "(the orphan scan will retry it)", c.sink_id, c.epoch, c.partition,
                          c.participant, redact(str(exc), self.backend.secret_values()))
        done = [c for c in committables if all(c is not f for f, _ in failed)]
        if done:
            log.info("sink=%s epoch=%d: aborted %d participant(s) (%s)", self.sink_id, epoch,
                     len(done), reason)
            self.plugins.epoch_aborted(self.sink_id, epoch, done, reason)
        if failed and raise_errors:
            first, error = failed[0]
            raise CommitError(
                f"could not abort {first.describe()}: "
                f"{redact(str(error), self.backend.secret_values())}",
                sink_id=first.sink_id, epoch=first.epoch, participant=first.participant) from None

    def _remember_write(self, write: WriteId) -> None:
        """Keep the committed version of a write identity after its record is pruned."""
        meta = self.store.read_meta() or self._meta
        assert meta is not None
        query_known = write.query_id is None or (
            meta.write_queries.get(write.app_id) == write.query_id)
        if meta.writes.get(write.app_id, -1) >= write.version and query_known:
            return
        queries = dict(meta.write_queries)
        if write.query_id is not None:
            queries[write.app_id] = write.query_id
        # Most recently written app ids last; beyond MAX_WRITE_IDS the oldest are
        # forgotten (a job given a new txnAppId per run would grow the metadata, which
        # every commit reads, without end).
        writes = {a: v for a, v in meta.writes.items() if a != write.app_id}
        writes[write.app_id] = max(write.version, meta.writes.get(write.app_id, -1))
        if len(writes) > MAX_WRITE_IDS:
            dropped = list(writes)[:len(writes) - MAX_WRITE_IDS]
            log.warning("sink=%s: forgetting the committed versions of the %d least recently "
                        "written txnAppId(s) (%s...): a sink keeps %d; a re-run of those jobs "
                        "would write again", self.sink_id, len(dropped), dropped[0],
                        MAX_WRITE_IDS)
            writes = {a: v for a, v in writes.items() if a not in dropped}
            queries = {a: q for a, q in queries.items() if a in writes}
        meta = dataclasses.replace(meta, writes=writes, write_queries=queries)
        self.store.write_meta(self.lease, meta)
        self._meta = meta

    def _abort_orphans(self, up_to_epoch: int | None,
                       states: Mapping[int, EpochState] | None = None,
                       *, reclaim_stale: bool = False) -> list[Committable]:
        """Abort prepared participants no decision holds, of epochs ``<= up_to_epoch``.

        Epochs reserved by batch writes still in flight bound the scan from above,
        so their writers' participants are left alone; with ``reclaim_stale`` only
        this owner's reservations count as in flight. Only the DECIDED records (and,
        with ``reclaim_stale``, the RESERVED ones) are read: a record that moved on
        since ``states`` was listed still protects what it held.
        """
        if states is None:
            states = self.store.states()
        protected: set[str] = set()
        live: list[int] = []
        for epoch, state in states.items():
            if state is EpochState.RESERVED and not reclaim_stale:
                live.append(epoch)
                continue
            if state is EpochState.COMMITTED:
                continue
            record = self.store.get(epoch)
            if record is None:
                continue
            if record.state is EpochState.RESERVED:
                if record.owner == self.owner or not reclaim_stale:
                    live.append(epoch)
            else:
                protected |= record.participants
        if live:
            below = min(live) - 1
            up_to_epoch = below if up_to_epoch is None else min(up_to_epoch, below)
            if up_to_epoch < 0:
                return []
        meta = self.store.read_meta() or self._meta
        names = DecisionNames(self.sink_id, self.store, states, protected, self.lease,
                              watermark=meta.committed_watermark if meta else -1,
                              targets=self._sink_ids() if self.group else None,
                              # Without decisions (at_least_once) tasks commit on their
                              # own: an epoch the target holds and the state does not know
                              # is a crash before it was recorded, not a restored state.
                              holds_epoch=(lambda e: self.backend.holds_epoch(self.sink_id, e))
                              if self.guarantee.transactional else None)
        aborted = self.backend.abort_orphans(self.sink_id, names, up_to_epoch)
        if names.roll_forward:
            self._roll_forward(names.roll_forward)
        by_epoch: dict[int, list[Committable]] = {}
        for c in aborted:
            by_epoch.setdefault(c.epoch, []).append(c)
        for epoch, cs in sorted(by_epoch.items()):
            log.info("sink=%s epoch=%d: aborted %d orphan participant(s): %s", self.sink_id,
                     epoch, len(cs), ", ".join(c.participant for c in cs))
            self.plugins.epoch_aborted(self.sink_id, epoch, cs, "orphan")
        return aborted

    def _roll_forward(self, found: Mapping[str, Committable | None]) -> None:
        """Commit prepared participants that a COMMITTED decision names.

        The target was failed over to a standby, or restored from a backup, that holds
        their PREPARE but not their COMMIT: the decision stands, so they are committed,
        never aborted. A pruned epoch's committable is rebuilt from the target's own
        listing; one that cannot be committed stops with an error naming it.
        """
        committables = [c for c in found.values() if c is not None]
        named = {n for n, c in found.items() if c is None}
        if named:
            try:
                listed = {c.participant: c for c in self.backend.list_prepared(self.sink_id)}
            except NotImplementedError:
                listed = {}
            committables += [listed[n] for n in sorted(named) if n in listed]
            if len(committables) < len(found):
                missing = sorted(n for n in named if n not in listed)
                raise FatalCommitError(
                    f"sink={self.sink_id}: participant(s) {', '.join(missing)} of committed "
                    f"epochs are prepared in {self.backend.describe()} again (failed over or "
                    "restored?), but the backend cannot rebuild their committables to "
                    "commit them; nothing was aborted. Commit them in the target by hand",
                    sink_id=self.sink_id, participant=missing[0])
        results = self._commit_many(committables)
        failures = [r for r in results if isinstance(r, CommitError)]
        for c, r in zip(committables, results, strict=True):
            if not isinstance(r, CommitError):
                log.warning(
                    "sink=%s epoch=%d partition=%d participant=%s: prepared again although "
                    "its epoch is COMMITTED (%s was failed over to a standby, or restored "
                    "from a backup taken before this commit reached it); committed it "
                    "again (rolled forward), its rows are visible once", c.sink_id, c.epoch,
                    c.partition, c.participant, self.backend.describe())
        if failures:
            raise type(failures[0])(
                f"sink={self.sink_id}: {len(failures)} participant(s) of committed epochs, "
                "prepared again after a failover or restore, could not be committed; they "
                f"stay prepared and the next start tries again. First error: {failures[0]}",
                sink_id=self.sink_id, epoch=failures[0].epoch,
                participant=failures[0].participant) from failures[0]

    def _prune(self, states: Mapping[int, EpochState]) -> None:
        committed = sorted(e for e, s in states.items() if s is EpochState.COMMITTED)
        if not committed:
            return
        meta = self.store.read_meta() or self._meta
        assert meta is not None
        top = committed[-1]
        if top > meta.committed_watermark:
            meta = dataclasses.replace(meta, committed_watermark=top)
            self.store.write_meta(self.lease, meta)
            self._meta = meta
        # Prune in steps of a tenth of the retained epochs, not one record per commit:
        # each delete is a locked, synced change of the store, and one per epoch made
        # every commit after the first ``retain_epochs`` slower than the ones before.
        slack = self.retain_epochs // 10
        if len(committed) <= self.retain_epochs + slack:
            return
        old = committed[: len(committed) - self.retain_epochs]
        if self.store.supports_archive:
            # The names outlive the records: a restore can bring their participants back.
            records = [r for r in (self.store.get(e) for e in old) if r is not None]
            archive_records(self.store, self.lease, records)
        self.store.delete(self.lease, old)
        if self.store.supports_archive and old[-1] // ARCHIVE_CHUNK > (
                old[0] - 1) // ARCHIVE_CHUNK:
            # A new chunk was started: drop the ones past their retention (once per
            # thousand epochs).
            expired = expired_chunks(self.store, self.archive_retention_s)
            if expired:
                self.store.delete_archive(self.lease, expired)


def _kept(meta: SinkMeta | None, epoch: int) -> set[tuple[str | None, int]]:
    """The (target, partition) pairs a forced resolve of ``epoch`` kept committed."""
    if meta is None:
        return set()
    kept: set[tuple[str | None, int]] = {(None, p) for p in meta.kept.get(epoch, ())}
    for target, partitions in meta.kept_targets.get(epoch, {}).items():
        kept |= {(target, p) for p in partitions}
    return kept


def _kept_words(kept: set[tuple[str | None, int]]) -> str:
    return ", ".join(f"{t}:{p}" if t else str(p) for t, p in sorted(
        kept, key=lambda k: (k[0] or "", k[1])))


def record_prepared(store: StateStore, owner: str, epoch: int,
                    committables: Sequence[Committable], query_id: str | None) -> None:
    """Add ``committables`` to the RESERVED record of ``epoch`` that ``owner`` holds.

    A grouped write (``txsink.spark.epoch``) prepares its targets one Spark job after
    the other, each in a process of Spark's choosing: each job's committer records what
    it prepared here, and the reserving driver decides the epoch from the record. A
    RESERVED record names nobody: until the decision, its participants are aborted
    like any other undecided ones. ``query_id`` (the streaming query the tasks ran for)
    is kept with the write identity, for the decision's check of that query.
    """
    lease = store.acquire(owner)  # the reserving owner's own lease, or FencedError
    record = store.get(epoch)
    if record is None or record.state is not EpochState.RESERVED or record.owner != owner:
        raise StateError(
            f"epoch {epoch} is not reserved by {owner} (found "
            f"{record.state.value + ' of ' + str(record.owner) if record else 'nothing'}); "
            "the grouped write's participants are not recorded and will be rolled back",
            epoch=epoch)
    write = record.write
    if write is not None and query_id is not None:
        if write.query_id is not None and write.query_id != query_id:
            raise StateError(f"epoch {epoch}: the writes of one grouped epoch report different "
                             f"streaming queries ({write.query_id}, {query_id})", epoch=epoch)
        write = dataclasses.replace(write, query_id=query_id)
    store.put(lease, dataclasses.replace(record, committables=(*record.committables,
                                                               *committables), write=write))
