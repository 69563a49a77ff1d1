"""A full librdkafka queue (the broker takes records slower than a task makes them,
as on a loaded machine) delays a write; it never fails it spuriously and never
produces a record twice. A queue of 5 messages makes every write hit it."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest
from conftest import Broker
from txsink.coordinator import Coordinator, EpochOutcome
from txsink.model import TransactionContext
from txsink.plugins import get_plugins
from txsink.realtime import PositionWriter, SourcePartition
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant
from txsink_kafka import testing as kt
from txsink_kafka.backend import KafkaBackend

pytestmark = [pytest.mark.integration]

TINY_QUEUE = {"kafka.queue.buffering.max.messages": "5"}
ROWS = 300


def _values(broker: Broker, topic: str) -> list[int]:
    return sorted(int(m.value()) for m in kt.read_topic(broker.bootstrap, topic))


def test_a_micro_batch_write_waits_for_room_and_writes_each_record_once(
        kafka_broker: Broker, topic: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    if kt.tansu_selected():
        pytest.skip(kt.TANSU_CANNOT)
    sink = f"qf-{uuid.uuid4().hex[:8]}"
    markers = f"{sink}-markers"
    kt.create_topic(kafka_broker.bootstrap, markers, compacted=True)
    backend = get_plugins().create_backend("kafka", {
        "kafka.bootstrap.servers": kafka_broker.bootstrap, "topic": topic,
        "marker.topic": markers, **TINY_QUEUE})
    try:
        coord = Coordinator(backend, DirectoryStateStore(tmp_path / "state"), sink)
        coord.start()
        batch = pa.record_batch({"value": pa.array([b"%d" % i for i in range(ROWS)])})
        keyed = pa.record_batch({"value": pa.array([b"%d" % i for i in range(ROWS, 2 * ROWS)]),
                                 "topic": pa.array([topic] * ROWS)})
        msgs = [write_participant(backend, TransactionContext(sink, 0, 0), [batch]),
                write_participant(backend, TransactionContext(sink, 0, 1), [keyed])]
        assert coord.commit_epoch(0, msgs) is EpochOutcome.COMMITTED
    finally:
        assert isinstance(backend, KafkaBackend)
        backend.close()
    assert _values(kafka_broker, topic) == list(range(2 * ROWS))


def test_a_real_time_write_waits_for_room_and_writes_each_record_once(
        kafka_broker: Broker, topic: str) -> None:
    if kt.tansu_selected():
        pytest.skip(kt.TANSU_CANNOT)
    sink = f"qf-{uuid.uuid4().hex[:8]}"
    spec = KafkaBackend.realtime_target(sink, {
        "topic": topic, "kafka.bootstrap.servers": kafka_broker.bootstrap,
        "progress.topic": f"{sink}-progress", **TINY_QUEUE})
    spec.prepare()
    source = SourcePartition("orders", 0)
    w = PositionWriter(spec, commit_interval_s=3600)  # one transaction of every row
    for off in range(ROWS):
        w.add(source, off, {"value": str(off)})
    w.close()
    assert _values(kafka_broker, topic) == list(range(ROWS))
    assert spec.stored_positions() == {source: ROWS - 1}
