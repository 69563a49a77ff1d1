"""Recovery: what a crash, a retry or a failover left behind, found and finished.

Following the recovery table of the design notes:

* an epoch DECIDED and not COMMITTED is committed again (commits are idempotent);
* a prepared participant no decision holds (a failed or speculative task, a crashed
  driver) is an orphan and aborted, below the lowest epoch still in flight;
* a reservation of a batch write whose run is gone (stale) is dropped, its
  participants aborted;
* a participant of a COMMITTED epoch prepared again (the target failed over to a
  standby, or was restored) is rolled forward: committed, never aborted;
* old COMMITTED records are pruned, their participant names archived.

The commits themselves are :class:`~txsink.coordinator.decision.Decision`'s.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

from txsink.coordinator.decision import Decision
from txsink.coordinator.sink import Sink
from txsink.decisions import (
    ARCHIVE_CHUNK,
    DecisionNames,
    archive_records,
    expired_chunks,
)
from txsink.errors import CommitError, FatalCommitError
from txsink.model import Committable, RecoveryReport
from txsink.state import EpochState

log = logging.getLogger(__name__)


class Recovery:
    """Finishes what earlier runs of one sink (:class:`Sink`) left behind."""

    def __init__(self, sink: Sink, decision: Decision) -> None:
        self.sink = sink
        self.decision = decision

    def recover(self, *, up_to_epoch: int | None = None) -> RecoveryReport:
        """Re-commit DECIDED epochs, then abort orphans (epochs ``<= up_to_epoch``).

        Epochs this owner reserved for batch writes still in flight keep their
        participants; reservations of other owners (a crashed or fenced run: this
        one holds the lease now) are dropped and their participants aborted.
        """
        sink = self.sink
        lease = sink.lease
        sink.store.check(lease)  # a run taken over recovers nothing: the newer one does
        report = RecoveryReport()
        # The streaming writer recovers before every epoch it commits: read the
        # states, then only the bodies of the records recovery acts on.
        states = sink.store.states()
        for epoch, state in sorted(states.items()):
            record = sink.store.get(epoch) if state is EpochState.DECIDED else None
            if record is not None and record.state is EpochState.DECIDED:
                log.warning("sink=%s epoch=%d: found DECIDED but not COMMITTED; committing "
                            "its %d participant(s) again", sink.sink_id, epoch,
                            len(record.committables))
                self.decision.finish(record)
                report.recommitted_epochs.append(epoch)
        sink.store.check(lease)
        reserved = [sink.store.get(e) for e, s in states.items() if s is EpochState.RESERVED]
        stale = [r for r in reserved if r is not None and r.state is EpochState.RESERVED
                 and r.owner != sink.owner]
        # The states listed before the re-commits serve: an epoch committed since
        # is read as such, and its participants are no longer prepared anyway.
        report.aborted_orphans = [c.participant for c in self.abort_orphans(
            up_to_epoch, states, reclaim_stale=True)]
        if stale:
            for r in stale:
                log.warning("sink=%s epoch=%d: batch write%s reserved by %s was never "
                            "decided (that run crashed or was fenced); its participants "
                            "were aborted and nothing of it is committed", sink.sink_id,
                            r.epoch, f" {r.write}" if r.write else "", r.owner)
            self.decision.epochs.give_up([r.epoch for r in stale])
        if report:
            log.info("sink=%s recovery: re-committed epochs %s, aborted %d orphan(s)",
                     sink.sink_id, report.recommitted_epochs, len(report.aborted_orphans))
        sink.plugins.recovered(sink.sink_id, report)
        return report

    def abort_orphans(self, up_to_epoch: int | None,
                      states: Mapping[int, EpochState] | None = None,
                      *, reclaim_stale: bool = False) -> list[Committable]:
        """Abort prepared participants no decision holds, of epochs ``<= up_to_epoch``.

        Epochs reserved by batch writes still in flight bound the scan from above,
        so their writers' participants are left alone; with ``reclaim_stale`` only
        this owner's reservations count as in flight. Only the DECIDED records (and,
        with ``reclaim_stale``, the RESERVED ones) are read: a record that moved on
        since ``states`` was listed still protects what it held.
        """
        sink = self.sink
        if states is None:
            states = sink.store.states()
        protected: set[str] = set()
        live: list[int] = []
        for epoch, state in states.items():
            if state is EpochState.RESERVED and not reclaim_stale:
                live.append(epoch)
                continue
            if state is EpochState.COMMITTED:
                continue
            record = sink.store.get(epoch)
            if record is None:
                continue
            if record.state is EpochState.RESERVED:
                if record.owner == sink.owner or not reclaim_stale:
                    live.append(epoch)
            else:
                protected |= record.participants
        if live:
            below = min(live) - 1
            up_to_epoch = below if up_to_epoch is None else min(up_to_epoch, below)
            if up_to_epoch < 0:
                return []
        meta = sink.store.read_meta() or sink.cached_meta
        names = DecisionNames(sink.sink_id, sink.store, states, protected, sink.lease,
                              watermark=meta.committed_watermark if meta else -1,
                              targets=sink.sink_ids() if sink.group else None,
                              given_up_in_part={*meta.kept, *meta.kept_targets}
                              if meta else (),
                              # Without decisions (at_least_once) tasks commit on their
                              # own: an epoch the target holds and the state does not know
                              # is a crash before it was recorded, not a restored state.
                              holds_epoch=(lambda e: sink.backend.holds_epoch(sink.sink_id, e))
                              if sink.guarantee.transactional else None)
        aborted = sink.backend.abort_orphans(sink.sink_id, names, up_to_epoch)
        if names.roll_forward:
            self.roll_forward(names.roll_forward)
        by_epoch: dict[int, list[Committable]] = {}
        for c in aborted:
            by_epoch.setdefault(c.epoch, []).append(c)
        for epoch, cs in sorted(by_epoch.items()):
            log.info("sink=%s epoch=%d: aborted %d orphan participant(s): %s", sink.sink_id,
                     epoch, len(cs), ", ".join(c.participant for c in cs))
            sink.plugins.epoch_aborted(sink.sink_id, epoch, cs, "orphan")
        return aborted

    def roll_forward(self, found: Mapping[str, Committable | None]) -> None:
        """Commit prepared participants that a COMMITTED decision names.

        The target was failed over to a standby, or restored from a backup, that holds
        their PREPARE but not their COMMIT: the decision stands, so they are committed,
        never aborted. A pruned epoch's committable is rebuilt from the target's own
        listing; one that cannot be committed stops with an error naming it.
        """
        sink = self.sink
        committables = [c for c in found.values() if c is not None]
        named = {n for n, c in found.items() if c is None}
        if named:
            try:
                listed = {c.participant: c for c in sink.backend.list_prepared(sink.sink_id)}
            except NotImplementedError:
                listed = {}
            committables += [listed[n] for n in sorted(named) if n in listed]
            if len(committables) < len(found):
                missing = sorted(n for n in named if n not in listed)
                raise FatalCommitError(
                    f"sink={sink.sink_id}: participant(s) {', '.join(missing)} of committed "
                    f"epochs are prepared in {sink.backend.describe()} again (failed over or "
                    "restored?), but the backend cannot rebuild their committables to "
                    "commit them; nothing was aborted. Commit them in the target by hand",
                    sink_id=sink.sink_id, participant=missing[0])
        results = self.decision.commit_many(committables)
        failures = [r for r in results if isinstance(r, CommitError)]
        for c, r in zip(committables, results, strict=True):
            if not isinstance(r, CommitError):
                log.warning(
                    "sink=%s epoch=%d partition=%d participant=%s: prepared again although "
                    "its epoch is COMMITTED (%s was failed over to a standby, or restored "
                    "from a backup taken before this commit reached it); committed it "
                    "again (rolled forward), its rows are visible once", c.sink_id, c.epoch,
                    c.partition, c.participant, sink.backend.describe())
        if failures:
            raise type(failures[0])(
                f"sink={sink.sink_id}: {len(failures)} participant(s) of committed epochs, "
                "prepared again after a failover or restore, could not be committed; they "
                f"stay prepared and the next start tries again. First error: {failures[0]}",
                sink_id=sink.sink_id, epoch=failures[0].epoch,
                participant=failures[0].participant) from failures[0]

    def prune(self, states: Mapping[int, EpochState]) -> None:
        """Move the committed watermark up, and drop (archiving their participant names)
        the COMMITTED records beyond the ``retain_epochs`` newest."""
        sink = self.sink
        committed = sorted(e for e, s in states.items() if s is EpochState.COMMITTED)
        if not committed:
            return
        meta = sink.store.read_meta() or sink.cached_meta
        assert meta is not None
        top = committed[-1]
        if top > meta.committed_watermark:
            meta = dataclasses.replace(meta, committed_watermark=top)
            sink.store.write_meta(sink.lease, meta)
            sink.cached_meta = meta
        # Prune in steps of a tenth of the retained epochs, not one record per commit:
        # each delete is a locked, synced change of the store, and one per epoch made
        # every commit after the first ``retain_epochs`` slower than the ones before.
        slack = sink.retain_epochs // 10
        if len(committed) <= sink.retain_epochs + slack:
            return
        old = committed[: len(committed) - sink.retain_epochs]
        if sink.store.supports_archive:
            # The names outlive the records: a restore can bring their participants back.
            records = [r for r in (sink.store.get(e) for e in old) if r is not None]
            archive_records(sink.store, sink.lease, records)
        sink.store.delete(sink.lease, old)
        if sink.store.supports_archive and old[-1] // ARCHIVE_CHUNK > (
                old[0] - 1) // ARCHIVE_CHUNK:
            # A new chunk was started: drop the ones past their retention (once per
            # thousand epochs).
            expired = expired_chunks(sink.store, sink.archive_retention_s)
            if expired:
                sink.store.delete_archive(sink.lease, expired)

