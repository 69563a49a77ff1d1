"""Pending-transaction state: the coordinator's durable log of decided epochs.

Writing an epoch as DECIDED is the commit point of the whole epoch. The default
store is a directory (designed to sit under a Spark checkpoint location): one JSON
file per epoch, written to a temporary name, fsynced and renamed into place, so a
reader sees either the old or the new record, never half of one. The epoch's state
is part of the file name, so the states of all retained epochs (what every commit
checks) come from one directory listing without reading the records.

Fencing: a coordinator acquires the store's lease, which bumps a generation number.
Every write checks, under an exclusive file lock, that the lease still holds that
generation; a coordinator that was taken over gets :class:`~txsink.errors.FencedError`
instead of interleaving its decisions with the new owner's. An owner stays fenced:
asking for the lease again after a newer owner took it fails too, so an older query
run cannot win the sink back by starting another coordinator.

A write that cannot complete (disk full, read-only directory) raises
:class:`~txsink.errors.StateError` naming the path and leaves the previous record in
place: a truncated decision is never renamed into place.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import enum
import errno
import fcntl
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txsink.errors import ConfigError, FencedError, StateError
from txsink.model import Committable

log = logging.getLogger(__name__)

STATE_FORMAT_VERSION = 1


#: Owners a lease remembers as fenced (older query runs); older ones are forgotten.
FENCED_OWNERS_KEPT = 64


class EpochState(str, enum.Enum):
    #: Taken by a batch write that is still writing: no other write may use the epoch,
    #: and recovery leaves its participants alone while its owner may still commit.
    RESERVED = "reserved"
    DECIDED = "decided"
    COMMITTED = "committed"


@dataclass(frozen=True)
class WriteId:
    """A batch write's identity (Delta's ``txnAppId``/``txnVersion``).

    Versions of one ``app_id`` only grow: a write whose version is at or below the
    highest committed version of its ``app_id`` was written before and is skipped.
    """

    app_id: str
    version: int
    #: The streaming query whose ``foreachBatch`` made this write (Spark's query id),
    #: None for a write no stream drove. Versions of one ``app_id`` count within one
    #: query: a reset checkpoint starts a new query whose batch ids restart at 0.
    query_id: str | None = field(default=None, compare=False)

    def __str__(self) -> str:
        return f"{self.app_id}@{self.version}"

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"app_id": self.app_id, "version": self.version}
        if self.query_id is not None:
            data["query_id"] = self.query_id
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WriteId:
        query = data.get("query_id")
        return cls(str(data["app_id"]), int(data["version"]),
                   None if query is None else str(query))


@dataclass(frozen=True)
class EpochRecord:
    epoch: int
    state: EpochState
    committables: tuple[Committable, ...]
    decided_at: float
    committed_at: float | None = None
    #: The batch write this epoch belongs to, when it was given an identity.
    write: WriteId | None = None
    #: The coordinator owner that reserved the epoch (RESERVED records only).
    owner: str | None = None
    #: Participants salvaged since the decision, as (replacement, original) names: the
    #: target aborted the original on its own and its data was prepared again as the
    #: replacement, which took its place in :attr:`committables` (see
    #: :meth:`txsink.backend.Backend.salvage`).
    salvaged: tuple[tuple[str, str], ...] = ()
    #: What wrote the epoch: ``stream`` (a micro-batch of the streaming sink), ``batch``
    #: (a batch write's reserved epoch), None (not said: a record of an older release,
    #: or a caller driving the coordinator directly). See
    #: :mod:`txsink.coordinator.identity`.
    origin: str | None = None
    #: The streaming query whose micro-batch this epoch is (``origin`` ``stream``), when
    #: known.
    query_id: str | None = None
    #: A digest of the source offsets Spark logged for the micro-batch this epoch holds
    #: (:func:`txsink.spark.queries.batch_source`), when known: a batch Spark runs again
    #: under the same number is a replay only when its offsets are these.
    source: str | None = None

    @property
    def participants(self) -> frozenset[str]:
        return frozenset(c.participant for c in self.committables)

    @property
    def rows(self) -> int:
        return sum(c.rows for c in self.committables)

    def committed(self, at: float | None = None) -> EpochRecord:
        return EpochRecord(self.epoch, EpochState.COMMITTED, self.committables,
                           self.decided_at, time.time() if at is None else at, self.write,
                           salvaged=self.salvaged, origin=self.origin, query_id=self.query_id,
                           source=self.source)

    def with_replacements(self, replacements: Mapping[str, Committable]) -> EpochRecord:
        """This decision with each participant named in ``replacements`` (original name
        -> replacement) swapped for its replacement, remembered in :attr:`salvaged`."""
        return dataclasses.replace(
            self, committables=tuple(replacements.get(c.participant, c)
                                     for c in self.committables),
            salvaged=self.salvaged + tuple((r.participant, name)
                                           for name, r in replacements.items()))

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "v": STATE_FORMAT_VERSION,
            "epoch": self.epoch,
            "state": self.state.value,
            "decided_at": self.decided_at,
            "committed_at": self.committed_at,
            "committables": [c.to_dict() for c in self.committables],
        }
        if self.write is not None:
            data["write"] = self.write.to_dict()
        if self.owner is not None:
            data["owner"] = self.owner
        if self.salvaged:
            data["salvaged"] = [list(pair) for pair in self.salvaged]
        if self.origin is not None:
            data["origin"] = self.origin
        if self.query_id is not None:
            data["query_id"] = self.query_id
        if self.source is not None:
            data["source"] = self.source
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EpochRecord:
        if data.get("v") != STATE_FORMAT_VERSION:
            raise StateError(f"state record format {data.get('v')!r} is not supported")
        try:
            return cls(
                epoch=int(data["epoch"]),
                state=EpochState(data["state"]),
                committables=tuple(Committable.from_dict(c) for c in data["committables"]),
                decided_at=float(data["decided_at"]),
                committed_at=None if data.get("committed_at") is None
                else float(data["committed_at"]),
                write=None if data.get("write") is None else WriteId.from_dict(data["write"]),
                owner=None if data.get("owner") is None else str(data["owner"]),
                salvaged=tuple((str(r), str(o)) for r, o in data.get("salvaged", ())),
                origin=None if data.get("origin") is None else str(data["origin"]),
                query_id=None if data.get("query_id") is None else str(data["query_id"]),
                source=None if data.get("source") is None else str(data["source"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"malformed state record: {exc}") from exc


@dataclass(frozen=True)
class SinkMeta:
    """What the store is for: binds a state location to exactly one sink id."""

    sink_id: str
    backend: str
    #: Secret-free backend options, so operators can resolve epochs by hand.
    options: Mapping[str, str] = field(default_factory=dict)
    #: Highest epoch known COMMITTED, kept after old records are pruned.
    committed_watermark: int = -1
    #: Random identity of this state, created once: backends bind the sink id to it so
    #: that a second query (another state) with the same sink id is refused.
    state_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    #: Spark's query id from the checkpoint's ``metadata`` file, once a streaming query
    #: wrote through this state: a checkpoint with another id is not this state's.
    query_id: str | None = None
    #: Highest committed version per batch-write ``app_id`` (kept after pruning).
    writes: Mapping[str, int] = field(default_factory=dict)
    #: The delivery guarantee of the last run (``exactly_once`` unless chosen).
    guarantee: str = "exactly_once"
    #: The streaming query that drove the committed versions of each ``app_id``
    #: (``foreachBatch`` writes): versions from another query are not comparable.
    write_queries: Mapping[str, str] = field(default_factory=dict)
    #: Epochs given up by ``txsink resolve --abort --force`` with some participants
    #: already committed: epoch -> their partitions, which a replay does not write again.
    kept: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    #: A group of targets (``backend`` is ``group``): per target name, its backend, its
    #: derived sink id and its secret-free options, so ``txsink status``/``resolve``
    #: can rebuild every target and a run with other targets is refused.
    targets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: Like ``kept``, for a group: epoch -> target -> partitions kept committed.
    kept_targets: Mapping[int, Mapping[str, tuple[int, ...]]] = field(default_factory=dict)
    #: The epoch of the streaming sink's micro-batch 0, fixed when a stream first wrote
    #: through this state (None: no stream did). Its batch ``b`` is epoch
    #: ``stream_from + b``: epochs batch writes used before are never its own, and
    #: batch writes are refused from then on (they would take its next batches' numbers).
    stream_from: int | None = None
    #: The highest epoch number ever given up without being committed (a forced
    #: resolve, a batch write's reservation dropped): a new epoch is allocated above it,
    #: so a number never means two different sets of rows.
    given_up: int = -1
    #: Writes with an identity (``foreachBatch``'s ``version=batch_id``) whose epoch a
    #: forced resolve gave up with some participants committed: ``app_id@version`` ->
    #: (that epoch, the streaming query that drove the write or None). Their replay
    #: is written under the same epoch, without the kept partitions.
    kept_writes: Mapping[str, tuple[int, str | None]] = field(default_factory=dict)
    #: For each epoch with kept partitions: the rows of every participant its decision
    #: named (``target/partition`` -> rows). A replay must match it, or the partitions
    #: it does not write again may not hold the rows the kept ones do.
    kept_rows: Mapping[int, Mapping[str, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "v": STATE_FORMAT_VERSION, "sink_id": self.sink_id, "backend": self.backend,
            "options": dict(self.options), "committed_watermark": self.committed_watermark,
            "state_id": self.state_id}
        if self.query_id is not None:
            data["query_id"] = self.query_id
        if self.writes:
            # Pairs, not an object: the order (least recently written first) is kept.
            data["writes"] = [[app, version] for app, version in self.writes.items()]
        if self.guarantee != "exactly_once":
            data["guarantee"] = self.guarantee
        if self.write_queries:
            data["write_queries"] = dict(self.write_queries)
        if self.kept:
            data["kept"] = {str(e): list(p) for e, p in self.kept.items()}
        if self.targets:
            data["targets"] = {name: dict(t) for name, t in self.targets.items()}
        if self.kept_targets:
            data["kept_targets"] = {str(e): {t: list(p) for t, p in by.items()}
                                    for e, by in self.kept_targets.items()}
        if self.stream_from is not None:
            data["stream_from"] = self.stream_from
        if self.given_up >= 0:
            data["given_up"] = self.given_up
        if self.kept_writes:
            data["kept_writes"] = {k: list(v) for k, v in self.kept_writes.items()}
        if self.kept_rows:
            data["kept_rows"] = {str(e): dict(by) for e, by in self.kept_rows.items()}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SinkMeta:
        try:
            return cls(str(data["sink_id"]), str(data["backend"]), dict(data.get("options", {})),
                       int(data.get("committed_watermark", -1)), str(data["state_id"]),
                       None if data.get("query_id") is None else str(data["query_id"]),
                       _write_versions(data.get("writes")),
                       str(data.get("guarantee", "exactly_once")),
                       {str(k): str(v) for k, v in
                        dict(data.get("write_queries", {})).items()},
                       {int(e): tuple(int(p) for p in ps) for e, ps in
                        dict(data.get("kept", {})).items()},
                       {str(n): dict(t) for n, t in dict(data.get("targets", {})).items()},
                       {int(e): {str(t): tuple(int(p) for p in ps) for t, ps in by.items()}
                        for e, by in dict(data.get("kept_targets", {})).items()},
                       None if data.get("stream_from") is None else int(data["stream_from"]),
                       int(data.get("given_up", -1)),
                       {str(k): (int(v[0]), None if v[1] is None else str(v[1]))
                        for k, v in dict(data.get("kept_writes", {})).items()},
                       {int(e): {str(k): int(n) for k, n in dict(by).items()}
                        for e, by in dict(data.get("kept_rows", {})).items()})
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"malformed state metadata: {exc}") from exc


def _write_versions(data: Any) -> dict[str, int]:
    """``writes`` as stored: ordered pairs, or an object (releases before the order)."""
    pairs = data.items() if isinstance(data, dict) else (data or [])
    return {str(app): int(version) for app, version in pairs}


@dataclass(frozen=True)
class Lease:
    owner: str
    generation: int


class StateStore(abc.ABC):
    """Durable storage for one sink's pending-transaction state."""

    location: str

    @abc.abstractmethod
    def acquire(self, owner: str) -> Lease:
        """Take the lease. The same owner gets its lease back; another owner fences it.

        An owner that was fenced stays fenced: raise :class:`FencedError` when it asks
        again (keep at least the last :data:`FENCED_OWNERS_KEPT` fenced owners).
        """

    @abc.abstractmethod
    def check(self, lease: Lease) -> None:
        """Raise :class:`FencedError` if ``lease`` is no longer current."""

    @abc.abstractmethod
    def read_meta(self) -> SinkMeta | None: ...

    @abc.abstractmethod
    def write_meta(self, lease: Lease, meta: SinkMeta) -> None: ...

    @abc.abstractmethod
    def records(self) -> dict[int, EpochRecord]: ...

    @abc.abstractmethod
    def put(self, lease: Lease, record: EpochRecord) -> None:
        """Durably write ``record``, replacing any record of the same epoch."""

    @abc.abstractmethod
    def put_new(self, lease: Lease, record: EpochRecord) -> bool:
        """Write ``record`` only if no record of its epoch exists; False if one does.

        Atomic against concurrent writers of the same store: this is how batch
        writes running at once reserve distinct epochs.
        """

    @abc.abstractmethod
    def delete(self, lease: Lease, epochs: Iterable[int]) -> None: ...

    def get(self, epoch: int) -> EpochRecord | None:
        return self.records().get(epoch)

    def states(self) -> dict[int, EpochState]:
        """Each retained epoch's state, for the checks every commit makes.

        The coordinator asks on every epoch it commits, and a record holds every
        participant of its epoch, so stores that can answer without reading the
        record bodies (an index, the names of the files) override it: the cost of a
        commit then does not grow with the retained epochs. Default: from
        :meth:`records`.
        """
        return {epoch: record.state for epoch, record in self.records().items()}

    # -- the archive of decided participant names ---------------------------------------
    #
    # A pruned record takes its committables with it, but a target failed over to a
    # standby (or restored from a backup) can bring back, prepared, a participant whose
    # COMMIT was lost with the old primary. Only a decision's list of names tells such a
    # participant (roll it forward) from a failed attempt's leftover (abort it). The
    # coordinator keeps those names for pruned epochs in chunks of ARCHIVE_CHUNK epochs:
    # ``{"epochs": {"<epoch>": {"at": decided_at, "names": [[partition, attempt], ...]}}}``.
    # A store that does not implement these keeps nothing, and says so at start.

    supports_archive: bool = False

    def archive_chunks(self) -> list[int]:
        """The numbers of the archive chunks present, ascending."""
        return []

    def read_archive(self, chunk: int) -> dict[str, Any] | None:
        """Archive chunk ``chunk`` as written, or None."""
        return None

    def merge_archive(self, lease: Lease, chunk: int, epochs: Mapping[str, Any]) -> None:
        """Add ``epochs`` (``{"<epoch>": {...}}``) to chunk ``chunk``, creating it if needed.

        Fenced like every write, and atomic against a concurrent merge of the same chunk:
        names once archived are never lost.
        """
        raise NotImplementedError(f"state store {type(self).__name__} keeps no archive")

    def delete_archive(self, lease: Lease, chunks: Iterable[int]) -> None:
        """Drop archive chunks past their retention."""
        raise NotImplementedError(f"state store {type(self).__name__} keeps no archive")

    def release(self, lease: Lease) -> bool:
        """Mark ``lease`` given up when its run ends, so ``txsink status`` can tell a
        stopped query from a running (or crashed) one. False if another owner holds it.

        The next owner takes a released lease like any other; a store that cannot
        record this returns False.
        """
        return False

    def lease_info(self) -> dict[str, Any]:
        """The lease as stored (owner, generation, acquired_at, released_at), for display."""
        return {}


