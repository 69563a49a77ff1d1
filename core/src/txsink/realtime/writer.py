"""Exactly-once by source position: the engine-agnostic writer of Real-time Mode.

A real-time engine (Spark's ``trigger(realTime=...)``) streams rows to the sink
inside long batches, and a replayed (partition, batch) may carry other rows than
the first attempt (SPARK-28650): (partition, epoch) cannot be the idempotency key.
The source position can: every row carries the (topic, partition, offset) of the
Kafka record it came from, and the target stores, **in the same transaction as the
rows**, the highest offset it holds per source partition. A replay skips every row
at or below the stored offset, so each source record lands once.

Each source partition gets its own :class:`PositionTarget` session. Opening it
*claims* the source partition (fencing any older writer of it: a zombie task of a
dead driver, a second query on the same sink id) and reads the stored offset.
Commits are small and frequent (``commit_interval_s``, a few hundred
milliseconds): that interval, not the engine's batch length, bounds how long a
written row stays invisible.

A claim costs round trips (Kafka: ``init_transactions`` and a read of the progress
topic, a few hundred milliseconds); a real-time engine opens a new writer per task
and batch, so targets that allow it (``PositionTarget.reusable``) keep their claimed
sessions in a :class:`SessionPool` between the batches of one query run, in the
process that ran them. A kept session that another writer fenced meanwhile fails its
first commit with nothing visible; it is then claimed afresh and its rows filtered
again by the offset the new claim reads, before anything is written.

Rows of one source record are never split across two commits when the pipeline
may emit several rows per record (``rows_per_record="many"``, e.g. ``explode``):
then the newest record's rows wait for the next record or the end of the batch.
"""

from __future__ import annotations

import abc
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from txsink.errors import FencedError, TxsinkError
from txsink.realtime.identity import claim_refusal
from txsink.realtime.positions import (
    SourcePartition,
    StoredPosition,
    stored_position,
)
from txsink.realtime.stats import RealtimeStats, TargetStats

if TYPE_CHECKING:
    from txsink.realtime.source import SourceTopics

log = logging.getLogger(__name__)

DEFAULT_COMMIT_INTERVAL_S = 0.25


class PositionOrderError(TxsinkError):
    """A source partition's offsets went backwards within one writer: the pipeline
    reorders rows, so position-based idempotency would drop some. Nothing of the
    out-of-order row was written."""


