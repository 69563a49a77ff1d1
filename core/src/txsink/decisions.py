"""Which participants a decision names, for every epoch a restore can bring back.

A participant named by a decision is rolled forward, never back: DECIDED or
COMMITTED, retained or pruned. Retained records hold their committables; when the
coordinator prunes COMMITTED records, the names of their participants go to the
state store's archive (chunks of :data:`ARCHIVE_CHUNK` epochs, kept for
:data:`DEFAULT_ARCHIVE_RETENTION_S`). A target failed over to a standby, or restored
from a backup taken between PREPARE and COMMIT, shows such a participant prepared
again; the orphan scan asks :class:`DecisionNames` before it aborts anything, and
the coordinator commits what a committed decision names.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

from txsink.errors import StateError
from txsink.model import Committable, parse_participant
from txsink.state import EpochRecord, EpochState, Lease, StateStore

#: Epochs per archive chunk: one small object or file per thousand pruned epochs.
ARCHIVE_CHUNK = 1000
#: How long the names of pruned decisions are kept: restores of a target (or of its
#: backup) older than this can no longer tell a decided participant from an orphan.
DEFAULT_ARCHIVE_RETENTION_S = 14 * 86400.0


def archive_records(store: StateStore, lease: Lease, records: Sequence[EpochRecord]) -> None:
    """Add the participant names of ``records`` (about to be pruned) to the archive."""
    by_chunk: dict[int, dict[str, Any]] = {}
    for r in records:
        # A group's participants carry their target: [partition, attempt, target].
        names = sorted([c.partition, c.attempt, *([c.target] if c.target else [])]
                       for c in r.committables)
        by_chunk.setdefault(r.epoch // ARCHIVE_CHUNK, {})[str(r.epoch)] = {
            "at": r.decided_at, "names": names}
    for chunk, epochs in sorted(by_chunk.items()):
        store.merge_archive(lease, chunk, epochs)


def expired_chunks(store: StateStore, retention_s: float, *,
                   now: float | None = None) -> list[int]:
    """Archive chunks whose newest decision is older than ``retention_s``.

    Read from the oldest chunk on, stopping at the first one still within its
    retention: epochs are decided in order, so later chunks are younger, and the check
    (once per 1,000 epochs) reads the chunks that go plus one, not every chunk of the
    retention (over a thousand of them at a one-second trigger). A later chunk that is
    somehow older waits for the ones before it: kept longer, never shorter. The newest
    chunk is never expired: it may still be filling.
    """
    now = time.time() if now is None else now
    chunks = store.archive_chunks()
    old: list[int] = []
    for chunk in chunks[:-1]:
        data = store.read_archive(chunk) or {}
        times = [float(e.get("at", 0)) for e in dict(data.get("epochs", {})).values()]
        if times and max(times) >= now - retention_s:
            break
        old.append(chunk)
    return old


class DecisionNames(Collection[str]):
    """The participant names any decision holds, as a collection backends can ask.

    ``in`` answers for DECIDED records (read up front), retained COMMITTED records and
    the archive (read on demand, once each). Before it answers "not named" (the
    backend then aborts the participant) it checks the lease: a fenced coordinator
    aborts nothing. Names it answers for because a
    *committed* decision holds them are collected in :attr:`roll_forward`: the backend
    asked about them, so they are prepared in the target again.
    """

    def __init__(self, sink_id: str, store: StateStore, states: Mapping[int, EpochState],
                 decided: Collection[str], lease: Lease, *, watermark: int = -1,
                 holds_epoch: Callable[[int], bool] | None = None,
                 targets: Mapping[str, str | None] | None = None,
                 given_up_in_part: Collection[int] = ()) -> None:
        self.sink_id = sink_id
        #: Epochs a forced resolve gave up with some participants kept committed: the
        #: state knows why the target holds part of them, and what else is prepared
        #: there (a failed attempt of the given-up try) is an orphan.
        self._given_up_in_part = frozenset(given_up_in_part)
        #: The sink id each name may carry, and its target: a group's participants are
        #: named after their target's sink id.
        self._targets: Mapping[str, str | None] = targets or {sink_id: None}
        self._store = store
        self._lease = lease
        self._watermark = watermark
        self._holds_epoch = holds_epoch
        self._held: dict[int, bool] = {}
        self._states = states
        self._decided = frozenset(decided)
        self._records: dict[int, EpochRecord | None] = {}
        self._chunks: dict[int, dict[str, Any]] = {}
        #: Participants of committed epochs found prepared: from a retained record
        #: (committable known) or from the archive (name only).
        self.roll_forward: dict[str, Committable | None] = {}

    def __contains__(self, name: object) -> bool:
        if self._named(name):
            return True
        # The caller is about to abort ``name``: a coordinator taken over since it
        # listed the states must not (the new owner may have decided it meanwhile).
        # FencedError stops the scan before that abort.
        self._store.check(self._lease)
        self._refuse_unknown_epoch_the_target_holds(name)
        return False

    def _refuse_unknown_epoch_the_target_holds(self, name: object) -> None:
        """An epoch the state never heard of (above its committed watermark, no record),
        which the target shows committed in part: the state is older than the target
        (restored from a copy) and lost that epoch's decision. Its prepared participants
        may be the rest of the decision: aborting them would leave the epoch half
        visible, so stop and say so."""
        ctx = parse_participant(name) if isinstance(name, str) else None
        if (ctx is None or self._holds_epoch is None or ctx.epoch <= self._watermark
                or ctx.epoch in self._states or ctx.epoch in self._given_up_in_part):
            return
        if ctx.epoch not in self._held:
            self._held[ctx.epoch] = self._holds_epoch(ctx.epoch)
        if self._held[ctx.epoch]:
            raise StateError(
                f"sink={self.sink_id} epoch={ctx.epoch}: the target holds part of this epoch "
                f"committed, but the txsink state at {self._store.location} has no decision "
                f"for it (it knows epochs up to {self._watermark}): the state is older than "
                "the target, restored from an older copy while this epoch was being "
                f"committed. Its prepared participant {name} may be the rest of that "
                "decision, so it is neither committed nor aborted. Restore the newest state "
                "(the one that decided this epoch): the next start then finishes the epoch. "
                "If the newest state has no decision for it either, it is a failed task "
                "attempt of a replay: `txsink resolve CHECKPOINT --epoch "
                f"{ctx.epoch} --abort` rolls it back",
                sink_id=self.sink_id, epoch=ctx.epoch, participant=str(name))

    def _named(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        if name in self._decided:
            return True
        ctx = parse_participant(name)
        if ctx is None or ctx.sink_id not in self._targets:
            return False
        target = self._targets[ctx.sink_id]
        state = self._states.get(ctx.epoch)
        if state is EpochState.COMMITTED:
            if ctx.epoch not in self._records:
                self._records[ctx.epoch] = self._store.get(ctx.epoch)
            record = self._records[ctx.epoch]
            if record is not None and record.state is EpochState.COMMITTED:
                for c in record.committables:
                    if c.participant == name:
                        self.roll_forward[name] = c
                        return True
                return False
        if state is not None:
            return False  # DECIDED ones are in ``decided``; RESERVED ones name nobody
        chunk = ctx.epoch // ARCHIVE_CHUNK
        if chunk not in self._chunks:
            self._chunks[chunk] = self._store.read_archive(chunk) or {}
        entry = dict(self._chunks[chunk].get("epochs", {})).get(str(ctx.epoch))
        key = [ctx.partition, ctx.attempt, *([target] if target else [])]
        if entry and key in entry.get("names", []):
            self.roll_forward[name] = None
            return True
        return False

    def __iter__(self) -> Iterator[str]:
        return iter(self._decided)

    def __len__(self) -> int:
        return len(self._decided)
