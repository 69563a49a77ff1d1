"""The Kafka backend: transactional producers on executors, committed by the driver.

This module wires the protocol's halves, as Flink's Kafka connector separates its
writer from its committer: :mod:`~txsink_kafka.writer` (executor side: producers,
delivery reports, pooled ids), :mod:`~txsink_kafka.committer` (driver side: EndTxn,
the commit-marker confirmation, aborts), :mod:`~txsink_kafka.recovery` (marker scans,
ListTransactions, orphan fencing), :mod:`~txsink_kafka.salvage` (writing again what the
broker aborted after a decision) and :mod:`~txsink_kafka.admin` (preflight, topics,
claims). They share one :class:`~txsink_kafka.clients.SinkClients`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from txsink.backend import Backend, Capability, CommitOutcome, Transaction
from txsink.errors import ParticipantLostError
from txsink.model import Committable, DeliveryGuarantee, TransactionContext

from txsink_kafka import config as cfg
from txsink_kafka.admin import KafkaAdmin
from txsink_kafka.clients import (
    NAME,
    PAYLOAD_VERSION,
    DriverClients,
    SinkClients,
    check_hosts,
    close_driver_clients,
    decode_payload,
)
from txsink_kafka.committer import KafkaCommitter, MarkerHiddenError, MarkerStatus
from txsink_kafka.markers import Marker
from txsink_kafka.naming import SinkIds, participant_id
from txsink_kafka.recovery import KafkaRecovery
from txsink_kafka.retry import retry_transient
from txsink_kafka.salvage import KafkaSalvage
from txsink_kafka.txn_protocol import ProducerIdentity, TransactionInfo
from txsink_kafka.writer import (
    PRODUCER_COUNTS,
    KafkaWriter,
    close_kept_producers,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from txsink.realtime import RealtimeTargetSpec
    from txsink.realtime.source import SourceTopics

T = TypeVar("T")
log = logging.getLogger(__name__)

__all__ = ["PRODUCER_COUNTS", "KafkaBackend", "MarkerStatus", "check_hosts",
           "close_kept_producers", "close_shared_clients"]


def close_shared_clients() -> None:
    """Close the driver clients and kept producers of this process (at exit, or
    between tests)."""
    close_kept_producers()
    close_driver_clients()


class KafkaBackend(Backend):
    """Exactly-once output to Kafka for ``read_committed`` consumers."""

    name: ClassVar[str] = NAME
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {Capability.COMMIT_FROM_ANY_PROCESS, Capability.COMMIT_MARKER,
         Capability.SURVIVES_RESTART, Capability.SALVAGE})
    secret_options: ClassVar[frozenset[str]] = cfg.SECRET_OPTIONS
    connect_retry_option: ClassVar[str | None] = "unavailable.retry.s"
    payload_version: ClassVar[int] = PAYLOAD_VERSION
    #: at_least_once / none: the task commits its own transaction (finish_in_task).
    guarantees: ClassVar[frozenset[DeliveryGuarantee]] = frozenset(DeliveryGuarantee)

    def __init__(self, config: cfg.KafkaSinkConfig) -> None:
        self.config = config
        self.shared = SinkClients(config)
        self.writer = KafkaWriter(self.shared)
        self.committer = KafkaCommitter(self.shared, self.decode_payload)
        self.recovery = KafkaRecovery(self.shared, self.committer)
        self.salvager = KafkaSalvage(self.shared, self.writer, self.committer)
        self.admin = KafkaAdmin(self.shared, self.recovery)

    # -- configuration ------------------------------------------------------------------

    @classmethod
    def realtime_target(cls, sink_id: str, options: Mapping[str, str]) -> RealtimeTargetSpec:
        """The Real-time Mode target (idempotent by source position; docs/realtime.md)."""
        from txsink_kafka.realtime import KafkaRealtimeSpec

        return KafkaRealtimeSpec(sink_id, options)

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> KafkaBackend:
        return cls(cfg.parse(options))

    @classmethod
    def trigger_options(cls, interval_ms: int) -> Mapping[str, str]:
        # Lets check_timeout compare transaction.timeout.ms with the pipeline's trigger.
        return {"trigger.interval.ms": str(interval_ms)}

    @classmethod
    def target_options(cls) -> Mapping[str, str]:
        # A group's readers stop at its consistent cut by the epoch of each record.
        return {"epoch.header": "true"}

    def __getstate__(self) -> dict[str, Any]:
        # The parts hold only the config and the shared clients (which pickle without
        # their connections): rebuilt from those on the executor.
        return {"config": self.config, "shared": self.shared}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.config = state["config"]
        self.shared = state["shared"]
        self.writer = KafkaWriter(self.shared)
        self.committer = KafkaCommitter(self.shared, self.decode_payload)
        self.recovery = KafkaRecovery(self.shared, self.committer)
        self.salvager = KafkaSalvage(self.shared, self.writer, self.committer)
        self.admin = KafkaAdmin(self.shared, self.recovery)

    def feeds(self, source: SourceTopics) -> bool:
        """The stream reads this target's topic (``subscribe``, a ``subscribePattern``
        matching it, an ``assign`` naming it) on the same brokers, under any alias. A
        target whose topic comes from each row's ``topic`` column cannot be judged."""
        from txsink.realtime.places import endpoints, share_endpoint

        topic = self.config.topic
        if not topic or not source.reads(topic):
            return False
        return share_endpoint(endpoints(self.config.bootstrap, "9092"),
                              endpoints(source.servers(), "9092"))

    def participant_timeout_s(self) -> float | None:
        """The broker aborts a prepared transaction after ``transaction.timeout.ms``."""
        return self.config.transaction_timeout_ms / 1000

    def describe(self) -> str:
        topic = self.config.topic or "<topic column>"
        return f"kafka {self.config.bootstrap} topic={topic} (read with read_committed)"

    def secret_values(self) -> list[str]:
        return list(self.config.secrets)

    @classmethod
    def destination(cls, options: Mapping[str, str]) -> dict[str, str]:
        # The topic (empty: each row's topic column) and the marker topic recovery reads
        # decisions from. Not the bootstrap servers: another list of brokers of the same
        # cluster (one added, one replaced) is a legitimate change, and a list alone
        # cannot tell it from another cluster.
        return {"topic": str(options.get("topic") or ""),
                "marker.topic": str(options.get("marker.topic") or "txsink-markers")}

    def safe_options(self, options: Mapping[str, str]) -> dict[str, str]:
        # By name, not only the listed keys: every SASL/SSL/OAuth secret stays out.
        return {k: v for k, v in super().safe_options(options).items()
                if not cfg.is_secret_key(k)}

    def transactional_id(self, ctx: TransactionContext) -> str:
        """The id of ``ctx`` under the ``participant`` naming (pooled ids are probed)."""
        return participant_id(self.config.transactional_id_prefix, ctx)

    def sink_ids(self, sink_id: str) -> SinkIds:
        return SinkIds(self.config.transactional_id_prefix, sink_id)

    def driver(self) -> DriverClients:
        return self.shared.driver()

    def check_settings(self, sink_id: str) -> None:
        """librdkafka's own check of every ``kafka.*`` setting (no broker needed)."""
        self.admin.check_settings(sink_id)

    def preflight(self, sink_id: str) -> None:
        self.admin.preflight(sink_id)

    def claim_sink(self, sink_id: str, state_id: str, state_location: str) -> None:
        self.admin.claim_sink(sink_id, state_id, state_location)

    def check_claim(self, sink_id: str, state_id: str, state_location: str) -> None:
        self.admin.check_claim(sink_id, state_id, state_location)

    def close(self) -> None:
        self.shared.close()

    # -- executor side ------------------------------------------------------------------

    def begin_transaction(self, ctx: TransactionContext) -> Transaction:
        return self.writer.begin_transaction(ctx)

    def write(self, txn: Transaction, batch: pa.RecordBatch) -> None:
        self.writer.write(txn, batch)

    def pre_commit(self, txn: Transaction) -> Committable:
        return self.writer.pre_commit(txn)

    def finish_in_task(self, txn: Transaction, guarantee: DeliveryGuarantee) -> Committable:
        return self.writer.finish_in_task(txn, guarantee)

    def discard(self, txn: Transaction) -> None:
        self.writer.discard(txn)

    # -- driver side --------------------------------------------------------------------

    def commit(self, committable: Committable) -> CommitOutcome:
        try:
            return self.committer.commit(committable)
        except MarkerHiddenError:
            # Its begin marker waits for another transaction to end (another sink's on
            # a shared marker topic, open until its timeout if that sink's driver is
            # gone): the records' control records are read uncommitted.
            if not self.salvager.committed_in_log(committable):
                raise
            log.info("%s: its marker is behind a transaction still open on the marker "
                     "partition; its records show its transaction committed",
                     committable.describe())
            return CommitOutcome.ALREADY_COMMITTED
        except ParticipantLostError:
            # Its markers may be gone (compaction keeps one per pooled id): the
            # records' own control records say whether it was committed.
            try:
                committed = self.salvager.committed_in_log(committable)
            except Exception as exc:  # the loss stands, with why it was not checked
                log.warning("%s: reading its records to check the commit failed: %s",
                            committable.describe(), self.shared.redact(str(exc)))
                committed = False
            if not committed:
                raise
            log.info("%s: its begin and end markers are gone from the marker topic "
                     "(compacted after its pooled id was used again); its records show "
                     "its transaction committed", committable.describe())
            return CommitOutcome.ALREADY_COMMITTED

    def abort(self, committable: Committable) -> None:
        self.committer.abort(committable)

    def salvage(self, committable: Committable, ctx: TransactionContext) -> Committable:
        return self.salvager.salvage(committable, ctx)

    def decode_payload(self, version: int, payload: Mapping[str, Any]) -> Mapping[str, Any]:
        """Versions 1 (no offsets recorded) and 2 (see :data:`PAYLOAD_VERSION`)."""
        return decode_payload(version, payload)

    # The driver's reads and orphan aborts wait for a broker that is away (a restart, a
    # leader moving) within unavailable.retry.s, as commits do: each is a scan that can
    # start over (abort_orphans ends what it finds and fences only current epochs).

    def _riding_out(self, what: str, action: Callable[[], T]) -> T:
        return retry_transient(action, what=what, bound_s=self.config.retry_bound_s,
                               redact=self.shared.redact)

    def list_prepared(self, sink_id: str) -> list[Committable]:
        return self._riding_out(f"sink={sink_id}: listing prepared participants",
                                lambda: self.recovery.list_prepared(sink_id))

    def abort_orphans(self, sink_id: str, protected: Collection[str],
                      up_to_epoch: int | None = None) -> list[Committable]:
        return self._riding_out(
            f"sink={sink_id}: aborting orphans",
            lambda: self.recovery.abort_orphans(sink_id, protected, up_to_epoch))

    def open_transactions(self, sink_id: str) -> list[Mapping[str, Any]]:
        return self._riding_out(f"sink={sink_id}: listing open transactions",
                                lambda: self.recovery.open_transactions(sink_id))

    def broker_transactions(self, sink_id: str) -> dict[str, TransactionInfo] | None:
        return self.recovery.broker_transactions(sink_id)

    def open_markers(self, sink_id: str) -> dict[str, Marker]:
        # The scan itself waits for a broker that is away (its internal callers too).
        return self.recovery.open_markers(sink_id)

    def holds_epoch(self, sink_id: str, epoch: int) -> bool:
        return self.recovery.holds_epoch(sink_id, epoch)

    def highest_epoch(self, sink_id: str) -> int | None:
        return self.recovery.highest_epoch(sink_id)

    def is_committed(self, committable: Committable) -> bool | None:
        return self._riding_out(f"{committable.describe()}: checking whether it is committed",
                                lambda: self.committer.is_committed(committable)
                                or self.salvager.committed_in_log(committable))

    def payload(self, c: Committable) -> tuple[str, ProducerIdentity, tuple[str, int, int]]:
        return self.committer.payload(c)

    def epoch_committed(self, sink_id: str, epoch: int,
                        committables: Sequence[Committable]) -> None:
        """Nothing to publish: each participant's end marker is its commit record."""
