"""Epoch identity: which write an epoch number belongs to, and fresh numbers for new ones.

The rule: **an epoch number means one set of rows, in every target, forever**. One
question is answered here: *is this write a replay of that one?* It is recognised by
the identity that wrote the epoch, never by the number alone:

* a micro-batch of the streaming sink is (Spark's query id, batch id). Its epoch is
  ``stream_from + batch id``, where ``stream_from`` is fixed when a stream first
  writes through the state: 0 on a fresh state, above every epoch used before when
  batch writes (a backfill) came first. An epoch the state recorded for that stream
  is a replay of it; one recorded for anything else (a batch write) is refused;
* a batch write (``df.write``, ``TargetSet.write``, ``txsink.spark.epoch``) reserves a
  fresh epoch (``put_new``: concurrent writes get distinct ones), above every number
  ever used: committed, reserved, given up by a forced resolve or a dropped
  reservation, or held by a target. Once a stream writes through the state, batch
  writes are refused: they would take the numbers of its next batches;
* a batch write with an identity (Delta's ``txnAppId``/``txnVersion``) is a replay
  of a committed version ``>=`` its own only when the same driver wrote that version:
  the same streaming query (``foreachBatch``), or no stream for both. Versions of one
  app id written by another driver are refused, never compared.

Decision and recovery ask; they never compare epoch numbers on their own.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence

from txsink.coordinator.sink import Sink
from txsink.errors import CheckpointChangedError, StateError
from txsink.model import Committable
from txsink.state import EpochRecord, EpochState, SinkMeta, StateStore, WriteId

log = logging.getLogger(__name__)

#: Batch-write identities (``txnAppId``) whose committed version a sink remembers.
MAX_WRITE_IDS = 1000
#: :attr:`EpochRecord.origin` of a streaming sink's micro-batch, and of a batch write.
STREAM, BATCH = "stream", "batch"


class Epochs:
    """The epoch numbers of one sink: who wrote which, and which are free."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    # -- numbers --------------------------------------------------------------------------

    def watermark(self) -> int:
        """The highest epoch known to be COMMITTED (records may have been pruned)."""
        store = self.sink.store
        meta = store.read_meta()
        best = meta.committed_watermark if meta else -1
        committed = [e for e, s in store.states().items() if s is EpochState.COMMITTED]
        return max([best, *committed])

    def used_in_state(self) -> int:
        """The highest epoch number the state has used: committed (also pruned), known,
        or given up (-1: none)."""
        meta = self.sink.store.read_meta()
        known = list(self.sink.store.states())
        return max([self.watermark(), *known, meta.given_up if meta else -1])

    def held_by_targets(self) -> int:
        """The highest epoch any target's own markers show (-1: none, or none can say)."""
        sink = self.sink
        if sink.group is not None:
            highs = list(sink.group.highest_epochs().values())
        else:
            highs = [sink.backend.highest_epoch(sink.sink_id)]
        return max((h for h in highs if h is not None), default=-1)

    def allocate_epoch(self) -> int:
        """The next unused epoch (not reserved: see :meth:`reserve_epoch`): above every
        number the state ever used or gave up, and every epoch a target holds."""
        return max(self.used_in_state(), self.held_by_targets()) + 1

    def reserve_epoch(self, write: WriteId | None = None) -> int:
        """Reserve a fresh epoch for one batch write; concurrent writes get distinct ones.

        With ``write``, a second write of the same identity in flight is refused (the
        one holding the lower epoch goes on), so one identity is committed at most once.
        On a state a stream writes through, refused (:meth:`refuse_beside_stream`).
        """
        sink = self.sink
        lease = sink.lease
        self.refuse_beside_stream(None)
        meta = sink.store.read_meta()
        again = meta.kept_writes.get(str(write)) if write and meta else None
        if write is not None and again is not None:
            epoch = self._reserve_again(write, again[0])
        else:
            held = self.held_by_targets()
            while True:
                epoch = max(self.used_in_state(), held) + 1
                record = EpochRecord(epoch, EpochState.RESERVED, (), time.time(),
                                     write=write, owner=sink.owner, origin=BATCH)
                if sink.store.put_new(lease, record):
                    break
        # Again after the reservation: a stream that bound the state meanwhile took its
        # numbers from what it saw, which may not have included this one.
        self.refuse_beside_stream(epoch)
        if write is not None:
            rival = self.rival(epoch, write)
            if rival is not None:
                self.give_up([epoch])
                raise StateError(
                    f"sink={sink.sink_id}: batch write {write} is already being written or "
                    f"was written (epoch {rival.epoch}, {rival.state.value}); a write "
                    "identity is written at most once, so this one writes nothing",
                    sink_id=sink.sink_id, epoch=epoch)
        log.info("sink=%s epoch=%d: reserved for a batch write%s", sink.sink_id, epoch,
                 f" ({write})" if write else "")
        return epoch

    def _reserve_again(self, write: WriteId, epoch: int) -> int:
        """The replay of a write whose epoch a forced resolve gave up with some of its
        participants committed (kept): the same write, so the same number, in every
        target; the decision writes only the partitions that were not kept."""
        sink = self.sink
        record = EpochRecord(epoch, EpochState.RESERVED, (), time.time(), write=write,
                             owner=sink.owner, origin=BATCH)
        if not sink.store.put_new(sink.lease, record):
            raise StateError(
                f"sink={sink.sink_id}: batch write {write} is being written again already "
                f"(epoch {epoch}, given up by a forced resolve with part of it kept); a "
                "write identity is written at most once, so this one writes nothing",
                sink_id=sink.sink_id, epoch=epoch)
        log.warning("sink=%s epoch=%d: batch write %s is written again under the epoch a "
                    "forced resolve gave up; the partitions it kept are not written twice",
                    sink.sink_id, epoch, write)
        return epoch

    def give_up(self, epochs: Sequence[int]) -> None:
        """Delete the records of ``epochs``, never to be committed; their numbers are
        remembered first, so no later write is allocated one of them."""
        if not epochs:
            return
        sink = self.sink
        meta = sink.meta()
        if max(epochs) > meta.given_up:
            meta = dataclasses.replace(meta, given_up=max(epochs))
            sink.store.write_meta(sink.lease, meta)
            sink.cached_meta = meta
        sink.store.delete(sink.lease, epochs)

    def refuse_beside_stream(self, reserved: int | None) -> None:
        """Refuse a batch write on a state a stream writes through (dropping the
        reservation ``reserved`` if it was made already)."""
        sink = self.sink
        meta = sink.store.read_meta()
        if meta is None or meta.stream_from is None:
            return
        if reserved is not None:
            self.give_up([reserved])
        raise beside_stream(sink.sink_id, sink.store.location, meta.stream_from)

    # -- streams ----------------------------------------------------------------------------

    def bind_stream(self, legacy: bool) -> int:
        """Fix the epoch of the streaming sink's micro-batch 0 (once per state).

        0 on a state nothing wrote yet; above every epoch the state used when batch
        writes came first (a backfill), and above every epoch a target holds. The
        targets count too: a state that knows none of their epochs is a new query's,
        either on a sink id its old owner released ("the old query and its checkpoint
        are gone for good", as every claim refusal puts it) or beside epochs written
        by batch writes; taking its batches for the old epochs dropped them. A stream
        whose state alone was lost meets the target's claim of the old state first.
        ``legacy``: a stream wrote through this state under a release that did not
        record it, with epochs equal to batch ids (0).
        """
        sink = self.sink
        meta = sink.cached_meta or sink.meta()  # start() has just read it
        if meta.stream_from is not None:
            return meta.stream_from
        meta = sink.meta()
        if meta.stream_from is not None:
            return meta.stream_from
        if not legacy:
            self._refuse_behind_targets()
        start = 0 if legacy else max(self.used_in_state(), self.held_by_targets()) + 1
        while True:
            meta = sink.meta()
            meta = dataclasses.replace(meta, stream_from=start,
                                       query_id=meta.query_id or sink.query_id)
            sink.store.write_meta(sink.lease, meta)
            sink.cached_meta = meta
            if legacy:
                break
            # Again now that it is written: a batch write that reserved meanwhile (the
            # driver's backfill) read no stream_from, and took a number this stream was
            # about to take. It goes on; the stream starts above it.
            above = max(self.used_in_state(), self.held_by_targets()) + 1
            if above <= start:
                break
            start = above
        if start:
            log.warning("sink=%s: epochs up to %d were written before the first "
                        "streaming query of this state wrote through it (batch writes, or "
                        "the query that released the sink id): the stream's micro-batch b "
                        "is epoch %d + b", sink.sink_id, start - 1, start)
        return start

    def _refuse_behind_targets(self) -> None:
        """A stream about to bind a state that has used epochs, while the targets hold
        higher ones it does not know: the state (or the checkpoint holding it) was
        restored from a copy taken before a stream bound it. That stream's batches are
        in the targets under epochs this state never recorded; bound again above them,
        Spark's replays of those batches would be written a second time. (A state that
        used no epoch at all is a new query's: the claims judge it.)"""
        known = self.used_in_state()
        if known < 0:
            return
        held = self.held_by_targets()
        if held <= known:
            return
        sink = self.sink
        raise StateError(
            f"sink={sink.sink_id}: the targets hold epochs up to {held}, but the txsink "
            f"state at {sink.store.location} knows epochs up to {known} and no stream bound "
            "to it: the state (or the checkpoint holding it) was restored from an older "
            "copy, taken before a streaming query first wrote through it. That query's "
            "batches are in the targets under epochs this state does not know, so its "
            "micro-batches cannot be told from them and would be written twice. Nothing "
            "was written. Put the newest state back; or write on under a new sink_id and "
            "output", sink_id=sink.sink_id)

    def stream_from(self) -> int:
        """The epoch of the streaming sink's micro-batch 0 (0 when no stream bound it)."""
        meta = self.sink.cached_meta
        if meta is None or meta.stream_from is None:  # fixed once set: the cache serves
            meta = self.sink.store.read_meta() or meta
        return meta.stream_from if meta is not None and meta.stream_from is not None else 0

    # -- replays --------------------------------------------------------------------------

    def seen_before(self, epoch: int, record: EpochRecord | None, *, reserved: bool) -> bool:
        """Whether a write of ``epoch`` meets an epoch committed before (a replay).

        ``record`` is the state's record of ``epoch`` as the decision reads it (None:
        no record, or the write's own reservation). Ask :meth:`stranger` first: a
        record another identity wrote is never this write's.
        """
        if record is not None:
            return record.state is EpochState.COMMITTED
        return not reserved and epoch <= self.watermark()

    def stranger(self, epoch: int, record: EpochRecord | None) -> str | None:
        """Who else the state recorded ``epoch`` for, in words, when this run's
        micro-batch of ``epoch`` is not that write; None when it is (or this run is not
        the streaming sink's: a batch write's reservation is checked by its owner).

        A stream's batch is the same write as the recorded one only if the record is
        of a stream of the same query (or says nothing: an older release).
        """
        sink = self.sink
        if record is None or not sink.stream:
            return None  # only the streaming sink says which query a write is of
        if record.origin == BATCH or record.state is EpochState.RESERVED:
            return (f"the batch write {record.write}" if record.write is not None
                    else "a batch write") + f" ({record.state.value})"
        if (record.origin == STREAM and sink.stream and record.query_id and sink.query_id
                and record.query_id != sink.query_id):
            return f"the streaming query {record.query_id} ({record.state.value})"
        return None

    def rival(self, epoch: int, write: WriteId) -> EpochRecord | None:
        """Another record of the same write identity that wins over ``epoch``."""
        for other in sorted(self.sink.store.records().values(), key=lambda r: r.epoch):
            if other.epoch == epoch or other.write is None:
                continue
            if other.write.app_id != write.app_id or other.write.version < write.version:
                continue
            if other.state is not EpochState.RESERVED or other.epoch < epoch:
                return other
        return None

    def committed_write(self, write: WriteId) -> int | None:
        """The highest committed version of ``write.app_id`` if it is ``>= write.version``."""
        store = self.sink.store
        meta = store.read_meta()
        best = meta.writes.get(write.app_id, -1) if meta else -1
        for record in store.records().values():
            if (record.state is EpochState.COMMITTED and record.write is not None
                    and record.write.app_id == write.app_id):
                best = max(best, record.write.version)
        return best if best >= write.version else None

    def write_query(self, app_id: str) -> str | None:
        """The streaming query that drove the committed versions of ``app_id``, if any."""
        store = self.sink.store
        meta = store.read_meta()
        query = meta.write_queries.get(app_id) if meta else None
        if query is None:
            best = -1
            for record in store.records().values():
                w = record.write
                if (record.state is EpochState.COMMITTED and w is not None
                        and w.app_id == app_id and w.query_id and w.version > best):
                    best, query = w.version, w.query_id
        return query

    def check_write_query(self, write: WriteId) -> None:
        """Refuse a versioned write whose app id's versions another driver wrote.

        Versions of one ``txnAppId`` count within the driver that wrote them: one
        streaming query (``foreachBatch`` with ``txnVersion=batch_id``), or batch jobs
        no stream drives. Spark numbers a stream's batches from 0 again when its
        checkpoint is deleted or replaced, and a batch job's versions mean nothing to
        a stream's batch ids: compared across drivers, new batches would be taken for
        ones already written and dropped. ``write.query_id`` is the driving query
        (None: none).
        """
        before = self.write_query(write.app_id)
        if before == write.query_id:
            return
        best = self.committed_version(write.app_id)
        if best < 0:
            return  # nothing committed under this app id yet: any driver may start it
        sink_id = self.sink.sink_id
        if before is not None and write.query_id is not None:
            raise CheckpointChangedError(
                f"sink={sink_id}: batch write {write} is driven by the streaming query "
                f"{write.query_id}, but the versions of txnAppId {write.app_id!r} (committed "
                f"up to {best}) were written by the query {before}: the stream's checkpoint "
                "was deleted or replaced, and Spark numbers its batches from 0 again, so "
                "each new batch would be taken for one already written and dropped. Nothing "
                "of this batch was written. Restore the stream's checkpoint, or give the "
                "writes a new txnAppId (one per query, e.g. derived from the checkpoint's "
                "name)", sink_id=sink_id)
        if before is None:
            raise StateError(
                f"sink={sink_id}: batch write {write} is driven by the streaming query "
                f"{write.query_id}, but the versions of txnAppId {write.app_id!r} (committed "
                f"up to {best}) were written by batch jobs no stream drives: versions of one "
                "txnAppId count for one writer, so this stream's batches up to "
                f"{best} would be taken for written and dropped. Nothing of this batch was "
                "written. Give the stream's writes a txnAppId of their own (app_id= of "
                "txsink.spark.epoch, or option txnAppId)", sink_id=sink_id)
        raise StateError(
            f"sink={sink_id}: batch write {write} is driven by no streaming query, but the "
            f"versions of txnAppId {write.app_id!r} (committed up to {best}) are the batch "
            f"ids of the streaming query {before}: a version written here would be compared "
            "with its batch ids, and its batches taken for written and dropped. Nothing of "
            "this write was written. Give batch jobs a txnAppId of their own", sink_id=sink_id)

    def check_kept_query(self, epoch: int, write: WriteId) -> None:
        """Refuse a write reserved as the replay of a kept write (:meth:`_reserve_again`)
        that another driver made: it has the same ``app_id@version`` only by chance (a
        replaced checkpoint numbers its batches from 0 again), so its rows are not the
        ones the kept partitions hold."""
        meta = self.sink.store.read_meta()
        kept = meta.kept_writes.get(str(write)) if meta is not None else None
        if kept is None or kept[0] != epoch or kept[1] == write.query_id:
            return
        sink_id = self.sink.sink_id
        raise CheckpointChangedError(
            f"sink={sink_id}: batch write {write} is driven by "
            f"{'the streaming query ' + write.query_id if write.query_id else 'no stream'}, "
            f"but a forced resolve gave up epoch {epoch} of {write} written by "
            f"{'the streaming query ' + kept[1] if kept[1] else 'a batch job'} with part of "
            "it kept in the targets: versions of one txnAppId count for one writer, so this "
            "write would be taken for that one and partly dropped. Nothing of it was "
            "written. Restore that query's checkpoint, or give this writer's writes a "
            "txnAppId of their own", sink_id=sink_id)

    def committed_version(self, app_id: str) -> int:
        """The highest committed version of ``app_id`` (-1: none)."""
        found = self.committed_write(WriteId(app_id, 0))
        return -1 if found is None else found

    def remember_write(self, write: WriteId) -> None:
        """Keep the committed version of a write identity after its record is pruned."""
        sink = self.sink
        meta = sink.meta()
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
                        "would write again", sink.sink_id, len(dropped), dropped[0],
                        MAX_WRITE_IDS)
            writes = {a: v for a, v in writes.items() if a not in dropped}
            queries = {a: q for a, q in queries.items() if a in writes}
        meta = dataclasses.replace(meta, writes=writes, write_queries=queries)
        sink.store.write_meta(sink.lease, meta)
        sink.cached_meta = meta


