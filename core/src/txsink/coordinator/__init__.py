"""The driver side of the protocol: decide, commit, recover.

For each epoch the coordinator durably writes the decision (the commit point),
commits every participant with bounded retries, then marks the epoch COMMITTED.
On start, and whenever it meets an epoch it already knows, it follows the recovery
table of the design notes: re-commit decided epochs, abort replayed attempts of
committed epochs, abort orphans no decided epoch holds. A decided participant is
never aborted and never dropped: if it cannot be committed the pipeline stops with
an error naming it, and the epoch stays DECIDED for the next start.

:class:`Coordinator` is the one entry point (the Spark data source, grouped epochs,
the CLI and tests drive it). Its work is done by three parts, each a module that
reads alone:

* :mod:`.identity` (:class:`~.identity.Epochs`): which write an epoch number belongs
  to, "is this write a replay of that one?", and fresh epochs for batch writes;
* :mod:`.decision` (:class:`~.decision.Decision`): validate, decide, commit, finish,
  salvage;
* :mod:`.recovery` (:class:`~.recovery.Recovery`): re-commit DECIDED epochs, abort
  orphans, drop stale reservations, roll forward, prune.

:mod:`.sink` holds what they share (:class:`~.sink.Sink`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Mapping, Sequence

from txsink.coordinator.decision import MAX_SALVAGE_ROUNDS, Decision, EpochOutcome
from txsink.coordinator.identity import MAX_WRITE_IDS, Epochs, record_prepared
from txsink.coordinator.recovery import Recovery
from txsink.coordinator.sink import RetryPolicy, Sink
from txsink.errors import CheckpointChangedError, ConfigError
from txsink.model import Committable, DeliveryGuarantee, RecoveryReport
from txsink.state import EpochState, SinkMeta, WriteId
from txsink.targets import moved_target

log = logging.getLogger(__name__)

__all__ = ["MAX_SALVAGE_ROUNDS", "MAX_WRITE_IDS", "Coordinator", "EpochOutcome",
           "RetryPolicy", "record_prepared"]


class Coordinator(Sink):
    """Decides and commits the epochs of one sink. Plain Python: no Spark in here.

    Takes the same arguments as :class:`~txsink.coordinator.sink.Sink`.
    """

    @functools.cached_property
    def epochs(self) -> Epochs:
        """Epoch identity and allocation (:mod:`.identity`)."""
        return Epochs(self)

    @functools.cached_property
    def decision(self) -> Decision:
        """Decide, commit, finish (:mod:`.decision`)."""
        return Decision(self, self.epochs)

    @functools.cached_property
    def recovery(self) -> Recovery:
        """What crashes left behind (:mod:`.recovery`)."""
        return Recovery(self, self.decision)

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
        for name, target in meta.targets.items():
            refusal = moved_target(target, name, now[name]["destination"], self.sink_id,
                                   backend=type(self.group.members[name].backend))
            if refusal is not None:
                raise refusal
        if dict(meta.targets) != now:
            meta = dataclasses.replace(meta, targets=now)
            self.store.write_meta(self.lease, meta)
        return meta

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, *, recover: bool = True, up_to_epoch: int | None = None,
              query_id: str | None = None, stream: bool = False,
              batch: bool = False) -> RecoveryReport:
        """Take the state's lease, bind it to this sink, and (by default) recover.

        :param query_id: the identity of the engine's checkpoint (Spark's query id). The
            state remembers the first one it sees; another one means the checkpoint was
            deleted or replaced while the state was kept, and its batch numbers mean
            nothing to this state, so the start is refused.
        :param stream: this run commits the streaming sink's micro-batches (of the
            query ``query_id``): the state fixes the epoch of micro-batch 0 the first
            time (:meth:`stream_epoch`), and refuses batch writes from then on.
        :param batch: this run is a batch write: refused on a state a stream writes
            through *before* recovery, whose orphan scan would abort the stream's batch
            in flight (a backfill started in the driver that runs the stream), and
            before the lease, which would fence the stream's driver.
        """
        if batch:
            self.epochs.refuse_beside_stream(None)
        self._lease = self.store.acquire(self.owner)
        meta = self.store.read_meta()
        # A stream wrote here under a release that did not record where its epochs
        # start: they were its batch ids.
        legacy_stream = (meta is not None and meta.query_id is not None
                         and meta.stream_from is None)
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
        drivers = {q for q in (meta.write_queries.values() if meta is not None else ()) if q}
        if (stream and query_id and meta is not None and meta.query_id is None
                and meta.stream_from is None and drivers and query_id not in drivers):
            # The state's epochs are micro-batches of a stream written with grouped
            # writes (txsink.spark.epoch(..., version=batch_id)); this stream, through the
            # data source or Spark's own writer, is another query: its batches from the
            # earliest records would be written a second time above them.
            raise CheckpointChangedError(
                f"sink {self.sink_id!r}: the txsink state at {self.store.location} holds "
                f"the batches of the streaming query {', '.join(sorted(drivers))} "
                "(grouped writes with version=batch_id), but this stream belongs to the "
                f"Spark query {query_id}: the checkpoint was deleted or replaced while the "
                "state was kept, and the new query's batches would write records the old "
                "one wrote a second time, so nothing is written. Either restore the "
                "checkpoint that belongs to this state, or start a new sink: a new sink_id "
                "with a new, empty state_location (and, for the files backend, a new path)",
                sink_id=self.sink_id)
        # A stream's query id is written with its stream_from, in one write (bind_stream):
        # written alone, by a start that failed before the bind, it made the state look
        # like an older release's stream (epochs = batch ids) to the next start.
        deferred = stream and (meta is None or meta.stream_from is None) and not legacy_stream
        if meta is None:
            meta = SinkMeta(self.sink_id, self.backend.name,
                            self.backend.safe_options(self._options),
                            query_id=None if deferred else query_id or None,
                            guarantee=self.guarantee.value,
                            targets=self.group.meta_targets() if self.group else {})
            # A new state records the sink's destinations: refused by a target (another
            # query's or another sink's output, a server down), it must not be kept, or
            # the refusal's way out (another path) would then be refused as a move.
            self.backend.check_claim(self.sink_id, meta.state_id, self.store.location)
            self.store.write_meta(self._lease, meta)
        elif meta.guarantee != self.guarantee.value:
            log.warning("sink=%s: delivery guarantee changes from %s to %s from now on; "
                        "epochs written before keep what their guarantee gave readers",
                        self.sink_id, meta.guarantee, self.guarantee.value)
            meta = dataclasses.replace(meta, guarantee=self.guarantee.value)
            self.store.write_meta(self._lease, meta)
        elif query_id and meta.query_id is None and not deferred:
            meta = dataclasses.replace(meta, query_id=query_id)
            self.store.write_meta(self._lease, meta)
        if self.group is None and meta.options and self._options:
            # A single sink's destination is its identity too (see :func:`moved_target`);
            # its state keeps the options, so the destination is derived from them.
            moved = moved_target(
                {"backend": meta.backend, "options": meta.options}, self.sink_id,
                type(self.backend).destination(self._options), self.sink_id,
                backend=type(self.backend), field="sink.options")
            if moved is not None:
                raise moved
        meta = self._check_targets(meta)
        self.cached_meta = meta
        if batch:
            self.epochs.refuse_beside_stream(None)
        if stream:
            self.stream, self.query_id = True, query_id or meta.query_id
            self.epochs.bind_stream(legacy_stream)
        # Before recovery can abort anything as an orphan: make sure no other query
        # (another state) writes under this sink id.
        self.backend.claim_sink(self.sink_id, meta.state_id, self.store.location)
        self.plugins.coordinator_started(self.sink_id, self.backend.name,
                                         self.backend.participant_timeout_s())
        return self.recover(up_to_epoch=up_to_epoch) if recover else RecoveryReport()


    # -- identity and allocation (identity.py) ----------------------------------------

    def watermark(self) -> int:
        """The highest epoch known to be COMMITTED (records may have been pruned)."""
        return self.epochs.watermark()

    def allocate_epoch(self) -> int:
        """The next unused epoch (not reserved: see :meth:`reserve_epoch`)."""
        return self.epochs.allocate_epoch()

    def stream_epoch(self, batch_id: int) -> int:
        """The epoch of the streaming sink's micro-batch ``batch_id`` (see :meth:`start`)."""
        return self.epochs.stream_from() + batch_id

    def reserve_epoch(self, write: WriteId | None = None) -> int:
        """Reserve a fresh epoch for one batch write (:meth:`Epochs.reserve_epoch`)."""
        return self.epochs.reserve_epoch(write)

    def committed_write(self, write: WriteId) -> int | None:
        """The highest committed version of ``write.app_id`` if it is ``>= write.version``."""
        return self.epochs.committed_write(write)

    def write_query(self, app_id: str) -> str | None:
        """The streaming query that drove the committed versions of ``app_id``, if any."""
        return self.epochs.write_query(app_id)

    def check_write_query(self, write: WriteId) -> None:
        """Refuse a ``foreachBatch`` write whose versions count in another query."""
        self.epochs.check_write_query(write)

    # -- the decision (decision.py) -------------------------------------------------------

    def commit_epoch(
        self, epoch: int, messages: Sequence[Committable | None], *,
        write_query: str | None = None, source: str | None = None,
    ) -> EpochOutcome:
        """Decide and commit ``epoch`` given every writer's committable
        (:meth:`Decision.commit_epoch`)."""
        return self.decision.commit_epoch(epoch, messages, write_query=write_query,
                                          source=source)

    def record_epoch(self, epoch: int, messages: Sequence[Committable | None],
                     guarantee: DeliveryGuarantee, *,
                     write_query: str | None = None) -> EpochOutcome:
        """Record an epoch whose tasks committed their own participants
        (:meth:`Decision.record_epoch`)."""
        return self.decision.record_epoch(epoch, messages, guarantee, write_query=write_query)

    def abort_epoch(self, epoch: int, messages: Sequence[Committable | None]) -> None:
        """Roll back an epoch that will not be committed (:meth:`Decision.abort_epoch`)."""
        self.decision.abort_epoch(epoch, messages)

    # -- recovery (recovery.py) -----------------------------------------------------------

    def recover(self, *, up_to_epoch: int | None = None) -> RecoveryReport:
        """Re-commit DECIDED epochs, then abort orphans (:meth:`Recovery.recover`)."""
        return self.recovery.recover(up_to_epoch=up_to_epoch)

    def abort_orphans(self, up_to_epoch: int | None,
                      states: Mapping[int, EpochState] | None = None,
                      *, reclaim_stale: bool = False) -> list[Committable]:
        return self.recovery.abort_orphans(up_to_epoch, states, reclaim_stale=reclaim_stale)

    _abort_orphans = abort_orphans

    def prune(self, states: Mapping[int, EpochState]) -> None:
        self.recovery.prune(states)
