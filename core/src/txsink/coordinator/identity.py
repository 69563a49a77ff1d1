"""Epoch identity: which write an epoch number belongs to, and fresh numbers for new ones.

One question is answered here: **is this write a replay of that one?** A stream's
batch is one write, a batch write (``df.write``, ``txsink.spark.epoch``) another; the
state records, per epoch, what wrote it. Decision and recovery ask; they never
compare epoch numbers on their own.

The other half is allocation: a batch write reserves a fresh epoch (``put_new``, so
concurrent writes get distinct ones), and a write identity (Delta's
``txnAppId``/``txnVersion``) is committed at most once.
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

    def allocate_epoch(self) -> int:
        """The next unused epoch (not reserved: see :meth:`reserve_epoch`)."""
        known = list(self.sink.store.states())
        return max([self.watermark(), *known]) + 1

    def reserve_epoch(self, write: WriteId | None = None) -> int:
        """Reserve a fresh epoch for one batch write; concurrent writes get distinct ones.

        With ``write``, a second write of the same identity in flight is refused (the
        one holding the lower epoch goes on), so one identity is committed at most once.
        """
        sink = self.sink
        lease = sink.lease
        while True:
            epoch = self.allocate_epoch()
            record = EpochRecord(epoch, EpochState.RESERVED, (), time.time(), write=write,
                                 owner=sink.owner)
            if sink.store.put_new(lease, record):
                break
        if write is not None:
            rival = self.rival(epoch, write)
            if rival is not None:
                sink.store.delete(lease, [epoch])
                raise StateError(
                    f"sink={sink.sink_id}: batch write {write} is already being written or "
                    f"was written (epoch {rival.epoch}, {rival.state.value}); a write "
                    "identity is written at most once, so this one writes nothing",
                    sink_id=sink.sink_id, epoch=epoch)
        log.info("sink=%s epoch=%d: reserved for a batch write%s", sink.sink_id, epoch,
                 f" ({write})" if write else "")
        return epoch

    # -- replays --------------------------------------------------------------------------

    def seen_before(self, epoch: int, record: EpochRecord | None, *, reserved: bool) -> bool:
        """Whether a write of ``epoch`` meets an epoch committed before (a replay).

        ``record`` is the state's record of ``epoch`` as the decision reads it (None:
        no record, or the write's own reservation).
        """
        if record is not None:
            return record.state is EpochState.COMMITTED
        return not reserved and epoch <= self.watermark()

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
        sink_id = self.sink.sink_id
        meta = self.sink.store.read_meta()
        best = meta.writes.get(write.app_id, -1) if meta else -1
        raise CheckpointChangedError(
            f"sink={sink_id}: batch write {write} is driven by the streaming query "
            f"{write.query_id}, but the versions of txnAppId {write.app_id!r} (committed up "
            f"to {best}) were written by the query {before}: the stream's checkpoint was "
            "deleted or replaced, and Spark numbers its batches from 0 again, so each new "
            "batch would be taken for one already written and dropped. Nothing of this "
            "batch was written. Restore the stream's checkpoint, or give the writes a new "
            "txnAppId (one per query, e.g. derived from the checkpoint's name)",
            sink_id=sink_id)

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


def kept(meta: SinkMeta | None, epoch: int) -> set[tuple[str | None, int]]:
    """The (target, partition) pairs a forced resolve of ``epoch`` kept committed."""
    if meta is None:
        return set()
    out: set[tuple[str | None, int]] = {(None, p) for p in meta.kept.get(epoch, ())}
    for target, partitions in meta.kept_targets.get(epoch, {}).items():
        out |= {(target, p) for p in partitions}
    return out


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
