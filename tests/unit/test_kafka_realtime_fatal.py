"""A Kafka real-time producer refused with a fatal error is reported as fenced, so a
kept session is claimed again instead of failing the query (no broker needed: the
errors are librdkafka's own objects)."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException
from txsink.errors import FencedError
from txsink.realtime import SourcePartition
from txsink_kafka.realtime import KafkaPositionTarget, KafkaRealtimeSpec


def _target() -> KafkaPositionTarget:
    spec = KafkaRealtimeSpec("rt", {"topic": "out", "kafka.bootstrap.servers": "b:9092"})
    return KafkaPositionTarget(spec, SourcePartition("in", 0))


def test_a_produce_refused_as_fatal_is_a_fenced_producer() -> None:
    # What produce() raised at 10,000 records/s once the producer had been fenced.
    local = KafkaException(KafkaError(KafkaError._FATAL,
                                      "Unable to produce message: Local: Fatal error"))
    assert isinstance(_target()._fail("write", local), FencedError)
    flagged = KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
    assert isinstance(_target()._fail("commit", flagged), FencedError)


def test_a_retriable_error_is_not_taken_for_fencing() -> None:
    timeout = KafkaException(KafkaError(KafkaError._TIMED_OUT, "timed out"))
    error = _target()._fail("commit", timeout)
    assert not isinstance(error, FencedError) and "timed out" in str(error)
