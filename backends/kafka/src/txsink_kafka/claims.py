"""Sink-id claims: which query's txsink state owns a sink id.

Two queries with one sink id derive the same transactional ids and abort each
other's transactions as orphans, so the first query to start binds the sink id to
its state and a second one is refused. The claims live in a small compacted topic
(``claim.topic``, one partition) that is read **whole** at every start, so a claim
holds however old it is and however much other sinks write; the marker topic's
tail, which every sink shares, cannot promise that.

One record per (sink, state), keyed ``<transactional.id prefix>-<sink id>/<state
id>``, so compaction keeps every claimant's latest record and the order between
them. The owner is the claimant of the latest *takeover* record if there is one,
otherwise the **first** claimant in the log: two queries that claim at the same
moment both write, both read back, and agree that the earlier record wins.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

CLAIM = "claim"


@dataclass(frozen=True)
class Claim:
    owner_key: str
    state_id: str
    state_location: str
    takeover: bool
    offset: int = -1

    def encode(self) -> tuple[bytes, bytes]:
        value = {"k": CLAIM, "st": self.state_id, "loc": self.state_location,
                 "takeover": self.takeover}
        return (f"{self.owner_key}/{self.state_id}".encode(),
                json.dumps(value, separators=(",", ":")).encode())

    @classmethod
    def decode(cls, key: bytes | None, value: bytes | None, offset: int) -> Claim | None:
        """``None`` for records that are not claims (or tombstones)."""
        if not key or not value:
            return None
        owner_key, sep, state_id = key.decode(errors="replace").rpartition("/")
        try:
            data = json.loads(value)
            if not sep or data.get("k") != CLAIM or data.get("st") != state_id:
                return None
            return cls(owner_key, state_id, str(data.get("loc", "")),
                       bool(data.get("takeover")), offset)
        except (ValueError, AttributeError):
            return None


def owner_key(prefix: str, sink_id: str) -> str:
    """Sinks collide when their transactional ids do: same prefix, same sink id."""
    return f"{prefix}-{sink_id}"


def owner_of(claims: list[Claim]) -> Claim | None:
    """The latest takeover, else the earliest claim (``claims`` in log order)."""
    takeovers = [c for c in claims if c.takeover]
    if takeovers:
        return takeovers[-1]
    return claims[0] if claims else None
