"""The decision: validate an epoch's participants, decide it, drive it to COMMITTED.

Writing the DECIDED record is the commit point of the whole epoch. After it, every
participant is committed with bounded retries (commits are idempotent) and the epoch
is marked COMMITTED. A decided participant is never aborted and never dropped: if it
cannot be committed the pipeline stops with an error naming it, and the epoch stays
DECIDED for the next start; one the target aborted on its own is salvaged
(:meth:`~txsink.backend.Backend.salvage`) and the replacement recorded in the decision.

Whether a write is a replay is not decided here: :class:`~txsink.coordinator.identity.Epochs`
answers it. What a crash left behind is :mod:`~txsink.coordinator.recovery`'s.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import time
from collections.abc import Mapping, Sequence

from txsink.backend import Backend, CommitOutcome
from txsink.coordinator.identity import BATCH, STREAM, Epochs, kept_words, layout
from txsink.coordinator.identity import kept as kept_partitions
from txsink.coordinator.sink import Sink
from txsink.errors import (
    CommitError,
    FatalCommitError,
    FencedError,
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
)
from txsink.model import (
    Committable,
    DeliveryGuarantee,
    TransactionContext,
    salvage_attempt,
)
from txsink.redact import leaked_secret, redact
from txsink.state import EpochRecord, EpochState, SinkMeta, WriteId

log = logging.getLogger(__name__)

#: Salvages of one epoch in one ``finish``: a replacement lost again at once (its own
#: timeout expired while it was committed) is salvaged again, this many times in all.
MAX_SALVAGE_ROUNDS = 3


class EpochOutcome(str, enum.Enum):
    #: Decided and committed now.
    COMMITTED = "committed"
    #: Already committed before (Spark replayed it): this attempt's participants aborted.
    REPLAYED = "replayed"
    #: Found DECIDED from a crashed run: its participants committed now, this attempt's aborted.
    RECOVERED = "recovered"


class Decision:
    """Decides and commits the epochs of one sink (:class:`Sink`)."""

    def __init__(self, sink: Sink, epochs: Epochs) -> None:
        self.sink = sink
        self.epochs = epochs
        self._last_salvage_attempt = 0

    def commit_epoch(
        self, epoch: int, messages: Sequence[Committable | None], *,
        write_query: str | None = None, source: str | None = None,
    ) -> EpochOutcome:
        """Decide and commit ``epoch`` given every writer's committable.

        :param write_query: the streaming query driving a batch write (``foreachBatch``):
            bound to the write's identity, and checked against the query that wrote
            its earlier versions (:meth:`check_write_query`).
        :param source: the digest of the micro-batch's source offsets, kept in the
            decision (what tells its replay from a batch planned anew).
        """
        sink = self.sink
        lease = sink.lease
        committables = self._validate(epoch, messages)
        record = sink.store.get(epoch)
        self._refuse_stranger(epoch, record, committables)
        write: WriteId | None = None
        reserved = record is not None and record.state is EpochState.RESERVED
        #: A micro-batch reserved by its stream (the native path), not a batch write.
        stream_batch = reserved and record is not None and record.origin == STREAM
        origin, query = ((STREAM, record.query_id) if stream_batch and record is not None
                         else self._origin(reserved=reserved))
        if record is not None and record.state is EpochState.RESERVED:
            if record.owner != sink.owner:
                self.abort_all(epoch, committables, "aborted", raise_errors=False)
                raise StateError(
                    f"sink={sink.sink_id} epoch={epoch}: the epoch is reserved by another "
                    f"run ({record.owner}); this write's {len(committables)} participant(s) "
                    "were aborted and nothing was committed", sink_id=sink.sink_id,
                    epoch=epoch)
            write = record.write
            if write is not None:
                if write_query is not None:
                    write = dataclasses.replace(write, query_id=write_query)
                try:
                    self.epochs.check_write_query(write)
                    self.epochs.check_kept_query(epoch, write)
                except StateError:
                    self._discard_reserved(epoch, committables)
                    raise
            if write is not None:
                rival = self.epochs.rival(epoch, write)
                if rival is not None:
                    self._discard_reserved(epoch, committables)
                    raise StateError(
                        f"sink={sink.sink_id} epoch={epoch}: batch write {write} was written "
                        f"meanwhile by epoch {rival.epoch}; this write's "
                        f"{len(committables)} participant(s) were aborted and nothing of it "
                        "is committed", sink_id=sink.sink_id, epoch=epoch)
            record = None
        if self.epochs.seen_before(epoch, record, reserved=reserved):
            # Spark replays a batch whose commit it did not log: the output already
            # holds it exactly once, so everything this attempt prepared goes.
            log.info("sink=%s epoch=%d already committed; aborting %d replayed participant(s)",
                     sink.sink_id, epoch, len(committables))
            self.abort_all(epoch, committables, "replayed")
            return EpochOutcome.REPLAYED

        if record is not None and record.state is EpochState.DECIDED:
            self.finish(record)
            extra = [c for c in committables if c not in record.committables]
            self.abort_all(epoch, extra, "replayed")
            return EpochOutcome.RECOVERED

        meta = sink.store.read_meta() or sink.cached_meta
        kept = kept_partitions(meta, epoch)
        if kept:
            self._refuse_other_layout(epoch, committables, meta, reserved=reserved)
            # A forced resolve gave this epoch up with these partitions committed: they
            # stay, and the replay writes only the others.
            again = [c for c in committables if (c.target, c.partition) in kept]
            self.abort_all(epoch, again, "replayed")
            committables = [c for c in committables if (c.target, c.partition) not in kept]
            log.warning("sink=%s epoch=%d: replay of %s a forced resolve gave up: "
                        "partitions %s stayed committed and are not written again; %d "
                        "participant(s) of the other partitions are decided now",
                        sink.sink_id, epoch, "the epoch" if write is None else f"write {write}",
                        kept_words(kept), len(committables))
        elif sink.backend.holds_epoch(sink.sink_id, epoch):
            return self._held_by_target(epoch, committables, reserved=reserved and
                                        not stream_batch)

        self._check_secrets(epoch, committables)
        try:
            sink.backend.check_prepared(committables)
        except Exception:
            if reserved:
                self._discard_reserved(epoch, committables)
            else:
                self.abort_all(epoch, committables, "aborted", raise_errors=False)
            raise
        sink.plugins.epoch_prepared(sink.sink_id, epoch, committables)
        sink.faults.hit(BEFORE_DECIDE, epoch)
        record = EpochRecord(epoch, EpochState.DECIDED, tuple(committables), time.time(),
                             write=write, origin=origin, query_id=query, source=source)
        sink.store.put(lease, record)  # the commit point of the epoch
        log.info("sink=%s epoch=%d decided: %d participant(s), %d row(s)",
                 sink.sink_id, epoch, len(committables), record.rows)
        sink.plugins.epoch_decided(sink.sink_id, epoch, committables)
        sink.faults.hit(AFTER_DECIDE, epoch)
        self.finish(record)
        if kept and meta is not None:
            latest = sink.store.read_meta() or meta
            sink.cached_meta = dataclasses.replace(
                latest, kept={e: p for e, p in latest.kept.items() if e != epoch},
                kept_targets={e: p for e, p in latest.kept_targets.items()
                              if e != epoch},
                kept_writes={k: v for k, v in latest.kept_writes.items() if v[0] != epoch},
                kept_rows={e: r for e, r in latest.kept_rows.items() if e != epoch})
            sink.store.write_meta(lease, sink.cached_meta)
        # One listing of the states serves the orphan scan and pruning (the scan
        # writes none); only the records they act on are read.
        states = sink.store.states()
        if sink.scan_orphans:
            sink.abort_orphans(epoch, states)
        sink.prune(states)
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
        sink = self.sink
        lease = sink.lease
        committables = [m for m in messages if m is not None]
        for c in committables:
            if c.sink_id != sink.sink_id or c.epoch != epoch or c.backend != sink.backend.name:
                raise StateError(f"committable {c.describe()} backend={c.backend} does not "
                                 f"belong to sink={sink.sink_id} epoch={epoch}",
                                 sink_id=sink.sink_id, epoch=epoch)
        rows = sum(c.rows for c in committables)
        missing = len(messages) - len(committables)
        if missing:
            log.warning("sink=%s epoch=%d: %d writer(s) sent nothing under %s; what they "
                        "committed before failing stays visible", sink.sink_id, epoch,
                        missing, guarantee.value)
        record = sink.store.get(epoch)
        self._refuse_stranger(epoch, record, committables, visible=True)
        write = record.write if record is not None else None
        if write is not None:
            if write_query is not None:
                write = dataclasses.replace(write, query_id=write_query)
            self.epochs.check_write_query(write)  # its tasks' rows are visible already: say so
        if record is not None and record.state is EpochState.DECIDED:
            # An exactly-once run crashed after deciding this epoch: finish it first.
            self.finish(record)
            record = sink.store.get(epoch)
        if self.epochs.seen_before(epoch, record, reserved=False):
            log.warning("sink=%s epoch=%d: Spark replayed an epoch that was written before; "
                        "under %s its tasks wrote %d row(s) again, so readers see them twice",
                        sink.sink_id, epoch, guarantee.value, rows)
            return EpochOutcome.REPLAYED
        # The target's own per-epoch marker (files epoch markers, S3 manifests), as for a
        # committed exactly-once epoch: what holds_epoch and readers go by.
        sink.backend.epoch_committed(sink.sink_id, epoch, committables)
        now = time.time()
        if write is not None:
            self.epochs.remember_write(write)  # before the record can be pruned (see _finish)
        origin, query = self._origin(
            reserved=record is not None and record.state is EpochState.RESERVED)
        sink.store.put(lease, EpochRecord(epoch, EpochState.COMMITTED, tuple(committables),
                                          now, now, write, origin=origin, query_id=query))
        log.info("sink=%s epoch=%d written by its tasks (%s): %d participant(s), %d row(s)",
                 sink.sink_id, epoch, guarantee.value, len(committables), rows)
        # The same crash point as after an exactly-once decision: the epoch is durable
        # in the target, and Spark has not logged it yet.
        sink.faults.hit(AFTER_DECIDE, epoch)
        sink.plugins.epoch_committed(sink.sink_id, epoch, committables, 0.0)
        states = sink.store.states()
        if sink.scan_orphans:
            sink.abort_orphans(epoch, states)
        sink.prune(states)
        return EpochOutcome.COMMITTED

    def _refuse_other_layout(self, epoch: int, committables: Sequence[Committable],
                             meta: SinkMeta | None, *, reserved: bool) -> None:
        """A replay of an epoch with kept partitions writes only the others: sound only
        if its partitions hold the rows they held (same partitions, same row counts)."""
        sink = self.sink
        before = meta.kept_rows.get(epoch) if meta is not None else None
        now = layout(committables)
        if not before or now == before:
            return
        if reserved:
            self._discard_reserved(epoch, committables)
        else:
            self.abort_all(epoch, committables, "aborted", raise_errors=False)
        raise StateError(
            f"sink={sink.sink_id} epoch={epoch}: this replay of an epoch a forced resolve "
            "gave up is partitioned differently from the attempt whose partitions it kept "
            f"(then: {_layout_words(before)}; now: {_layout_words(now)}), so txsink cannot "
            "tell which of its rows the targets hold already; nothing was written. Replay "
            "it with the partitioning it had (a fixed repartition(n) in the query), or start "
            "a new sink (new sink_id and checkpoint)", sink_id=sink.sink_id, epoch=epoch)

    def _discard_reserved(self, epoch: int, committables: Sequence[Committable]) -> None:
        sink = self.sink
        self.abort_all(epoch, committables, "aborted", raise_errors=False)
        record = sink.store.get(epoch)
        if record is not None and record.state is EpochState.RESERVED:
            self.epochs.give_up([epoch])

    def _held_by_target(self, epoch: int, committables: Sequence[Committable],
                        *, reserved: bool) -> EpochOutcome:
        """The target already holds an epoch the state does not know: never write it twice."""
        sink = self.sink
        rows = sum(c.rows for c in committables)
        if sink.group is not None:
            held = sink.group.held_by(epoch)
            if not all(held.values()):
                self._discard_reserved(epoch, committables)
                have = ", ".join(n for n, h in held.items() if h)
                lack = ", ".join(n for n, h in held.items() if not h)
                raise StateError(
                    f"sink={sink.sink_id} epoch={epoch}: target(s) {have} already hold epoch "
                    f"{epoch}, which the txsink state at {sink.store.location} does not know, "
                    f"and target(s) {lack} do not: the state is older than the targets "
                    "(restored from a backup?) and lost this epoch's decision while it was "
                    f"being committed. This attempt's {len(committables)} participant(s) "
                    f"({rows} row(s)) were aborted and nothing was written. Restore the "
                    "newest state: its next start finishes the epoch in every target",
                    sink_id=sink.sink_id, epoch=epoch)
        if reserved:
            self._discard_reserved(epoch, committables)
            raise StateError(
                f"sink={sink.sink_id} epoch={epoch}: {sink.backend.describe()} already holds "
                f"epoch {epoch} of this sink, which the txsink state at "
                f"{sink.store.location} does not know: the state is older than the target "
                "(restored from a backup?). This batch write's participants "
                f"({rows} row(s)) were aborted and nothing was written; restore the newest "
                "state, or write into a new sink", sink_id=sink.sink_id, epoch=epoch)
        log.warning(
            "sink=%s epoch=%d: %s already holds this epoch, but the txsink state at %s does "
            "not know it: the checkpoint was restored from an older backup and Spark "
            "replays an epoch that was committed before. Aborting this attempt's %d "
            "participant(s) (%d row(s)) instead of writing the epoch twice", sink.sink_id,
            epoch, sink.backend.describe(), sink.store.location, len(committables), rows)
        self.abort_all(epoch, committables, "replayed")
        record = sink.store.get(epoch)
        if record is not None and record.state is EpochState.RESERVED:
            self.epochs.give_up([epoch])  # a stream's reservation of its replayed batch
        return EpochOutcome.REPLAYED

    def abort_epoch(self, epoch: int, messages: Sequence[Committable | None]) -> None:
        """Roll back an epoch that will not be committed (a task failed, or Spark aborted).

        Participants of a *decided* epoch are never aborted: they are left to recovery.
        Failed tasks send no committable, so their participants are found as orphans.
        """
        sink = self.sink
        lease = sink.lease
        record = sink.store.get(epoch)
        protected = record.committables if record is not None else ()
        if record is not None and record.state is EpochState.DECIDED:
            log.warning("sink=%s epoch=%d: abort requested for a DECIDED epoch; its "
                        "participants stay prepared and will be committed on recovery",
                        sink.sink_id, epoch)
        to_abort = [c for c in messages if c is not None and c not in protected]
        # A run taken over aborts nothing: the newer run's orphan scan does it, knowing
        # what the newer run decided meanwhile.
        sink.store.check(lease)
        self.abort_all(epoch, to_abort, "aborted", raise_errors=False)
        if (record is not None and record.state is EpochState.RESERVED
                and record.owner == sink.owner):
            self.epochs.give_up([epoch])  # the batch write gave up its epoch
        try:
            sink.store.check(lease)
            sink.abort_orphans(epoch)
        except TxsinkError:
            raise
        except Exception:
            log.exception("sink=%s epoch=%d: orphan scan after abort failed; the next "
                          "start will retry it", sink.sink_id, epoch)

    # -- internals ----------------------------------------------------------------------

    def _origin(self, *, reserved: bool) -> tuple[str | None, str | None]:
        """What a record says wrote it: a batch write (its reservation), or this run's
        stream (and its query), or nothing (a caller driving the coordinator itself)."""
        if reserved:
            return BATCH, None
        if self.sink.stream:
            return STREAM, self.sink.query_id
        return None, None

    def _refuse_stranger(self, epoch: int, record: EpochRecord | None,
                         committables: Sequence[Committable], *,
                         visible: bool = False) -> None:
        """A micro-batch meeting an epoch the state recorded for another write is not a
        replay of it: roll it back and say so (:meth:`Epochs.stranger`). ``visible``:
        its tasks committed their rows themselves (``at_least_once``): say that."""
        other = self.epochs.stranger(epoch, record)
        if other is None:
            return
        sink = self.sink
        rows = sum(c.rows for c in committables)
        if visible:
            outcome = (f"Its tasks committed their {rows} row(s) themselves (under "
                       f"{sink.guarantee.value}): they stay visible, under an epoch number "
                       "that already held other rows")
        else:
            self.abort_all(epoch, committables, "aborted", raise_errors=False)
            outcome = (f"Its {len(committables)} participant(s) ({rows} row(s)) were rolled "
                       "back and nothing of it was written")
        batch = epoch - self.epochs.stream_from()
        raise StateError(
            f"sink={sink.sink_id} epoch={epoch}: micro-batch {batch} of the streaming query "
            f"{sink.query_id or '(id unknown)'} is epoch {epoch}, which this sink's state "
            f"records for {other}: an epoch number holds one set of rows, so the batch is "
            f"not taken for a replay of it. {outcome}. Write batch jobs and the stream "
            "under separate sink_ids and checkpoints", sink_id=sink.sink_id, epoch=epoch)

    def _validate(self, epoch: int, messages: Sequence[Committable | None]) -> list[Committable]:
        sink = self.sink
        committables = [m for m in messages if m is not None]
        problem = None
        if len(committables) != len(messages):
            problem = (f"{len(messages) - len(committables)} writer(s) sent no committable; "
                       "an epoch can only be committed when every writer prepared")
        seen: dict[tuple[str | None, int], Committable] = {}
        for c in committables:
            if not sink.belongs(c) or c.epoch != epoch:
                problem = (f"committable {c.describe()} backend={c.backend} does not belong to "
                           f"sink={sink.sink_id} epoch={epoch} backend={sink.backend.name}")
            key = (c.target, c.partition)
            if key in seen:
                where = f" of target {c.target}" if c.target else ""
                problem = (f"two committables for partition {c.partition}{where}: "
                           f"{seen[key].participant} and {c.participant}")
            seen[key] = c
        if sink.group is not None and committables and not problem:
            missing = [n for n in sink.group.members if n not in {t for t, _ in seen}]
            if missing:
                problem = (f"no participant in target(s) {', '.join(missing)}: every target "
                           "of a group takes part in every epoch")
        if problem:
            self.abort_epoch(epoch, [c for c in committables if sink.belongs(c)])
            raise StateError(f"sink={sink.sink_id} epoch={epoch}: {problem}; nothing was "
                             "committed", sink_id=sink.sink_id, epoch=epoch)
        return committables

    def _check_secrets(self, epoch: int, committables: Sequence[Committable]) -> None:
        # A group's committables are checked against their own target's secrets, as a
        # single target's are (another target's password may well be a bucket's name).
        sink = self.sink
        owners: dict[str | None, Backend] = (
            {n: m.backend for n, m in sink.group.members.items()} if sink.group is not None
            else {None: sink.backend})
        secrets = {n: [s for s in b.secret_values() if len(s) >= 4] for n, b in owners.items()}
        if not any(secrets.values()):
            return
        for c in committables:
            owner = owners.get(c.target, sink.backend)
            if leaked_secret(c.to_dict(), secrets.get(c.target, []), (
                    owner.name, owner.describe(), c.sink_id, c.participant, c.target or "")):
                self.abort_all(epoch, committables, "aborted", raise_errors=False)
                where = f" (target {c.target})" if c.target else ""
                raise PluginError(
                    f"backend {owners[c.target].name!r}{where} put a secret into the "
                    f"committable of participant {c.participant}; refusing to store it "
                    "(nothing committed)",
                    sink_id=sink.sink_id, epoch=epoch, participant=c.participant)

    def commit_many(
        self, committables: Sequence[Committable]
    ) -> list[CommitOutcome | CommitError]:
        """Commit ``committables`` through :meth:`Backend.commit_all`, retrying failures.

        Retriable failures are retried together with bounded backoff; a
        :class:`FatalCommitError` (or a lost participant) is final at once.
        """
        sink = self.sink
        results: list[CommitOutcome | CommitError | None] = [None] * len(committables)
        pending = list(range(len(committables)))
        delay = sink.retry.initial_backoff_s
        secrets = sink.backend.secret_values()
        for attempt in range(1, sink.retry.attempts + 1):
            try:
                answers = sink.backend.commit_all([committables[i] for i in pending])
            except Exception as exc:  # the whole call failed: every one of them did
                answers = [exc] * len(pending)
            if len(answers) != len(pending):
                raise PluginError(
                    f"backend {sink.backend.name!r}: commit_all returned {len(answers)} "
                    f"result(s) for {len(pending)} participant(s)", sink_id=sink.sink_id)
            retry: list[int] = []
            for i, answer in zip(pending, answers, strict=True):
                c = committables[i]
                if isinstance(answer, CommitOutcome | FatalCommitError):
                    results[i] = answer
                elif attempt == sink.retry.attempts:
                    message = redact(f"{type(answer).__name__}: {answer}", secrets)
                    results[i] = RetriableCommitError(
                        f"committing {c.describe()} failed {attempt} times; last error: "
                        f"{message}", sink_id=c.sink_id, epoch=c.epoch,
                        participant=c.participant)
                else:
                    log.warning("sink=%s epoch=%d partition=%d participant=%s: commit "
                                "attempt %d/%d failed: %s; retrying in %.2fs", c.sink_id,
                                c.epoch, c.partition, c.participant, attempt,
                                sink.retry.attempts,
                                redact(f"{type(answer).__name__}: {answer}", secrets), delay)
                    retry.append(i)
            if not retry:
                break
            pending = retry
            sink.retry.sleep(delay)
            delay = min(delay * 2, sink.retry.max_backoff_s)
        done: list[CommitOutcome | CommitError] = []
        for r in results:
            assert r is not None
            done.append(r)
        return done

    def finish(self, record: EpochRecord) -> None:
        """Commit every participant of a DECIDED record, then mark it COMMITTED.

        The first participant is committed alone, so a crash can be injected (and
        happen) with an epoch partly committed; the rest go to the backend in one
        :meth:`Backend.commit_all` call.
        """
        sink = self.sink
        started = time.monotonic()
        failures: list[CommitError] = []
        split = sink.backend.first_commit_size(record.committables)
        first, rest = record.committables[:split], record.committables[split:]
        results = self.commit_many(first)
        if first and isinstance(results[0], CommitOutcome):
            sink.faults.hit(AFTER_FIRST_COMMIT, record.epoch)
        if rest:
            results += self.commit_many(rest)
            # The decision is made, so the order of the commits does not matter, but a
            # participant's commit can wait for another's: Kafka confirms a commit whose
            # producer was fenced since (its id opened again) by reading its begin
            # marker, which the epoch's other participants, open on the same marker
            # partition, hide until they are committed. So the first one is retried once
            # the rest are in, instead of stopping every restart the same way.
            again = [i for i in range(split) if isinstance(results[i], RetriableCommitError)]
            if again:
                log.info("sink=%s epoch=%d: committing %d participant(s) again after the "
                         "others of the epoch", sink.sink_id, record.epoch, len(again))
                retried = self.commit_many([record.committables[i] for i in again])
                for i, outcome in zip(again, retried, strict=True):
                    results[i] = outcome
        if any(isinstance(r, ParticipantLostError) for r in results):
            record, results = self._salvage(record, results)
        failed: list[Committable] = []
        for c, outcome in zip(record.committables, results, strict=True):
            if isinstance(outcome, CommitError):
                log.error("sink=%s epoch=%d partition=%d participant=%s: %s", c.sink_id,
                          c.epoch, c.partition, c.participant, outcome)
                failures.append(outcome)
                failed.append(c)
                continue
            log.debug("sink=%s epoch=%d partition=%d participant=%s: %s", c.sink_id, c.epoch,
                      c.partition, c.participant, outcome.value)
        if failures:
            # The committables name the participants (an error raised for a whole
            # table's epoch carries none).
            names = ", ".join((f"target {c.target}: " if c.target else "") + c.participant
                              for c in failed)
            error_type: type[CommitError] = (
                ParticipantLostError if any(isinstance(f, ParticipantLostError)
                                            for f in failures)
                else FatalCommitError if any(isinstance(f, FatalCommitError) for f in failures)
                else RetriableCommitError)
            after = ("nothing of it is reported committed; the first error says what was "
                     "lost and what to do" if error_type is ParticipantLostError else
                     "restarting the query commits it again")
            raise error_type(
                f"sink={sink.sink_id} epoch={record.epoch}: {len(failures)} decided "
                f"participant(s) could not be committed: {names}. The epoch stays DECIDED: "
                f"{after}; `txsink status` shows it. First error: {failures[0]}",
                sink_id=sink.sink_id, epoch=record.epoch, participant=failed[0].participant,
            ) from failures[0]
        sink.backend.epoch_committed(sink.sink_id, record.epoch, record.committables)
        sink.faults.hit(BEFORE_MARK_COMMITTED, record.epoch)
        if record.write is not None:
            # Before the record turns COMMITTED, and so can be pruned: once pruned, the
            # metadata is all that says this version was written.
            self.epochs.remember_write(record.write)
        sink.store.put(sink.lease, record.committed())
        duration = time.monotonic() - started
        log.info("sink=%s epoch=%d committed: %d participant(s), %d row(s) in %.3fs",
                 sink.sink_id, record.epoch, len(record.committables), record.rows, duration)
        sink.plugins.epoch_committed(sink.sink_id, record.epoch, record.committables, duration)
        sink.faults.hit(AFTER_MARK_COMMITTED, record.epoch)

    def _salvage(self, record: EpochRecord, results: list[CommitOutcome | CommitError]
                 ) -> tuple[EpochRecord, list[CommitOutcome | CommitError]]:
        """Prepare the lost participants of a DECIDED record again, record the
        replacements in the decision, then commit them (:meth:`Backend.salvage`).

        The order makes every crash end exactly once: a replacement not yet recorded is
        an orphan (the next start salvages the original again and the orphan scan
        aborts it); a recorded one is committed like any decided participant, or
        salvaged in turn if it was lost too. A participant whose data is gone keeps the
        backend's :class:`ParticipantLostError`, which says why. A fenced driver opens
        no replacement, and ends those it opened when its record of them is refused:
        no decision names them, and left open they would hold readers back.
        """
        sink = self.sink
        results = list(results)
        sink.store.check(sink.lease)
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
                    replacements[i] = sink.backend.salvage(c, ctx)
                except NotImplementedError:
                    return record, results
                except CommitError as exc:
                    results[i] = exc  # gone (it says why), or not now (retriable)
                except Exception as exc:
                    results[i] = RetriableCommitError(
                        f"salvaging {c.describe()} failed: "
                        f"{redact(f'{type(exc).__name__}: {exc}', sink.backend.secret_values())}",
                        sink_id=c.sink_id, epoch=c.epoch, participant=c.participant)
            if not replacements:
                break
            sink.faults.hit(AFTER_SALVAGE_PREPARE, record.epoch)
            originals = {i: record.committables[i] for i in replacements}
            record = record.with_replacements(
                {originals[i].participant: r for i, r in replacements.items()})
            try:
                sink.store.put(sink.lease, record)  # before any replacement is committed
            except FencedError:
                self.abort_all(record.epoch, list(replacements.values()),
                               "fenced before the salvage was recorded", raise_errors=False)
                raise
            for i, r in sorted(replacements.items()):
                c = originals[i]
                log.warning("sink=%s epoch=%d partition=%d participant=%s: the target aborted "
                            "this decided participant on its own; its %d row(s) were written "
                            "again as participant %s, recorded in the decision, and are "
                            "committed now (salvaged)", c.sink_id, c.epoch, c.partition,
                            c.participant, c.rows, r.participant)
                sink.plugins.participant_salvaged(sink.sink_id, record.epoch, c, r)
            sink.faults.hit(AFTER_SALVAGE_RECORD, record.epoch)
            order = sorted(replacements)
            for i, outcome in zip(order, self.commit_many([replacements[i] for i in order]),
                                  strict=True):
                results[i] = outcome
            if all(isinstance(results[i], CommitOutcome) for i in order):
                sink.faults.hit(AFTER_SALVAGE_COMMIT, record.epoch)
        return record, results

    def abort_all(self, epoch: int, committables: Sequence[Committable], reason: str,
                  *, raise_errors: bool = True) -> None:
        sink = self.sink
        if not committables:
            return
        failed: list[tuple[Committable, Exception]] = []
        for c in committables:
            try:
                sink.backend.abort(c)
            except Exception as exc:
                failed.append((c, exc))
                log.error("sink=%s epoch=%d partition=%d participant=%s: abort failed: %s "
                          "(the orphan scan will retry it)", c.sink_id, c.epoch, c.partition,
                          c.participant, redact(str(exc), sink.backend.secret_values()))
        done = [c for c in committables if all(c is not f for f, _ in failed)]
        if done:
            log.info("sink=%s epoch=%d: aborted %d participant(s) (%s)", sink.sink_id, epoch,
                     len(done), reason)
            sink.plugins.epoch_aborted(sink.sink_id, epoch, done, reason)
        if failed and raise_errors:
            first, error = failed[0]
            raise CommitError(
                f"could not abort {first.describe()}: "
                f"{redact(str(error), sink.backend.secret_values())}",
                sink_id=first.sink_id, epoch=first.epoch, participant=first.participant) from None


def _layout_words(rows: Mapping[str, int]) -> str:
    def where(key: str) -> str:
        target, _, partition = key.rpartition("/")
        return f"{target} partition {partition}" if target else f"partition {partition}"

    return ", ".join(f"{where(k)}: {n} row(s)" for k, n in sorted(rows.items()))
