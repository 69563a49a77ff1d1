"""What every part of a sink's coordinator shares: one sink, its targets, its state.

The coordinator is three parts that each answer one kind of question:

* :mod:`~txsink.coordinator.identity`: which write an epoch number belongs to ("is
  this write a replay of that one?") and which numbers are free for a new write;
* :mod:`~txsink.coordinator.decision`: deciding an epoch and driving it to COMMITTED;
* :mod:`~txsink.coordinator.recovery`: what a crash left behind (DECIDED epochs,
  orphans, stale reservations, participants a failover brought back).

They all work on one :class:`Sink`: the backend (or group of targets), the state
store and its lease, and the run's settings. :class:`~txsink.coordinator.Coordinator`
is a :class:`Sink` and wires the parts together.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from txsink.backend import Backend
from txsink.decisions import DEFAULT_ARCHIVE_RETENTION_S
from txsink.faults import FaultInjector
from txsink.group import TargetGroup
from txsink.model import Committable, DeliveryGuarantee, RecoveryReport, validate_sink_id
from txsink.plugins import Plugins, get_plugins
from txsink.state import EpochState, Lease, SinkMeta, StateStore, new_owner_token


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff for commits of decided participants."""

    attempts: int = 5
    initial_backoff_s: float = 0.2
    max_backoff_s: float = 5.0
    sleep: Callable[[float], None] = time.sleep


class Sink:
    """One sink's backend, state and settings, as one run of its coordinator holds them.

    :param owner: identifies this coordinator run for fencing; two coordinators with
        different owners on the same state cannot both write.
    :param scan_orphans: abort orphans of epochs up to each committed epoch right
        after committing it (task retries and speculative attempts leave some).
    """

    def __init__(
        self,
        backend: Backend,
        store: StateStore,
        sink_id: str,
        *,
        backend_options: Mapping[str, str] | None = None,
        owner: str | None = None,
        plugins: Plugins | None = None,
        retry: RetryPolicy | None = None,
        retain_epochs: int = 100,
        scan_orphans: bool = True,
        faults: FaultInjector | None = None,
        guarantee: DeliveryGuarantee = DeliveryGuarantee.EXACTLY_ONCE,
        archive_retention_s: float = DEFAULT_ARCHIVE_RETENTION_S,
    ) -> None:
        self.guarantee = guarantee
        self.archive_retention_s = archive_retention_s
        self.backend = backend
        self.store = store
        self.sink_id = validate_sink_id(sink_id)
        self.owner = owner or new_owner_token()
        self.plugins = plugins if plugins is not None else get_plugins()
        self.retry = retry or RetryPolicy()
        self.retain_epochs = retain_epochs
        self.scan_orphans = scan_orphans
        self.faults = faults if faults is not None else FaultInjector.from_env()
        self._options = dict(backend_options or {})
        self._lease: Lease | None = None
        #: The metadata as this run last wrote or checked it (the store's copy wins).
        self.cached_meta: SinkMeta | None = None
        #: The group of targets this coordinator drives, if it drives one.
        self.group = backend if isinstance(backend, TargetGroup) else None
        #: Whether this run commits the streaming sink's micro-batches, and of which
        #: Spark query (set by ``start``).
        self.stream = False
        self.query_id: str | None = None

    # -- what the facade provides ---------------------------------------------------------

    def start(self, *, recover: bool = True, up_to_epoch: int | None = None,
              query_id: str | None = None, stream: bool = False) -> RecoveryReport:
        """Take the lease and bind the state to this sink (the facade implements it)."""
        raise NotImplementedError

    def abort_orphans(self, up_to_epoch: int | None,
                      states: Mapping[int, EpochState] | None = None,
                      *, reclaim_stale: bool = False) -> list[Committable]:
        """Abort prepared participants no decision holds (recovery implements it)."""
        raise NotImplementedError

    def prune(self, states: Mapping[int, EpochState]) -> None:
        """Drop old COMMITTED records (recovery implements it)."""
        raise NotImplementedError

    # -- shared ---------------------------------------------------------------------------

    @property
    def lease(self) -> Lease:
        if self._lease is None:
            self.start(recover=False)
        assert self._lease is not None
        return self._lease

    def meta(self) -> SinkMeta:
        """The state's metadata (this run's copy if the store has none yet)."""
        meta = self.store.read_meta() or self.cached_meta
        assert meta is not None
        return meta

    def sink_ids(self) -> dict[str, str | None]:
        """The sink id of each target (``None`` for a sink with one target)."""
        if self.group is None:
            return {self.sink_id: None}
        return {m.sink_id: m.name for m in self.group.members.values()}

    def belongs(self, c: Committable) -> bool:
        """Whether ``c`` is a participant of this sink (of one of its targets)."""
        if self.group is None:
            return (c.sink_id == self.sink_id and c.backend == self.backend.name
                    and c.target is None)
        m = self.group.members.get(c.target or "")
        return m is not None and c.sink_id == m.sink_id and c.backend == m.backend.name
