"""Marker records: how the Kafka sink lists and verifies its own transactions.

Kafka offers no way to list open transactions by transactional id prefix on every
broker (ListTransactions needs Kafka 3.0+, Tansu has none), and a second EndTxn for
a completed transaction is answered with success, so the answer alone cannot tell
"committed now" from "committed before". Both gaps are closed with one small
single-partition-per-sink topic (``marker.topic``):

* every participant writes a ``begin`` record **as the first record of its own
  transaction** and waits for it before writing data. It becomes visible to
  ``read_committed`` readers exactly when the participant commits, so it is the
  participant's commit marker (docs/concepts.md, "Recovery"), and its offset goes into the
  committable;
* whoever ends a participant (commit, abort, fence) appends a plain ``end`` record
  with the outcome, so a scan of the topic's tail lists participants that began and
  never ended, and a committed participant stays provably committed after
  compaction has removed its ``begin`` record (same key, older).
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Any

BEGIN = "begin"
END = "end"
#: Binds a sink id to one query's txsink state (``claim_sink``).
OWNER = "owner"
COMMITTED = "committed"
ABORTED = "aborted"


def marker_partition(sink_id: str, partitions: int) -> int:
    """All markers of one sink go to one partition, so one scan sees them in order."""
    return zlib.crc32(sink_id.encode()) % max(1, partitions)


@dataclass(frozen=True)
class Marker:
    kind: str
    transactional_id: str
    sink_id: str
    epoch: int
    partition: int
    attempt: int
    offset: int = -1
    #: Producer id and epoch of the transaction (begin markers), -1 when unknown.
    producer_id: int = -1
    producer_epoch: int = -1
    #: Owner markers: the txsink state id and location that own the sink id.
    state_id: str = ""
    state_location: str = ""
    #: End markers: ``committed`` or ``aborted`` (what the writer of the end knew).
    outcome: str = ""

    def encode(self) -> tuple[bytes, bytes]:
        value = {"k": self.kind, "s": self.sink_id, "e": self.epoch, "p": self.partition,
                 "a": self.attempt}
        if self.producer_id >= 0:
            value.update(pid=self.producer_id, pe=self.producer_epoch)
        if self.state_id:
            value.update(st=self.state_id, loc=self.state_location)
        if self.outcome:
            value.update(o=self.outcome)
        return self.transactional_id.encode(), json.dumps(value, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, key: bytes | None, value: bytes | None, offset: int) -> Marker | None:
        """``None`` for records that are not txsink markers."""
        if not key or not value:
            return None
        try:
            data: Any = json.loads(value)
            return cls(str(data["k"]), key.decode(), str(data["s"]), int(data["e"]),
                       int(data["p"]), int(data["a"]), offset, int(data.get("pid", -1)),
                       int(data.get("pe", -1)), str(data.get("st", "")),
                       str(data.get("loc", "")), str(data.get("o", "")))
        except (ValueError, KeyError, TypeError):
            return None
