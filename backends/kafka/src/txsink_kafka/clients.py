"""What the parts of the Kafka backend share: the driver's clients, kept per process.

The writer (executor side), the committer and recovery (driver side) and the admin
checks of one :class:`~txsink_kafka.backend.KafkaBackend` share one
:class:`SinkClients`; every backend of a process shares the driver clients of a
cluster (:class:`DriverClients`), so connections stay warm across the Spark adapter's
per-batch backends and marker scans go on where the last one stopped.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from txsink.errors import ConfigError, ServerUnavailableError, TxsinkError
from txsink.model import Committable
from txsink.redact import redact

from txsink_kafka import config as cfg
from txsink_kafka.markers import Marker
from txsink_kafka.retry import BrokerReadTimeout, is_transient, retry_transient
from txsink_kafka.txn_protocol import TxnCoordinatorClient, TxnProtocolError

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Message

log = logging.getLogger(__name__)

#: The backend's name, and the version of the committable payload its parts write.
NAME = "kafka"
#: 2 added ``ranges`` (per topic: ``[partition, first offset, last offset, records]``
#: of the participant's records, from its delivery reports: what a salvage reads back),
#: ``transaction_version`` (the transaction protocol the participant ran: 1, the
#: pre-KIP-890 one librdkafka and txsink's EndTxn speak) and
#: ``broker_transaction_version`` (the cluster's finalized ``transaction.version`` then).
PAYLOAD_VERSION = 2
#: The transaction protocol txsink's participants run (librdkafka has no KIP-890).
TRANSACTION_VERSION = 1


def decode_payload(version: int, payload: Mapping[str, Any]) -> Mapping[str, Any]:
    """A committable payload of any release, in this release's shape.

    Version 1 (before offsets were recorded) has no ``ranges`` (``None``: its records
    cannot be salvaged) and ran transaction version 1.
    """
    if version == PAYLOAD_VERSION:
        return payload
    if version == 1:
        return {"ranges": None, "transaction_version": TRANSACTION_VERSION,
                "broker_transaction_version": -1, **payload}
    from txsink.errors import StateError

    raise StateError(f"the kafka backend cannot read committable payload version {version} "
                     f"(this release reads 1 and {PAYLOAD_VERSION}); upgrade txsink-kafka")
#: Warn when a prepared transaction is older than this share of transaction.timeout.ms.
TIMEOUT_WARN_SHARE = 0.8


@dataclass
class ScanState:
    cursor: int | None = None
    open: dict[str, Marker] = field(default_factory=dict)
    #: The latest owner marker seen (claim_sink).
    owner: Marker | None = None
    #: Epochs with a participant ended as committed, among the markers scanned.
    committed_epochs: set[int] = field(default_factory=set)


class DriverClients:
    """Clients the driver side keeps for the life of a backend instance."""

    def __init__(self, config: cfg.KafkaSinkConfig) -> None:
        from confluent_kafka import Consumer, Producer

        self.config = config
        conn = config.connection()
        self.txn = TxnCoordinatorClient(conn, timeout_s=config.request_timeout_s)
        # Small request/response round trips: Nagle's delay would dominate them, and a
        # long-polling fetch would hold up the next request on the same connection.
        common = {"socket.nagle.disable": True, "fetch.wait.max.ms": 10,
                  **cfg.with_librdkafka_log(conn),
                  "group.id": "txsink-driver", "enable.auto.commit": False,
                  "enable.partition.eof": True, "auto.offset.reset": "earliest"}
        committed = {**common, "isolation.level": "read_committed"}
        uncommitted = {**common, "isolation.level": "read_uncommitted"}
        self.committed: Consumer = Consumer(committed)
        self.uncommitted: Consumer = Consumer(uncommitted)
        # Never assigned, so no fetch is ever in flight ahead of their ListOffsets.
        self.committed_offsets: Consumer = Consumer(committed)
        self.uncommitted_offsets: Consumer = Consumer(uncommitted)
        # One record per batch: Tansu reports a wrong end offset after larger batches.
        self.ends: Producer = Producer({"socket.nagle.disable": True,
                                        **cfg.with_librdkafka_log(conn),
                                        "enable.idempotence": True, "linger.ms": 0,
                                        "batch.num.messages": 1})
        self.scans: dict[str, ScanState] = {}
        self.partitions: int | None = None
        self.lock = threading.RLock()

    def close(self) -> None:
        try:
            self.ends.flush(self.config.request_timeout_s)
        finally:
            for consumer in (self.committed, self.uncommitted, self.committed_offsets,
                             self.uncommitted_offsets):
                consumer.close()
            self.txn.close()


class _ProcessClients:
    """The driver clients and the writers' coordinator clients of this process, by
    cluster connection: one lock, one exit hook, one place a fork resets."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.drivers: dict[tuple[Any, ...], DriverClients] = {}
        self.txn_clients: dict[tuple[Any, ...], TxnCoordinatorClient] = {}
        #: Connection keys whose brokers answered that they cannot describe transactions.
        self.no_describe: set[tuple[Any, ...]] = set()
        #: The cluster's finalized transaction.version, by connection key (asked once).
        self.transaction_versions: dict[tuple[Any, ...], int] = {}
        self._atexit = False
        #: Clients a forked child inherited: referenced so that they are never destroyed.
        self.inherited: list[Any] = []

    def _at_exit(self) -> None:
        if not self._atexit:
            atexit.register(close_driver_clients)
            self._atexit = True

    def driver(self, config: cfg.KafkaSinkConfig) -> DriverClients:
        key = connection_key(config)
        with self.lock:
            driver = self.drivers.get(key)
            if driver is None:
                check_hosts(config.bootstrap)
                try:
                    driver = retry_transient(lambda: DriverClients(config),
                                             what=f"Kafka at {config.bootstrap}: driver clients",
                                             bound_s=config.retry_bound_s,
                                             redact=lambda t: redact(t, config.secrets))
                except TxnProtocolError as exc:
                    said = redact(str(exc), config.secrets)
                    if is_transient(exc):
                        # Retried for the whole bound: down or unreachable, not a wrong
                        # setting (`txsink resolve` and a claim start here, no preflight).
                        raise ServerUnavailableError(
                            f"kafka sink: Kafka at {config.bootstrap!r} is down or "
                            "unreachable (option 'kafka.bootstrap.servers'), retried for up "
                            f"to {config.retry_bound_s:g}s (unavailable.retry.s): {said}",
                            field="kafka.bootstrap.servers") from None
                    raise ConfigError(said, field="kafka.bootstrap.servers") from None
                self._at_exit()
                self.drivers[key] = driver
            return driver

    def txn_client(self, config: cfg.KafkaSinkConfig) -> TxnCoordinatorClient:
        """A coordinator client for writers: one per process and cluster, reused by tasks
        (the driver's own, where this process has one)."""
        key = connection_key(config)
        with self.lock:
            driver = self.drivers.get(key)
            if driver is not None:
                return driver.txn
            client = self.txn_clients.get(key)
            if client is None:
                client = TxnCoordinatorClient(config.connection(),
                                              timeout_s=config.request_timeout_s)
                self._at_exit()
                self.txn_clients[key] = client
            return client

    def broker_transaction_version(self, config: cfg.KafkaSinkConfig) -> int:
        """The cluster's finalized ``transaction.version`` (0 where the cluster has none,
        e.g. Kafka 3.9; -1 when it could not be asked), once per process and cluster."""
        key = connection_key(config)
        known = self.transaction_versions.get(key)
        if known is not None:
            return known
        try:
            level = self.txn_client(config).finalized_features().get("transaction.version", 0)
        except TxnProtocolError as exc:  # recorded as unknown; not asked again
            log.debug("asking Kafka at %s for its transaction.version failed: %s",
                      config.bootstrap, redact(str(exc), config.secrets))
            level = -1
        with self.lock:
            self.transaction_versions[key] = level
        return level

    def forget_inherited(self) -> None:
        """In a forked child: drop the parent's clients without using or closing them.

        A fork copies the clients but not kafka-python's IO threads, so a request
        through an inherited client waits for ever (seen in the chaos driver, which
        forks its writer tasks after its coordinator has talked to the broker); the
        sockets are the parent's to close. They are kept referenced, never destroyed:
        destroying a librdkafka handle whose threads stayed in the parent crashes the
        child. The lock may have been held by another thread at the fork.
        """
        self.lock = threading.Lock()
        self.inherited.extend([*self.drivers.values(), *self.txn_clients.values()])
        self.drivers.clear()
        self.txn_clients.clear()
        self.no_describe.clear()
        self.transaction_versions.clear()

    def close(self) -> None:
        with self.lock:
            drivers = list(self.drivers.values())
            clients = list(self.txn_clients.values())
            self.drivers.clear()
            self.txn_clients.clear()
            self.no_describe.clear()
        for client in clients:
            client.close()
        for driver in drivers:
            try:
                driver.close()
            except Exception:  # pragma: no cover - best effort at shutdown
                log.debug("closing Kafka driver clients failed", exc_info=True)


