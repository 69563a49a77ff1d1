"""The few transaction-coordinator requests librdkafka cannot send for us.

librdkafka (confluent-kafka) cannot resume a transaction that another process
opened, so the driver finishes prepared participants the way Flink's
``resumeTransaction`` does: it sends ``EndTxn(transactional.id, producer id,
epoch, commit)`` itself. ``InitProducerId`` on a transactional id fences its
current producer and aborts the transaction it left open: that is how orphans are
cleaned up without creating a producer. Both requests go to the transaction
coordinator of the id, found with ``FindCoordinator(key_type=transaction)``.

kafka-python 3 has the protocol messages and a connection manager that handles
SASL/SSL; it has no public "send this request to that node" call, so the two
private entry points used here (``KafkaAdminClient._manager`` and
``_find_coordinator_id``) are confined to this module (:func:`send_to_node` lends
the first to the test helpers' log reader).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

#: EndTxn v3 is the last version with "transaction version 1" semantics (v5+ is
#: KIP-890, where the broker bumps the epoch at every EndTxn).
END_TXN_MAX_VERSION = 3
INIT_PRODUCER_ID_MAX_VERSION = 3

#: Error codes (Kafka protocol) the coordinator answers with.
NONE = 0
COORDINATOR_LOAD_IN_PROGRESS = 14
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
INVALID_PRODUCER_ID_MAPPING = 49
INVALID_TRANSACTION_TIMEOUT = 50
CONCURRENT_TRANSACTIONS = 51
PRODUCER_FENCED = 90
TRANSACTIONAL_ID_NOT_FOUND = 105

#: Fetch answers: the offset is below the log start (deleted) or above the end.
OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3
#: Fetch answers worth another try after new metadata: a leader moving, a broker
#: loading, a request timing out.
FETCH_RETRIABLE = frozenset({5, 6, 7, 14, 15, 74, 75})

#: Consecutive dropped connections on one request before giving up on it.
MAX_DROPPED = 3

_RETRIABLE = {COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR,
              CONCURRENT_TRANSACTIONS}
_MOVED = {COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR}

#: confluent-kafka (librdkafka) setting -> kafka-python setting, for the connection only.
_CONFIG_MAP: dict[str, str] = {
    "bootstrap.servers": "bootstrap_servers",
    "client.id": "client_id",
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
}
#: librdkafka settings that change how a connection is made but cannot be mapped.
UNMAPPED_CONNECTION_SETTINGS = ("sasl.oauthbearer.", "sasl.kerberos.", "ssl.keystore.",
                                "ssl.engine.", "ssl.providers", "ssl_engine_")


class TxnProtocolError(Exception):
    """The coordinator could not be reached or answered with an unexpected error."""

    def __init__(self, message: str, *, error_code: int | None = None,
                 retriable: bool = True) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.retriable = retriable


class ConnectionDroppedError(TxnProtocolError):
    """The broker closed the connection on this request again and again.

    Apache Kafka answers a rejected EndTxn with an error code; Tansu 0.6 drops the
    connection instead, so callers treat this like a rejection they cannot name.
    """


class EndTxnResult(str, enum.Enum):
    #: The coordinator accepted the request (also answered to an identical retry).
    OK = "ok"
    #: The producer epoch is no longer current: someone fenced this transactional id.
    FENCED = "fenced"
    #: The transaction is not in a state that allows this (e.g. abort after commit).
    INVALID_STATE = "invalid-state"
    #: The coordinator does not know this producer id for the transactional id
    #: (expired after ``transactional.id.expiration.ms``, or never existed).
    UNKNOWN_PRODUCER = "unknown-producer"


@dataclass(frozen=True)
class ProducerIdentity:
    producer_id: int
    producer_epoch: int


#: Coordinator states in which a transaction is open (holds records back from readers).
OPEN_STATES = frozenset({"Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence"})


@dataclass(frozen=True)
class TransactionInfo:
    """One transactional id as its coordinator describes it (DescribeTransactions)."""

    transactional_id: str
    state: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    #: When the open transaction began (coordinator clock, ms); -1 when none is open.
    start_ms: int
    partitions: tuple[tuple[str, int], ...] = ()

    @property
    def is_open(self) -> bool:
        return self.state in OPEN_STATES

    @property
    def identity(self) -> ProducerIdentity:
        return ProducerIdentity(self.producer_id, self.producer_epoch)


class UnsupportedByBrokerError(TxnProtocolError):
    """The broker lacks the admin request (Kafka before 3.0, Tansu)."""


class TopicGoneError(TxnProtocolError):
    """The topic or partition is not in the cluster's metadata (deleted)."""


