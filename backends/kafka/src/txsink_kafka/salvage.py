"""Salvage: writing again the records of a decided participant the broker aborted.

Kafka aborts a prepared transaction after ``transaction.timeout.ms``: a driver down
longer than that after deciding an epoch finds its participants aborted (Flink's
users call it "data loss after downtime"). The records stay in the log, though, as
aborted batches, until retention deletes their segment, and every batch carries its
producer id and epoch. So the driver reads them back (``read_uncommitted``, raw
Fetch, control batches included) from the offset ranges the writer recorded from its
delivery reports, takes exactly the batches of the participant's producer id and
epoch inside those ranges (nothing another producer interleaved), checks that the
partition's next control record of that producer is an abort and that every record
is there, and produces them again, same partition, key, value, headers and
timestamp, in a new transaction: the replacement, which the coordinator records in
the decision before committing it (:meth:`txsink.backend.Backend.salvage`).

Where the records are gone (retention, a deleted or truncated topic, compaction)
the loss stands as :class:`~txsink.errors.ParticipantLostError`, naming the epoch,
the participant, the offsets and why.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from txsink.errors import FatalCommitError, ParticipantLostError, RetriableCommitError
from txsink.model import Committable, TransactionContext

from txsink_kafka.clients import SinkClients, warn_near_timeout
from txsink_kafka.committer import KafkaCommitter, MarkerStatus, aborted_because
from txsink_kafka.markers import ABORTED
from txsink_kafka.retry import retry_transient
from txsink_kafka.txn_protocol import (
    FETCH_RETRIABLE,
    OFFSET_OUT_OF_RANGE,
    FetchAnswer,
    ProducerIdentity,
    TopicGoneError,
    TxnProtocolError,
)
from txsink_kafka.writer import KafkaWriter, LogRecord

log = logging.getLogger(__name__)

#: Bytes asked for per Fetch (Kafka answers at least one whole batch).
FETCH_BYTES = 1 << 20
#: CreateTime (0) or LogAppendTime (1), from a batch's attributes.
_LOG_APPEND_TIME = 1


@dataclass(frozen=True)
class Span:
    """Where one participant's records are in one partition (from its committable)."""

    topic: str
    partition: int
    first: int
    last: int
    records: int

    def describe(self) -> str:
        return (f"{self.topic}[{self.partition}] offsets {self.first}-{self.last} "
                f"({self.records} records)")


class RecordsGone(Exception):
    """Internal: the records of one span can no longer be read (the message says why)."""

    def __init__(self, span: Span, why: str) -> None:
        super().__init__(f"{span.describe()}: {why}")
        self.span = span


def spans_of(ranges: object) -> list[Span]:
    """The spans of a payload's ``ranges`` (``{topic: [[p, first, last, n], ...]}``)."""
    if not isinstance(ranges, dict):
        raise ValueError(f"ranges must be an object, got {type(ranges).__name__}")
    return [Span(str(topic), int(p), int(first), int(last), int(n))
            for topic, rows in sorted(ranges.items()) for p, first, last, n in rows]