PROCESS = _ProcessClients()
os.register_at_fork(after_in_child=lambda: PROCESS.forget_inherited())


def close_driver_clients() -> None:
    """Close this process's driver and coordinator clients (at exit, between tests)."""
    PROCESS.close()


def check_hosts(bootstrap: str, sink_id: str | None = None) -> None:
    """A bootstrap list none of whose hosts resolves is a configuration error, at once."""
    import socket

    hosts = []
    for server in bootstrap.split(","):
        address = server.strip().split("://")[-1]
        host = address.rpartition(":")[0] or address
        hosts.append(host.strip("[]"))
    problems = []
    for host in hosts:
        try:
            socket.getaddrinfo(host, None)
            return
        except (socket.gaierror, UnicodeError) as exc:
            problems.append(f"{host!r}: {exc}")
    raise ConfigError(f"kafka sink: option 'kafka.bootstrap.servers' names no host that "
                      f"resolves ({'; '.join(problems)}); check the host names",
                      field="kafka.bootstrap.servers", sink_id=sink_id)


def connection_key(config: cfg.KafkaSinkConfig) -> tuple[Any, ...]:
    return (tuple(sorted(config.connection().items())), config.request_timeout_s)


def read_range(consumer: Consumer, topic: str, partition: int, start: int, end: int | None,
                timeout_s: float) -> Iterator[Message]:
    """Records of one partition from ``start`` until ``end`` (exclusive) or its end.

    ``end=None`` reads to the end the fetch reports (Tansu 0.6 answers ListOffsets
    with the base offset of the last batch plus one, too low after a batch of
    several records, so scans do not trust it).
    """
    from confluent_kafka import KafkaError, TopicPartition

    if end is not None and start >= end:
        return
    consumer.assign([TopicPartition(topic, partition, start)])
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            # poll(), not consume(n): consume waits for n records or the whole timeout.
            msg = consumer.poll(0.5)
            if msg is not None:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        return
                    raise TxsinkError(f"reading {topic}[{partition}] failed: {err.str()}")
                yield msg
                offset = msg.offset()
                if end is not None and offset is not None and offset >= end - 1:
                    return
        raise BrokerReadTimeout(f"reading {topic}[{partition}] offsets {start}..{end} did "
                                f"not finish within {timeout_s:.0f}s")
    finally:
        consumer.unassign()