def new_owner_token() -> str:
    """A token unique to one coordinator run: host, pid and a random part."""
    return f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


class DirectoryStateStore(StateStore):
    """The default store: a local directory, e.g. ``<checkpointLocation>/txsink``."""

    def __init__(self, location: str | os.PathLike[str]) -> None:
        text = os.fspath(location)
        if text.startswith("file://"):
            text = text[len("file://"):]
        elif "://" in text:
            raise ConfigError(
                f"state location {text!r}: the directory state store needs a local path "
                "or file:// URL; install a state-store plugin for other schemes",
                field="state",
            )
        self.root = Path(text)
        self.location = str(self.root)
        self._epochs = self.root / "epochs"

    # -- files --------------------------------------------------------------------------

    def _ensure(self) -> None:
        self._epochs.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self._ensure()
            fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StateError(f"txsink state directory {self.root}: cannot write "
                             f"({exc.strerror}); make it writable (and give it free space) "
                             "or choose another state_location") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _write_json(self, path: Path, data: Mapping[str, Any], *,
                    compact: bool = False) -> None:
        # Records are written compact: an indented dump goes through json's pure-Python
        # encoder, which for an epoch of many participants cost more than the fsyncs.
        text = (json.dumps(data, sort_keys=True, separators=(",", ":")) if compact
                else json.dumps(data, sort_keys=True, indent=1))
        write_file_atomically(path, text.encode(), what="txsink state")

    @staticmethod
    def _read_json(path: Path) -> dict[str, Any] | None:
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise StateError(f"state file {path} is corrupt: {exc}") from exc
        if not isinstance(data, dict):
            raise StateError(f"state file {path} is not a JSON object")
        return data

    # -- lease --------------------------------------------------------------------------

    def _current_lease(self) -> Lease | None:
        data = self._read_json(self.root / "lease.json")
        if data is None:
            return None
        return Lease(str(data["owner"]), int(data["generation"]))

    def acquire(self, owner: str) -> Lease:
        with self._locked():
            data = self._read_json(self.root / "lease.json") or {}
            current = (Lease(str(data["owner"]), int(data["generation"]))
                       if "owner" in data else None)
            if current is not None and current.owner == owner:
                if data.get("released_at") is not None:
                    # Taken up again: keep the fenced owners, drop the release.
                    kept = {k: v for k, v in data.items() if k != "released_at"}
                    self._write_json(self.root / "lease.json",
                                     {**kept, "acquired_at": time.time()})
                self._upgrade_locked()
                return current
            fenced = [str(o) for o in data.get("fenced", [])]
            if owner in fenced:
                raise FencedError(
                    f"state {self.location}: {owner} was taken over by a newer run "
                    f"({current.owner if current else '?'}, generation "
                    f"{current.generation if current else '?'}) and must stop. Two runs of "
                    "one query must never write at once; stop the older one.")
            if current is not None:
                fenced = [*fenced, current.owner][-FENCED_OWNERS_KEPT:]
            lease = Lease(owner, (current.generation + 1) if current else 1)
            self._write_json(self.root / "lease.json",
                             {"owner": owner, "generation": lease.generation,
                              "acquired_at": time.time(), "fenced": fenced})
            if current is not None:
                log.info("state %s: lease taken over from %s (generation %d -> %d)",
                         self.location, current.owner, current.generation, lease.generation)
            self._upgrade_locked()
            return lease

    def _check_locked(self, lease: Lease) -> None:
        current = self._current_lease()
        if current != lease:
            raise FencedError(
                f"state {self.location}: another coordinator ({current.owner if current else '?'}, "
                f"generation {current.generation if current else '?'}) took over this sink; "
                f"this one ({lease.owner}, generation {lease.generation}) must stop. Two "
                "queries must never share a checkpoint location or sink id."
            )

    def check(self, lease: Lease) -> None:
        with self._locked():
            self._check_locked(lease)

    def release(self, lease: Lease) -> bool:
        with self._locked():
            if self._current_lease() != lease:
                return False
            self._write_json(self.root / "lease.json",
                             {**self.lease_info(), "released_at": time.time()})
            return True

    def lease_info(self) -> dict[str, Any]:
        return self._read_json(self.root / "lease.json") or {}

    # -- records ------------------------------------------------------------------------

    def read_meta(self) -> SinkMeta | None:
        data = self._read_json(self.root / "meta.json")
        return None if data is None else SinkMeta.from_dict(data)

    def write_meta(self, lease: Lease, meta: SinkMeta) -> None:
        with self._locked():
            self._check_locked(lease)
            self._write_json(self.root / "meta.json", meta.to_dict())

    # -- archive ------------------------------------------------------------------------

    supports_archive = True

    def _archive_path(self, chunk: int) -> Path:
        return self.root / "archive" / f"{chunk:08d}.json"

    def archive_chunks(self) -> list[int]:
        try:
            names = os.listdir(self.root / "archive")
        except FileNotFoundError:
            return []
        return sorted(int(n[:-5]) for n in names if _ARCHIVE_NAME.match(n))

    def read_archive(self, chunk: int) -> dict[str, Any] | None:
        return self._read_json(self._archive_path(chunk))

    def merge_archive(self, lease: Lease, chunk: int, epochs: Mapping[str, Any]) -> None:
        with self._locked():
            self._check_locked(lease)
            path = self._archive_path(chunk)
            data = self._read_json(path) or {"v": STATE_FORMAT_VERSION, "epochs": {}}
            data["epochs"] = {**data.get("epochs", {}), **epochs}
            path.parent.mkdir(exist_ok=True)
            self._write_json(path, data, compact=True)

    def delete_archive(self, lease: Lease, chunks: Iterable[int]) -> None:
        with self._locked():
            self._check_locked(lease)
            for chunk in chunks:
                with contextlib.suppress(FileNotFoundError):
                    self._archive_path(chunk).unlink()

    # Record files are named ``<epoch:012d>.<state>.json`` so that the state of every
    # epoch is known from one directory listing (:meth:`states`). Releases before
    # that named them ``<epoch:012d>.json`` (state only in the body): those are still
    # read, and renamed to the new layout by :meth:`acquire`.

    def _path(self, epoch: int, state: EpochState | None) -> Path:
        suffix = "" if state is None else f".{state.value}"
        return self._epochs / f"{epoch:012d}{suffix}.json"

    def _candidates(self, epoch: int) -> list[Path]:
        return [self._path(epoch, state) for state in (*_ADVANCED_FIRST, None)]

    @contextlib.contextmanager
    def _shared(self) -> Iterator[None]:
        """Hold the lock shared while reading record names: :meth:`put` writes the new
        name before it removes the old one, and a listing taken during that could
        otherwise see neither. A location without a lock file has no writer yet, and
        a read-only one (a copy being inspected) is read without the lock."""
        try:
            fd = os.open(self.root / ".lock", os.O_RDONLY)
        except OSError:
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)

    def _names(self) -> dict[int, list[tuple[EpochState | None, str]]]:
        """Every record file name by epoch, with the state its name gives (None for
        the old layout). Plain strings: this runs several times per commit."""
        out: dict[int, list[tuple[EpochState | None, str]]] = {}
        try:
            names = os.listdir(self._epochs)
        except FileNotFoundError:
            return out
        for name in names:
            m = _RECORD_NAME.match(name)
            if m is None:
                continue
            state = None if m.group(2) is None else _BY_VALUE[m.group(2)]
            out.setdefault(int(m.group(1)), []).append((state, name))
        return out

    def _current(self, names: list[tuple[EpochState | None, str]]) -> tuple[EpochState, Path]:
        """The record file that counts among the names of one epoch: the furthest
        advanced state (states only move RESERVED -> DECIDED -> COMMITTED; two names
        are left by a crash in :meth:`put`), a new-layout name before an old one."""
        best: tuple[int, int, EpochState, str] | None = None
        for state, name in names:
            layout = 1
            if state is None:
                data = self._read_json(self._epochs / name)
                if data is None:
                    continue
                state, layout = EpochRecord.from_dict(data).state, 0
            key = (_RANK[state], layout, state, name)
            if best is None or key[:2] > best[:2]:
                best = key
        if best is None:
            raise FileNotFoundError
        return best[2], self._epochs / best[3]

    def _read_record(self, epoch: int, state: EpochState, path: Path) -> EpochRecord | None:
        data = self._read_json(path)
        if data is None:
            return None
        record = EpochRecord.from_dict(data)
        if record.epoch != epoch or record.state is not state:
            raise StateError(f"state file {path} is corrupt: it holds epoch {record.epoch} "
                             f"{record.state.value}")
        return record

    def records(self) -> dict[int, EpochRecord]:
        out: dict[int, EpochRecord] = {}
        with self._shared():
            for epoch, names in sorted(self._names().items()):
                with contextlib.suppress(FileNotFoundError):
                    record = self._read_record(epoch, *self._current(names))
                    if record is not None:
                        out[epoch] = record
        return out

    def states(self) -> dict[int, EpochState]:
        """From the file names alone (one directory listing), bodies unread."""
        out: dict[int, EpochState] = {}
        with self._shared():
            for epoch, names in sorted(self._names().items()):
                if len(names) == 1 and names[0][0] is not None:
                    out[epoch] = names[0][0]  # the usual case: one name, the state in it
                    continue
                with contextlib.suppress(FileNotFoundError):
                    out[epoch] = self._current(names)[0]
        return out

    def get(self, epoch: int) -> EpochRecord | None:
        with self._shared():
            names = [(state, path.name) for state, path in
                     zip((*_ADVANCED_FIRST, None), self._candidates(epoch), strict=True)
                     if state is None or path.exists()]
            try:
                return self._read_record(epoch, *self._current(names))
            except FileNotFoundError:
                return None

    def put(self, lease: Lease, record: EpochRecord) -> None:
        with self._locked():
            self._check_locked(lease)
            self._put_locked(record)

    def _put_locked(self, record: EpochRecord) -> None:
        """Write the record under its new name, then drop the epoch's other names.

        The removals are not synced: a name that comes back after a power loss is
        of an earlier state, and readers take the furthest advanced one.
        """
        path = self._path(record.epoch, record.state)
        self._write_json(path, record.to_dict(), compact=True)
        for other in self._candidates(record.epoch):
            if other != path:
                with contextlib.suppress(FileNotFoundError):
                    other.unlink()

    def put_new(self, lease: Lease, record: EpochRecord) -> bool:
        with self._locked():
            self._check_locked(lease)
            if any(p.exists() for p in self._candidates(record.epoch)):
                return False
            self._put_locked(record)
            return True

    def delete(self, lease: Lease, epochs: Iterable[int]) -> None:
        with self._locked():
            self._check_locked(lease)
            for epoch in epochs:
                for path in self._candidates(epoch):
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
            _fsync_dir(self._epochs)

    def _upgrade_locked(self) -> None:
        """Rename old-layout record files (``<epoch>.json``) to ``<epoch>.<state>.json``.

        The record is linked under its new name (same bytes) before the old name
        goes; a crash in between leaves both, which readers resolve the same way.
        """
        moved = 0
        for epoch, names in self._names().items():
            if all(state is not None for state, _ in names):
                continue
            state, path = self._current(names)
            keep = self._path(epoch, state)
            if path != keep:
                with contextlib.suppress(FileExistsError):
                    os.link(path, keep)
                _fsync_dir(self._epochs)
            for stale in self._candidates(epoch):
                if stale != keep:
                    with contextlib.suppress(FileNotFoundError):
                        stale.unlink()
            moved += 1
        if moved:
            _fsync_dir(self._epochs)
            log.info("state %s: %d epoch record(s) renamed to <epoch>.<state>.json",
                     self.location, moved)