class PositionTarget(abc.ABC):
    """One target's session for one source partition.

    ``claim`` fences every older session of the same (sink id, source partition)
    and returns what the target holds for it. ``commit`` makes the rows handed to
    ``write`` since the last commit visible together with the new highest offset (and
    the source's topic id and the target's destination, so the position says what it
    is a position of), atomically, or raises (``FencedError`` when a newer session
    claimed the source partition: nothing of this transaction becomes visible).
    """

    @abc.abstractmethod
    def claim(self) -> StoredPosition | int:
        """Fence older sessions; the stored position (an offset alone: one recorded
        without identity), offset :data:`NOTHING` if none."""

    @abc.abstractmethod
    def write(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Add ``rows`` to the open transaction (opening one if needed)."""

    @abc.abstractmethod
    def commit(self, offset: int) -> None:
        """Commit the written rows and ``offset`` as the new highest, atomically."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Drop the open transaction, if any (the rows never become visible)."""

    #: Whether a claimed session may serve later tasks of the same query run (see
    #: :class:`SessionPool`): only for targets whose every transaction is refused once a
    #: newer session claimed the source partition (fencing), so a kept session can never
    #: commit on a stale offset.
    reusable: bool = False

    def close(self) -> None:  # noqa: B027 - optional
        """Release connections; an open transaction is aborted first."""

    def identity(self) -> tuple[str, Mapping[str, str]] | None:
        """The sink id and the destination this session writes, to judge a claimed
        position by (:func:`txsink.realtime.identity.claim_refusal`); ``None``: nothing
        to judge by (the position is taken as it is)."""
        return None

    def still_holds(self) -> bool:
        """Whether this kept session is still the newest claim of its source partition
        (asked when a later task takes it from the pool). ``True`` when the target cannot
        tell cheaply: a fenced session then fails its first commit, with nothing visible,
        and is claimed again."""
        return True


def older_run_refusal(sink_id: str, source: SourcePartition, run: int | None,
                      reset: int | None) -> FencedError | None:
    """The refusal of a claim by a session of run ``run`` when the target's positions
    were last deleted at generation ``reset`` (``None``: never), or ``None`` when the
    run started after that. The session belongs to a run the reset meant to end (a
    task of a dead driver that had not claimed yet): it stops before it writes."""
    if reset is None or (run is not None and run > reset):
        return None
    return FencedError(
        f"sink {sink_id}: source partition {source}: this task belongs to a run "
        f"(generation {'unprepared' if run is None else run}) started before the sink's "
        f"positions were deleted (txsink reset, generation {reset}); it stops without "
        "writing. A run started after the reset writes this source partition",
        sink_id=sink_id)


#: Builds the session of one source partition (called on the first row from it).
TargetFactory = Callable[[SourcePartition], PositionTarget]


class RealtimeTargetSpec(abc.ABC):
    """A backend's real-time target for one sink id: checked on the driver, then
    pickled to the tasks, where it builds one :class:`PositionTarget` per source
    partition. Holds no open client (it travels), and no secret in ``describe``."""

    sink_id: str

    #: This query run's generation, drawn by :meth:`prepare` on the driver from the
    #: target's own sequence (PostgreSQL: the generation sequence; Kafka: the progress
    #: topic's end offset) and pickled to the tasks with the spec. :meth:`delete_positions`
    #: (``txsink reset``) records a generation past every run started before it, and a
    #: claim of an older run is refused (:func:`older_run_refusal`): a task of a dead
    #: driver that had not claimed its source partition yet would otherwise claim after
    #: the reset, fence the new run and store its old batch's position over the new
    #: run's. ``None``: not prepared, the oldest run there is.
    run: int | None = None

    @abc.abstractmethod
    def prepare(self) -> None:
        """Driver side, before any data moves: check the target, create the progress
        store and draw this run's generation (:attr:`run`); raise ``ConfigError`` naming
        the option and the way out."""

    @abc.abstractmethod
    def __call__(self, source: SourcePartition) -> PositionTarget:
        """The session of ``source`` (task side)."""

    @abc.abstractmethod
    def describe(self) -> str:
        """Where the rows go, without secrets."""

    def stored(self) -> dict[SourcePartition, StoredPosition]:
        """Every source partition's stored position, with the topic id and destination
        it was stored for (read only: ``txsink status``, the checks before a start).
        Offset :data:`NOTHING` for one claimed but never committed; a deleted position
        (a PostgreSQL row deleted, a Kafka tombstone) is absent."""
        raise NotImplementedError

    def stored_positions(self) -> dict[SourcePartition, int]:
        """Every source partition's highest stored offset (:meth:`stored`'s offsets)."""
        return {source: position.offset for source, position in self.stored().items()}

    def delete_positions(self, topics: Sequence[str] | None = None) -> list[str]:
        """Delete this sink id's stored positions (of the source ``topics`` only, if
        given), fencing every session that holds one, and every claim of a run prepared
        before (:attr:`run`): ``txsink reset``. One secret-free line per source partition
        deleted. The rows the target holds stay."""
        raise NotImplementedError(f"{type(self).__name__} cannot delete its positions")

    def destination(self) -> dict[str, str]:
        """Where the rows land, as an identity (no secret, no address that a failover
        changes), one entry per option that names it: every stored position records it,
        and so does a checkpoint's record of its targets. A run of the same sink id
        whose destination differs is refused as a move (:func:`txsink.targets.moved_target`,
        the check micro-batch sinks use too): the positions belong to the old place."""
        return {"place": self.describe()}

    def place(self) -> str:
        """:meth:`destination` in words (messages, a group's checkpoint record)."""
        return self.describe()

    def feeds(self, source: SourceTopics) -> bool:
        """Whether this target writes a topic ``source`` reads (now, or later: a
        pattern), on the cluster it reads: the query would read its own output again,
        without end. Default: no (not a Kafka target)."""
        return False

    def same_place(self, other: RealtimeTargetSpec) -> bool:
        """Whether ``other`` writes the same rows' destination (two targets of a group
        there would hold each record twice)."""
        return type(self) is type(other) and self.describe() == other.describe()

    def check_columns(self, columns: Mapping[str, str]) -> None:  # noqa: B027 - optional
        """Driver side, before any data moves: refuse output columns (name -> Spark type
        name, position columns left out) this target would not write as they are, with
        a ``ConfigError`` naming the column. Targets that refuse them at the first write
        anyway, before anything is visible, need not."""


class SessionPool:
    """Claimed sessions kept, idle, between the tasks of one query run in one process.

    Keyed by the run (a token the query's writer carries: a restarted query claims
    afresh), the source partition and its topic id (a topic recreated while the query
    runs is claimed afresh, and its stored position judged). A session is kept only
    after its task ended with everything committed; one idle for :attr:`idle_s` is
    closed at the next access.
    """

    def __init__(self, idle_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_s = idle_s
        self._clock = clock
        self._lock = threading.Lock()
        self._idle: dict[tuple[str, SourcePartition, str | None], Kept] = {}

    def take(self, run: str, source: SourcePartition) -> Kept | None:
        with self._lock:
            stale = self._expire()
            kept = self._idle.pop((run, source, source.topic_id), None)
        _close_all(stale)
        return kept

    def give(self, run: str, source: SourcePartition, target: PositionTarget,
             stored: int, batch: int | None = None) -> None:
        with self._lock:
            stale = self._expire()
            old = self._idle.pop((run, source, source.topic_id), None)
            self._idle[(run, source, source.topic_id)] = Kept(target, stored, self._clock(),
                                                              batch)
        _close_all(stale + ([old.target] if old is not None else []))

    def clear(self) -> None:
        with self._lock:
            targets = [k.target for k in self._idle.values()]
            self._idle.clear()
        _close_all(targets)

    def __len__(self) -> int:
        return len(self._idle)

    def _expire(self) -> list[PositionTarget]:
        now = self._clock()
        old = [k for k, kept in self._idle.items() if now - kept.since > self.idle_s]
        return [self._idle.pop(k).target for k in old]


@dataclass(frozen=True)
class Kept:
    """A session in the pool: what it committed last, since when it idles, and the
    engine's batch whose task gave it back (``None``: the engine has no batch ids)."""

    target: PositionTarget
    stored: int
    since: float
    batch: int | None = None


def _close_all(targets: Sequence[PositionTarget]) -> None:
    for target in targets:
        try:
            target.close()
        except Exception as exc:
            log.warning("closing an idle real-time session: %s", exc)


#: The pool of this process (a Python worker serves many tasks of a query run).
SESSIONS = SessionPool()


@dataclass
class _Session:
    target: PositionTarget
    stored: int
    #: Highest offset seen by this writer (written or skipped).
    last: int
    #: ``None``: a record seen but not for this target (a group target's ``where``):
    #: it moves the stored position without a row.
    pending: list[Mapping[str, Any] | None] = field(default_factory=list)
    pending_offsets: list[int] = field(default_factory=list)
    #: When each pending row reached the writer (wall clock): its commit's latency.
    pending_arrivals: list[float] = field(default_factory=list)
    #: Taken from the pool and not yet committed through: a newer writer may have
    #: fenced it while it was idle.
    kept: bool = False


@dataclass
class WriterStats:
    """What one writer did, for logs and tests."""

    written: int = 0
    skipped: int = 0
    commits: int = 0


class PositionWriter:
    """Feeds rows with their source positions to per-partition target sessions.

    One writer per task. Call :meth:`add` for every row, then :meth:`close` with the
    task's error (``None`` on success: the rest is committed). :meth:`flush_due` may
    run from a timer thread, so rows that arrived just before a pause still become
    visible within the commit interval.
    """

    def __init__(self, factory: TargetFactory, *,
                 commit_interval_s: float = DEFAULT_COMMIT_INTERVAL_S,
                 rows_per_record: str = "one",
                 clock: Callable[[], float] = time.monotonic,
                 run: str | None = None, pool: SessionPool = SESSIONS,
                 trace: Callable[[dict[str, Any]], None] | None = None,
                 batch: int | None = None) -> None:
        if commit_interval_s < 0:
            raise ValueError("commit_interval_s must be >= 0")
        if rows_per_record not in ("one", "many"):
            raise ValueError("rows_per_record must be 'one' or 'many'")
        self._factory = factory
        self._interval = commit_interval_s
        self._many = rows_per_record == "many"
        self._clock = clock
        self._sessions: dict[SourcePartition, _Session] = {}
        self._last_commit = clock()
        self._lock = threading.Lock()
        self._run = run
        self._pool = pool
        self._trace = trace
        #: The engine's batch this writer's task belongs to (kept sessions: _still_holds).
        self._batch = batch
        self.stats = WriterStats()
        #: Rows, commits and each row's time from reaching the writer to visible.
        self.progress = TargetStats()

    def _session(self, source: SourcePartition) -> _Session:
        session = self._sessions.get(source)
        if session is None:
            began = time.time()
            kept = self._pool.take(self._run, source) if self._run is not None else None
            if kept is not None:
                session = _Session(kept.target, kept.stored, kept.stored, kept=True)
                if not self._still_holds(kept):
                    # Another process claimed it while it was idle (Spark gave a task of
                    # this source partition to another Python worker): claim it again now,
                    # not at the first commit.
                    self._reclaim(source, session)
            else:
                target, stored = self._claim(source)
                session = _Session(target, stored, stored)
            self._sessions[source] = session
            if self._trace is not None:
                self._trace({"claim": str(source), "kept": session.kept, "began": began,
                             "ended": time.time()})
            log.debug("source partition %s: target holds up to offset %s%s", source,
                      session.stored, " (kept from an earlier task)" if session.kept else "")
        return session

    def _still_holds(self, kept: Kept) -> bool:
        """Whether a kept session is likely still the newest claim of its source partition.
        An engine that runs every source partition's task in every batch (Spark's
        Real-time Mode) tells by batch ids: kept by the batch just before this one, the
        session wrote this source partition last (a newer claim from elsewhere, rare, is
        then caught by its first commit: fenced, nothing visible, claimed again); kept by
        an older one, another process wrote it since, and the session is claimed again
        at once. Without batch ids the target is asked."""
        if self._batch is not None and kept.batch is not None:
            return kept.batch == self._batch - 1
        return kept.target.still_holds()

    def claim(self, source: SourcePartition) -> int:
        """Claim ``source`` now (if not yet): the stored offset. A group claims a source
        partition in every target before any of them commits a row of it."""
        with self._lock:
            return self._session(source).stored

    def _claim(self, source: SourcePartition) -> tuple[PositionTarget, int]:
        target = self._factory(source)
        try:
            stored = stored_position(target.claim())
            identity = target.identity()
            if identity is not None:
                refusal = claim_refusal(identity[0], identity[1], source, stored)
                if refusal is not None:
                    raise refusal
            return target, stored.offset
        except BaseException:
            target.close()
            raise

    def add(self, source: SourcePartition, offset: int,
            row: Mapping[str, Any] | None) -> None:
        """One row that came from source record (``source``, ``offset``); ``None``: the
        record has no row for this target, but its position counts as passed."""
        with self._lock:
            self._add(source, offset, row)

    def _add(self, source: SourcePartition, offset: int,
             row: Mapping[str, Any] | None) -> None:
        session = self._session(source)
        if offset <= session.stored:
            self.stats.skipped += 1  # the target holds this record already (a replay)
            self.progress.skipped += 1
            return
        if offset < session.last or (offset == session.last and not self._many):
            raise PositionOrderError(
                f"source partition {source}: offset {offset} came after {session.last}; "
                "real-time mode needs each source partition's rows in offset order, one row "
                "per record (remove the repartition/sort, or declare rows_per_record='many' "
                "for explode-like transforms)")
        session.last = offset
        session.pending.append(row)
        session.pending_offsets.append(offset)
        session.pending_arrivals.append(time.time())
        if self._clock() - self._last_commit >= self._interval:
            self._flush(final=False)

    def flush_due(self) -> None:
        """Commit pending rows if the commit interval has passed (timer threads)."""
        with self._lock:
            if self._clock() - self._last_commit >= self._interval:
                self._flush(final=False)

    def flush(self, *, final: bool = True) -> None:
        """Commit what is pending in every session. ``final=False`` keeps the newest
        record's rows back when a record may have several rows (they commit with the
        next record or at the end of the batch)."""
        with self._lock:
            self._flush(final=final)

    def _reclaim(self, source: SourcePartition, session: _Session) -> None:
        log.info("source partition %s: a kept session was fenced while idle; claiming "
                 "it again", source)
        try:
            session.target.abort()
        finally:
            session.target.close()
        known = session.stored
        began = time.time()
        session.target, session.stored = self._claim(source)
        session.kept = False
        if self._trace is not None:
            self._trace({"claim": str(source), "kept": False, "reclaim": True,
                         "began": began, "ended": time.time()})
        if session.stored < known:
            # Positions only move forward, unless deleted (txsink reset, by hand) while
            # this session was idle: the run that kept it is the one being reset. Going
            # on would write into the new start what the reset meant to keep out.
            session.target.close()
            raise FencedError(
                f"source partition {source}: the target held offset {known} when this "
                f"session was kept and holds {session.stored} now: its positions were "
                "deleted (txsink reset) while it was idle; this writer stops without "
                "writing")
        keep = [i for i, o in enumerate(session.pending_offsets) if o > session.stored]
        self.stats.skipped += len(session.pending) - len(keep)
        self.progress.skipped += len(session.pending) - len(keep)
        session.pending = [session.pending[i] for i in keep]
        session.pending_offsets = [session.pending_offsets[i] for i in keep]
        session.pending_arrivals = [session.pending_arrivals[i] for i in keep]

    def _flush(self, *, final: bool) -> None:
        committed = False
        for source in list(self._sessions):
            committed = self._flush_one(source, final=final) or committed
        if committed:
            # The interval spaces commits out; after one without rows (an idle spell)
            # the next row commits at once.
            self._last_commit = self._clock()

    def _flush_one(self, source: SourcePartition, *, final: bool) -> bool:
        session = self._sessions[source]
        while True:
            rows, offsets = session.pending, session.pending_offsets
            cut = len(rows)
            if self._many and not final and cut:
                newest = offsets[-1]
                while cut and offsets[cut - 1] == newest:
                    cut -= 1
            if cut == 0:
                return False
            real = [r for r in rows[:cut] if r is not None]
            began = time.time()
            try:
                if real:
                    session.target.write(real)
                session.target.commit(offsets[cut - 1])
            except FencedError:
                if not session.kept:
                    raise
                # Fenced while idle in the pool (another process took the source
                # partition in between): nothing of this transaction is visible. Claim
                # again (once: the new session is not kept) and keep only the rows
                # above what the target now holds.
                self._reclaim(source, session)
                continue
            ended = time.time()
            arrivals = [a for r, a in zip(rows[:cut], session.pending_arrivals[:cut],
                                          strict=True) if r is not None]
            session.kept = False
            session.stored = offsets[cut - 1]
            self.stats.written += len(real)
            self.stats.commits += 1
            self.progress.committed(arrivals, ended)
            if self._trace is not None:
                self._trace({"source": str(source), "partition": source.partition,
                             "offsets": [o for r, o in zip(rows[:cut], offsets[:cut],
                                                           strict=True) if r is not None],
                             "arrivals": arrivals, "began": began, "ended": ended})
            session.pending, session.pending_offsets = rows[cut:], offsets[cut:]
            session.pending_arrivals = session.pending_arrivals[cut:]
            return True

    def close(self, error: BaseException | None = None) -> None:
        """End of the task: commit the rest on success, abort on error; always release."""
        with self._lock:
            self._close(error)

    def _close(self, error: BaseException | None) -> None:
        clean = False
        try:
            if error is None:
                self._flush(final=True)
                clean = True
        finally:
            first: BaseException | None = None
            for source, session in self._sessions.items():
                try:
                    if (clean and not session.pending and session.target.reusable
                            and self._run is not None):
                        self._pool.give(self._run, source, session.target, session.stored,
                                        self._batch)
                        continue
                    if error is not None or session.pending:
                        session.target.abort()
                    session.target.close()
                except BaseException as exc:
                    first = first or exc
            self._sessions.clear()
            if first is not None and error is None:
                raise first


class GroupWriter:
    """Several targets fed from one stream of rows, each exactly once by its own stored
    positions (one :class:`PositionWriter` per target).

    A source partition is claimed in every target before any target commits a row of
    it, and a record a target's ``where`` leaves out still moves that target's position,
    so every target's stored positions say how far through the source it has come.
    There is no decision across targets: each commits on its own, one after the other
    at each commit interval, so a reader may see a record in one target a commit
    earlier than in another, never twice and never missing after a replay.
    """

    def __init__(self, factories: Mapping[str, TargetFactory], *,
                 commit_interval_s: float = DEFAULT_COMMIT_INTERVAL_S,
                 rows_per_record: str = "one",
                 clock: Callable[[], float] = time.monotonic,
                 run: str | None = None, pool: SessionPool = SESSIONS,
                 trace: Callable[[dict[str, Any]], None] | None = None,
                 batch: int | None = None) -> None:
        # Kept sessions are keyed by run and source partition: each target gets a run of
        # its own, so a session kept by one target is never handed to another.
        self.writers = {name: PositionWriter(
            factory, commit_interval_s=commit_interval_s, rows_per_record=rows_per_record,
            clock=clock, run=None if run is None else f"{run}/{name}" if name else run,
            pool=pool, trace=None if trace is None else _traced(trace, name), batch=batch)
            for name, factory in factories.items()}
        self._claimed: set[SourcePartition] = set()

    def add(self, source: SourcePartition, offset: int,
            rows: Mapping[str, Mapping[str, Any] | None]) -> None:
        """One source record's row per target (``None`` or absent: none for it)."""
        if source not in self._claimed:
            for writer in self.writers.values():
                writer.claim(source)
            self._claimed.add(source)
        for name, writer in self.writers.items():
            writer.add(source, offset, rows.get(name))

    def flush_due(self) -> None:
        for writer in self.writers.values():
            writer.flush_due()

    def close(self, error: BaseException | None = None) -> None:
        """Every target: commit the rest on success, abort on error; always release.
        A target whose last commit fails does not stop the others from committing
        (each is exactly once on its own); the first failure is raised after."""
        first: BaseException | None = None
        for writer in self.writers.values():
            try:
                writer.close(error)
            except BaseException as exc:
                first = first or exc
        if first is not None:
            raise first

    @property
    def stats(self) -> dict[str, WriterStats]:
        return {name: writer.stats for name, writer in self.writers.items()}

    @property
    def progress(self) -> RealtimeStats:
        """Every target's rows, commits and latencies (``txsink run``'s lines)."""
        return RealtimeStats({name: writer.progress for name, writer in self.writers.items()})


def _traced(trace: Callable[[dict[str, Any]], None],
            name: str) -> Callable[[dict[str, Any]], None]:
    return lambda record: trace({"target": name, **record})
