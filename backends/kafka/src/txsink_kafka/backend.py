"""The Kafka backend: transactional producers on executors, committed by the driver.

Executor: ``begin_transaction`` creates a librdkafka producer with a
``transactional.id`` from :mod:`txsink_kafka.naming` (by default a pooled id of the
write partition that has no open transaction), writes the participant's marker
record first (see :mod:`txsink_kafka.markers`), streams rows, and ``pre_commit``
flushes, reads the producer id and epoch librdkafka acquired, and closes the
producer **without aborting**: the transaction stays open on the broker, invisible
to ``read_committed`` readers.

Driver: ``commit`` sends ``EndTxn(commit)`` for that producer id and epoch (Flink's
``resumeTransaction``) through :mod:`txsink_kafka.txn_protocol`; ``abort`` sends
``EndTxn(abort)`` or fences the id with ``InitProducerId``; orphans are found by
scanning the sink's marker partition for participants that began and never ended,
checked against the coordinators' own list (ListTransactions) where the broker
has it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import sys
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from txsink.backend import Backend, Capability, CommitOutcome, Transaction
from txsink.errors import (
    ConfigError,
    FatalCommitError,
    FencedError,
    ParticipantLostError,
    RetriableCommitError,
    SinkOwnedError,
    TxsinkError,
)
from txsink.model import Committable, DeliveryGuarantee, TransactionContext, participant_name
from txsink.redact import redact

from txsink_kafka import config as cfg
from txsink_kafka.claims import Claim, owner_key, owner_of
from txsink_kafka.markers import (
    ABORTED,
    BEGIN,
    COMMITTED,
    END,
    OWNER,
    Marker,
    marker_partition,
)
from txsink_kafka.naming import (
    SinkIds,
    acquire_pooled_id,
    participant_id,
    preflight_id,
)
from txsink_kafka.retry import BrokerReadTimeout, retry_transient
from txsink_kafka.txn_protocol import (
    ConnectionDroppedError,
    EndTxnResult,
    ProducerIdentity,
    TransactionInfo,
    TxnCoordinatorClient,
    TxnProtocolError,
    UnsupportedByBrokerError,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from confluent_kafka import Consumer, KafkaError, Message, Producer

log = logging.getLogger(__name__)

_PID_RE = re.compile(r"Acquired PID\{Id:(-?\d+),Epoch:(-?\d+)\}")
#: Warn when a prepared transaction is older than this share of transaction.timeout.ms.
TIMEOUT_WARN_SHARE = 0.8


class _PidCapture(logging.Handler):
    """Reads the producer id and epoch from librdkafka's ``eos`` debug log.

    librdkafka has no API that returns them; its debug line
    ``Acquired PID{Id:N,Epoch:M}`` is the one place it says them.
    """

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.identity: ProducerIdentity | None = None

    def emit(self, record: logging.LogRecord) -> None:
        match = _PID_RE.search(record.getMessage())
        if match:
            self.identity = ProducerIdentity(int(match[1]), int(match[2]))


class _WriterProducer:
    """A writer's transactional producer, and where its callbacks report to.

    librdkafka binds the delivery callback and the logger when the producer is made;
    both go through this object, so that one producer can serve several transactions
    in turn (at_least_once / none keep it between tasks, see :func:`_keep_producer`).
    """

    def __init__(self, key: tuple[Any, ...], transactional_id: str) -> None:
        self.key = key
        self.transactional_id = transactional_id
        self.capture = _PidCapture()
        self.producer: Producer | None = None
        self.txn: _KafkaTransaction | None = None
        self.marker_partition: int | None = None

    def on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if self.txn is not None:
            self.txn.on_delivery(err, msg)


class _KafkaTransaction(Transaction):
    def __init__(self, ctx: TransactionContext, transactional_id: str) -> None:
        super().__init__(ctx)
        self.transactional_id = transactional_id
        self.producer: Producer | None = None
        self.holder: _WriterProducer | None = None
        #: Whether the producer came from this worker's cache (no init_transactions).
        self.reused = False
        #: The open in the background (begin_transaction) and what it raised.
        self.opening: threading.Thread | None = None
        self.open_error: BaseException | None = None
        #: How long the open took (id probe, producer, marker), and how long the task
        #: waited for it.
        self.open_ms = 0.0
        self.open_wait_ms = 0.0
        self.capture = _PidCapture()
        self.errors: list[str] = []
        self.fatal = False
        self.topics: set[str] = set()
        self.marker_topic = ""
        self.marker_partition = 0
        self.marker_offset = -1
        #: The broker's transaction timeout runs from the first record, not the flush.
        self.began_at = time.time()

    def on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None and len(self.errors) < 10:
            from confluent_kafka import KafkaError

            self.errors.append(f"{msg.topic()}: {err.str()}")
            # A record refused for an old producer epoch: another producer
            # initialised the id since (its transaction was aborted by it).
            if err.fatal() or "fence" in err.str().lower() or err.code() in (
                    KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                    KafkaError.INVALID_PRODUCER_EPOCH):
                self.fatal = True


def _raised() -> BaseException:
    """What the ``except:`` clause around it caught, as an exception.

    confluent-kafka sometimes raises a bare ``KafkaError``, which is no exception class
    (seen for a fenced producer's flush in a thread other than the main one): only a
    bare ``except:`` catches it, and it is wrapped in a ``KafkaException`` here.
    """
    from confluent_kafka import KafkaException

    caught = sys.exc_info()[1]
    if isinstance(caught, BaseException):
        return caught
    return KafkaException(caught)


class MarkerStatus:
    VISIBLE = "visible"  # committed (Tansu: or aborted, see docs)
    HIDDEN = "hidden"  # at or above the last stable offset: open, or behind an open one
    MISSING = "missing"  # below the last stable offset yet not readable: aborted


@dataclass
class _ScanState:
    cursor: int | None = None
    open: dict[str, Marker] = field(default_factory=dict)
    #: The latest owner marker seen (claim_sink).
    owner: Marker | None = None


class _DriverClients:
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
        self.scans: dict[str, _ScanState] = {}
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


_DRIVERS: dict[tuple[Any, ...], _DriverClients] = {}
_DRIVERS_LOCK = threading.Lock()


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


def _shared_driver(config: cfg.KafkaSinkConfig) -> _DriverClients:
    key = _connection_key(config)
    with _DRIVERS_LOCK:
        driver = _DRIVERS.get(key)
        if driver is None:
            check_hosts(config.bootstrap)
            try:
                driver = retry_transient(lambda: _DriverClients(config),
                                         what=f"Kafka at {config.bootstrap}: driver clients",
                                         bound_s=config.retry_bound_s,
                                         redact=lambda t: redact(t, config.secrets))
            except TxnProtocolError as exc:
                raise ConfigError(redact(str(exc), config.secrets),
                                  field="kafka.bootstrap.servers") from None
            if not _DRIVERS and not _TXN_CLIENTS:
                atexit.register(close_shared_clients)
            _DRIVERS[key] = driver
        return driver


_TXN_CLIENTS: dict[tuple[Any, ...], TxnCoordinatorClient] = {}
#: Connection keys whose brokers answered that they cannot describe transactions.
_NO_DESCRIBE: set[tuple[Any, ...]] = set()


def _connection_key(config: cfg.KafkaSinkConfig) -> tuple[Any, ...]:
    return (tuple(sorted(config.connection().items())), config.request_timeout_s)


def _shared_txn_client(config: cfg.KafkaSinkConfig) -> TxnCoordinatorClient:
    """A coordinator client for writers: one per process and cluster, reused by tasks."""
    key = _connection_key(config)
    with _DRIVERS_LOCK:
        driver = _DRIVERS.get(key)
        if driver is not None:
            return driver.txn
        client = _TXN_CLIENTS.get(key)
        if client is None:
            client = TxnCoordinatorClient(config.connection(),
                                          timeout_s=config.request_timeout_s)
            if not _DRIVERS and not _TXN_CLIENTS:
                atexit.register(close_shared_clients)
            _TXN_CLIENTS[key] = client
        return client


#: Producers of finished at_least_once / none tasks, idle (no open transaction), by
#: producer settings and transactional id, least recently used first.
_PRODUCERS: OrderedDict[tuple[Any, ...], _WriterProducer] = OrderedDict()
_PRODUCERS_LOCK = threading.Lock()
#: How many producers a worker keeps: one per pooled id it wrote with lately.
MAX_KEPT_PRODUCERS = 8
#: ``init_transactions`` (a new producer) and ``reused`` (a kept one) per process, for
#: tests and benchmarks.
PRODUCER_COUNTS: Counter[str] = Counter()


def _take_producer(key: tuple[Any, ...]) -> _WriterProducer | None:
    """This process's kept producer for ``key``, taken out so no other task uses it."""
    with _PRODUCERS_LOCK:
        return _PRODUCERS.pop(key, None)


def _keep_producer(holder: _WriterProducer) -> None:
    """Keep an idle producer for the next task; the least recently used beyond
    :data:`MAX_KEPT_PRODUCERS` is closed."""
    holder.txn = None
    with _PRODUCERS_LOCK:
        evicted = _PRODUCERS.pop(holder.key, None)
        _PRODUCERS[holder.key] = holder
        while len(_PRODUCERS) > MAX_KEPT_PRODUCERS:
            _, oldest = _PRODUCERS.popitem(last=False)
            _drop_producer(oldest)
    if evicted is not None and evicted is not holder:  # pragma: no cover - defensive
        _drop_producer(evicted)


def _drop_producer(holder: _WriterProducer) -> None:
    """Forget a producer. It holds no open transaction (or a prepared one, which
    destroying it leaves open, as pre_commit needs)."""
    holder.producer = None
    holder.txn = None


def close_kept_producers() -> None:
    """Close the producers this process kept between tasks."""
    with _PRODUCERS_LOCK:
        holders = list(_PRODUCERS.values())
        _PRODUCERS.clear()
    for holder in holders:
        producer = holder.producer
        if producer is not None:
            with contextlib.suppress(Exception):
                producer.flush(1.0)
        _drop_producer(holder)


def _forget_inherited_clients() -> None:
    """In a forked child: drop the parent's clients without using or closing them.

    A fork copies the clients but not kafka-python's IO threads, so a request through
    an inherited client waits for ever (seen in the chaos driver, which forks its
    writer tasks after its coordinator has talked to the broker); the sockets are the
    parent's to close. They are kept referenced, never destroyed: destroying a
    librdkafka handle whose threads stayed in the parent crashes the child. The lock
    may have been held by another thread at the fork.
    """
    global _DRIVERS_LOCK, _PRODUCERS_LOCK
    _DRIVERS_LOCK = threading.Lock()
    _PRODUCERS_LOCK = threading.Lock()
    # A kept producer too: its transactional id stays the parent's.
    _INHERITED.extend([*_DRIVERS.values(), *_TXN_CLIENTS.values(), *_PRODUCERS.values()])
    _DRIVERS.clear()
    _TXN_CLIENTS.clear()
    _PRODUCERS.clear()
    _NO_DESCRIBE.clear()


#: Clients a forked child inherited: referenced so that they are never destroyed.
_INHERITED: list[Any] = []


os.register_at_fork(after_in_child=_forget_inherited_clients)


def close_shared_clients() -> None:
    """Close the driver clients and kept producers of this process (at exit, or
    between tests)."""
    close_kept_producers()
    with _DRIVERS_LOCK:
        drivers = list(_DRIVERS.values())
        _DRIVERS.clear()
        clients = list(_TXN_CLIENTS.values())
        _TXN_CLIENTS.clear()
        _NO_DESCRIBE.clear()
    for client in clients:
        client.close()
    for driver in drivers:
        try:
            driver.close()
        except Exception:  # pragma: no cover - best effort at shutdown
            log.debug("closing Kafka driver clients failed", exc_info=True)


def _read_range(consumer: Consumer, topic: str, partition: int, start: int, end: int | None,
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


class KafkaBackend(Backend):
    """Exactly-once output to Kafka for ``read_committed`` consumers."""

    name: ClassVar[str] = "kafka"
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {Capability.COMMIT_FROM_ANY_PROCESS, Capability.COMMIT_MARKER,
         Capability.SURVIVES_RESTART})
    secret_options: ClassVar[frozenset[str]] = cfg.SECRET_OPTIONS
    payload_version: ClassVar[int] = 1
    #: at_least_once / none: the task commits its own transaction (finish_in_task).
    guarantees: ClassVar[frozenset[DeliveryGuarantee]] = frozenset(DeliveryGuarantee)

    def __init__(self, config: cfg.KafkaSinkConfig) -> None:
        self.config = config
        self._driver: _DriverClients | None = None
        #: The process ``_driver`` belongs to: a forked child must not use it.
        self._driver_pid = os.getpid()
        self._marker_partitions: int | None = None

    # -- configuration ------------------------------------------------------------------

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> KafkaBackend:
        return cls(cfg.parse(options))

    @classmethod
    def trigger_options(cls, interval_ms: int) -> Mapping[str, str]:
        # Lets check_timeout compare transaction.timeout.ms with the pipeline's trigger.
        return {"trigger.interval.ms": str(interval_ms)}

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config, "_driver": None, "_driver_pid": -1,
                "_marker_partitions": self._marker_partitions}

    def participant_timeout_s(self) -> float | None:
        """The broker aborts a prepared transaction after ``transaction.timeout.ms``."""
        return self.config.transaction_timeout_ms / 1000

    def describe(self) -> str:
        topic = self.config.topic or "<topic column>"
        return f"kafka {self.config.bootstrap} topic={topic} (read with read_committed)"

    def secret_values(self) -> list[str]:
        return list(self.config.secrets)

    def safe_options(self, options: Mapping[str, str]) -> dict[str, str]:
        # By name, not only the listed keys: every SASL/SSL/OAuth secret stays out.
        return {k: v for k, v in super().safe_options(options).items()
                if not cfg.is_secret_key(k)}

    def transactional_id(self, ctx: TransactionContext) -> str:
        """The id of ``ctx`` under the ``participant`` naming (pooled ids are probed)."""
        return participant_id(self.config.transactional_id_prefix, ctx)

    def sink_ids(self, sink_id: str) -> SinkIds:
        return SinkIds(self.config.transactional_id_prefix, sink_id)

    def _choose_id(self, ctx: TransactionContext) -> str:
        """A pooled id with no open transaction, or the participant's own id.

        Brokers without DescribeTransactions (Kafka before 3.0, Tansu) get the
        ``participant`` naming, with a warning once per process.
        """
        if self.config.naming != "pooled":
            return self.transactional_id(ctx)
        key = _connection_key(self.config)
        if key not in _NO_DESCRIBE:
            try:
                return retry_transient(
                    lambda: acquire_pooled_id(_shared_txn_client(self.config),
                                              self.config.transactional_id_prefix, ctx,
                                              self.config.pool_size),
                    what=f"{ctx.describe()}: picking a transactional.id",
                    bound_s=self.config.retry_bound_s, redact=self._redact)
            except UnsupportedByBrokerError:
                _NO_DESCRIBE.add(key)
                log.warning("sink=%s: %s cannot describe transactions, so transactional ids "
                            "cannot be pooled; using one id per participant (set "
                            "transactional.id.naming=participant to silence this)",
                            ctx.sink_id, self.config.bootstrap)
            except TxnProtocolError as exc:
                raise TxsinkError(f"{ctx.describe()}: cannot pick a pooled transactional.id: "
                                  f"{self._redact(str(exc))}", sink_id=ctx.sink_id,
                                  epoch=ctx.epoch, participant=ctx.participant) from None
        return self.transactional_id(ctx)

    def _redact(self, text: str) -> str:
        return redact(text, self.config.secrets)

    def preflight(self, sink_id: str) -> None:
        """Reach the brokers, check the topic, create the marker topic, check the timeout."""
        import confluent_kafka.admin as kadmin
        from confluent_kafka import KafkaError, KafkaException

        timeout = self.config.request_timeout_s
        check_hosts(self.config.bootstrap, sink_id)
        errors: list[KafkaError] = []
        conf: dict[str, Any] = {**self.config.connection(), "socket.timeout.ms": 10_000,
                                "error_cb": errors.append}
        admin = kadmin.AdminClient(cfg.with_librdkafka_log(conf))

        def metadata_or_auth_error() -> Any:
            try:
                return admin.list_topics(timeout=min(timeout, 15.0))
            except KafkaException:
                admin.poll(0.1)  # serves error_cb, where librdkafka says why
                auth = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
                if auth:
                    raise ConfigError(
                        f"kafka sink: Kafka at {self.config.bootstrap!r} refused the login: "
                        f"{self._redact(auth[0].str())}; check kafka.sasl.mechanism, "
                        "kafka.sasl.username and kafka.sasl.password (or the SSL/OAuth "
                        "settings)", field="kafka.sasl.password", sink_id=sink_id) from None
                raise

        bound = self.config.retry_bound_s
        try:
            metadata = retry_transient(metadata_or_auth_error,
                                       what=f"sink={sink_id}: preflight", bound_s=bound,
                                       redact=self._redact)
        except KafkaException as exc:
            raise ConfigError(
                f"kafka sink: cannot reach Kafka at {self.config.bootstrap!r} "
                f"(option 'kafka.bootstrap.servers'), retried for {bound:.0f}s "
                f"(unavailable.retry.s): {self._redact(str(exc))}",
                field="kafka.bootstrap.servers", sink_id=sink_id) from None
        topic = self.config.topic
        if topic is not None and (topic not in metadata.topics
                                  or metadata.topics[topic].error is not None):
            raise ConfigError(
                f"kafka sink: topic {topic!r} (option 'topic') does not exist on "
                f"{self.config.bootstrap}; create it first (txsink does not create output "
                "topics)", field="topic", sink_id=sink_id)
        for name, field_name in ((self.config.marker_topic, "marker.topic"),
                                 (self.config.claim_topic, "claim.topic")):
            if name not in metadata.topics:
                self._create_compacted(admin, name, field_name, sink_id)
        # The broker rejects a transaction.timeout.ms above its transaction.max.timeout.ms
        # only when a producer registers: find out now, not in the first task.
        probe = preflight_id(self.config.transactional_id_prefix, sink_id)
        try:
            self.driver().txn.init_producer_id(probe, self.config.transaction_timeout_ms)
        except TxnProtocolError as exc:
            if exc.error_code == 50:
                raise ConfigError(
                    f"kafka sink: kafka.transaction.timeout.ms="
                    f"{self.config.transaction_timeout_ms} is above the broker's "
                    "transaction.max.timeout.ms (Kafka's default is "
                    f"{cfg.KAFKA_DEFAULT_MAX_TIMEOUT_MS} ms); lower it or raise the broker's "
                    "limit", field="kafka.transaction.timeout.ms", sink_id=sink_id) from None
            raise ConfigError(f"kafka sink: cannot use transactions on "
                              f"{self.config.bootstrap}: {self._redact(str(exc))}",
                              field="kafka.bootstrap.servers", sink_id=sink_id) from None

    def _create_compacted(self, admin: Any, name: str, field_name: str, sink_id: str) -> None:
        """Create a one-partition compacted topic txsink keeps its own records in."""
        import confluent_kafka.admin as kadmin
        from confluent_kafka import KafkaException

        log.info("sink=%s: creating topic %s (option '%s')", sink_id, name, field_name)
        new = kadmin.NewTopic(  # type: ignore[attr-defined]
            name, num_partitions=1, replication_factor=self.config.marker_replication,
            config={"cleanup.policy": "compact"})
        try:
            admin.create_topics([new])[name].result(self.config.request_timeout_s)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise ConfigError(
                    f"kafka sink: cannot create topic {name!r} (option '{field_name}'): "
                    f"{self._redact(str(exc))}; create it with one partition and "
                    "cleanup.policy=compact, or name an existing one", field=field_name,
                    sink_id=sink_id) from None

    def driver(self) -> _DriverClients:
        """Driver-side clients, shared by every backend instance of this process.

        The Spark adapter builds a backend per micro-batch and closes it after the
        commit; sharing the clients keeps connections warm and lets orphan scans
        continue where the previous one stopped instead of rereading the tail.
        """
        if self._driver is None or self._driver_pid != os.getpid():
            self._driver = _shared_driver(self.config)
            self._driver_pid = os.getpid()
        return self._driver

    def close(self) -> None:
        driver, self._driver = self._driver, None
        if driver is not None:
            with driver.lock:
                driver.ends.flush(self.config.request_timeout_s)

    # -- executor side ------------------------------------------------------------------

    def _marker_partition(self, producer: Producer, sink_id: str) -> int:
        """The sink's marker partition, from metadata requests of the new producer.

        Asked even when the partition count is known, twice: librdkafka drops the
        bootstrap connection once the first answer names the cluster's brokers, and
        the second request waits until it is connected to one of those. A transaction
        coordinator lookup that finds no broker up is retried by a fixed 500 ms timer
        only, so without this about half of all opens took ~530 ms instead of ~60 ms
        (measured on Apache Kafka 4.4, librdkafka 2.16; docs/backends/kafka.md).
        """
        for _ in range(2):
            md = producer.list_topics(self.config.marker_topic,
                                      timeout=self.config.request_timeout_s)
        if self._marker_partitions is None:
            tmd = md.topics.get(self.config.marker_topic)
            if tmd is None or tmd.error is not None or not tmd.partitions:
                raise ConfigError(f"kafka sink: marker topic {self.config.marker_topic!r} "
                                  "is missing; run the sink's preflight (the driver creates "
                                  "it) or create it", field="marker.topic", sink_id=sink_id)
            self._marker_partitions = len(tmd.partitions)
        return marker_partition(sink_id, self._marker_partitions)

    def _producer_error(self, txn: _KafkaTransaction, what: str,
                        exc: BaseException) -> BaseException:
        """What to raise for ``exc``, raised by a producer call of ``txn`` while ``what``:
        a Kafka error becomes a TxsinkError naming the participant (FencedError if
        another producer took the id over); anything else is raised as it is."""
        from confluent_kafka import KafkaError, KafkaException

        if not isinstance(exc, (KafkaException, SystemError)):
            return exc
        if isinstance(exc, SystemError):
            # A fatal error (fenced) raised inside flush/poll while a Python callback
            # was still due: confluent-kafka reports a SystemError, usually caused by
            # it; sometimes the cause is lost, and the delivery reports say what it was.
            if isinstance(exc.__cause__, KafkaException):
                exc = exc.__cause__
            else:
                assert txn.producer is not None
                with contextlib.suppress(Exception):
                    txn.producer.poll(0)  # the delivery reports still due
                if not txn.errors:
                    raise exc
                return self._delivery_error(txn)
        text = self._redact(str(exc))
        ctx = txn.ctx
        if isinstance(exc, KafkaException) and exc.args:
            err = exc.args[0]
            if isinstance(err, KafkaError) and err.code() == KafkaError._FATAL and (
                    txn.producer is not None):
                # "Local: Fatal error" says only that the producer is in the fatal
                # state. confluent-kafka raises the cause from the next poll (instead of
                # calling error_cb), and the delivery reports due may say it too.
                try:
                    txn.producer.poll(0)
                except:  # noqa: E722 - see _raised
                    cause = _raised()
                    if not isinstance(cause, KafkaException):
                        raise
                    fatal = cause.args[0] if cause.args else None
                    if isinstance(fatal, KafkaError) and fatal.code() != KafkaError._FATAL:
                        return self._producer_error(txn, what, cause)
                if txn.fatal:
                    return self._delivery_error(txn)
            if isinstance(err, KafkaError) and err.code() in (
                    KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                    KafkaError.INVALID_PRODUCER_EPOCH):
                return FencedError(
                    f"{txn.describe()}: transactional.id {txn.transactional_id!r} was fenced "
                    f"while {what}: another producer took it over. Two queries writing with "
                    f"sink id {ctx.sink_id!r}? A sink id must be used by one query only.",
                    sink_id=ctx.sink_id, epoch=ctx.epoch, participant=ctx.participant)
            if isinstance(err, KafkaError) and err.code() == KafkaError.INVALID_TRANSACTION_TIMEOUT:
                return ConfigError(
                    f"kafka sink: kafka.transaction.timeout.ms="
                    f"{self.config.transaction_timeout_ms} is above the broker's "
                    "transaction.max.timeout.ms", field="kafka.transaction.timeout.ms",
                    sink_id=ctx.sink_id)
        return TxsinkError(f"{txn.describe()}: {what} failed: {text}", sink_id=ctx.sink_id,
                           epoch=ctx.epoch, participant=ctx.participant)

    def _producer_key(self, ctx: TransactionContext) -> tuple[Any, ...]:
        """What a kept producer must match: cluster, settings, sink and partition (a
        pooled id names both)."""
        return (_connection_key(self.config), tuple(sorted(
            (k, repr(v)) for k, v in self.config.producer.items())),
            self.config.transaction_timeout_ms, self.config.transactional_id_prefix,
            ctx.sink_id, ctx.partition)

    def begin_transaction(self, ctx: TransactionContext) -> Transaction:
        """Open the participant in a background thread; write() waits for it.

        The open (slot probe, producer, init_transactions, begin marker) is 25-35 ms
        for a new producer; in a Spark task it overlaps with the JVM handing over the
        partition's first Arrow batch.
        """
        txn = _KafkaTransaction(ctx, "")
        thread = threading.Thread(target=self._open_in_background, args=(txn,),
                                  name=f"txsink-kafka-open-{ctx.participant}", daemon=True)
        txn.opening = thread
        thread.start()
        return txn

    def _open_in_background(self, txn: _KafkaTransaction) -> None:
        from confluent_kafka import KafkaException

        started = time.perf_counter()
        try:
            self._open(txn)
        except:  # noqa: E722 - see _raised; handed to the task's thread by _opened
            error = _raised()
            if isinstance(error, KafkaException):
                error = self._producer_error(txn, "starting the transaction", error)
            txn.open_error = error
        finally:
            # The participant's fixed cost, kept in its committable for status and
            # benchmarks.
            txn.open_ms = (time.perf_counter() - started) * 1000

    def _opened(self, txn: _KafkaTransaction, *, raise_error: bool = True) -> None:
        """Wait for the background open of ``txn``; raise what it raised."""
        thread = txn.opening
        if thread is not None:
            waited = time.perf_counter()
            thread.join()
            txn.opening = None
            txn.open_wait_ms = (time.perf_counter() - waited) * 1000
        if raise_error and txn.open_error is not None:
            raise txn.open_error

    def _open(self, txn: _KafkaTransaction) -> None:
        ctx = txn.ctx
        if self.config.naming == "pooled":
            # The kept producer's slot is not probed: it has no open transaction unless
            # another writer took the id over since, which fenced the kept producer,
            # and its first write (the begin marker) fails; then the slot is probed.
            holder = _take_producer(self._producer_key(ctx))
            if holder is not None and self._begin_reused(txn, holder):
                return
        self._begin_new(txn, self._choose_id(ctx))

    def _begin_reused(self, txn: _KafkaTransaction, holder: _WriterProducer) -> bool:
        """Begin on a producer kept from an earlier task: no new producer, no
        init_transactions. False (producer dropped) if it cannot go on, e.g. fenced
        by a writer elsewhere that took the id over."""
        from confluent_kafka import KafkaException

        producer = holder.producer
        assert producer is not None and holder.marker_partition is not None
        txn.transactional_id = holder.transactional_id
        self._attach(txn, holder)
        txn.reused = True
        txn.marker_partition = holder.marker_partition
        try:
            producer.begin_transaction()
            self._write_begin_marker(txn)
        except:  # noqa: E722 - see _raised
            exc = _raised()
            if not isinstance(exc, (KafkaException, TxsinkError)):
                raise
            log.info("%s: the producer kept for transactional.id=%s cannot go on (%s); "
                     "opening a new one", txn.describe(), txn.transactional_id,
                     self._redact(str(exc)))
            with contextlib.suppress(Exception):
                producer.abort_transaction(self.config.request_timeout_s)
            _drop_producer(holder)
            txn.producer, txn.holder, txn.reused = None, None, False
            txn.errors.clear()
            txn.fatal = False
            txn.capture = _PidCapture()
            return False
        PRODUCER_COUNTS["reused"] += 1
        log.debug("%s: transaction open on the kept producer of transactional.id=%s",
                  txn.describe(), txn.transactional_id)
        return True

    @staticmethod
    def _attach(txn: _KafkaTransaction, holder: _WriterProducer) -> _KafkaTransaction:
        holder.txn = txn
        txn.holder = holder
        txn.producer = holder.producer
        txn.capture = holder.capture
        return txn

    def _begin_new(self, txn: _KafkaTransaction, tid: str) -> None:
        from confluent_kafka import Producer

        ctx = txn.ctx
        txn.transactional_id = tid
        holder = _WriterProducer(self._producer_key(ctx), tid)
        # A private logger (not in logging's registry, so none accumulates per participant)
        # that only captures the producer id.
        logger = logging.Logger(f"txsink_kafka.librdkafka.{tid}")  # noqa: LOG001
        logger.addHandler(holder.capture)
        conf: dict[str, Any] = {
            "queue.buffering.max.kbytes": 32768,
            "linger.ms": 20,
            # librdkafka holds back a connection to a broker the metadata named for
            # half of this (default 100 ms): ~50 ms of every new producer's open.
            # Reconnects after failures still back off exponentially.
            "reconnect.backoff.ms": 20,
            **self.config.producer,
            "transactional.id": tid,
            "transaction.timeout.ms": self.config.transaction_timeout_ms,
            "debug": "eos",
            "logger": logger,
            "on_delivery": holder.on_delivery,
        }
        timeout = self.config.request_timeout_s
        try:
            holder.producer = Producer(conf)
            producer = holder.producer
            self._attach(txn, holder)
            txn.marker_partition = self._marker_partition(producer, ctx.sink_id)
            holder.marker_partition = txn.marker_partition
            retry_transient(lambda: producer.init_transactions(timeout),
                            what=f"{txn.describe()}: init_transactions",
                            bound_s=self.config.retry_bound_s, redact=self._redact)
            PRODUCER_COUNTS["init_transactions"] += 1
            producer.begin_transaction()
        except:  # noqa: E722 - see _raised
            raise self._producer_error(txn, "starting the transaction", _raised()) from None
        self._write_begin_marker(txn)
        log.debug("%s: transaction open as transactional.id=%s", txn.describe(),
                  txn.transactional_id)

    def _write_begin_marker(self, txn: _KafkaTransaction) -> None:
        """The first record of the transaction: its commit marker and its trace for scans."""

        ctx = txn.ctx
        assert txn.producer is not None
        txn.marker_topic = self.config.marker_topic
        # poll() serves librdkafka's log queue, where the producer id is announced.
        deadline = time.monotonic() + 1.0
        while txn.capture.identity is None and time.monotonic() < deadline:
            txn.producer.poll(0.01)
        identity = txn.capture.identity or ProducerIdentity(-1, -1)
        key, value = Marker(BEGIN, txn.transactional_id, ctx.sink_id, ctx.epoch,
                            ctx.partition, ctx.attempt, producer_id=identity.producer_id,
                            producer_epoch=identity.producer_epoch).encode()

        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                txn.marker_offset = msg.offset() or 0
            else:
                txn.on_delivery(err, msg)

        try:
            txn.producer.produce(txn.marker_topic, value, key, txn.marker_partition,
                                 on_delivery=delivered)
            # Wait for it: data must never reach the broker before the marker does,
            # or a crash could leave an open transaction no scan can find.
            remaining = txn.producer.flush(self.config.request_timeout_s)
        except:  # noqa: E722 - see _raised
            raise self._producer_error(txn, "writing the marker record", _raised()) from None
        if remaining or txn.marker_offset < 0:
            raise TxsinkError(
                f"{txn.describe()}: the marker record to {txn.marker_topic!r} was not "
                f"delivered within {self.config.request_timeout_s:.0f}s"
                + (f": {txn.errors[0]}" if txn.errors else ""),
                sink_id=ctx.sink_id, epoch=ctx.epoch, participant=ctx.participant)

    def write(self, txn: Transaction, batch: pa.RecordBatch) -> None:
        assert isinstance(txn, _KafkaTransaction)
        self._opened(txn)
        assert txn.producer is not None
        if txn.errors:
            raise self._delivery_error(txn)
        names = batch.schema.names
        if "value" not in names:
            raise ConfigError(
                f"kafka sink: the data has no 'value' column (columns: {', '.join(names)}); "
                "like Spark's Kafka sink it writes columns key, value, and optionally topic, "
                "partition, headers", field="value", sink_id=txn.ctx.sink_id)
        n = batch.num_rows
        values = batch.column("value").to_pylist()
        keys = batch.column("key").to_pylist() if "key" in names else [None] * n
        fixed = self.config.topic
        if fixed is None and "topic" not in names:
            raise ConfigError(
                "kafka sink: no topic: set the 'topic' option or add a 'topic' column",
                field="topic", sink_id=txn.ctx.sink_id)
        topics = [fixed] * n if fixed is not None else batch.column("topic").to_pylist()
        parts = batch.column("partition").to_pylist() if "partition" in names else None
        headers = batch.column("headers").to_pylist() if "headers" in names else None
        producer = txn.producer
        produce = producer.produce
        try:
            if parts is None and headers is None and fixed is not None:
                for k, v in zip(keys, values, strict=True):
                    try:
                        produce(fixed, v, k)
                    except BufferError:
                        producer.poll(0.05)
                        produce(fixed, v, k)
                txn.topics.add(fixed)
            else:
                for i in range(n):
                    topic = topics[i]
                    if topic is None:
                        raise ConfigError(f"kafka sink: row {i} of a batch has a null topic",
                                          field="topic", sink_id=txn.ctx.sink_id)
                    kwargs: dict[str, Any] = {}
                    row_partition = parts[i] if parts is not None else None
                    if row_partition is not None:
                        kwargs["partition"] = int(row_partition)
                    row_headers = headers[i] if headers is not None else None
                    if row_headers:
                        kwargs["headers"] = [(h["key"], h["value"]) for h in row_headers]
                    try:
                        produce(topic, values[i], keys[i], **kwargs)
                    except BufferError:
                        producer.poll(0.05)
                        produce(topic, values[i], keys[i], **kwargs)
                    txn.topics.add(topic)
            producer.poll(0)
        except:  # noqa: E722 - see _raised
            raise self._producer_error(txn, "producing", _raised()) from None
        txn.rows += n

    def _delivery_error(self, txn: _KafkaTransaction) -> TxsinkError:
        ctx = txn.ctx
        first = self._redact(txn.errors[0])
        if txn.fatal or "fence" in first.lower():
            return FencedError(
                f"{txn.describe()}: transactional.id {txn.transactional_id!r} was fenced: "
                f"{first}. Two queries writing with sink id {ctx.sink_id!r}?",
                sink_id=ctx.sink_id, epoch=ctx.epoch, participant=ctx.participant)
        hint = (" (missing topic? txsink does not create output topics)"
                if "Unknown topic" in first or "UNKNOWN_TOPIC" in first else "")
        return TxsinkError(f"{txn.describe()}: {len(txn.errors)} record(s) were not delivered; "
                           f"first: {first}{hint}", sink_id=ctx.sink_id, epoch=ctx.epoch,
                           participant=ctx.participant)

    def _flush(self, txn: _KafkaTransaction) -> None:
        """Wait until every record of ``txn`` is acknowledged; raise on any failure."""

        assert txn.producer is not None
        producer = txn.producer
        deadline = time.monotonic() + max(self.config.request_timeout_s,
                                          self.config.transaction_timeout_ms / 2000)
        try:
            while producer.flush(1.0) > 0:
                if txn.errors:
                    break
                if time.monotonic() > deadline:
                    raise TxsinkError(f"{txn.describe()}: records were not acknowledged "
                                      "before the flush deadline", sink_id=txn.ctx.sink_id,
                                      epoch=txn.ctx.epoch, participant=txn.ctx.participant)
            producer.poll(0)
        except:  # noqa: E722 - see _raised
            raise self._producer_error(txn, "flushing", _raised()) from None
        if txn.errors:
            raise self._delivery_error(txn)

    def pre_commit(self, txn: Transaction) -> Committable:
        assert isinstance(txn, _KafkaTransaction)
        self._opened(txn)
        assert txn.producer is not None
        producer = txn.producer
        self._flush(txn)
        identity = txn.capture.identity
        if identity is None:
            raise TxsinkError(
                f"{txn.describe()}: librdkafka did not report the producer id of "
                f"transactional.id {txn.transactional_id!r} (its 'eos' debug log has no "
                "'Acquired PID' line); this librdkafka version is not supported",
                sink_id=txn.ctx.sink_id, epoch=txn.ctx.epoch,
                participant=txn.ctx.participant)
        payload = {
            "transactional_id": txn.transactional_id,
            "producer_id": identity.producer_id,
            "producer_epoch": identity.producer_epoch,
            "topics": sorted(txn.topics),
            "marker": {"topic": txn.marker_topic, "partition": txn.marker_partition,
                       "offset": txn.marker_offset},
            "transaction_timeout_ms": self.config.transaction_timeout_ms,
            "began_at": round(txn.began_at, 3),
            "prepared_at": round(time.time(), 3),
            "open_ms": round(txn.open_ms, 1),
            "open_wait_ms": round(txn.open_wait_ms, 1),
        }
        committable = Committable.for_context(self.name, txn.ctx, payload, rows=txn.rows,
                                              payload_version=self.payload_version)
        self._check_age(committable)  # a long write already eats into the timeout
        # Close without aborting: the transaction stays open for the driver's EndTxn.
        # librdkafka cannot begin again on a producer whose transaction another
        # process ended, so it is never kept (docs/backends/kafka.md).
        txn.producer = None
        if txn.holder is not None:
            _drop_producer(txn.holder)
        del producer
        log.debug("%s: prepared transactional.id=%s producer_id=%d epoch=%d rows=%d",
                  txn.describe(), txn.transactional_id, identity.producer_id,
                  identity.producer_epoch, txn.rows)
        return committable

    def finish_in_task(self, txn: Transaction, guarantee: DeliveryGuarantee) -> Committable:
        """at_least_once / none: the task commits its own transaction, with the end
        marker in it, and keeps the producer for its worker's next task.

        Not the driver's EndTxn: librdkafka can begin again only on a producer that
        ended its last transaction itself, so keeping it saves the next task a new
        producer and ``init_transactions``. Only pooled ids are kept (a per-participant
        id is never used again).
        """

        assert isinstance(txn, _KafkaTransaction)
        self._opened(txn)
        assert txn.producer is not None
        producer = txn.producer
        ctx = txn.ctx
        self._flush(txn)
        identity = txn.capture.identity or ProducerIdentity(-1, -1)
        # In the transaction: scans see the participant ended exactly when its data
        # became visible (or, if the commit fails, discard() writes an aborted end).
        key, value = Marker(END, txn.transactional_id, ctx.sink_id, ctx.epoch,
                            ctx.partition, ctx.attempt, producer_id=identity.producer_id,
                            producer_epoch=identity.producer_epoch,
                            outcome=COMMITTED).encode()
        try:
            producer.produce(txn.marker_topic, value, key, txn.marker_partition)
            producer.commit_transaction(self.config.request_timeout_s)
        except:  # noqa: E722 - see _raised
            raise self._producer_error(txn, "committing in the task", _raised()) from None
        if txn.errors:  # pragma: no cover - commit_transaction raises first
            raise self._delivery_error(txn)
        txn.producer = None
        holder = txn.holder
        if holder is not None:
            if self._is_pooled(txn.transactional_id) and not txn.fatal:
                _keep_producer(holder)
            else:
                _drop_producer(holder)
        log.debug("%s: committed transactional.id=%s in the task (%s), %d rows",
                  txn.describe(), txn.transactional_id, guarantee.value, txn.rows)
        payload = {"direct": True, "transactional_id": txn.transactional_id,
                   "producer_id": identity.producer_id,
                   "producer_epoch": identity.producer_epoch, "topics": sorted(txn.topics),
                   "open_ms": round(txn.open_ms, 1),
                   "open_wait_ms": round(txn.open_wait_ms, 1),
                   "reused_producer": txn.reused}
        return Committable.for_context(self.name, ctx, payload, rows=txn.rows,
                                       payload_version=self.payload_version)

    def discard(self, txn: Transaction) -> None:
        from confluent_kafka import KafkaException

        assert isinstance(txn, _KafkaTransaction)
        self._opened(txn, raise_error=False)
        producer, txn.producer = txn.producer, None
        if txn.holder is not None:
            _drop_producer(txn.holder)  # never kept after a failure
        if producer is None or txn.open_error is not None:
            # Never opened (as before, when begin_transaction raised): an open
            # transaction it may have left is found by the orphan scans.
            return
        timeout = self.config.request_timeout_s
        try:
            producer.abort_transaction(timeout)
            # A fresh (committed) transaction carrying only the end marker, so scans
            # know this participant is over.
            producer.begin_transaction()
            identity = txn.capture.identity or ProducerIdentity(-1, -1)
            key, value = Marker(END, txn.transactional_id, txn.ctx.sink_id, txn.ctx.epoch,
                                txn.ctx.partition, txn.ctx.attempt,
                                producer_id=identity.producer_id,
                                producer_epoch=identity.producer_epoch,
                                outcome=ABORTED).encode()
            producer.produce(txn.marker_topic, value, key, txn.marker_partition)
            producer.commit_transaction(timeout)
        except:  # noqa: E722 - see _raised
            exc = _raised()
            if not isinstance(exc, KafkaException):
                raise
            log.warning("%s: discarding transactional.id=%s failed: %s; orphan cleanup "
                        "will fence it", txn.describe(), txn.transactional_id,
                        self._redact(str(exc)))

    # -- driver side --------------------------------------------------------------------

    def _payload(self, c: Committable) -> tuple[str, ProducerIdentity, tuple[str, int, int]]:
        p = self.decode_payload(c.payload_version, c.payload)
        try:
            marker = p["marker"]
            return (str(p["transactional_id"]),
                    ProducerIdentity(int(p["producer_id"]), int(p["producer_epoch"])),
                    (str(marker["topic"]), int(marker["partition"]), int(marker["offset"])))
        except (KeyError, TypeError, ValueError) as exc:
            raise FatalCommitError(f"{c.describe()}: malformed Kafka committable: {exc}",
                                   sink_id=c.sink_id, epoch=c.epoch,
                                   participant=c.participant) from None

    def marker_status(self, topic: str, partition: int, offset: int, transactional_id: str
                      ) -> str:
        """Is the marker at ``offset`` visible to ``read_committed`` readers?"""
        from confluent_kafka import TopicPartition

        d = self.driver()
        timeout = self.config.request_timeout_s
        with d.lock:
            _, lso = d.committed_offsets.get_watermark_offsets(
                TopicPartition(topic, partition), timeout, cached=False)
            if offset >= lso:
                return MarkerStatus.HIDDEN
            for msg in _read_range(d.committed, topic, partition, offset, lso, timeout):
                key = msg.key()
                if msg.offset() == offset and key is not None and key.decode() == \
                        transactional_id:
                    return MarkerStatus.VISIBLE
                return MarkerStatus.MISSING
            return MarkerStatus.MISSING

    def _ended_as_committed(self, topic: str, partition: int, offset: int,
                            transactional_id: str, identity: ProducerIdentity) -> bool:
        """Is there a ``committed`` end marker for ``transactional_id`` after ``offset``?

        Any committed end wins: a fence of an already committed participant (its end
        marker was lost in a crash) writes an ``aborted`` end after it.
        """
        d = self.driver()
        with d.lock:
            for msg in _read_range(d.uncommitted, topic, partition, offset, None,
                                   self.config.request_timeout_s):
                key = msg.key()
                if key is None or key.decode() != transactional_id:
                    continue
                m = Marker.decode(key, msg.value(), msg.offset() or 0)
                if (m is not None and m.kind == END and m.outcome == COMMITTED
                        and m.producer_id == identity.producer_id
                        and m.producer_epoch == identity.producer_epoch):
                    return True
        return False

    def _write_end(self, c: Committable, transactional_id: str, topic: str,
                   partition: int, outcome: str) -> None:
        # The producer id names *this* use of the transactional id: a later participant
        # with the same name (a restarted query reuses Spark's task attempt ids) has
        # another one.
        key, value = Marker(END, transactional_id, c.sink_id, c.epoch, c.partition,
                            c.attempt, producer_id=int(c.payload.get("producer_id", -1)),
                            producer_epoch=int(c.payload.get("producer_epoch", -1)),
                            outcome=outcome).encode()
        ends = self.driver().ends
        try:
            ends.produce(topic, value, key, partition)
        except BufferError:
            ends.flush(self.config.request_timeout_s)
            ends.produce(topic, value, key, partition)
        ends.poll(0)

    def _check_age(self, c: Committable) -> float:
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

    def commit(self, committable: Committable) -> CommitOutcome:
        # Idempotent from the top (the marker check comes first), so a retry after
        # the broker came back is safe.
        return retry_transient(lambda: self._commit_once(committable),
                               what=f"{committable.describe()}: commit",
                               bound_s=self.config.retry_bound_s, redact=self._redact)

    def _commit_once(self, committable: Committable) -> CommitOutcome:
        c = committable
        tid, identity, (mtopic, mpart, moffset) = self._payload(c)
        age = self._check_age(c)
        first = self.marker_status(mtopic, mpart, moffset, tid)
        if first == MarkerStatus.VISIBLE or (
                first == MarkerStatus.MISSING
                and self._ended_as_committed(mtopic, mpart, moffset, tid, identity)):
            # (MISSING: compaction removed the begin marker; the end marker says committed.)
            return CommitOutcome.ALREADY_COMMITTED
        d = self.driver()
        rejected = ""
        try:
            result = d.txn.end_txn(tid, identity, commit=True)
        except ConnectionDroppedError as exc:
            result, rejected = None, str(exc)
        except TxnProtocolError as exc:
            error = RetriableCommitError if exc.retriable else FatalCommitError
            raise error(f"{c.describe()}: {self._redact(str(exc))}", sink_id=c.sink_id,
                        epoch=c.epoch, participant=c.participant) from None
        if result is EndTxnResult.OK:
            pending = self._markers_pending(c, identity, mtopic, mpart)
            if pending:
                raise RetriableCommitError(
                    f"{c.describe()}: the transaction coordinator accepted the commit of "
                    f"transactional.id {tid!r}, but the transaction is still open on "
                    f"{', '.join(pending)} after {self.config.request_timeout_s:.0f}s (the "
                    "broker writes its commit markers after answering); the epoch stays "
                    "decided and the commit is retried. If it stays open it is a hanging "
                    "transaction: `txsink status` shows it",
                    sink_id=c.sink_id, epoch=c.epoch, participant=c.participant)
            self._write_end(c, tid, mtopic, mpart, COMMITTED)
            log.debug("%s: committed transactional.id=%s", c.describe(), tid)
            return CommitOutcome.COMMITTED
        rejected = rejected or f"the coordinator answered {result.value if result else '?'}"
        status = self.marker_status(mtopic, mpart, moffset, tid)
        if status == MarkerStatus.VISIBLE:
            self._write_end(c, tid, mtopic, mpart, COMMITTED)
            return CommitOutcome.ALREADY_COMMITTED
        if status == MarkerStatus.MISSING and self._ended_as_committed(mtopic, mpart, moffset,
                                                                       tid, identity):
            # The begin marker was compacted away; the end marker says committed.
            return CommitOutcome.ALREADY_COMMITTED
        if status == MarkerStatus.HIDDEN:
            raise RetriableCommitError(
                f"{c.describe()}: EndTxn(commit) for transactional.id {tid!r} was refused "
                f"({rejected}) and its marker is not readable yet (an open transaction "
                "holds the marker partition's last stable offset); retry later",
                sink_id=c.sink_id, epoch=c.epoch, participant=c.participant)
        timeout_ms = int(c.payload.get("transaction_timeout_ms", 0) or 0)
        topics = c.payload.get("topics") or []
        if timeout_ms and age * 1000 > timeout_ms:
            why = (f"the broker's transaction.timeout.ms ({timeout_ms} ms) expired: the "
                   f"transaction was opened {age:.0f}s ago")
        else:
            why = ("it was fenced and aborted (another query using the same sink id, or a "
                   "manual abort)")
        raise ParticipantLostError(
            f"{c.describe()}: DATA AT RISK: the prepared transaction of transactional.id "
            f"{tid!r} ({c.rows} rows to {', '.join(map(str, topics))}) was "
            f"aborted, not committed: {why}. EndTxn: {rejected}. Those rows are not in the "
            "output; replay the epoch from the source to restore them",
            sink_id=c.sink_id, epoch=c.epoch, participant=c.participant)

    def _markers_pending(self, c: Committable, identity: ProducerIdentity, mtopic: str,
                         mpart: int) -> list[str]:
        """Partitions where the transaction of ``c`` is still open after EndTxn(commit)
        was accepted; waits up to ``request.timeout`` for none to be left.

        Kafka answers EndTxn before it writes the commit markers into the partitions, and
        a broker restarting at that moment has been seen to give up on them (it took its
        own partitions for deleted): the transaction then stays open there, and the next
        InitProducerId of the id aborts it. Only once the markers are in is the end
        marker written and the participant reported committed, so a committed end marker
        always means the data was committed. DescribeProducers (KIP-664) is asked per
        partition; a broker that cannot answer it at all (before Kafka 2.8, or no READ
        on the topics) is not waited for, one that does not answer now (restarting) is.
        """
        d = self.driver()
        timeout = self.config.request_timeout_s
        partitions = [(mtopic, mpart)]
        with d.lock:
            for topic in c.payload.get("topics") or []:
                md = d.committed_offsets.list_topics(str(topic), timeout=timeout)
                tmd = md.topics.get(str(topic))
                if tmd is not None and tmd.error is None:
                    partitions += [(str(topic), p) for p in sorted(tmd.partitions)]
        deadline = time.monotonic() + timeout
        pause = 0.002
        while True:
            try:
                starts = d.txn.transaction_starts(partitions)
                pending = [f"{t}[{p}]" for (t, p), producers in sorted(starts.items())
                           if identity.producer_id in producers]
            except UnsupportedByBrokerError as exc:
                log.debug("%s: cannot check that the commit markers arrived: %s",
                          c.describe(), exc)
                return []
            except TxnProtocolError as exc:  # a broker restarting: not known yet
                pending = [f"{t}[{p}]" for t, p in partitions]
                pending[-1] += f" (not confirmed: {self._redact(str(exc))})"
            if not pending or time.monotonic() > deadline:
                return pending
            time.sleep(pause)
            pause = min(pause * 2, 0.5)

    def abort(self, committable: Committable) -> None:
        retry_transient(lambda: self._abort_once(committable),
                        what=f"{committable.describe()}: abort",
                        bound_s=self.config.retry_bound_s, redact=self._redact)

    def _abort_once(self, committable: Committable) -> None:
        c = committable
        tid, identity, (mtopic, mpart, _) = self._payload(c)
        d = self.driver()
        try:
            result: EndTxnResult | None = d.txn.end_txn(tid, identity, commit=False)
        except ConnectionDroppedError:
            result = None
        if result is not EndTxnResult.OK:
            # Refused (fenced, wrong state, Tansu's dropped connection): fencing the id
            # aborts whatever this participant still has open on it.
            self._fence(tid, identity)
        self._write_end(c, tid, mtopic, mpart, ABORTED)
        log.debug("%s: aborted transactional.id=%s", c.describe(), tid)

    def _fence(self, tid: str, identity: ProducerIdentity) -> bool:
        """Bump ``tid``'s producer epoch so the writer of ``identity`` can go on no more.

        A per-participant id belongs to one participant, so it is always fenced. A
        pooled id may already serve a later participant: it is fenced only while the
        coordinator still shows the producer epoch of ``identity`` (nobody took the id
        over since), so a writer of a later epoch is never fenced by orphan cleanup.
        """
        d = self.driver()
        if self._is_pooled(tid) and identity.producer_id >= 0:
            info = d.txn.describe_transactions([tid]).get(tid)
            if info is None or info.identity != identity:
                log.debug("transactional.id=%s moved on from producer %s (now %s); not "
                          "fencing it", tid, identity, info.identity if info else None)
                return False
        d.txn.init_producer_id(tid, self.config.transaction_timeout_ms)
        return True

    def _is_pooled(self, tid: str) -> bool:
        """Is ``tid`` a pooled id (of any sink with this prefix)?"""
        return bool(re.match(re.escape(self.config.transactional_id_prefix)
                             + r"-.+-p\d+-t\d+\Z", tid))

    def broker_transactions(self, sink_id: str) -> dict[str, TransactionInfo] | None:
        """The sink's open transactions, per the transaction coordinators.

        ``None`` where the broker cannot list transactions (before Kafka 3.0, Tansu).
        Needs DESCRIBE on the sink's transactional ids (WRITE implies it); ids the
        principal may not describe are silently left out by the broker.
        """
        txn = self.driver().txn
        ids = self.sink_ids(sink_id)
        try:
            listed = [t for t in txn.list_open_transactional_ids() if ids.owns(t)]
            described = txn.describe_transactions(listed) if listed else {}
        except UnsupportedByBrokerError:
            return None
        return {t: info for t, info in described.items() if info is not None and info.is_open}

    def open_transactions(self, sink_id: str) -> list[Mapping[str, Any]]:
        """The sink's open transactions on the broker: age, timeout, readers held back.

        A ``read_committed`` reader of a partition stops at its last stable offset,
        the first offset of the oldest open transaction there: records after it, of
        any producer, stay invisible until that transaction ends.
        """
        from confluent_kafka import TopicPartition

        broker = self.broker_transactions(sink_id)
        if broker is None:
            return []
        markers = self.open_markers(sink_id)
        d = self.driver()
        timeout = self.config.request_timeout_s
        now_ms = time.time() * 1000
        partitions = sorted({tp for info in broker.values() for tp in info.partitions})
        starts = d.txn.open_transaction_starts(partitions)
        rows: list[Mapping[str, Any]] = []
        for tid, info in sorted(broker.items()):
            marker = markers.get(tid)
            participant = (self._from_marker(marker).participant if marker is not None
                           and marker.producer_id == info.producer_id else None)
            age_s = max(0.0, (now_ms - info.start_ms) / 1000) if info.start_ms >= 0 else None
            held: list[dict[str, Any]] = []
            with d.lock:
                for topic, partition in info.partitions:
                    tp = TopicPartition(topic, partition)
                    _, lso = d.committed_offsets.get_watermark_offsets(tp, timeout,
                                                                       cached=False)
                    _, high = d.uncommitted_offsets.get_watermark_offsets(tp, timeout,
                                                                          cached=False)
                    start = starts.get((topic, partition), {}).get(info.producer_id)
                    held.append({"topic": topic, "partition": partition,
                                 "last_stable_offset": lso, "high_watermark": high,
                                 "transaction_start_offset": start,
                                 # The oldest open transaction sets the LSO.
                                 "holds_back_readers": high > lso and (
                                     start is None or start <= lso)})
            blocking = [h for h in held if h["holds_back_readers"]]
            age = ("?" if age_s is None else
                   f"{age_s:.0f}s of its {info.timeout_ms / 1000:.0f}s timeout")
            summary = (
                f"transactional.id {tid} ({participant or 'no marker: participant unknown'}):"
                f" {info.state}, open {age}; "
                + ("holds back read_committed readers of " + ", ".join(
                    f"{h['topic']}[{h['partition']}] (last stable offset "
                    f"{h['last_stable_offset']} < high watermark {h['high_watermark']})"
                    for h in blocking) if blocking else "holds back no reader"))
            rows.append({"name": tid, "summary": summary, "participant": participant,
                         "state": info.state, "producer_id": info.producer_id,
                         "producer_epoch": info.producer_epoch, "age_s": age_s,
                         "timeout_ms": info.timeout_ms, "partitions": held})
        return rows

    def _broker_view(self, sink_id: str) -> dict[str, TransactionInfo] | None:
        try:
            return self.broker_transactions(sink_id)
        except TxnProtocolError as exc:
            log.warning("sink=%s: listing its open transactions on the broker failed (%s); "
                        "going by the marker records alone", sink_id, self._redact(str(exc)))
            return None

    def open_markers(self, sink_id: str) -> dict[str, Marker]:
        """Participants of ``sink_id`` that began and were not ended, per marker scan.

        Scans from where the previous scan stopped; the first scan of a process reads
        the last ``orphan.scan.records`` records of the sink's marker partition.
        """
        from confluent_kafka import TopicPartition

        d = self.driver()
        topic = self.config.marker_topic
        timeout = self.config.request_timeout_s
        with d.lock:
            d.ends.flush(timeout)
            if self._marker_partitions is None:
                md = d.ends.list_topics(topic, timeout=timeout)
                tmd = md.topics.get(topic)
                self._marker_partitions = len(tmd.partitions) if tmd and tmd.partitions else 1
            partition = marker_partition(sink_id, self._marker_partitions)
            state = d.scans.setdefault(f"{topic}/{sink_id}", _ScanState())
            low, high = d.uncommitted_offsets.get_watermark_offsets(
                TopicPartition(topic, partition), timeout, cached=False)
            start = state.cursor
            if start is None:
                # Every open participant's begin marker is at or after the partition's
                # last stable offset (it is the first record of its transaction).
                _, lso = d.committed_offsets.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout, cached=False)
                records = self.config.orphan_scan_records
                start = max(low, min(high - records, max(lso, high - 10 * records)))
            last = -1
            # Markers are one-record batches, so the end offset is right even on Tansu;
            # past it, read to the end the fetch reports.
            for msg in _read_range(d.uncommitted, topic, partition, max(start, low),
                                   None if start < high else start, timeout):
                last = msg.offset() or 0
                m = Marker.decode(msg.key(), msg.value(), last)
                if m is None or m.sink_id != sink_id:
                    continue
                if m.kind == BEGIN:
                    state.open[m.transactional_id] = m
                elif m.kind == END:
                    began = state.open.get(m.transactional_id)
                    # A restarted query reuses names (Spark's task attempt ids start
                    # again), and a transactional id keeps its producer id: only an end
                    # for the same producer epoch ends this use of the name.
                    if began is not None and (m.producer_id < 0 or began.producer_id < 0 or (
                            m.producer_id, m.producer_epoch) == (began.producer_id,
                                                                 began.producer_epoch)):
                        del state.open[m.transactional_id]
                elif m.kind == OWNER:
                    state.owner = m
            state.cursor = max(high, last + 1)
            return dict(state.open)

    def _scan_state(self, sink_id: str) -> _ScanState:
        return self.driver().scans[f"{self.config.marker_topic}/{sink_id}"]

    def _read_claims(self, sink_id: str) -> list[Claim]:
        """Every claim on ``sink_id``, in log order: the whole claim topic is read."""
        from confluent_kafka import KafkaException, TopicPartition

        d = self.driver()
        topic = self.config.claim_topic
        key = owner_key(self.config.transactional_id_prefix, sink_id)
        timeout = self.config.request_timeout_s
        claims: list[Claim] = []
        with d.lock:
            try:
                low, high = d.uncommitted_offsets.get_watermark_offsets(
                    TopicPartition(topic, 0), timeout, cached=False)
            except KafkaException:
                # Not there yet (a coordinator started without the preflight, as
                # `txsink resolve` does): create it, once.
                import confluent_kafka.admin as kadmin

                conf: dict[str, Any] = {**self.config.connection()}
                self._create_compacted(kadmin.AdminClient(conf), topic, "claim.topic",
                                       sink_id)
                low, high = d.uncommitted_offsets.get_watermark_offsets(
                    TopicPartition(topic, 0), timeout, cached=False)
            for msg in _read_range(d.uncommitted, topic, 0, low, high, timeout):
                claim = Claim.decode(msg.key(), msg.value(), msg.offset() or 0)
                if claim is not None and claim.owner_key == key:
                    claims.append(claim)
        return claims

    def _refuse_claim(self, sink_id: str, owner_location: str, where: str) -> ConfigError:
        return SinkOwnedError(
            f"kafka sink: sink id {sink_id!r} is already written by another query "
            f"(txsink state at {owner_location!r}, per {where}). Two queries with one sink "
            "id fence each other's transactions: give this query its own sink_id, or, if "
            "the other query and its checkpoint are gone for good, set the option "
            "'owner.takeover' to 'true' once", field="sink_id", sink_id=sink_id,
            owner_state=owner_location)

    def claim_sink(self, sink_id: str, state_id: str, state_location: str) -> None:
        """Bind ``sink_id`` to one query's state in the claim topic, or refuse.

        See :mod:`txsink_kafka.claims`: the whole claim topic is read, so the claim
        holds regardless of its age and of other sinks' traffic.
        """
        claims = self._read_claims(sink_id)
        owner = owner_of(claims)
        if owner is not None and owner.state_id == state_id:
            return
        where = f"the claim topic {self.config.claim_topic!r}"
        if owner is None:
            # Sinks claimed by releases before the claim topic: their owner record in
            # the marker partition, if it is still in the scan window.
            self.open_markers(sink_id)
            legacy = self._scan_state(sink_id).owner
            if legacy is not None and legacy.state_id != state_id and not self.config.takeover:
                raise self._refuse_claim(sink_id, legacy.state_location,
                                         f"the owner record in {self.config.marker_topic!r}")
        elif not self.config.takeover:
            raise self._refuse_claim(sink_id, owner.state_location, where)
        takeover = owner is not None and self.config.takeover
        mine = Claim(owner_key(self.config.transactional_id_prefix, sink_id), state_id,
                     state_location, takeover)
        key, value = mine.encode()
        d = self.driver()
        d.ends.produce(self.config.claim_topic, value, key, 0)
        if d.ends.flush(self.config.request_timeout_s):
            raise ConfigError(f"kafka sink: could not write the claim of sink {sink_id!r} to "
                              f"{self.config.claim_topic!r}", field="claim.topic",
                              sink_id=sink_id)
        # Read back: of claims written at the same moment the first one wins (for
        # takeovers, the last one).
        latest = owner_of(self._read_claims(sink_id))
        if latest is None or latest.state_id != state_id:
            raise ConfigError(
                f"kafka sink: sink id {sink_id!r} was claimed by another query (txsink state "
                f"at {latest.state_location if latest else '?'!r}) at the same time; give "
                "each query its own sink_id", field="sink_id", sink_id=sink_id)
        log.info("sink=%s: claimed for txsink state %s%s", sink_id, state_location,
                 " (takeover)" if takeover else "")

    def _from_marker(self, m: Marker) -> Committable:
        participant = participant_name(m.sink_id, m.epoch, m.partition, m.attempt)
        return Committable(
            self.name, m.sink_id, m.epoch, m.partition, m.attempt, participant,
            {"transactional_id": m.transactional_id, "producer_id": m.producer_id,
             "producer_epoch": m.producer_epoch,
             "marker": {"topic": self.config.marker_topic,
                        "partition": marker_partition(m.sink_id, self._marker_partitions or 1),
                        "offset": m.offset}})

    def list_prepared(self, sink_id: str) -> list[Committable]:
        """Participants that began and never ended.

        From the marker scan (which starts at or before the marker partition's last
        stable offset, so every open participant's begin marker is in it), checked
        against the coordinators where the broker can list transactions: a
        participant whose transaction the broker no longer has open (timed out, or
        committed with its end marker lost in a crash) is not listed. Includes
        participants still being written.
        """
        markers = self.open_markers(sink_id)
        broker = self._broker_view(sink_id)
        out: list[Committable] = []
        for tid, m in markers.items():
            if broker is not None:
                info = broker.get(tid)
                if info is None:
                    continue
                if m.producer_id >= 0 and info.identity != ProducerIdentity(
                        m.producer_id, m.producer_epoch):
                    continue  # a later use of a pooled id whose marker is not read yet
            out.append(self._from_marker(m))
        return sorted(out, key=lambda c: (c.epoch, c.partition, c.attempt))

    def abort_orphans(self, sink_id: str, protected: Collection[str],
                      up_to_epoch: int | None = None) -> list[Committable]:
        """Fence every participant that began, never ended, and no decided epoch holds.

        With ``up_to_epoch`` unset (a query start: none of its writers runs yet), open
        transactions of the sink that have no begin marker (a writer that died between
        registering its transaction and writing its first record) are aborted too.
        """
        aborted: list[Committable] = []
        d = self.driver()
        prepared = self.list_prepared(sink_id)
        for c in prepared:
            if c.participant in protected or (up_to_epoch is not None
                                              and c.epoch > up_to_epoch):
                continue
            tid, identity, (mtopic, mpart, _) = self._payload(c)
            if identity.producer_id >= 0:
                # Abort the transaction with its own producer id and epoch, then fence
                # the id so that a zombie writer cannot go on with it (InitProducerId
                # alone also aborts an ongoing transaction on Kafka and on Tansu 0.6).
                with contextlib.suppress(ConnectionDroppedError):
                    d.txn.end_txn(tid, identity, commit=False)
            self._fence(tid, identity)
            self._write_end(c, tid, mtopic, mpart, ABORTED)
            log.info("sink=%s epoch=%d partition=%d participant=%s: fenced orphan "
                     "transactional.id=%s", c.sink_id, c.epoch, c.partition, c.participant,
                     tid)
            aborted.append(c)
        if up_to_epoch is None:
            self._abort_unmarked(sink_id, {str(c.payload["transactional_id"])
                                           for c in prepared})
        if aborted:
            d.ends.flush(self.config.request_timeout_s)
        return aborted

    def _abort_unmarked(self, sink_id: str, marked: Collection[str]) -> None:
        broker = self._broker_view(sink_id) or {}
        preflight = preflight_id(self.config.transactional_id_prefix, sink_id)
        for tid, info in sorted(broker.items()):
            if tid in marked or tid == preflight:
                continue
            # Its begin marker is not in the marker partition, so no data of it either
            # (writers wait for the marker before writing data).
            log.warning("sink=%s: aborting open transaction of transactional.id=%s "
                        "(producer %d epoch %d, state %s) that has no begin marker",
                        sink_id, tid, info.producer_id, info.producer_epoch, info.state)
            with contextlib.suppress(ConnectionDroppedError):
                self.driver().txn.end_txn(tid, info.identity, commit=False)
            self._fence(tid, info.identity)