#: Record states, furthest advanced first; their rank for choosing among names.
_ADVANCED_FIRST = (EpochState.COMMITTED, EpochState.DECIDED, EpochState.RESERVED)
_RANK = {state: len(_ADVANCED_FIRST) - i for i, state in enumerate(_ADVANCED_FIRST)}
_BY_VALUE = {state.value: state for state in EpochState}
_RECORD_NAME = re.compile(r"^(\d{12})(?:\.(reserved|decided|committed))?\.json$")
_ARCHIVE_NAME = re.compile(r"^\d{8}\.json$")


def write_file_atomically(path: Path, payload: bytes, *, what: str) -> None:
    """Write ``payload`` to ``path`` whole or not at all: temp file, fsync, rename.

    ``os.write`` may write less than asked (a full disk): loop until all is written,
    and on any error remove the temp file and raise a :class:`StateError` naming the
    path, so a short or empty file never replaces a good one.
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(payload)
            while view:
                written = os.write(fd, view)
                if written <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise StateError(f"{what}: cannot write {path} ({exc.strerror or exc}); nothing was "
                         "changed. Free space or make the directory writable, then restart "
                         "the query") from exc
    try:
        _fsync_dir(path.parent)
    except OSError as exc:
        raise StateError(f"{what}: {path} was written but its directory could not be "
                         f"synced ({exc.strerror}); it may not survive a power loss") from exc


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:  # pragma: no cover - platforms without directory fds
        if exc.errno in (errno.EISDIR, errno.EACCES):
            return
        raise
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
