"""The small values the protocol passes around: transaction contexts and committables.

A committable is the secret-free handle that lets *any* process finish a prepared
participant. It is serialized into the pending-transaction state and into Spark's
``WriterCommitMessage``, so it is versioned: a newer txsink must read what an older
one decided before it crashed.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from txsink.errors import ConfigError, StateError

#: Sink ids become Kafka transactional ids, PostgreSQL gids, S3 key prefixes and
#: file names, so they are limited to characters that are safe in all of them
#: (no path separators, no LIKE/glob wildcards other than ``_``/``-``, which the
#: backends escape).
SINK_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")

COMMITTABLE_VERSION = 1
#: Version of a committable tagged with its target (a participant of a group of targets).
#: Untagged committables keep version 1, so single-target states read as before, and a
#: txsink that predates groups refuses a group's state instead of misreading it.
TARGETED_COMMITTABLE_VERSION = 2


class DeliveryGuarantee(str, enum.Enum):
    """What readers of a sink's output may see after failures (Flink's ``DeliveryGuarantee``).

    ``exactly_once`` (the default): tasks prepare, the driver decides and commits; a
    retried task or a replayed batch never shows twice. ``at_least_once``: each task
    commits its own participant when it finishes, with no prepare and no driver round;
    nothing is lost, but a retried task or a replayed batch is written again.
    ``none``: like ``at_least_once`` without waiting for durability where a backend can
    skip it (e.g. no fsync): fastest, and a crash may lose the last writes.
    """

    EXACTLY_ONCE = "exactly_once"
    AT_LEAST_ONCE = "at_least_once"
    NONE = "none"

    @property
    def transactional(self) -> bool:
        return self is DeliveryGuarantee.EXACTLY_ONCE

    def reader_note(self) -> str:
        """One line for operators: what readers of the output may see."""
        if self is DeliveryGuarantee.EXACTLY_ONCE:
            return "exactly once: readers see each row once, and only committed epochs"
        if self is DeliveryGuarantee.AT_LEAST_ONCE:
            return ("at least once: nothing is lost, but rows of a retried task or a replayed "
                    "batch appear again (duplicates), and readers see rows as tasks finish")
        return ("none: duplicates after retries and replays, and a crash may lose the last "
                "rows written; readers see rows as tasks finish")

    @classmethod
    def parse(cls, value: object, *, field_name: str = "guarantee") -> DeliveryGuarantee:
        text = str(value).strip().lower().replace("-", "_") if value is not None else ""
        for g in cls:
            if g.value == text:
                return g
        raise ConfigError(
            f"'{field_name}' must be one of {', '.join(g.value for g in cls)}, "
            f"got {str(value)[:40]!r}", field=field_name)


def validate_sink_id(sink_id: object, *, field_name: str = "sink_id") -> str:
    """Return ``sink_id`` if it is safe to derive external names from, else raise."""
    if not isinstance(sink_id, str) or not sink_id:
        raise ConfigError(
            f"'{field_name}' is required: a globally unique name for this output, "
            "e.g. 'orders-to-parquet'",
            field=field_name,
        )
    if not SINK_ID_PATTERN.match(sink_id):
        raise ConfigError(
            f"'{field_name}' {sink_id[:80]!r} is not valid: use 1-64 characters from "
            "A-Z a-z 0-9 _ - starting with a letter or digit (it becomes part of "
            "transaction ids, object keys and file names)",
            field=field_name,
            sink_id=None,
        )
    return sink_id


@dataclass(frozen=True)
class TransactionContext:
    """Who is writing: identifies one participant (one writer task attempt of one epoch)."""

    sink_id: str
    epoch: int
    partition: int
    attempt: int = 0

    def __post_init__(self) -> None:
        validate_sink_id(self.sink_id)
        for name in ("epoch", "partition", "attempt"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ConfigError(
                    f"transaction context: '{name}' must be an int >= 0, got {value!r}")

    @property
    def participant(self) -> str:
        """The deterministic participant name, used to derive every external name."""
        return participant_name(self.sink_id, self.epoch, self.partition, self.attempt)

    def describe(self) -> str:
        return (
            f"sink={self.sink_id} epoch={self.epoch} partition={self.partition} "
            f"attempt={self.attempt}"
        )


def participant_name(sink_id: str, epoch: int, partition: int, attempt: int) -> str:
    return f"{sink_id}-e{epoch}-p{partition}-a{attempt}"


#: Attempt numbers of salvaged participants start here, far above Spark's task attempt
#: ids (which count the tasks of one SparkContext), so a replacement's name is never a
#: writer's.
SALVAGE_ATTEMPT_BASE = 10**13


def salvage_attempt(after: int = 0, *, now: float | None = None) -> int:
    """A fresh attempt number for a salvage replacement: from the clock (milliseconds),
    above ``after``, so the replacements of one participant never share a name (a
    replacement prepared by a run that crashed before recording it is an orphan, and
    only a distinct name lets the orphan scan abort it)."""
    ms = int((time.time() if now is None else now) * 1000)
    return max(SALVAGE_ATTEMPT_BASE + ms, after + 1)


def is_salvage_attempt(attempt: int) -> bool:
    return attempt >= SALVAGE_ATTEMPT_BASE


_PARTICIPANT_RE = re.compile(
    r"^(?P<sink>.+)-e(?P<epoch>\d+)-p(?P<partition>\d+)-a(?P<attempt>\d+)$")


def parse_participant(name: str) -> TransactionContext | None:
    """Inverse of :func:`participant_name`; ``None`` for names txsink did not make."""
    m = _PARTICIPANT_RE.match(name)
    if not m or not SINK_ID_PATTERN.match(m["sink"]):
        return None
    return TransactionContext(m["sink"], int(m["epoch"]), int(m["partition"]), int(m["attempt"]))


@dataclass(frozen=True)
class Committable:
    """Everything needed to commit or abort one prepared participant from any process.

    ``payload`` is backend-specific and must be JSON-serializable and secret-free;
    ``payload_version`` lets the backend migrate payloads written by older releases.
    """

    backend: str
    sink_id: str
    epoch: int
    partition: int
    attempt: int
    participant: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    payload_version: int = 1
    rows: int = 0
    #: The target (of a group of targets) this participant belongs to; None for a sink
    #: with one target. Set by the group, never by a backend.
    target: str | None = None

    @classmethod
    def for_context(
        cls,
        backend: str,
        ctx: TransactionContext,
        payload: Mapping[str, Any],
        *,
        rows: int = 0,
        payload_version: int = 1,
    ) -> Committable:
        return cls(
            backend=backend,
            sink_id=ctx.sink_id,
            epoch=ctx.epoch,
            partition=ctx.partition,
            attempt=ctx.attempt,
            participant=ctx.participant,
            payload=dict(payload),
            payload_version=payload_version,
            rows=rows,
        )

    def describe(self) -> str:
        where = f"target={self.target} " if self.target else ""
        return (
            f"{where}sink={self.sink_id} epoch={self.epoch} partition={self.partition} "
            f"attempt={self.attempt} participant={self.participant}"
        )

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "v": COMMITTABLE_VERSION,
            "backend": self.backend,
            "sink_id": self.sink_id,
            "epoch": self.epoch,
            "partition": self.partition,
            "attempt": self.attempt,
            "participant": self.participant,
            "rows": self.rows,
            "payload_version": self.payload_version,
            "payload": dict(self.payload),
        }
        if self.target is not None:
            data.update(v=TARGETED_COMMITTABLE_VERSION, target=self.target)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Committable:
        version = data.get("v")
        if version not in (COMMITTABLE_VERSION, TARGETED_COMMITTABLE_VERSION):
            raise StateError(
                f"committable format version {version!r} is not supported by this txsink "
                f"(supports {COMMITTABLE_VERSION} and {TARGETED_COMMITTABLE_VERSION}); "
                "upgrade txsink to read this state"
            )
        if version == TARGETED_COMMITTABLE_VERSION and not isinstance(data.get("target"), str):
            raise StateError(f"malformed committable {dict(data)!r}: version "
                             f"{TARGETED_COMMITTABLE_VERSION} needs its 'target'")
        try:
            return cls(
                backend=str(data["backend"]),
                sink_id=str(data["sink_id"]),
                epoch=int(data["epoch"]),
                partition=int(data["partition"]),
                attempt=int(data["attempt"]),
                participant=str(data["participant"]),
                payload=dict(data["payload"]),
                payload_version=int(data.get("payload_version", 1)),
                rows=int(data.get("rows", 0)),
                target=None if version == COMMITTABLE_VERSION else str(data["target"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"malformed committable {dict(data)!r}: {exc}") from exc

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Committable:
        try:
            decoded = json.loads(data)
        except ValueError as exc:
            raise StateError(f"committable is not valid JSON: {exc}") from exc
        if not isinstance(decoded, dict):
            raise StateError("committable is not a JSON object")
        return cls.from_dict(decoded)


@dataclass
class RecoveryReport:
    """What a coordinator's recovery did (passed to the ``txsink_recovered`` hook)."""

    recommitted_epochs: list[int] = field(default_factory=list)
    aborted_orphans: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.recommitted_epochs or self.aborted_orphans)


#: Length of a micro-batch's source digest (:func:`source_digest`).
SOURCE_DIGEST_LENGTH = 32


def source_digest(offsets: str) -> str:
    """The digest of a micro-batch's offset log entry (without its version line): what
    tells a replay of a batch from a batch planned anew under the same number."""
    return hashlib.sha256(offsets.encode()).hexdigest()[:SOURCE_DIGEST_LENGTH]