@dataclass(frozen=True)
class FetchAnswer:
    """One partition's answer to a raw Fetch (``read_uncommitted``, control batches
    included): kafka-python record batches in offset order, and where the log is."""

    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    batches: tuple[Any, ...] = ()


def _kafka() -> Any:
    """Import kafka-python's pieces, hiding the DeprecationWarning its import raises.

    kafka-python 3.0 loads its protocol schemas with ``importlib.resources.read_text``,
    deprecated since Python 3.11; nothing a caller can act on.
    """
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import kafka  # type: ignore[import-untyped]
        import kafka.net.inet  # type: ignore[import-untyped]
        import kafka.protocol.admin.transactions  # type: ignore[import-untyped]
        import kafka.protocol.consumer.fetch  # type: ignore[import-untyped]
        import kafka.protocol.metadata  # type: ignore[import-untyped]
        import kafka.protocol.producer.transaction  # type: ignore[import-untyped]
        import kafka.record  # type: ignore[import-untyped]
    _close_refused_sockets(kafka.net.inet.KafkaNetSocket)
    return kafka


def _close_refused_sockets(socket_class: Any) -> None:
    """Make kafka-python close a socket whose connect failed.

    kafka-python 3.0's ``KafkaNetSocket.sock_connect`` raises on a refused or timed
    out connect without closing the socket, so a client that keeps trying a broker
    that is restarting (what txsink's commit retries do) leaks one file descriptor
    per try. Wrapped once per process.
    """
    original = socket_class.sock_connect
    if getattr(original, "_txsink_closes", False):
        return

    async def sock_connect(self: Any, net: Any, sock: Any, sockaddr: Any,
                           timeout_at: Any = None) -> Any:
        try:
            return await original(self, net, sock, sockaddr, timeout_at=timeout_at)
        except BaseException:
            sock.close()
            raise

    sock_connect._txsink_closes = True  # type: ignore[attr-defined]
    socket_class.sock_connect = sock_connect


class _RedactSecrets(logging.Filter):
    """Scrubs known secret values from kafka-python's log records.

    kafka-python logs its whole configuration (SASL/SSL passwords included) and, at
    DEBUG, the raw bytes of every request (a SASL/PLAIN handshake carries the
    password): neither may reach a txsink user's logs.
    """

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            text = record.getMessage()
            if any(s in text for s in self.secrets):
                for secret in sorted(self.secrets, key=len, reverse=True):
                    text = text.replace(secret, "***")
                record.msg, record.args = text, ()
        return True


_REDACT = _RedactSecrets()


def _guard_kafka_python_logs(secrets: list[str]) -> None:
    """Put the redacting filter on every kafka-python logger that exists by now."""
    _REDACT.secrets.update(s for s in secrets if s)
    if not _REDACT.secrets:
        return
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if ((name == "kafka" or name.startswith("kafka."))
                and isinstance(logger, logging.Logger) and _REDACT not in logger.filters):
            logger.addFilter(_REDACT)


def send_to_node(admin: Any, request: Any, node_id: int) -> Any:
    """Send ``request`` to broker ``node_id`` with ``admin``'s connections; the response."""

    async def send() -> Any:
        return await admin._manager.send(request, node_id=node_id)

    return admin._manager.run(send)