class KafkaSalvage:
    """Reads a lost participant's records back and writes them into a replacement."""

    def __init__(self, shared: SinkClients, writer: KafkaWriter,
                 committer: KafkaCommitter) -> None:
        self.shared = shared
        self.config = shared.config
        self.writer = writer
        self.committer = committer

    def salvage(self, c: Committable, ctx: TransactionContext) -> Committable:
        tid, identity, (mtopic, mpart, moffset) = self.committer.payload(c)
        age = warn_near_timeout(c)
        status = self.committer.marker_status(c)
        if status == MarkerStatus.VISIBLE or (
                status == MarkerStatus.MISSING and self.committer.ended_as_committed(
                    mtopic, mpart, moffset, tid, identity)):
            raise FatalCommitError(
                f"{c.describe()}: not salvaged: the transaction of transactional.id {tid!r} "
                "shows committed after all; the next commit finds it so",
                sink_id=c.sink_id, epoch=c.epoch, participant=c.participant)
        if status == MarkerStatus.HIDDEN:
            raise RetriableCommitError(
                f"{c.describe()}: not salvaged yet: the transaction of transactional.id "
                f"{tid!r} is still open on the marker partition", sink_id=c.sink_id,
                epoch=c.epoch, participant=c.participant)
        payload = self.committer.decode(c.payload_version, c.payload)
        why = aborted_because(c, age)
        if payload.get("ranges") is None:
            raise self._lost(c, tid, identity, why, "its committable holds no offsets (it was "
                             "written by a txsink-kafka release before salvage)")
        try:
            spans = spans_of(payload["ranges"])
        except (TypeError, ValueError) as exc:
            raise FatalCommitError(f"{c.describe()}: malformed offset ranges in the Kafka "
                                   f"committable: {exc}", sink_id=c.sink_id, epoch=c.epoch,
                                   participant=c.participant) from None
        found = sum(s.records for s in spans)
        if found != c.rows:
            raise self._lost(c, tid, identity, why, f"its committable counts {c.rows} rows "
                             f"but its offset ranges {found} records")
        try:
            # Before a replacement is opened: are the records still there at all?
            for span in spans:
                self._check_start(span, identity)
            replacement = self._write_again(c, ctx, identity, spans)
        except RecordsGone as gone:
            raise self._lost(c, tid, identity, why, str(gone)) from None
        # The original is over: its scan entry ends (it was aborted, by the broker).
        self.committer.write_end(c, tid, mtopic, mpart, ABORTED)
        log.warning("%s: transactional.id %s (producer %d epoch %d) was aborted by the "
                    "broker (%s); its %d record(s) from %s were written again as %s "
                    "(transactional.id %s)", c.describe(), tid, identity.producer_id,
                    identity.producer_epoch, why, c.rows,
                    ", ".join(s.describe() for s in spans) or "no partition",
                    replacement.participant, replacement.payload["transactional_id"])
        return replacement

    def committed_in_log(self, c: Committable) -> bool:
        """Do the participant's own records show its transaction committed?

        The output's log is the last word when the marker topic has none: compaction
        keeps one marker per key, and a pooled id's key is reused every epoch, so an
        older participant's begin and end markers go once its slot is used again. Its
        records keep their producer id and epoch, and the producer's next control
        record in each partition after them ends exactly that transaction. True only
        if every partition it wrote shows a commit there; False when unknown (no
        offsets recorded, records gone, still open) or aborted.
        """
        tid, identity, _ = self.committer.payload(c)
        payload = self.committer.decode(c.payload_version, c.payload)
        if payload.get("ranges") is None:
            return False
        try:
            spans = [s for s in spans_of(payload["ranges"]) if s.records]
        except (TypeError, ValueError):
            return False
        if not spans or sum(s.records for s in spans) != c.rows:
            return False
        try:
            return all(self._ended(span, identity) is True for span in spans)
        except (RecordsGone, TxnProtocolError) as exc:
            log.info("%s: its records cannot tell whether transactional.id %s committed: %s",
                     c.describe(), tid, self.shared.redact(str(exc)))
            return False

    def _ended(self, span: Span, identity: ProducerIdentity) -> bool | None:
        """How the producer's transaction over ``span`` ended: True committed, False
        aborted, None not yet (open)."""
        for batch in self._producer_batches(span, identity.producer_id):
            if (batch.is_control_batch and batch.base_offset >= span.first
                    and batch.producer_epoch >= identity.producer_epoch):
                return any(bool(control.commit) for control in batch)
        return None

    def _producer_batches(self, span: Span, producer_id: int) -> Iterator[Any]:
        """The batches of ``producer_id`` in the span's partition from its first offset
        on, in log order, until the end of the log (or a read that gets no further)."""
        offset, size = span.first, FETCH_BYTES
        while True:
            answer = self._fetch(span, offset, size)
            self._raise_for(span, offset, answer)
            if not answer.batches:
                if offset >= answer.high_watermark:
                    return
                size = min(size * 2, 256 << 20)  # no whole batch fitted: ask for more
                continue
            before = offset
            for batch in answer.batches:
                if batch.next_offset <= offset:
                    continue
                offset = batch.next_offset
                if batch.producer_id == producer_id:
                    yield batch
            if offset == before:
                return

    def _write_again(self, c: Committable, ctx: TransactionContext,
                     identity: ProducerIdentity, spans: list[Span]) -> Committable:
        txn = self.writer.begin_salvage(ctx)
        try:
            for span in spans:
                self.writer.write_records(txn, self._records(span, identity))
            committable = self.writer.pre_commit(txn)
        except BaseException:
            self.writer.discard(txn)
            raise
        tid, _, _ = self.committer.payload(c)
        return dataclasses.replace(committable, payload={
            **committable.payload,
            "salvage_of": {"participant": c.participant, "transactional_id": tid,
                           "producer_id": identity.producer_id,
                           "producer_epoch": identity.producer_epoch}})

    def _lost(self, c: Committable, tid: str, identity: ProducerIdentity, why: str,
              gone: str) -> ParticipantLostError:
        return ParticipantLostError(
            f"{c.describe()}: DATA LOST: the decided transaction of transactional.id "
            f"{tid!r} (producer {identity.producer_id} epoch {identity.producer_epoch}, "
            f"{c.rows} rows) was aborted by the broker, not committed ({why}), and cannot "
            f"be salvaged: {gone}. Retention of the output topics must outlast the "
            "longest outage of the driver. The epoch stays DECIDED; to go on, "
            f"`txsink resolve CHECKPOINT --epoch {c.epoch} --abort --force`, then replay "
            "the epoch from the source (docs/backends/kafka.md, \"Salvage\")",
            sink_id=c.sink_id, epoch=c.epoch, participant=c.participant)

    def _fetch(self, span: Span, offset: int, size: int) -> FetchAnswer:
        """One Fetch, riding out leader moves and a broker that is briefly away."""
        client = self.shared.driver().txn
        deadline = time.monotonic() + self.config.retry_bound_s
        while True:
            try:
                answer = retry_transient(
                    lambda: client.fetch(span.topic, span.partition, offset, size),
                    what=f"reading {span.topic}[{span.partition}] at offset {offset}",
                    bound_s=self.config.retry_bound_s, redact=self.shared.redact)
            except TopicGoneError as exc:
                raise RecordsGone(span, f"{exc} (the topic was deleted or recreated)") from None
            if answer.error_code not in FETCH_RETRIABLE or time.monotonic() > deadline:
                return answer
            time.sleep(0.2)

    def _check_start(self, span: Span, identity: ProducerIdentity) -> None:
        """The span's first offset must still hold a batch of the participant's producer.

        The writer recorded that offset from the broker's own delivery report, so
        anything else there means the log there was replaced: the topic was deleted and
        recreated (its offsets start again and others' records fill them), or the
        partition was truncated and written again. Without this check the salvage found
        no end of the producer's transaction after that offset and waited for it on
        every restart, forever.
        """
        if span.records == 0:
            return
        answer = self._fetch(span, span.first, 1)
        self._raise_for(span, span.first, answer)
        batch = next((b for b in answer.batches if b.next_offset > span.first), None)
        if batch is None:
            if span.first >= answer.high_watermark:
                raise RecordsGone(span, f"the partition now ends at offset "
                                  f"{answer.high_watermark} (the topic was deleted and "
                                  "recreated, or truncated)")
            return  # no whole batch came back: _records reads on with larger fetches
        if batch.base_offset > span.first:
            raise RecordsGone(span, f"offset {span.first} is no longer in the log (the next "
                              f"batch starts at {batch.base_offset}: compaction, or the "
                              "topic was deleted and recreated)")
        if (batch.producer_id, batch.producer_epoch) != (
                identity.producer_id, identity.producer_epoch) or batch.is_control_batch:
            raise RecordsGone(span, f"offset {span.first} now holds a record of producer "
                              f"{batch.producer_id} epoch {batch.producer_epoch}, not of "
                              f"producer {identity.producer_id} epoch "
                              f"{identity.producer_epoch} (the topic was deleted and "
                              "recreated, or the partition truncated and written again)")

    def _raise_for(self, span: Span, offset: int, answer: FetchAnswer) -> None:
        code = answer.error_code
        if code == OFFSET_OUT_OF_RANGE:
            # The answer carries no offsets then: ask where the log is now.
            from confluent_kafka import TopicPartition

            d = self.shared.driver()
            with d.lock:
                low, high = d.uncommitted_offsets.get_watermark_offsets(
                    TopicPartition(span.topic, span.partition),
                    self.config.request_timeout_s, cached=False)
            if low > offset:
                raise RecordsGone(span, f"the partition's log now starts at offset {low} "
                                  "(retention deleted the segment, or DeleteRecords)")
            raise RecordsGone(span, f"the partition now ends at offset {high} (truncated: "
                              "an unclean leader election, or the topic was recreated)")
        if code:
            raise TxnProtocolError(f"reading {span.topic}[{span.partition}] at offset "
                                   f"{offset} failed with Kafka error code {code}",
                                   error_code=code)

    def _records(self, span: Span, identity: ProducerIdentity) -> Iterator[LogRecord]:
        """The span's records of ``identity``, checked whole and aborted, in order."""
        if span.records == 0:
            return
        found = 0
        for batch in self._producer_batches(span, identity.producer_id):
            if batch.is_control_batch:
                if batch.base_offset < span.first:
                    continue
                # The producer's next control record ends its transaction here. (A
                # timeout abort carries the epoch the coordinator bumped to.)
                commit = any(bool(control.commit) for control in batch)
                if commit:
                    raise FatalCommitError(
                        f"{span.describe()}: not salvaged: the transaction of producer "
                        f"{identity.producer_id} epoch {identity.producer_epoch} was "
                        "committed there, not aborted (a broker lost markers "
                        "elsewhere?); check the output by hand")
                if found != span.records:
                    raise RecordsGone(span, f"{found} of its {span.records} records are "
                                      "left (compaction, or a truncation, removed the "
                                      "others)")
                return
            if batch.producer_epoch != identity.producer_epoch or not batch.is_transactional:
                continue
            log_append = batch.timestamp_type == _LOG_APPEND_TIME
            for rec in _decoded(batch, span):
                if span.first <= rec.offset <= span.last:
                    found += 1
                    yield LogRecord(span.topic, span.partition, rec.key, rec.value,
                                    tuple(rec.headers or ()),
                                    None if log_append else int(rec.timestamp))
        # No end of this transaction in the partition: it is open there.
        raise RetriableCommitError(
            f"{span.describe()}: the transaction of producer {identity.producer_id} epoch "
            f"{identity.producer_epoch} has no commit or abort marker there yet (still open); "
            "salvage waits")



def _decoded(batch: Any, span: Span) -> list[Any]:
    """The records of one batch, decompressed (gzip, snappy, lz4 or zstd, as the producer
    wrote them); a codec whose library is missing stops the salvage with the remedy."""
    from kafka.errors import UnsupportedCodecError  # type: ignore[import-untyped]

    try:
        return list(batch)
    except UnsupportedCodecError as exc:
        raise FatalCommitError(
            f"{span.describe()}: not salvaged: cannot decompress its record batch at "
            f"offset {batch.base_offset} ({exc}); install txsink-kafka with its "
            "dependencies (kafka-python[lz4,snappy,zstd]: lz4, python-snappy, zstandard) "
            "in the driver's environment and restart. The epoch stays DECIDED") from None
