"""The Kafka committer: the driver's half of the protocol (Flink's ``KafkaCommitter``).

``commit`` sends ``EndTxn(commit)`` for the producer id and epoch a writer prepared
(Flink's ``resumeTransaction``) through :mod:`txsink_kafka.txn_protocol`, then waits
until ``DescribeProducers`` shows the transaction closed on every partition it wrote
(Kafka answers EndTxn before it writes its markers), and only then writes the
participant's committed end marker. It is idempotent from the top: the begin marker,
readable to ``read_committed`` readers, says a participant was committed. ``abort``
sends ``EndTxn(abort)`` or fences the id with ``InitProducerId``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from txsink.backend import CommitOutcome
from txsink.errors import FatalCommitError, ParticipantLostError, RetriableCommitError
from txsink.model import Committable

from txsink_kafka.clients import (
    TRANSACTION_VERSION,
    SinkClients,
    read_range,
    warn_near_timeout,
    watermarks,
)
from txsink_kafka.markers import ABORTED, BEGIN, COMMITTED, END, Marker
from txsink_kafka.naming import is_pooled
from txsink_kafka.retry import retry_transient
from txsink_kafka.txn_protocol import (
    ConnectionDroppedError,
    EndTxnResult,
    ProducerIdentity,
    TxnProtocolError,
    UnsupportedByBrokerError,
)

log = logging.getLogger(__name__)


class MarkerHiddenError(RetriableCommitError):
    """A participant's id was opened again since its transaction ended (EndTxn refused
    as fenced) and its begin marker is behind a transaction still open on the marker
    partition: its own records may still say it committed (the backend asks them)."""


class MarkerStatus:
    VISIBLE = "visible"  # committed (Tansu: or aborted, see docs)
    HIDDEN = "hidden"  # at or above the last stable offset: open, or behind an open one
    MISSING = "missing"  # below the last stable offset yet not readable: aborted


class KafkaCommitter:
    """Commits and aborts prepared participants, from any process."""

    def __init__(self, shared: SinkClients,
                 decode: Callable[[int, Mapping[str, Any]], Mapping[str, Any]]) -> None:
        self.shared = shared
        self.config = shared.config
        #: The backend's committable payload decoder (migrates older versions).
        self.decode = decode

    def payload(self, c: Committable) -> tuple[str, ProducerIdentity, tuple[str, int, int]]:
        p = self.decode(c.payload_version, c.payload)
        try:
            marker = p["marker"]
            return (str(p["transactional_id"]),
                    ProducerIdentity(int(p["producer_id"]), int(p["producer_epoch"])),
                    (str(marker["topic"]), int(marker["partition"]), int(marker["offset"])))
        except (KeyError, TypeError, ValueError) as exc:
            raise FatalCommitError(f"{c.describe()}: malformed Kafka committable: {exc}",
                                   sink_id=c.sink_id, epoch=c.epoch,
                                   participant=c.participant) from None

    def marker_status(self, c: Committable) -> str:
        """Is the begin marker of ``c`` visible to ``read_committed`` readers?

        The record at the marker's offset counts only if it is that marker: same
        transactional id, sink, epoch, partition, attempt and producer id and epoch. A
        marker topic that was truncated (an unclean leader election) or recreated can
        hold another participant's marker at the same offset, with the same pooled id.
        """
        tid, identity, (topic, partition, offset) = self.payload(c)
        d = self.shared.driver()
        timeout = self.config.request_timeout_s
        with d.lock:
            _, lso = watermarks(d.committed_offsets, topic, partition, timeout)
            if offset >= lso:
                return MarkerStatus.HIDDEN
            for msg in read_range(d.committed, topic, partition, offset, lso, timeout):
                m = Marker.decode(msg.key(), msg.value(), msg.offset() or 0)
                if msg.offset() == offset and m is not None and _same_participant(
                        m, c, tid, identity):
                    return MarkerStatus.VISIBLE
                return MarkerStatus.MISSING
            return MarkerStatus.MISSING

    def ended_as_committed(self, topic: str, partition: int, offset: int,
                            transactional_id: str, identity: ProducerIdentity) -> bool:
        """Is there a ``committed`` end marker for ``transactional_id`` after ``offset``?

        Any committed end wins: a fence of an already committed participant (its end
        marker was lost in a crash) writes an ``aborted`` end after it.
        """
        d = self.shared.driver()
        with d.lock:
            for msg in read_range(d.uncommitted, topic, partition, offset, None,
                                   self.config.request_timeout_s):
                key = msg.key()
                if key is None or key.decode() != transactional_id:
                    continue
                m = Marker.decode(key, msg.value(), msg.offset() or 0)
                if (m is not None and m.kind == END and m.outcome == COMMITTED
                        and m.producer_id == identity.producer_id
                        and m.producer_epoch == identity.producer_epoch):
                    return True
        return False

    def write_end(self, c: Committable, transactional_id: str, topic: str,
                   partition: int, outcome: str) -> None:
        # The producer id names *this* use of the transactional id: a later participant
        # with the same name (a restarted query reuses Spark's task attempt ids) has
        # another one.
        key, value = Marker(END, transactional_id, c.sink_id, c.epoch, c.partition,
                            c.attempt, producer_id=int(c.payload.get("producer_id", -1)),
                            producer_epoch=int(c.payload.get("producer_epoch", -1)),
                            outcome=outcome).encode()
        ends = self.shared.driver().ends
        try:
            ends.produce(topic, value, key, partition)
        except BufferError:
            ends.flush(self.config.request_timeout_s)
            ends.produce(topic, value, key, partition)
        ends.poll(0)

    def is_committed(self, c: Committable) -> bool:
        """Its begin marker is readable to read_committed readers, or a committed end
        marker of this producer id and epoch follows it (compaction took the begin)."""
        tid, identity, (mtopic, mpart, moffset) = self.payload(c)
        status = self.marker_status(c)
        return status == MarkerStatus.VISIBLE or (
            status == MarkerStatus.MISSING
            and self.ended_as_committed(mtopic, mpart, moffset, tid, identity))

    def commit(self, committable: Committable) -> CommitOutcome:
        # Idempotent from the top (the marker check comes first), so a retry after
        # the broker came back is safe. A coordinator that is not ready yet (a broker
        # restarting) is waited for within unavailable.retry.s, like every other call.
        c = committable
        try:
            return retry_transient(lambda: self._commit_once(c), what=f"{c.describe()}: commit",
                                   bound_s=self.config.retry_bound_s, redact=self.shared.redact)
        except TxnProtocolError as exc:
            error = RetriableCommitError if exc.retriable else FatalCommitError
            raise error(f"{c.describe()}: {self.shared.redact(str(exc))}", sink_id=c.sink_id,
                        epoch=c.epoch, participant=c.participant) from None

    def _commit_once(self, committable: Committable) -> CommitOutcome:
        c = committable
        tid, identity, (mtopic, mpart, moffset) = self.payload(c)
        version = int(self.decode(c.payload_version, c.payload).get(
            "transaction_version", TRANSACTION_VERSION))
        if version != TRANSACTION_VERSION:
            # Its EndTxn (and what bumps the producer epoch) would differ: KIP-890's
            # version 2 ends a transaction with the epoch bumped.
            raise FatalCommitError(
                f"{c.describe()}: the transaction of transactional.id {tid!r} ran "
                f"transaction version {version}; this release commits version "
                f"{TRANSACTION_VERSION} only: commit it with the release that wrote it",
                sink_id=c.sink_id, epoch=c.epoch, participant=c.participant)
        age = warn_near_timeout(c)
        first = self.marker_status(c)
        if first == MarkerStatus.VISIBLE or (
                first == MarkerStatus.MISSING
                and self.ended_as_committed(mtopic, mpart, moffset, tid, identity)):
            # (MISSING: compaction removed the begin marker; the end marker says committed.)
            return CommitOutcome.ALREADY_COMMITTED
        d = self.shared.driver()
        rejected = ""
        try:
            result = d.txn.end_txn(tid, identity, commit=True)
        except ConnectionDroppedError as exc:
            result, rejected = None, str(exc)
        if result is EndTxnResult.OK:
            pending = self._markers_pending(c, identity, mtopic, mpart)
            if pending:
                raise RetriableCommitError(
                    f"{c.describe()}: the transaction coordinator accepted the commit of "
                    f"transactional.id {tid!r}, but the transaction is still open on "
                    f"{', '.join(pending)} after {self.config.request_timeout_s:.0f}s (the "
                    "broker writes its commit markers after answering); the epoch stays "
                    "decided and the commit is retried. If it stays open it is a hanging "
                    "transaction: `txsink status` shows it",
                    sink_id=c.sink_id, epoch=c.epoch, participant=c.participant)
            self.write_end(c, tid, mtopic, mpart, COMMITTED)
            log.debug("%s: committed transactional.id=%s", c.describe(), tid)
            return CommitOutcome.COMMITTED
        rejected = rejected or f"the coordinator answered {result.value if result else '?'}"
        status = self.marker_status(c)
        if status == MarkerStatus.VISIBLE:
            self.write_end(c, tid, mtopic, mpart, COMMITTED)
            return CommitOutcome.ALREADY_COMMITTED
        if status == MarkerStatus.MISSING and self.ended_as_committed(mtopic, mpart, moffset,
                                                                       tid, identity):
            # The begin marker was compacted away; the end marker says committed.
            return CommitOutcome.ALREADY_COMMITTED
        if status == MarkerStatus.HIDDEN:
            # Behind a transaction still open on the marker partition: one of this epoch
            # (committed after the rest), or of another sink sharing the marker topic,
            # whose driver may be gone (open until its timeout). The end marker, read
            # uncommitted, says so if this commit got that far.
            if self.ended_as_committed(mtopic, mpart, moffset, tid, identity):
                return CommitOutcome.ALREADY_COMMITTED
            raise MarkerHiddenError(
                f"{c.describe()}: EndTxn(commit) for transactional.id {tid!r} was refused "
                f"({rejected}) and its marker is not readable yet (an open transaction "
                "holds the marker partition's last stable offset); retry later",
                sink_id=c.sink_id, epoch=c.epoch, participant=c.participant)
        topics = c.payload.get("topics") or []
        raise ParticipantLostError(
            f"{c.describe()}: DATA AT RISK: the prepared transaction of transactional.id "
            f"{tid!r} ({c.rows} rows to {', '.join(map(str, topics))}) was "
            f"aborted, not committed: {aborted_because(c, age)}. EndTxn: {rejected}. Those "
            "rows are not in the output; txsink salvages them from the log while its "
            "records are kept (docs/backends/kafka.md, \"Salvage\")",
            sink_id=c.sink_id, epoch=c.epoch, participant=c.participant)

    def _markers_pending(self, c: Committable, identity: ProducerIdentity, mtopic: str,
                         mpart: int) -> list[str]:
        """Partitions where the transaction of ``c`` is still open after EndTxn(commit)
        was accepted; waits up to ``request.timeout`` for none to be left.

        Kafka answers EndTxn before it writes the commit markers into the partitions, and
        a broker restarting at that moment has been seen to give up on them (it took its
        own partitions for deleted): the transaction then stays open there, and the next
        InitProducerId of the id aborts it. Only once the markers are in is the end
        marker written and the participant reported committed, so a committed end marker
        always means the data was committed. DescribeProducers (KIP-664) is asked per
        partition; a broker that cannot answer it at all (before Kafka 2.8, or no READ
        on the topics) is not waited for, one that does not answer now (restarting) is.
        """
        d = self.shared.driver()
        timeout = self.config.request_timeout_s
        partitions = [(mtopic, mpart)]
        with d.lock:
            for topic in c.payload.get("topics") or []:
                md = d.committed_offsets.list_topics(str(topic), timeout=timeout)
                tmd = md.topics.get(str(topic))
                if tmd is not None and tmd.error is None:
                    partitions += [(str(topic), p) for p in sorted(tmd.partitions)]
        deadline = time.monotonic() + timeout
        pause = 0.002
        while True:
            try:
                starts = d.txn.transaction_starts(partitions)
                pending = [f"{t}[{p}]" for (t, p), producers in sorted(starts.items())
                           if identity.producer_id in producers]
            except UnsupportedByBrokerError as exc:
                log.debug("%s: cannot check that the commit markers arrived: %s",
                          c.describe(), exc)
                return []
            except TxnProtocolError as exc:  # a broker restarting: not known yet
                pending = [f"{t}[{p}]" for t, p in partitions]
                pending[-1] += f" (not confirmed: {self.shared.redact(str(exc))})"
            if not pending or time.monotonic() > deadline:
                return pending
            time.sleep(pause)
            pause = min(pause * 2, 0.5)

    def abort(self, committable: Committable) -> None:
        retry_transient(lambda: self._abort_once(committable),
                        what=f"{committable.describe()}: abort",
                        bound_s=self.config.retry_bound_s, redact=self.shared.redact)

    def _abort_once(self, committable: Committable) -> None:
        c = committable
        tid, identity, (mtopic, mpart, _) = self.payload(c)
        d = self.shared.driver()
        try:
            result: EndTxnResult | None = d.txn.end_txn(tid, identity, commit=False)
        except ConnectionDroppedError:
            result = None
        if result is not EndTxnResult.OK:
            # Refused (fenced, wrong state, Tansu's dropped connection): fencing the id
            # aborts whatever this participant still has open on it.
            self.fence(tid, identity)
        self.write_end(c, tid, mtopic, mpart, ABORTED)
        log.debug("%s: aborted transactional.id=%s", c.describe(), tid)

    def fence(self, tid: str, identity: ProducerIdentity) -> bool:
        """Bump ``tid``'s producer epoch so the writer of ``identity`` can go on no more.

        A per-participant id belongs to one participant, so it is always fenced. A
        pooled id may already serve a later participant: it is fenced only while the
        coordinator still shows the producer epoch of ``identity`` (nobody took the id
        over since), so a writer of a later epoch is never fenced by orphan cleanup.
        """
        d = self.shared.driver()
        pooled = is_pooled(self.config.transactional_id_prefix, tid)
        if pooled and identity.producer_id < 0:
            # A marker of an older release, written before the producer id was known:
            # nothing tells this use of the pooled id from a later writer's, so it is
            # left to the broker's transaction timeout rather than fenced blindly.
            log.warning("transactional.id=%s: an orphan whose producer id is unknown is "
                        "not fenced (a later writer may use the id now); the broker aborts "
                        "it at its transaction.timeout.ms", tid)
            return False
        if pooled:
            info = d.txn.describe_transactions([tid]).get(tid)
            if info is None or info.identity != identity:
                log.debug("transactional.id=%s moved on from producer %s (now %s); not "
                          "fencing it", tid, identity, info.identity if info else None)
                return False
        d.txn.init_producer_id(tid, self.config.transaction_timeout_ms)
        return True


def aborted_because(c: Committable, age: float) -> str:
    """Why the broker aborted the prepared transaction of ``c``, ``age`` seconds old."""
    timeout_ms = int(c.payload.get("transaction_timeout_ms", 0) or 0)
    if timeout_ms and age * 1000 > timeout_ms:
        return (f"the broker's transaction.timeout.ms ({timeout_ms} ms) expired: the "
                f"transaction was opened {age:.0f}s ago")
    return ("it was fenced and aborted (another query using the same sink id, a manual "
            "abort, or a transaction coordinator that lost it)")


def _same_participant(m: Marker, c: Committable, tid: str, identity: ProducerIdentity) -> bool:
    """Is the begin marker ``m`` the one ``c``'s writer wrote (the whole identity)?"""
    if (m.kind, m.transactional_id, m.sink_id, m.epoch, m.partition, m.attempt) != (
            BEGIN, tid, c.sink_id, c.epoch, c.partition, c.attempt):
        return False
    # A marker written before librdkafka reported the producer id carries -1.
    return m.producer_id < 0 or identity.producer_id < 0 or (
        m.producer_id, m.producer_epoch) == (identity.producer_id, identity.producer_epoch)