def kafka_python_config(librdkafka: Mapping[str, str]) -> dict[str, Any]:
    """Translate the connection part of a librdkafka config to kafka-python's names."""
    out: dict[str, Any] = {}
    for key, value in librdkafka.items():
        target = _CONFIG_MAP.get(key)
        if target is None:
            continue
        if target in ("security_protocol", "sasl_mechanism"):
            value = value.upper()
        out[target] = value
    return out


class TxnCoordinatorClient:
    """Sends FindCoordinator / EndTxn / InitProducerId with bounded retries.

    One instance holds one kafka-python connection manager; it is meant to live on
    the driver for the life of a backend instance and must be closed.
    """

    def __init__(self, librdkafka_config: Mapping[str, str], *, timeout_s: float = 30.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        kafka = _kafka()
        self.timeout_s = timeout_s
        self._sleep = sleep
        config = kafka_python_config(librdkafka_config)
        config.setdefault("client_id", "txsink-committer")
        # Before the client logs its configuration.
        _guard_kafka_python_logs([str(v) for k, v in config.items()
                                  if "password" in k or "secret" in k])
        ms = int(timeout_s * 1000)
        config.update(request_timeout_ms=ms, bootstrap_timeout_ms=ms)
        try:
            self._admin = kafka.KafkaAdminClient(**config)
        except Exception as exc:
            raise TxnProtocolError(
                f"cannot connect to Kafka at {librdkafka_config.get('bootstrap.servers')!r} "
                f"to reach the transaction coordinator: {type(exc).__name__}: {exc}"
            ) from None
        self._manager = self._admin._manager
        _guard_kafka_python_logs([])  # modules the client imported while starting

    def close(self) -> None:
        try:
            self._admin.close()
        except Exception:  # pragma: no cover - best effort on shutdown
            log.debug("closing the kafka-python admin client failed", exc_info=True)

    def find_coordinator(self, transactional_id: str, *, refresh: bool = False) -> int:
        """The node id of the transaction coordinator for ``transactional_id``; cached,
        unless ``refresh`` asks the cluster again."""
        if refresh:
            self._forget_coordinator(transactional_id)
        coordinator_type = _kafka().protocol.metadata.CoordinatorType
        node: int = self._manager.run(self._admin._find_coordinator_id, transactional_id,
                                      coordinator_type.TRANSACTION)
        return node

    def _forget_coordinator(self, transactional_id: str) -> None:
        coordinator_type = _kafka().protocol.metadata.CoordinatorType
        cache = getattr(self._manager.cluster, "_coordinators", None)
        if isinstance(cache, dict):
            cache.pop((coordinator_type.TRANSACTION, transactional_id), None)

    async def _send_to(self, request: Any, node: int) -> Any:
        return await self._manager.send(request, node_id=node)

    def _send(self, transactional_id: str, build: Callable[[], Any], what: str) -> Any:
        """Send to the coordinator, retrying coordinator moves and dropped connections."""
        deadline = time.monotonic() + self.timeout_s
        delay = 0.05
        last = "no attempt"
        dropped = 0
        while True:
            try:
                node = self.find_coordinator(transactional_id)
                request = build()

                response = self._manager.run(self._send_to, request, node)
            except Exception as exc:
                # Dropped connections, timeouts, unknown node: all worth another try.
                last = f"{type(exc).__name__}: {exc}"
                self._forget_coordinator(transactional_id)
                if "disconnected" in last:
                    dropped += 1
                    if dropped >= MAX_DROPPED:
                        raise ConnectionDroppedError(
                            f"{what} for transactional.id {transactional_id!r}: the broker "
                            f"closed the connection {dropped} times in a row instead of "
                            "answering (Tansu does this where Kafka answers an error such "
                            "as PRODUCER_FENCED)") from None
            else:
                code = int(response.error_code)
                if code not in _RETRIABLE:
                    return response
                last = f"error code {code}"
                if code in _MOVED:
                    self._forget_coordinator(transactional_id)
            if time.monotonic() + delay > deadline:
                raise TxnProtocolError(
                    f"{what} for transactional.id {transactional_id!r} did not complete "
                    f"within {self.timeout_s:.0f}s; last error: {last}")
            log.debug("%s for transactional.id %s: %s; retrying in %.2fs", what,
                      transactional_id, last, delay)
            self._sleep(delay)
            delay = min(delay * 2, 1.0)

    def end_txn(self, transactional_id: str, identity: ProducerIdentity,
                *, commit: bool) -> EndTxnResult:
        """Commit or abort the open transaction of ``identity`` on ``transactional_id``.

        Kafka answers an identical retry of a completed EndTxn with success, so
        ``OK`` alone does not say whether this call or an earlier one finished it.
        """
        messages = _kafka().protocol.producer.transaction

        def build() -> Any:
            return messages.EndTxnRequest(transactional_id=transactional_id,
                                 producer_id=identity.producer_id,
                                 producer_epoch=identity.producer_epoch,
                                 committed=commit, max_version=END_TXN_MAX_VERSION)

        what = "EndTxn(commit)" if commit else "EndTxn(abort)"
        code = int(self._send(transactional_id, build, what).error_code)
        if code == NONE:
            return EndTxnResult.OK
        if code in (PRODUCER_FENCED, INVALID_PRODUCER_EPOCH):
            return EndTxnResult.FENCED
        if code == INVALID_TXN_STATE:
            return EndTxnResult.INVALID_STATE
        if code == INVALID_PRODUCER_ID_MAPPING:
            return EndTxnResult.UNKNOWN_PRODUCER
        raise TxnProtocolError(f"{what} for transactional.id {transactional_id!r} failed "
                               f"with Kafka error code {code}", error_code=code,
                               retriable=False)

    def init_producer_id(self, transactional_id: str,
                         transaction_timeout_ms: int) -> ProducerIdentity:
        """Fence ``transactional_id``: bump its epoch and abort any open transaction."""
        messages = _kafka().protocol.producer.transaction

        def build() -> Any:
            return messages.InitProducerIdRequest(transactional_id=transactional_id,
                                         transaction_timeout_ms=transaction_timeout_ms,
                                         max_version=INIT_PRODUCER_ID_MAX_VERSION)

        response = self._send(transactional_id, build, "InitProducerId")
        code = int(response.error_code)
        if code != NONE:
            raise TxnProtocolError(
                f"InitProducerId for transactional.id {transactional_id!r} failed with Kafka "
                f"error code {code}"
                + (" (transaction.timeout.ms is above the broker's "
                   "transaction.max.timeout.ms)" if code == INVALID_TRANSACTION_TIMEOUT else ""),
                error_code=code, retriable=False)
        return ProducerIdentity(int(response.producer_id), int(response.producer_epoch))

    # -- admin: the coordinators' view of transactional ids ---------------------------

    def describe_transactions(self, transactional_ids: list[str]
                              ) -> dict[str, TransactionInfo | None]:
        """DescribeTransactions for each id; ``None`` for ids the coordinator never saw.

        Needs DESCRIBE on the ids (WRITE implies it). Raises
        :class:`UnsupportedByBrokerError` where the broker has no such request.
        """
        messages = _kafka().protocol.admin.transactions
        by_node: dict[int, list[str]] = {}
        for tid in transactional_ids:
            by_node.setdefault(self._coordinator_or_raise(tid), []).append(tid)
        out: dict[str, TransactionInfo | None] = {}
        for node, ids in by_node.items():
            request = messages.DescribeTransactionsRequest(transactional_ids=ids)
            try:
                response = self._manager.run(self._send_to, request, node)
            except Exception as exc:
                if "UnsupportedVersion" in type(exc).__name__ or "not support" in str(exc):
                    raise UnsupportedByBrokerError(
                        "the broker does not answer DescribeTransactions (Kafka 3.0+ does)",
                        retriable=False) from None
                for tid in ids:
                    self._forget_coordinator(tid)
                raise TxnProtocolError(f"DescribeTransactions failed: {type(exc).__name__}: "
                                       f"{exc}") from None
            for state in response.transaction_states:
                code = int(state.error_code)
                tid = str(state.transactional_id)
                if code == TRANSACTIONAL_ID_NOT_FOUND:
                    out[tid] = None
                    continue
                if code != NONE:
                    if code in _MOVED:
                        self._forget_coordinator(tid)
                    raise TxnProtocolError(f"DescribeTransactions for transactional.id "
                                           f"{tid!r} failed with Kafka error code {code}",
                                           error_code=code, retriable=code in _RETRIABLE)
                out[tid] = TransactionInfo(
                    tid, str(state.transaction_state), int(state.producer_id),
                    int(state.producer_epoch), int(state.transaction_timeout_ms),
                    int(state.transaction_start_time_ms),
                    tuple(sorted((str(t.topic), int(p)) for t in state.topics
                                 for p in t.partitions)))
        return out

    # -- raw reads and features -------------------------------------------------------

    def partition_leader(self, topic: str, partition: int) -> int:
        """The node id leading ``topic[partition]``; :class:`TopicGoneError` if the
        cluster does not have it."""
        try:
            described = self._admin.describe_topics([topic])
        except Exception as exc:
            raise TxnProtocolError(f"Metadata for topic {topic!r} failed: "
                                   f"{type(exc).__name__}: {exc}") from None
        if not described or int(described[0]["error_code"]) == UNKNOWN_TOPIC_OR_PARTITION:
            raise TopicGoneError(f"topic {topic!r} does not exist (deleted?)",
                                 error_code=UNKNOWN_TOPIC_OR_PARTITION, retriable=False)
        code = int(described[0]["error_code"])
        if code:
            raise TxnProtocolError(f"Metadata for topic {topic!r} answered Kafka error "
                                   f"code {code}", error_code=code)
        for p in described[0]["partitions"]:
            if int(p["partition_index"]) == partition:
                leader = int(p["leader_id"])
                if leader < 0:
                    raise TxnProtocolError(f"{topic}[{partition}] has no leader now")
                return leader
        raise TopicGoneError(f"topic {topic!r} has no partition {partition}",
                             error_code=UNKNOWN_TOPIC_OR_PARTITION, retriable=False)

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int) -> FetchAnswer:
        """Read ``topic[partition]`` from ``offset`` as the log holds it: every batch
        (aborted, open and control batches included) with its producer id and epoch.

        One Fetch (v12, by topic name) to the partition's leader, ``read_uncommitted``;
        up to ``max_bytes`` (at least the first batch whole, as Kafka answers).
        """
        kafka = _kafka()
        fetch_request = kafka.protocol.consumer.fetch.FetchRequest
        part_type = fetch_request.FetchTopic.FetchPartition
        request = fetch_request(
            replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=max_bytes,
            isolation_level=0, session_id=0, session_epoch=-1, forgotten_topics_data=[],
            rack_id="", max_version=12, topics=[fetch_request.FetchTopic(
                topic=topic, partitions=[part_type(
                    partition=partition, current_leader_epoch=-1, fetch_offset=offset,
                    log_start_offset=-1, partition_max_bytes=max_bytes)])])
        node = self.partition_leader(topic, partition)
        try:
            response = self._manager.run(self._send_to, request, node)
        except Exception as exc:
            raise TxnProtocolError(f"Fetch of {topic}[{partition}] at offset {offset} "
                                   f"failed: {type(exc).__name__}: {exc}") from None
        for answer in response.responses:
            for data in answer.partitions:
                if int(data.partition_index) != partition:
                    continue
                batches: list[Any] = []
                if data.records:
                    records = kafka.record.MemoryRecords(bytes(data.records))
                    while (batch := records.next_batch()) is not None:
                        batches.append(batch)
                return FetchAnswer(int(data.error_code), int(data.high_watermark),
                                   int(data.last_stable_offset), int(data.log_start_offset),
                                   tuple(batches))
        raise TxnProtocolError(f"Fetch of {topic}[{partition}] was answered without it")

    def finalized_features(self) -> dict[str, int]:
        """The cluster's finalized feature levels (ApiVersions v3+, KIP-584), e.g.
        ``transaction.version``; a feature the cluster has not finalized is absent."""
        try:
            features = self._admin.describe_features()
        except Exception as exc:
            raise TxnProtocolError(f"ApiVersions (features) failed: {type(exc).__name__}: "
                                   f"{exc}") from None
        return {str(name): int(v["finalized"][1]) for name, v in features.items()
                if "finalized" in v}

    def _coordinator_or_raise(self, transactional_id: str) -> int:
        try:
            return self.find_coordinator(transactional_id)
        except Exception as exc:
            raise TxnProtocolError(f"FindCoordinator for transactional.id "
                                   f"{transactional_id!r} failed: {type(exc).__name__}: "
                                   f"{exc}") from None

    def list_open_transactional_ids(self) -> list[str]:
        """Transactional ids with an open transaction, from every broker (ListTransactions).

        Only ids the principal may DESCRIBE are listed. Raises
        :class:`UnsupportedByBrokerError` where the broker has no such request.
        """
        try:
            listings = self._admin.list_transactions(state_filters=sorted(OPEN_STATES))
        except Exception as exc:
            if "UnsupportedVersion" in type(exc).__name__ or "not support" in str(exc):
                raise UnsupportedByBrokerError(
                    "the broker does not answer ListTransactions (Kafka 3.0+ does)",
                    retriable=False) from None
            raise TxnProtocolError(f"ListTransactions failed: {type(exc).__name__}: "
                                   f"{exc}") from None
        return sorted({str(t.transactional_id) for rows in listings.values() for t in rows})

    def open_transaction_starts(self, partitions: list[tuple[str, int]]
                                ) -> dict[tuple[str, int], dict[int, int]]:
        """Per partition: producer id -> first offset of its open transaction there.

        DescribeProducers (KIP-664), asked of each partition's leader; where the broker
        cannot answer, nothing (see :meth:`transaction_starts` for the strict form).
        """
        try:
            return self.transaction_starts(partitions)
        except TxnProtocolError as exc:
            log.debug("DescribeProducers failed: %s", exc)
            return {}

    def transaction_starts(self, partitions: list[tuple[str, int]]
                           ) -> dict[tuple[str, int], dict[int, int]]:
        """:meth:`open_transaction_starts` that says why it has no answer.

        Raises :class:`UnsupportedByBrokerError` where the broker has no such request
        (before Kafka 2.8) or the principal may not ask it (no READ on the topic), and a
        retriable :class:`TxnProtocolError` otherwise (a broker restarting, a leader
        moving).
        """
        from kafka.errors import (  # type: ignore[import-untyped]
            AuthorizationError,
            UnsupportedVersionError,
        )
        from kafka.structs import TopicPartition  # type: ignore[import-untyped]

        try:
            states = self._admin.describe_producers(
                [TopicPartition(t, p) for t, p in partitions])
        except (UnsupportedVersionError, AuthorizationError) as exc:
            raise UnsupportedByBrokerError(
                f"DescribeProducers is not answered: {type(exc).__name__}: {exc}",
                retriable=False) from None
        except Exception as exc:
            raise TxnProtocolError(f"DescribeProducers failed: {type(exc).__name__}: "
                                   f"{exc}") from None
        return {(str(tp.topic), int(tp.partition)): {
            int(p.producer_id): int(p.current_transaction_start_offset)
            for p in state.active_producers if int(p.current_transaction_start_offset) >= 0}
            for tp, state in states.items()}
