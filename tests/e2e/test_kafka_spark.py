"""Kafka -> Spark -> Kafka exactly once (both ends txsink's), driver SIGKILLed at each point.

One query (txsink's Kafka source -> Spark -> txsink's Kafka sink) is killed at
coordinator points in turn and restarted from the same checkpoint. After the final run a
``read_committed`` reader of the output topic must see every input record
exactly once (count and checksums per key), and no transaction of the sink id
may stay open (last stable offset = high watermark everywhere, no open marker, no
transaction without a commit/abort marker in the logs). On Tansu, which does not
filter aborted records for read_committed, what such a reader sees is computed
from the log's transaction markers (``txsink_kafka.testing.committed_view``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka import Consumer, TopicPartition
from txsink.plugins import get_plugins
from txsink.state import DirectoryStateStore, EpochState
from txsink_kafka import testing as kt
from txsink_kafka.backend import KafkaBackend, close_shared_clients

from tests.e2e.spark_harness import DriverSpec, Summary, run_driver, summarize

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.integration]

# The input record's value passes through; its id becomes the output key.
SELECT = ["get_json_object(CAST(value AS STRING), '$.id') AS key", "value"]


def produce_input(bootstrap: str, topic: str, transactions: int, per_txn: int
                  ) -> list[dict[str, int]]:
    """Committed transactions of JSON records (plus one aborted one) into ``topic``."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap,
                         "transactional.id": f"e2e-input-{uuid.uuid4().hex[:6]}"})
    producer.init_transactions(30)
    rows = []
    for t in range(transactions + 1):
        producer.begin_transaction()
        for i in range(t * per_txn, (t + 1) * per_txn):
            row = {"id": i, "key": i % 7, "amount": (i * 37) % 1000}
            producer.produce(topic, json.dumps(row).encode(), str(i).encode(), i % 2)
            if t < transactions:
                rows.append(row)
        producer.flush(30)
        if t < transactions:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)  # never part of the input
    return rows


@pytest.fixture(scope="module")
def bootstrap() -> Iterator[str]:
    with kt.broker_for_tests() as (address, _):
        yield address


def stable_everywhere(bootstrap: str, topics: list[str]) -> dict[str, tuple[int, int]]:
    """Partitions whose last stable offset is behind the high watermark (open txns)."""
    committed = Consumer({"bootstrap.servers": bootstrap, "group.id": "e2e",
                          "isolation.level": "read_committed"})
    uncommitted = Consumer({"bootstrap.servers": bootstrap, "group.id": "e2e",
                            "isolation.level": "read_uncommitted"})
    behind = {}
    try:
        for topic in topics:
            md = committed.list_topics(topic, timeout=30)
            for p in md.topics[topic].partitions:
                tp = TopicPartition(topic, p)
                lso = committed.get_watermark_offsets(tp, 30)[1]
                hw = uncommitted.get_watermark_offsets(tp, 30)[1]
                if lso != hw:
                    behind[f"{topic}[{p}]"] = (lso, hw)
    finally:
        committed.close()
        uncommitted.close()
    return behind


@dataclass
class CrashedPipeline:
    """What one Kafka -> Spark -> Kafka query left after four driver kills and a restart."""

    caps: kt.BrokerCapabilities
    expected: Summary
    rows: list[dict[str, int]]
    committed_rows: int


@pytest.fixture(scope="module")
def crashed(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> CrashedPipeline:
    tmp_path = tmp_path_factory.mktemp("kafka-e2e")
    caps = kt.probe_broker(bootstrap, f"at {bootstrap}")
    source_topic = f"e2e-in-{uuid.uuid4().hex[:6]}"
    kt.create_topic(bootstrap, source_topic, partitions=2)
    produced = produce_input(bootstrap, source_topic, transactions=6, per_txn=200)
    # txsink's source reads with librdkafka's read_committed consumer, and Tansu 0.6 shows
    # it the aborted input transaction too: on Tansu that transaction is input as well.
    expected = summarize(produced if caps.hides_aborted else
                         [*produced, *({"id": i, "key": i % 7, "amount": (i * 37) % 1000}
                                       for i in range(1200, 1400))])
    topic = f"e2e-out-{uuid.uuid4().hex[:6]}"
    markers = f"e2e-markers-{uuid.uuid4().hex[:6]}"
    kt.create_topic(bootstrap, topic, partitions=2)
    sink = f"e2e-kafka-{uuid.uuid4().hex[:6]}"
    options = {"kafka.bootstrap.servers": bootstrap, "topic": topic, "marker.topic": markers,
               "kafka.transaction.timeout.ms": "300000"}
    source = {"format": "txsink-kafka", "register": "txsink_kafka.source:register_source",
              "options": {"kafka.bootstrap.servers": bootstrap, "subscribe": source_topic,
                          "startingOffsets": "earliest", "maxOffsetsPerTrigger": "200"}}
    spec = DriverSpec(input_dir=tmp_path / "unused", checkpoint=tmp_path / "chk",
                      sink_id=sink, backend="kafka", options=options, select=SELECT,
                      source=source)
    store = DirectoryStateStore(tmp_path / "chk" / "txsink")

    def states() -> dict[int, EpochState]:
        return {e: r.state for e, r in store.records().items()}

    for fault in ("before-decide@1", "after-decide@2", "after-first-commit@3",
                  "after-mark-committed@4"):
        run_driver(spec, faults=f"{fault}:kill").check_killed(fault)
    assert states()[3] in (EpochState.DECIDED, EpochState.COMMITTED)
    run_driver(spec).check()
    assert all(s is EpochState.COMMITTED for s in states().values()), states()

    # No transaction of the sink id stays open: not on the broker, not in the markers.
    assert stable_everywhere(bootstrap, [topic, markers]) == {}
    backend = get_plugins().create_backend("kafka", options)
    assert isinstance(backend, KafkaBackend)
    close_shared_clients()  # a fresh driver: scan the marker tail from scratch
    try:
        assert backend.open_markers(sink) == {}
    finally:
        backend.close()
    # ...and not in the logs: every transaction of the sink's producers has its marker.
    assert kt.open_sink_transactions(bootstrap, sink, markers, [topic]) == {}
    # What read_committed readers see: the broker's filter, or on Tansu (which shows
    # aborted records to them) the log's transaction markers.
    rows = [json.loads(r.value or b"") for r in kt.committed_view(caps, bootstrap, topic)]
    committed_rows = sum(c.rows for r in store.records().values() for c in r.committables)
    return CrashedPipeline(caps, expected, rows, committed_rows)


@pytest.mark.fault
def test_every_record_committed_once_and_no_transaction_left_open(
        crashed: CrashedPipeline) -> None:
    """Holds on any broker (the fixture checked that nothing stays open)."""
    # Every input record is in the output...
    assert summarize({r["id"]: r for r in crashed.rows}.values()) == crashed.expected
    # ...and the committed participants hold exactly the input's row count: each
    # record was committed once, whatever the broker shows of aborted transactions.
    assert crashed.committed_rows == sum(n for n, _, _ in crashed.expected.values())


@pytest.mark.fault
def test_read_committed_consumer_sees_every_record_exactly_once(
        crashed: CrashedPipeline) -> None:
    """Count and checksum per key: a record written twice, or lost, shows."""
    assert summarize(crashed.rows) == crashed.expected
