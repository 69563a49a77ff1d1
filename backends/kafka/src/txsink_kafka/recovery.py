"""Recovery for the Kafka backend: which participants began and never ended.

Every participant's first record is a begin marker in the sink's marker partition;
committing or aborting it writes an end marker (see :mod:`txsink_kafka.markers`).
The scan reads that partition from where the previous scan of this process stopped
and cross-checks what it finds against the transaction coordinators' own list
(ListTransactions/DescribeTransactions) where the broker has one. Orphans (no
decision holds them) are aborted with their own producer id and epoch and their id
fenced; open transactions with no begin marker are aborted at a query's start.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Collection, Mapping
from typing import Any

from txsink.model import Committable, participant_name

from txsink_kafka.clients import NAME, ScanState, SinkClients, read_range, watermarks
from txsink_kafka.committer import KafkaCommitter
from txsink_kafka.markers import ABORTED, BEGIN, COMMITTED, END, OWNER, Marker, marker_partition
from txsink_kafka.naming import SinkIds, preflight_id
from txsink_kafka.retry import retry_transient
from txsink_kafka.txn_protocol import (
    ConnectionDroppedError,
    ProducerIdentity,
    TransactionInfo,
    TxnProtocolError,
    UnsupportedByBrokerError,
)

log = logging.getLogger(__name__)


class KafkaRecovery:
    """Finds and ends the sink's participants that no decision holds."""

    def __init__(self, shared: SinkClients, committer: KafkaCommitter) -> None:
        self.shared = shared
        self.config = shared.config
        self.committer = committer

    def broker_transactions(self, sink_id: str) -> dict[str, TransactionInfo] | None:
        """The sink's open transactions, per the transaction coordinators.

        ``None`` where the broker cannot list transactions (before Kafka 3.0, Tansu).
        Needs DESCRIBE on the sink's transactional ids (WRITE implies it); ids the
        principal may not describe are silently left out by the broker.
        """
        txn = self.shared.driver().txn
        ids = SinkIds(self.config.transactional_id_prefix, sink_id)
        try:
            listed = [t for t in txn.list_open_transactional_ids() if ids.owns(t)]
            described = txn.describe_transactions(listed) if listed else {}
        except UnsupportedByBrokerError:
            return None
        return {t: info for t, info in described.items() if info is not None and info.is_open}

    def open_transactions(self, sink_id: str) -> list[Mapping[str, Any]]:
        """The sink's open transactions on the broker: age, timeout, readers held back.

        A ``read_committed`` reader of a partition stops at its last stable offset,
        the first offset of the oldest open transaction there: records after it, of
        any producer, stay invisible until that transaction ends.
        """
        broker = self.broker_transactions(sink_id)
        if broker is None:
            return []
        markers = self.open_markers(sink_id)
        d = self.shared.driver()
        timeout = self.config.request_timeout_s
        now_ms = time.time() * 1000
        partitions = sorted({tp for info in broker.values() for tp in info.partitions})
        starts = d.txn.open_transaction_starts(partitions)
        rows: list[Mapping[str, Any]] = []
        for tid, info in sorted(broker.items()):
            marker = markers.get(tid)
            participant = (self.from_marker(marker).participant if marker is not None
                           and marker.producer_id == info.producer_id else None)
            age_s = max(0.0, (now_ms - info.start_ms) / 1000) if info.start_ms >= 0 else None
            held: list[dict[str, Any]] = []
            with d.lock:
                for topic, partition in info.partitions:
                    _, lso = watermarks(d.committed_offsets, topic, partition, timeout)
                    _, high = watermarks(d.uncommitted_offsets, topic, partition, timeout)
                    start = starts.get((topic, partition), {}).get(info.producer_id)
                    held.append({"topic": topic, "partition": partition,
                                 "last_stable_offset": lso, "high_watermark": high,
                                 "transaction_start_offset": start,
                                 # The oldest open transaction sets the LSO.
                                 "holds_back_readers": high > lso and (
                                     start is None or start <= lso)})
            blocking = [h for h in held if h["holds_back_readers"]]
            age = ("?" if age_s is None else
                   f"{age_s:.0f}s of its {info.timeout_ms / 1000:.0f}s timeout")
            summary = (
                f"transactional.id {tid} ({participant or 'no marker: participant unknown'}):"
                f" {info.state}, open {age}; "
                + ("holds back read_committed readers of " + ", ".join(
                    f"{h['topic']}[{h['partition']}] (last stable offset "
                    f"{h['last_stable_offset']} < high watermark {h['high_watermark']})"
                    for h in blocking) if blocking else "holds back no reader"))
            rows.append({"name": tid, "summary": summary, "participant": participant,
                         "state": info.state, "producer_id": info.producer_id,
                         "producer_epoch": info.producer_epoch, "age_s": age_s,
                         "timeout_ms": info.timeout_ms, "partitions": held})
        return rows

    def _broker_view(self, sink_id: str) -> dict[str, TransactionInfo] | None:
        try:
            return self.broker_transactions(sink_id)
        except TxnProtocolError as exc:
            log.warning("sink=%s: listing its open transactions on the broker failed (%s); "
                        "going by the marker records alone", sink_id, self.shared.redact(str(exc)))
            return None

    def open_markers(self, sink_id: str) -> dict[str, Marker]:
        """Participants of ``sink_id`` that began and were not ended, per marker scan.

        Scans from where the previous scan stopped; the first scan of a process reads
        the last ``orphan.scan.records`` records of the sink's marker partition. A
        broker just back from a restart may not know the partition's leader yet: that
        is waited for within ``unavailable.retry.s``, like every other call. A scan cut
        short is safe to repeat: it starts again from the same cursor.
        """
        return retry_transient(lambda: self._scan_markers(sink_id),
                               what=f"sink={sink_id}: marker scan",
                               bound_s=self.config.retry_bound_s, redact=self.shared.redact)

    def _scan_markers(self, sink_id: str) -> dict[str, Marker]:
        d = self.shared.driver()
        topic = self.config.marker_topic
        timeout = self.config.request_timeout_s
        with d.lock:
            d.ends.flush(timeout)
            if self.shared.marker_partitions is None:
                md = d.ends.list_topics(topic, timeout=timeout)
                tmd = md.topics.get(topic)
                self.shared.marker_partitions = len(tmd.partitions) if tmd and tmd.partitions else 1
            partition = marker_partition(sink_id, self.shared.marker_partitions)
            state = d.scans.setdefault(f"{topic}/{sink_id}", ScanState())
            low, high = watermarks(d.uncommitted_offsets, topic, partition, timeout)
            start = state.cursor
            if start is None:
                # Every open participant's begin marker is at or after the partition's
                # last stable offset (it is the first record of its transaction).
                _, lso = watermarks(d.committed_offsets, topic, partition, timeout)
                records = self.config.orphan_scan_records
                start = max(low, min(high - records, max(lso, high - 10 * records)))
            last = -1
            # Markers are one-record batches, so the end offset is right even on Tansu;
            # past it, read to the end the fetch reports.
            for msg in read_range(d.uncommitted, topic, partition, max(start, low),
                                   None if start < high else start, timeout):
                last = msg.offset() or 0
                m = Marker.decode(msg.key(), msg.value(), last)
                if m is None or m.sink_id != sink_id:
                    continue
                if m.kind == BEGIN:
                    state.open[m.transactional_id] = m
                elif m.kind == END:
                    if m.outcome == COMMITTED:
                        state.committed_epochs.add(m.epoch)
                    began = state.open.get(m.transactional_id)
                    # A restarted query reuses names (Spark's task attempt ids start
                    # again), and a transactional id keeps its producer id: only an end
                    # for the same producer epoch ends this use of the name.
                    if began is not None and (m.producer_id < 0 or began.producer_id < 0 or (
                            m.producer_id, m.producer_epoch) == (began.producer_id,
                                                                 began.producer_epoch)):
                        del state.open[m.transactional_id]
                elif m.kind == OWNER:
                    state.owner = m
            state.cursor = max(high, last + 1)
            _forget_old_epochs(state, self.config.orphan_scan_records)
            return dict(state.open)

    def holds_epoch(self, sink_id: str, epoch: int) -> bool:
        """A participant of ``epoch`` ended as committed, per the marker partition.

        End markers are written once a participant's commit is confirmed on every
        partition it wrote, so they never count prepared data. The scan covers the
        marker partition's tail (``orphan.scan.records`` behind the last stable
        offset in a new process), where the epochs a replay can bring back are; a
        process that runs on remembers the newest ``orphan.scan.records`` epochs.
        """
        retry_transient(lambda: self._scan_markers(sink_id),
                        what=f"sink={sink_id} epoch={epoch}: reading the marker partition "
                             "before the decision", bound_s=self.config.retry_bound_s,
                        redact=self.shared.redact)
        return epoch in self.scan_state(sink_id).committed_epochs

    def highest_epoch(self, sink_id: str) -> int:
        """The newest epoch with a participant ended as committed, per the marker scan
        (-1: none in the scanned tail); what a group's consistent cut reads."""
        self.open_markers(sink_id)
        return max(self.scan_state(sink_id).committed_epochs, default=-1)

    def scan_state(self, sink_id: str) -> ScanState:
        return self.shared.driver().scans[f"{self.config.marker_topic}/{sink_id}"]

    def from_marker(self, m: Marker) -> Committable:
        participant = participant_name(m.sink_id, m.epoch, m.partition, m.attempt)
        return Committable(
            NAME, m.sink_id, m.epoch, m.partition, m.attempt, participant,
            {"transactional_id": m.transactional_id, "producer_id": m.producer_id,
             "producer_epoch": m.producer_epoch,
             "marker": {"topic": self.config.marker_topic,
                        "partition": marker_partition(m.sink_id,
                                                      self.shared.marker_partitions or 1),
                        "offset": m.offset}})

    def list_prepared(self, sink_id: str) -> list[Committable]:
        """Participants that began and never ended.

        From the marker scan (which starts at or before the marker partition's last
        stable offset, so every open participant's begin marker is in it), checked
        against the coordinators where the broker can list transactions: a
        participant whose transaction the broker no longer has open (timed out, or
        committed with its end marker lost in a crash) is not listed. Includes
        participants still being written.
        """
        markers = self.open_markers(sink_id)
        broker = self._broker_view(sink_id)
        out: list[Committable] = []
        for tid, m in markers.items():
            if broker is not None:
                info = broker.get(tid)
                if info is None:
                    continue
                if m.producer_id >= 0 and info.identity != ProducerIdentity(
                        m.producer_id, m.producer_epoch):
                    continue  # a later use of a pooled id whose marker is not read yet
            out.append(self.from_marker(m))
        return sorted(out, key=lambda c: (c.epoch, c.partition, c.attempt))

    def abort_orphans(self, sink_id: str, protected: Collection[str],
                      up_to_epoch: int | None = None) -> list[Committable]:
        """Fence every participant that began, never ended, and no decided epoch holds.

        With ``up_to_epoch`` unset (a query start: none of its writers runs yet), open
        transactions of the sink that have no begin marker (a writer that died between
        registering its transaction and writing its first record) are aborted too.
        """
        aborted: list[Committable] = []
        d = self.shared.driver()
        prepared = self.list_prepared(sink_id)
        for c in prepared:
            if (up_to_epoch is not None and c.epoch > up_to_epoch) or \
                    c.participant in protected:
                continue
            tid, identity, (mtopic, mpart, _) = self.committer.payload(c)
            if identity.producer_id >= 0:
                # Abort the transaction with its own producer id and epoch, then fence
                # the id so that a zombie writer cannot go on with it (InitProducerId
                # alone also aborts an ongoing transaction on Kafka and on Tansu 0.6).
                with contextlib.suppress(ConnectionDroppedError):
                    d.txn.end_txn(tid, identity, commit=False)
            if not self.committer.fence(tid, identity) and identity.producer_id < 0:
                continue  # an unidentified use of a pooled id: left to the broker's timeout
            self.committer.write_end(c, tid, mtopic, mpart, ABORTED)
            log.info("sink=%s epoch=%d partition=%d participant=%s: fenced orphan "
                     "transactional.id=%s", c.sink_id, c.epoch, c.partition, c.participant,
                     tid)
            aborted.append(c)
        if up_to_epoch is None:
            self._abort_unmarked(sink_id, {str(c.payload["transactional_id"])
                                           for c in prepared})
        if aborted:
            d.ends.flush(self.config.request_timeout_s)
        return aborted

    def _abort_unmarked(self, sink_id: str, marked: Collection[str]) -> None:
        broker = self._broker_view(sink_id) or {}
        preflight = preflight_id(self.config.transactional_id_prefix, sink_id)
        for tid, info in sorted(broker.items()):
            if tid in marked or tid == preflight:
                continue
            # Its begin marker is not in the marker partition, so no data of it either
            # (writers wait for the marker before writing data).
            log.warning("sink=%s: aborting open transaction of transactional.id=%s "
                        "(producer %d epoch %d, state %s) that has no begin marker",
                        sink_id, tid, info.producer_id, info.producer_epoch, info.state)
            with contextlib.suppress(ConnectionDroppedError):
                self.shared.driver().txn.end_txn(tid, info.identity, commit=False)
            self.committer.fence(tid, info.identity)


def _forget_old_epochs(state: ScanState, window: int) -> None:
    """Keep the committed epochs a fresh process's scan could find, not one per epoch
    ever scanned: a driver that runs for months would hold every epoch id otherwise.

    A fresh process reads the last ``orphan.scan.records`` marker records, so it never
    knows more than that many epochs; once this process knows a tenth more, the oldest
    are forgotten, down to ``window``.
    """
    epochs = state.committed_epochs
    if len(epochs) > window + window // 10:
        keep = sorted(epochs)[-window:]
        epochs.clear()
        epochs.update(keep)