def beside_stream(sink_id: str, location: str, stream_from: int) -> StateError:
    """The refusal of a batch write on a state a stream writes through."""
    return StateError(
        f"sink={sink_id}: a streaming query writes through this sink's state "
        f"({location}); its micro-batch b is epoch {stream_from} + b, "
        "so a batch write here would take the number of one of its next batches. "
        "Nothing of this batch write was written. Write it under its own sink_id and "
        "checkpoint (or state_location), or write the stream with foreachBatch "
        "grouped writes (txsink.spark.epoch(..., version=batch_id)), which reserve "
        "their epochs like batch writes", sink_id=sink_id)


def kept(meta: SinkMeta | None, epoch: int) -> set[tuple[str | None, int]]:
    """The (target, partition) pairs a forced resolve of ``epoch`` kept committed."""
    if meta is None:
        return set()
    out: set[tuple[str | None, int]] = {(None, p) for p in meta.kept.get(epoch, ())}
    for target, partitions in meta.kept_targets.get(epoch, {}).items():
        out |= {(target, p) for p in partitions}
    return out


def layout(committables: Sequence[Committable]) -> dict[str, int]:
    """``target/partition`` -> rows, of one attempt at an epoch (:attr:`SinkMeta.kept_rows`)."""
    return {f"{c.target or ''}/{c.partition}": c.rows for c in committables}


def kept_words(pairs: set[tuple[str | None, int]]) -> str:
    return ", ".join(f"{t}:{p}" if t else str(p) for t, p in sorted(
        pairs, key=lambda k: (k[0] or "", k[1])))


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
