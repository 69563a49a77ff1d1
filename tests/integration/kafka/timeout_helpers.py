"""Helpers of the tests that let transactions outlive their timeout (timeouts, salvage,
producer-id rotation), on the short-timeout broker of conftest.py."""

from __future__ import annotations

import hashlib
import time
import uuid

import pyarrow as pa
from txsink.coordinator import Coordinator
from txsink.faults import FaultInjector, FaultRule
from txsink.model import Committable
from txsink.plugins import build_plugins, get_plugins
from txsink.state import DirectoryStateStore
from txsink_kafka import testing as kt
from txsink_kafka.backend import KafkaBackend, close_shared_clients
from txsink_kafka.local_broker import LocalKafka


def batch(ids: range) -> pa.RecordBatch:
    return pa.record_batch({"key": pa.array([str(i).encode() for i in ids], pa.binary()),
                            "value": pa.array([b"v%d" % i for i in ids], pa.binary())})


def kafka_sink(kafka: LocalKafka, prefix: str, partitions: int
               ) -> tuple[str, str, dict[str, str], KafkaBackend]:
    """A fresh topic, compacted marker topic and sink id on ``kafka``, and a backend for
    them whose preflight ran: ``(topic, sink, options, backend)``."""
    topic, markers = f"t-{uuid.uuid4().hex[:8]}", f"m-{uuid.uuid4().hex[:8]}"
    kt.create_topic(kafka.bootstrap, topic, partitions=partitions)
    kt.create_topic(kafka.bootstrap, markers, partitions=1, compacted=True)
    sink = f"{prefix}-{uuid.uuid4().hex[:8]}"
    # The broker's transaction.max.timeout.ms: the shortest the fixture allows.
    timeout_ms = kafka.properties["transaction.max.timeout.ms"]
    options = {"kafka.bootstrap.servers": kafka.bootstrap, "topic": topic,
               "marker.topic": markers, "kafka.transaction.timeout.ms": timeout_ms}
    return topic, sink, options, new_backend(options, sink)


def new_backend(options: dict[str, str], sink: str) -> KafkaBackend:
    backend = get_plugins().create_backend("kafka", options)
    assert isinstance(backend, KafkaBackend)
    backend.preflight(sink)
    return backend


def wait_until_not_open(backend: KafkaBackend, tids: list[str], within_s: float = 120) -> None:
    """Until the coordinator has aborted them (no clock assertion: the broker decides)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        described = backend.driver().txn.describe_transactions(tids)
        if all(info is not None and not info.is_open for info in described.values()):
            return
        time.sleep(0.5)
    raise AssertionError(f"the broker did not abort {tids} within {within_s}s")


def tid(c: Committable) -> str:
    return str(c.payload["transactional_id"])


def digest(values: list[bytes]) -> tuple[int, str]:
    """Count and order-free checksum of record values (the exactly-once oracle)."""
    return len(values), hashlib.sha256(b"\0".join(sorted(values))).hexdigest()


def committed_values(bootstrap: str, topic: str) -> list[bytes]:
    """What an independent read_committed consumer sees."""
    return [m.value() for m in kt.read_topic(bootstrap, topic)]


def restart(options: dict[str, str], sink: str, state: DirectoryStateStore,
            fault: str | None = None, epoch: int = 0) -> None:
    """A new driver process: fresh clients, recovery at start, maybe a crash in it (at
    ``fault`` of ``epoch``)."""
    close_shared_clients()
    backend = new_backend(options, sink)
    faults = FaultInjector([FaultRule(fault, epoch, "raise")] if fault else [])
    try:
        Coordinator(backend, state, sink, plugins=build_plugins(), faults=faults,
                    backend_options=options).start()
    finally:
        backend.close()