#: Longest single offsets query in :func:`watermarks` before the metadata is refreshed.
WATERMARK_TRY_S = 5.0


def watermarks(consumer: Consumer, topic: str, partition: int,
               timeout_s: float) -> tuple[int, int]:
    """``(low, high)`` of ``topic[partition]`` asked of its leader now
    (``get_watermark_offsets(cached=False)``; the high mark is the last stable offset
    for a ``read_committed`` consumer), riding out a leader move within ``timeout_s``.

    librdkafka does not refresh the metadata of a partition the consumer is not
    assigned: once its leader died, every later query of it timed out or answered
    "Unknown partition", for minutes, also after the node was back (found by the
    failover chaos on a three-node Apache Kafka 4.4 cluster, librdkafka 2.16). So a
    failed query is followed by a metadata request for the topic, which teaches
    librdkafka the new leader, and tried again. A topic that does not exist fails at
    once.
    """
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition),
                max(0.1, min(deadline - time.monotonic(), WATERMARK_TRY_S)), cached=False)
            return int(low), int(high)
        except KafkaException:
            if time.monotonic() >= deadline:
                raise
            try:
                md = consumer.list_topics(topic, timeout=max(
                    0.1, min(deadline - time.monotonic(), WATERMARK_TRY_S)))
            except KafkaException:
                continue
            tmd = md.topics.get(topic)
            error = tmd.error if tmd is not None else None
            if tmd is None or (error is not None
                               and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
                raise


def warn_near_timeout(c: Committable) -> float:
    """The age of ``c``'s transaction; a WARNING once it nears its timeout."""
    prepared_at = float(c.payload.get("began_at") or c.payload.get("prepared_at") or 0)
    timeout_ms = int(c.payload.get("transaction_timeout_ms", 0) or 0)
    age = time.time() - prepared_at if prepared_at else 0.0
    if timeout_ms and age * 1000 > TIMEOUT_WARN_SHARE * timeout_ms:
        log.warning("sink=%s epoch=%d partition=%d participant=%s: open for %.0fs, "
                    "%.0f%% of transaction.timeout.ms=%d; the broker aborts it at the "
                    "timeout (data at risk): raise kafka.transaction.timeout.ms",
                    c.sink_id, c.epoch, c.partition, c.participant, age,
                    100 * age * 1000 / timeout_ms, timeout_ms)
    return age


class SinkClients:
    """What the writer, committer, recovery and admin parts of one backend share."""

    def __init__(self, config: cfg.KafkaSinkConfig) -> None:
        self.config = config
        self._driver: DriverClients | None = None
        #: The process ``_driver`` belongs to: a forked child must not use it.
        self._driver_pid = os.getpid()
        #: Partitions of the marker topic, once a part has looked.
        self.marker_partitions: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config, "_driver": None, "_driver_pid": -1,
                "marker_partitions": self.marker_partitions}

    def redact(self, text: str) -> str:
        return redact(text, self.config.secrets)

    def driver(self) -> DriverClients:
        """Driver-side clients, shared by every backend instance of this process.

        The Spark adapter builds a backend per micro-batch and closes it after the
        commit; sharing the clients keeps connections warm and lets orphan scans
        continue where the previous one stopped instead of rereading the tail.
        """
        if self._driver is None or self._driver_pid != os.getpid():
            self._driver = PROCESS.driver(self.config)
            self._driver_pid = os.getpid()
        return self._driver

    def txn_client(self) -> TxnCoordinatorClient:
        return PROCESS.txn_client(self.config)

    def close(self) -> None:
        driver, self._driver = self._driver, None
        if driver is not None:
            with driver.lock:
                driver.ends.flush(self.config.request_timeout_s)
