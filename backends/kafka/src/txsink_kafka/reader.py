"""Reading a topic up to a group's consistent cut.

A target of a group writes a ``txsink-epoch`` header on every record (option
``epoch.header``, on for targets). :func:`read_up_to_cut` reads with
``read_committed`` from given offsets and stops each partition at its first record of
an epoch past the cut, so the records it returns are a prefix of every partition and
hold only epochs every target of the group holds. Resume from ``next_offsets`` once the
cut moved on (``txsink cut``).

The prefix holds every record of the epochs up to the cut when epochs are written
one after the other (a streaming query; grouped writes that do not run at once):
then a partition holds an epoch's records after those of every earlier epoch.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from txsink.errors import TxsinkError

from txsink_kafka.writer import EPOCH_HEADER


@dataclass
class CutRead:
    """What :func:`read_up_to_cut` read."""

    #: The records, per partition in offset order (confluent-kafka ``Message`` objects).
    records: list[Any] = field(default_factory=list)
    #: Per partition, the offset to resume from.
    next_offsets: dict[int, int] = field(default_factory=dict)
    #: Partitions that ended before the cut was reached: an open transaction (of a
    #: later epoch, or an orphan not yet aborted) holds ``read_committed`` readers back
    #: there; records of epochs up to the cut may follow it. Read again later.
    held_back: list[int] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Every partition reached a record past the cut, or the end of its log."""
        return not self.held_back


def record_epoch(msg: Any) -> int | None:
    """The epoch in a record's ``txsink-epoch`` header, or None."""
    for key, value in msg.headers() or ():
        if key == EPOCH_HEADER and value is not None:
            return int(value)
    return None


def read_up_to_cut(config: Mapping[str, str], topic: str, cut: int, *,
                   start: Mapping[int, int] | None = None,
                   timeout_s: float = 30.0) -> CutRead:
    """Records of ``topic`` with epochs up to ``cut``, from ``start`` (default: each
    partition's beginning), stopping each partition at its first record past the cut.

    ``config`` is the consumer's (``bootstrap.servers`` and security settings);
    ``isolation.level`` is always ``read_committed``. A record without the header
    (not written by a target of a group) is an error naming it.
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"group.id": "txsink-cut-reader", **config,
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "enable.partition.eof": True, "auto.offset.reset": "error"})
    out = CutRead()
    try:
        md = consumer.list_topics(topic, timeout=timeout_s)
        meta = md.topics.get(topic)
        if meta is None or meta.error is not None:
            raise TxsinkError(f"kafka reader: topic {topic!r} not found")
        parts = sorted(meta.partitions)
        begin = dict(start or {})
        ends: dict[int, int] = {}
        for p in parts:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout_s)
            begin.setdefault(p, low)
            ends[p] = high
            out.next_offsets[p] = begin[p]
        todo = {p for p in parts if begin[p] < ends[p]}
        if not todo:
            return out
        consumer.assign([TopicPartition(topic, p, begin[p]) for p in sorted(todo)])
        deadline = time.monotonic() + timeout_s
        while todo:
            if time.monotonic() > deadline:
                raise TxsinkError(f"kafka reader: {topic} partitions {sorted(todo)} did not "
                                  f"reach the cut or their end within {timeout_s:.0f}s")
            msg = consumer.poll(0.5)
            if msg is None or msg.partition() not in todo:
                continue
            p = int(msg.partition() or 0)
            offset = int(msg.offset() or 0)
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    raise TxsinkError(f"kafka reader: {topic}[{p}]: {err.str()}")
                # The end read_committed readers may see; short of the log's end, an
                # open transaction holds them back there.
                position = max(out.next_offsets[p], offset)
                out.next_offsets[p] = position
                if position < ends[p]:
                    out.held_back.append(p)
                todo.discard(p)
                consumer.incremental_unassign([TopicPartition(topic, p)])
                continue
            epoch = record_epoch(msg)
            if epoch is None:
                raise TxsinkError(f"kafka reader: {topic}[{p}] offset {offset} has no "
                                  f"{EPOCH_HEADER!r} header: was it written by a target of a "
                                  "group (option epoch.header)?")
            if epoch > cut:
                out.next_offsets[p] = offset
                todo.discard(p)
                consumer.incremental_unassign([TopicPartition(topic, p)])
                continue
            out.records.append(msg)
            out.next_offsets[p] = offset + 1
    finally:
        consumer.close()
    out.held_back.sort()
    return out
