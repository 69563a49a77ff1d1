"""The Kafka real-time target in a group: a claim leaves a progress marker at -1
before any target commits a row (what tells a crash between two targets' commits from
a target that was never there), read back by ``stored_positions`` (``txsink status``)
without changing anything."""

from __future__ import annotations

import uuid

import pytest
from conftest import Broker
from txsink.realtime import NOTHING, GroupWriter, SourcePartition
from txsink_kafka import testing as kt
from txsink_kafka.backend import KafkaBackend
from txsink_kafka.realtime import KafkaRealtimeSpec

pytestmark = [pytest.mark.integration]

A, B = SourcePartition("orders", 0), SourcePartition("orders", 1)


def spec_for(broker: Broker, topic: str, sink: str) -> KafkaRealtimeSpec:
    spec = KafkaBackend.realtime_target(sink, {
        "topic": topic, "kafka.bootstrap.servers": broker.bootstrap,
        "progress.topic": f"{sink.split('--')[0]}-progress"})
    assert isinstance(spec, KafkaRealtimeSpec)
    spec.prepare()
    return spec


@pytest.mark.promise("realtime-claim-before-commit", "realtime")
def test_a_claim_is_stored_before_any_target_commits_and_each_keeps_its_own(
        kafka_broker: Broker, topic: str) -> None:
    if kt.tansu_selected():
        pytest.skip(kt.TANSU_CANNOT)
    group = f"rtg-{uuid.uuid4().hex[:8]}"
    other = f"{topic}-b"
    kt.create_topic(kafka_broker.bootstrap, other)
    events = spec_for(kafka_broker, topic, f"{group}--events")
    audit = spec_for(kafka_broker, other, f"{group}--audit")
    w = GroupWriter({"events": events, "audit": audit}, commit_interval_s=60)
    w.add(A, 0, {"events": {"value": "0"}, "audit": {"value": "0"}})
    # Claimed in both, nothing committed yet: both know the source partition.
    assert events.stored_positions() == audit.stored_positions() == {A: NOTHING}
    w.add(A, 1, {"events": {"value": "1"}, "audit": None})  # audit's where left it out
    w.add(B, 0, {"events": {"value": "2"}, "audit": {"value": "2"}})
    w.close()
    assert events.stored_positions() == audit.stored_positions() == {A: 1, B: 0}
    assert sorted(int(m.value()) for m in kt.read_topic(kafka_broker.bootstrap, topic)) == [
        0, 1, 2]
    assert sorted(int(m.value()) for m in kt.read_topic(kafka_broker.bootstrap, other)) == [
        0, 2]
    # Reading positions changes nothing (status is read only): same answer again.
    assert events.stored_positions() == {A: 1, B: 0}
