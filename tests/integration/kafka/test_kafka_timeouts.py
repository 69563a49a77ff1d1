"""Transaction timeouts on a real broker, for both transaction versions.

Each test starts its own Apache Kafka with a short ``transaction.max.timeout.ms`` and
a one-second timed-out-transaction cleanup, so the coordinator aborts a prepared
transaction within seconds of its ``transaction.timeout.ms``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from txsink.coordinator import Coordinator
from txsink.errors import ParticipantLostError
from txsink.faults import AFTER_DECIDE, FaultInjector, FaultRule, InjectedFault
from txsink.model import TransactionContext
from txsink.plugins import build_plugins, get_plugins
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant
from txsink_kafka import testing as kt
from txsink_kafka.backend import KafkaBackend, close_shared_clients
from txsink_kafka.local_broker import LocalKafka

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TIMEOUT_MS = 3000


@pytest.fixture(params=[1, 2], ids=["tv1", "tv2"])
def short_timeout_kafka(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalKafka]:
    kafka = LocalKafka(tmp_path / "kafka", transaction_version=request.param, properties={
        "transaction.max.timeout.ms": str(TIMEOUT_MS),
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
    })
    try:
        kafka.start()
        yield kafka
    finally:
        close_shared_clients()
        kafka.close()


def batch(ids: range) -> pa.RecordBatch:
    return pa.record_batch({"key": pa.array([str(i).encode() for i in ids], pa.binary()),
                            "value": pa.array([b"v%d" % i for i in ids], pa.binary())})


def wait_until_not_open(backend: KafkaBackend, tids: list[str], within_s: float = 120) -> None:
    """Until the coordinator has aborted them (no clock assertion: the broker decides)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        described = backend.driver().txn.describe_transactions(tids)
        if all(info is not None and not info.is_open for info in described.values()):
            return
        time.sleep(0.5)
    raise AssertionError(f"the broker did not abort {tids} within {within_s}s")


def test_a_decided_epoch_lost_to_the_broker_timeout_stops_the_restart(
        short_timeout_kafka: LocalKafka, tmp_path: Path) -> None:
    bootstrap = short_timeout_kafka.bootstrap
    topic, markers = f"t-{uuid.uuid4().hex[:8]}", f"m-{uuid.uuid4().hex[:8]}"
    kt.create_topic(bootstrap, topic, partitions=2)
    kt.create_topic(bootstrap, markers, partitions=1)
    sink = f"to-{uuid.uuid4().hex[:8]}"
    options = {"kafka.bootstrap.servers": bootstrap, "topic": topic, "marker.topic": markers,
               "kafka.transaction.timeout.ms": str(TIMEOUT_MS)}
    backend = get_plugins().create_backend("kafka", options)
    assert isinstance(backend, KafkaBackend)
    backend.preflight(sink)
    state = DirectoryStateStore(tmp_path / "state")
    crash = FaultInjector([FaultRule(AFTER_DECIDE, 0, "raise")])
    coord = Coordinator(backend, state, sink, plugins=build_plugins(), faults=crash)
    coord.start()
    msgs = [write_participant(backend, TransactionContext(sink, 0, p), [batch(range(10))])
            for p in range(2)]
    with pytest.raises(InjectedFault):  # the driver dies right after deciding
        coord.commit_epoch(0, msgs)
    # ... and stays down longer than transaction.timeout.ms.
    wait_until_not_open(backend, [str(c.payload["transactional_id"]) for c in msgs])
    backend.close()
    close_shared_clients()  # a new driver process
    restarted = get_plugins().create_backend("kafka", options)
    try:
        with pytest.raises(ParticipantLostError) as lost:
            Coordinator(restarted, state, sink, plugins=build_plugins()).start()
    finally:
        restarted.close()
    text = str(lost.value)
    print(f"\ntransaction.version={short_timeout_kafka.transaction_version}: {text}")
    assert lost.value.epoch == 0 and lost.value.sink_id == sink
    for c in msgs:
        assert c.participant in text
    assert "transaction.timeout.ms" in str(lost.value.__cause__)
    # Never success: the epoch stays DECIDED, and the data is not readable.
    record = state.get(0)
    assert record is not None and record.state.value == "decided"
    assert kt.read_topic(bootstrap, topic) == []
