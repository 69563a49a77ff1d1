"""The conformance kit against a live broker (Apache Kafka by default, see conftest.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa
import pytest
from conftest import Broker
from txsink.backend import Backend
from txsink.testing.conformance import BackendConformance
from txsink_kafka import testing as kt
from txsink_kafka.backend import KafkaBackend
from txsink_kafka.markers import BEGIN, Marker

pytestmark = pytest.mark.integration


def participant_of(m: Marker) -> str:
    return f"{m.sink_id}-e{m.epoch}-p{m.partition}-a{m.attempt}"


def broker_open_participants(backend: KafkaBackend, sink_id: str) -> set[str]:
    """Participants whose transaction is still open, by the broker and by the log.

    By the broker: a participant's marker is the first record of its transaction,
    so while the transaction is open the marker partition's last stable offset
    (what a read_committed consumer may read up to) stays at or below the marker's
    offset. Each test has its own marker topic, so other tests do not hold it back.
    By the log: a transaction of the participant's producer id with no commit or
    abort marker after it, in the marker topic or the data topic.
    """
    from confluent_kafka import Consumer, TopicPartition

    bootstrap = backend.config.bootstrap
    topic = backend.config.marker_topic
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "txsink-test",
                         "isolation.level": "read_committed"})
    try:
        _, lso = consumer.get_watermark_offsets(TopicPartition(topic, 0), 30)
    finally:
        consumer.close()
    out = set()
    for msg in kt.read_topic(bootstrap, topic, isolation="read_uncommitted"):
        m = Marker.decode(msg.key(), msg.value(), msg.offset())
        if m is not None and m.kind == BEGIN and m.sink_id == sink_id and m.offset >= lso:
            out.add(participant_of(m))
    data = [backend.config.topic] if backend.config.topic else []
    out |= {participant_of(m) for m in kt.open_sink_transactions(
        bootstrap, sink_id, topic, data).values()}
    return out


@pytest.mark.promise("kafka-read-committed-exactly-once", "backend")
class TestKafkaConformance(BackendConformance):
    backend_name = "kafka"
    large_partition_bytes = 48 * 1024 * 1024
    # Kafka writes commit markers after answering EndTxn and accepts a repeated
    # EndTxn(commit): a repeat right after the first commit may answer COMMITTED.
    exact_repeat_outcome = False

    @pytest.fixture
    def backend_options(self, kafka_broker: Broker, topic: str,
                        marker_topic: str) -> Mapping[str, str]:
        return {"kafka.bootstrap.servers": kafka_broker.bootstrap, "topic": topic,
                "marker.topic": marker_topic, "kafka.transaction.timeout.ms": "120000"}

    def make_batch(self, ids: Sequence[int]) -> pa.RecordBatch:
        return pa.record_batch({
            "key": pa.array([str(i).encode() for i in ids], pa.binary()),
            "value": pa.array([b"row-%d-payload-%032d" % (i, i) for i in ids], pa.binary()),
        })

    @pytest.fixture(autouse=True)
    def _broker(self, broker_caps: kt.BrokerCapabilities) -> None:
        self.caps = broker_caps

    def read_ids(self, backend: Backend, sink_id: str) -> list[int]:
        """What read_committed readers see: the broker's filter on Kafka; on Tansu,
        which shows aborted records to them, the log's transaction markers."""
        assert isinstance(backend, KafkaBackend) and backend.config.topic
        return [int(r.key or b"") for r in kt.committed_view(
            self.caps, backend.config.bootstrap, backend.config.topic)]

    def open_participants(self, backend: Backend, sink_id: str) -> set[str]:
        assert isinstance(backend, KafkaBackend)
        return broker_open_participants(backend, sink_id)
