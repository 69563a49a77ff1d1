"""An in-memory backend that behaves like a system with real prepared transactions.

It exists to test the core: the coordinator, recovery and crash handling run
against it in microseconds. Like PostgreSQL it keeps a commit marker per
participant, so a re-commit after a crash can tell "committed" from "lost".
Systems are looked up by name so that two backend instances (a "writer" and a
"committer") share one system, as two processes share a database.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa

from txsink.backend import Backend, Capability, CommitOutcome, Transaction
from txsink.errors import ConfigError, ParticipantLostError, RetriableCommitError
from txsink.hookspecs import hookimpl
from txsink.model import Committable, DeliveryGuarantee, TransactionContext
from txsink.options import Options
from txsink.registry import BackendRegistry


@dataclass
class _Prepared:
    txn: str
    committable: Committable
    rows: list[dict[str, Any]]


@dataclass
class MemorySystem:
    """The "external system": prepared and committed participants, plus fault knobs."""

    prepared: dict[str, _Prepared] = field(default_factory=dict)
    #: Committed output in commit order: (participant, rows).
    output: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)
    #: (participant, txn) of every commit: the system's own commit marker.
    markers: set[tuple[str, str]] = field(default_factory=set)
    #: Participants the system aborted on its own (:meth:`expire`, like Kafka's
    #: transaction timeout) whose rows it still keeps, so they can be salvaged.
    aborted: dict[str, _Prepared] = field(default_factory=dict)
    #: Make the next N commit calls fail with a retriable error before doing anything.
    fail_next_commits: int = 0
    #: Called after a commit took effect and before it returns (simulates a lost reply).
    after_commit: Callable[[Committable], None] | None = None
    lock: threading.RLock = field(default_factory=threading.RLock)

    def rows(self) -> list[dict[str, Any]]:
        return [row for _, rows in self.output for row in rows]

    def expire(self, participant: str) -> None:
        """Abort a prepared participant on the system's own account (a timeout): it
        can no longer be committed, but its rows are kept until :meth:`forget`."""
        with self.lock:
            self.aborted[participant] = self.prepared.pop(participant)

    def forget(self, participant: str) -> None:
        """Drop the kept rows of an expired participant (retention ran)."""
        with self.lock:
            del self.aborted[participant]

    def snapshot(self) -> MemorySystem:
        """A copy of the system as it is now: what a standby or a backup holds."""
        with self.lock:
            return MemorySystem(dict(self.prepared), list(self.output), set(self.markers))

    def restore(self, snapshot: MemorySystem) -> None:
        """Become ``snapshot`` again, as a failover to that standby (or a restore) does:
        what was prepared then is prepared again, what was committed since is gone."""
        with self.lock:
            self.prepared = dict(snapshot.prepared)
            self.output = list(snapshot.output)
            self.markers = set(snapshot.markers)


SYSTEMS: dict[str, MemorySystem] = {}


def system(name: str) -> MemorySystem:
    return SYSTEMS.setdefault(name, MemorySystem())


class _MemoryTransaction(Transaction):
    def __init__(self, ctx: TransactionContext) -> None:
        super().__init__(ctx)
        self.txn = uuid.uuid4().hex
        self.buffer: list[dict[str, Any]] = []


class MemoryBackend(Backend):
    name: ClassVar[str] = "memory"
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {Capability.LIST_PREPARED, Capability.COMMIT_MARKER, Capability.SALVAGE}
    )
    guarantees: ClassVar[frozenset[DeliveryGuarantee]] = frozenset(DeliveryGuarantee)

    def __init__(self, system_name: str) -> None:
        self.system_name = system_name

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> MemoryBackend:
        opts = Options(options, owner="memory backend")
        name = opts.str("system", "default")
        opts.check_unknown()
        return cls(name)

    @property
    def system(self) -> MemorySystem:
        return system(self.system_name)

    def begin_transaction(self, ctx: TransactionContext) -> Transaction:
        return _MemoryTransaction(ctx)

    def write(self, txn: Transaction, batch: pa.RecordBatch) -> None:
        assert isinstance(txn, _MemoryTransaction)
        txn.buffer.extend(batch.to_pylist())
        txn.rows += batch.num_rows

    def pre_commit(self, txn: Transaction) -> Committable:
        assert isinstance(txn, _MemoryTransaction)
        c = Committable.for_context(self.name, txn.ctx, {"txn": txn.txn}, rows=txn.rows)
        with self.system.lock:
            if txn.ctx.participant in self.system.prepared:
                raise ConfigError(f"participant {txn.ctx.participant} is already prepared")
            self.system.prepared[txn.ctx.participant] = _Prepared(txn.txn, c, txn.buffer)
        return c

    def discard(self, txn: Transaction) -> None:
        assert isinstance(txn, _MemoryTransaction)
        txn.buffer = []

    def commit(self, committable: Committable) -> CommitOutcome:
        s = self.system
        txn = str(committable.payload["txn"])
        with s.lock:
            if s.fail_next_commits > 0:
                s.fail_next_commits -= 1
                raise RetriableCommitError(f"injected: cannot reach system for "
                                           f"{committable.participant}")
            p = s.prepared.get(committable.participant)
            if p is not None and p.txn == txn:
                del s.prepared[committable.participant]
                s.output.append((committable.participant, p.rows))
                s.markers.add((committable.participant, txn))
                outcome = CommitOutcome.COMMITTED
            elif (committable.participant, txn) in s.markers:
                outcome = CommitOutcome.ALREADY_COMMITTED
            else:
                raise ParticipantLostError(
                    f"participant {committable.participant} is neither prepared nor committed",
                    sink_id=committable.sink_id, epoch=committable.epoch,
                    participant=committable.participant)
        if s.after_commit is not None:
            s.after_commit(committable)
        return outcome

    def salvage(self, committable: Committable, ctx: TransactionContext) -> Committable:
        s = self.system
        with s.lock:
            p = s.aborted.get(committable.participant)
            if p is None or p.txn != committable.payload["txn"]:
                raise ParticipantLostError(
                    f"participant {committable.participant} was aborted and its rows are "
                    "gone", sink_id=committable.sink_id, epoch=committable.epoch,
                    participant=committable.participant)
            txn = _MemoryTransaction(ctx)
            txn.buffer = list(p.rows)
            txn.rows = len(p.rows)
        return self.pre_commit(txn)

    def holds_epoch(self, sink_id: str, epoch: int) -> bool:
        from txsink.model import parse_participant

        with self.system.lock:
            return any((ctx := parse_participant(name)) is not None
                       and ctx.sink_id == sink_id and ctx.epoch == epoch
                       for name, _ in self.system.markers)

    def highest_epoch(self, sink_id: str) -> int | None:
        from txsink.model import parse_participant

        with self.system.lock:
            epochs = [ctx.epoch for name, _ in self.system.markers
                      if (ctx := parse_participant(name)) is not None
                      and ctx.sink_id == sink_id]
        return max(epochs, default=-1)

    def is_committed(self, committable: Committable) -> bool | None:
        with self.system.lock:
            return (committable.participant, str(committable.payload["txn"])) in (
                self.system.markers)

    def abort(self, committable: Committable) -> None:
        s = self.system
        with s.lock:
            p = s.prepared.get(committable.participant)
            if p is not None and p.txn == committable.payload["txn"]:
                del s.prepared[committable.participant]

    def list_prepared(self, sink_id: str) -> Iterable[Committable]:
        with self.system.lock:
            return [p.committable for p in self.system.prepared.values()
                    if p.committable.sink_id == sink_id]


@hookimpl
def txsink_register_backends(registry: BackendRegistry) -> None:
    registry.add(MemoryBackend)
