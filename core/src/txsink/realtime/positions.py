"""What a real-time target stores per source partition, and what names it.

Plain values, no I/O: the writer, the identity checks and the backends share them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

#: Offset a target answers when it holds nothing of a source partition yet.
NOTHING = -1


@dataclass(frozen=True, order=True)
class SourcePartition:
    """One partition of the source (a Kafka topic partition).

    ``topic_id`` is the topic's identity where the engine knows it (Kafka gives every
    topic a uuid; a topic deleted and recreated under the same name gets a new one and
    starts its offsets again). It is not part of equality: a source partition is one
    key in every map whatever id it had, and the stored position says which id its
    offsets belong to (:func:`txsink.realtime.identity.claim_refusal`)."""

    topic: str
    partition: int
    topic_id: str | None = field(default=None, compare=False)

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True)
class StoredPosition:
    """What a target holds for one source partition: the highest offset, and what that
    offset is an offset *of*.

    ``topic_id``: the source topic's id the offset was counted in (``None``: stored
    before txsink recorded ids; adopted by the next commit). ``destination``: where the
    rows of these positions went (``RealtimeTargetSpec.destination``; ``None``:
    stored before txsink recorded it). A position with another topic id or another
    destination than this run's is not this run's position: it is refused, never used
    to skip records."""

    offset: int
    topic_id: str | None = None
    destination: Mapping[str, str] | None = None


def stored_position(value: StoredPosition | int) -> StoredPosition:
    """A claim's answer as a :class:`StoredPosition` (a bare offset: one without identity)."""
    return value if isinstance(value, StoredPosition) else StoredPosition(int(value))


__all__ = ["NOTHING", "SourcePartition", "StoredPosition", "stored_position"]
