"""The log reader (``scan_log`` / ``read_committed_from_log``) against a live broker.

It is what exactly-once is checked with on Tansu (which writes transaction markers
but does not filter aborted records for read_committed), so it is tested here on
its own: every case states the records a read_committed reader is entitled to, and
on a broker that filters (real Kafka) the broker's own answer must agree too.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer
from conftest import Broker
from txsink_kafka import testing as kt

pytestmark = pytest.mark.integration


class Txn:
    """A transactional producer; closed (without aborting) by the fixture."""

    def __init__(self, bootstrap: str) -> None:
        self.transactional_id = f"lv-{uuid.uuid4().hex[:10]}"
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                                  "transactional.id": self.transactional_id})
        self.producer.init_transactions(30)
        #: Set once another client fenced the id: the producer cannot end anything.
        self.fenced = False

    def send(self, topic: str, values: list[bytes], partition: int = 0,
             headers: list[tuple[str, bytes]] | None = None) -> None:
        for v in values:
            self.producer.produce(topic, v, b"k-" + v, partition, headers=headers)
        self.producer.flush(30)

    def run(self, topic: str, values: list[bytes], outcome: str, partition: int = 0) -> None:
        self.producer.begin_transaction()
        self.send(topic, values, partition)
        if outcome == "commit":
            self.producer.commit_transaction(30)
        elif outcome == "abort":
            self.producer.abort_transaction(30)


@pytest.fixture
def producers(kafka_broker: Broker) -> Iterator[Any]:
    made: list[Txn] = []

    def make() -> Txn:
        made.append(Txn(kafka_broker.bootstrap))
        return made[-1]

    yield make
    for t in (t for t in made if not t.fenced):
        with contextlib.suppress(Exception):  # raises when no transaction is open
            t.producer.abort_transaction(10)


def new_topic(broker: Broker, partitions: int = 1) -> str:
    name = f"lv-{uuid.uuid4().hex[:10]}"
    kt.create_topic(broker.bootstrap, name, partitions=partitions)
    return name


def values(view: kt.LogView) -> list[bytes | None]:
    return [r.value for r in view.records]


def vals(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def agrees_with_broker(broker: Broker, caps: kt.BrokerCapabilities, topic: str,
                       view: kt.LogView) -> None:
    """Where the broker filters itself, its read_committed answer is the same."""
    if caps.hides_aborted:
        seen = [kt.LogRecord.from_message(m) for m in kt.read_topic(broker.bootstrap, topic)]
        assert sorted(seen, key=lambda r: (r.partition, r.offset)) == view.records


def test_aborted_committed_and_open_transactions(
        kafka_broker: Broker, broker_caps: kt.BrokerCapabilities, producers: Any) -> None:
    topic = new_topic(kafka_broker)
    t = producers()
    t.run(topic, vals("aborted", 3), "abort")
    t.run(topic, vals("committed", 2), "commit")
    t.run(topic, vals("open", 4), "open")
    view = kt.scan_log(kafka_broker.bootstrap, topic)
    assert values(view) == vals("committed", 2)
    # Offsets: aborted 0-2, abort marker 3, committed 4-5, commit marker 6, open 7-10.
    assert [r.offset for r in view.records] == [4, 5]
    assert [r.key for r in view.records] == [b"k-committed0", b"k-committed1"]
    assert [(m.offset, m.commit) for m in view.markers] == [(3, False), (6, True)]
    assert view.aborted_records == 3
    (opened,) = view.open_transactions
    assert (opened.partition, opened.first_offset, opened.records) == (0, 7, 4)
    assert opened.producer_id == view.markers[0].producer_id
    assert view.open_producer_ids == {opened.producer_id}
    assert view.end_offsets == {0: 11} and view.stable_offsets == {0: 7}
    # The open transaction is in the log: a read_uncommitted reader sees it at once.
    raw = [m.value() for m in kt.read_topic(kafka_broker.bootstrap, topic,
                                            isolation="read_uncommitted")]
    assert raw == [*vals("aborted", 3), *vals("committed", 2), *vals("open", 4)]
    agrees_with_broker(kafka_broker, broker_caps, topic, view)

    t.producer.commit_transaction(30)
    after = kt.scan_log(kafka_broker.bootstrap, topic)
    assert values(after) == [*vals("committed", 2), *vals("open", 4)]
    assert after.open_transactions == [] and after.stable_offsets == {0: 12}
    assert kt.read_committed_from_log(kafka_broker.bootstrap, topic) == after.records
    agrees_with_broker(kafka_broker, broker_caps, topic, after)


def test_non_transactional_records_are_always_visible(
        kafka_broker: Broker, broker_caps: kt.BrokerCapabilities, producers: Any) -> None:
    topic = new_topic(kafka_broker)
    plain = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    idempotent = Producer({"bootstrap.servers": kafka_broker.bootstrap,
                           "enable.idempotence": True})
    plain.produce(topic, b"plain", None, 0, headers=[("h", b"1"), ("h", b"2")])
    plain.flush(30)
    idempotent.produce(topic, b"idempotent", b"i", 0)
    idempotent.flush(30)
    producers().run(topic, [b"aborted"], "abort")
    plain.produce(topic, b"after", None, 0)
    plain.flush(30)
    view = kt.scan_log(kafka_broker.bootstrap, topic)
    assert values(view) == [b"plain", b"idempotent", b"after"]
    assert view.records[0].key is None
    assert view.records[0].headers == (("h", b"1"), ("h", b"2"))
    assert view.aborted_records == 1 and view.open_transactions == []
    agrees_with_broker(kafka_broker, broker_caps, topic, view)


def test_interleaved_producers_and_the_last_stable_offset(
        kafka_broker: Broker, broker_caps: kt.BrokerCapabilities, producers: Any) -> None:
    topic = new_topic(kafka_broker)
    a, b, c = producers(), producers(), producers()
    a.producer.begin_transaction()
    b.producer.begin_transaction()
    a.send(topic, [b"a0"])
    b.send(topic, [b"b0"])
    a.send(topic, [b"a1"])
    b.send(topic, [b"b1"])
    b.producer.commit_transaction(30)  # b's records lie between a's, a is still open
    view = kt.scan_log(kafka_broker.bootstrap, topic)
    # A read_committed reader stops at the first open transaction (offset 0).
    assert values(view) == [] and view.stable_offsets == {0: 0}
    assert len(view.open_transactions) == 1 and view.open_transactions[0].records == 2
    a_pid = view.open_transactions[0].producer_id
    agrees_with_broker(kafka_broker, broker_caps, topic, view)

    a.producer.abort_transaction(30)
    c.run(topic, [b"c0"], "commit")
    view = kt.scan_log(kafka_broker.bootstrap, topic)
    assert values(view) == [b"b0", b"b1", b"c0"]
    assert view.aborted_records == 2 and view.open_transactions == []
    assert [m.commit for m in view.markers if m.producer_id == a_pid] == [False]
    assert len({m.producer_id for m in view.markers}) == 3
    agrees_with_broker(kafka_broker, broker_caps, topic, view)


def test_transactions_across_partitions(
        kafka_broker: Broker, broker_caps: kt.BrokerCapabilities, producers: Any) -> None:
    topic = new_topic(kafka_broker, partitions=4)  # partition 3 stays empty
    t = producers()
    t.producer.begin_transaction()
    for p in range(3):
        t.send(topic, vals(f"x{p}-", 2), partition=p)
    t.producer.abort_transaction(30)
    t.producer.begin_transaction()
    for p in range(3):
        t.send(topic, vals(f"y{p}-", 3), partition=p)
    t.producer.commit_transaction(30)
    t.producer.begin_transaction()
    t.send(topic, [b"open"], partition=1)
    view = kt.scan_log(kafka_broker.bootstrap, topic)
    assert [(r.partition, r.value) for r in view.records] == [
        (p, v) for p in range(3) for v in vals(f"y{p}-", 3)]
    assert sorted((m.partition, m.commit) for m in view.markers) == [
        (p, c) for p in range(3) for c in (False, True)]
    assert [(o.partition, o.records) for o in view.open_transactions] == [(1, 1)]
    assert view.end_offsets == {0: 7, 1: 8, 2: 7, 3: 0}
    assert view.stable_offsets == {0: 7, 1: 7, 2: 7, 3: 0}
    agrees_with_broker(kafka_broker, broker_caps, topic, view)


@pytest.mark.parametrize("page_bytes", [512, kt._FETCH_PARTITION_BYTES])
def test_paging_through_many_fetches(
        kafka_broker: Broker, broker_caps: kt.BrokerCapabilities, producers: Any,
        monkeypatch: pytest.MonkeyPatch, page_bytes: int) -> None:
    """512 bytes per fetch: many pages, most smaller than one batch; the default
    size: ~3 MiB per partition still takes several fetches."""
    from txsink_kafka import txn_protocol

    monkeypatch.setattr(kt, "_FETCH_PARTITION_BYTES", page_bytes)
    fetches = []
    send = txn_protocol.send_to_node

    def counting(admin: Any, request: Any, node_id: int) -> Any:
        fetches.append(request)
        return send(admin, request, node_id)

    monkeypatch.setattr(txn_protocol, "send_to_node", counting)
    topic = new_topic(kafka_broker, partitions=2)
    t = producers()
    pad = b"." * 1000
    expected: list[tuple[int, bytes]] = []
    for round_ in range(6):
        outcome = "abort" if round_ % 3 == 1 else "commit"
        t.producer.begin_transaction()
        for p in range(2):
            batch = [b"%d-%d-%04d" % (round_, p, i) + pad for i in range(500)]
            t.send(topic, batch, partition=p)
            if outcome == "commit":
                expected += [(p, v) for v in batch]
        (t.producer.commit_transaction if outcome == "commit" else
         t.producer.abort_transaction)(30)
    view = kt.scan_log(kafka_broker.bootstrap, topic, timeout_s=120)
    assert [(r.partition, r.value) for r in view.records] == sorted(
        expected, key=lambda pv: pv[0])
    assert view.aborted_records == 2 * 2 * 500
    # 6 transactions of 500 records + a marker each, per partition.
    assert view.end_offsets == {0: 3006, 1: 3006}
    offsets = [r.offset for r in view.records if r.partition == 0]
    assert offsets == sorted(set(offsets))
    # ~3 MiB per partition: at least 3 fetches of 1 MiB; with 512 bytes, at most one
    # batch per partition and fetch (6 transactions and 6 markers: 12 batches or more).
    assert len(fetches) >= (3 if page_bytes > 512 else 12)
    agrees_with_broker(kafka_broker, broker_caps, topic, view)


def test_a_fenced_open_transaction_gets_an_abort_marker(
        kafka_broker: Broker, producers: Any) -> None:
    """How txsink ends orphans: InitProducerId on the id aborts what it left open."""
    from txsink_kafka.txn_protocol import TxnCoordinatorClient

    topic = new_topic(kafka_broker)
    t = producers()
    t.run(topic, [b"orphan"], "open")
    before = kt.scan_log(kafka_broker.bootstrap, topic)
    assert len(before.open_transactions) == 1
    client = TxnCoordinatorClient({"bootstrap.servers": kafka_broker.bootstrap})
    try:
        client.init_producer_id(t.transactional_id, 60_000)
        t.fenced = True
    finally:
        client.close()
    after = kt.scan_log(kafka_broker.bootstrap, topic)
    assert after.open_transactions == []
    assert [m.commit for m in after.markers] == [False]
    assert after.markers[0].producer_id == before.open_transactions[0].producer_id
    assert values(after) == []


def test_unknown_topic_is_a_clear_error(kafka_broker: Broker) -> None:
    with pytest.raises(RuntimeError, match="no-such-topic"):
        kt.scan_log(kafka_broker.bootstrap, f"no-such-topic-{uuid.uuid4().hex[:6]}",
                    timeout_s=10)


def test_committed_view_uses_the_broker_filter_or_the_log(
        kafka_broker: Broker, broker_caps: kt.BrokerCapabilities, producers: Any) -> None:
    topic = new_topic(kafka_broker)
    t = producers()
    t.run(topic, [b"gone"], "abort")
    t.run(topic, [b"kept"], "commit")
    got = kt.committed_view(broker_caps, kafka_broker.bootstrap, topic)
    assert [r.value for r in got] == [b"kept"]
    assert got[0].topic == topic and got[0].key == b"k-kept" and got[0].offset == 2
    if not broker_caps.hides_aborted:
        assert any("exactly-once is checked against the log's transaction markers" in n
                   for n in kt.log_view_notes())
    # A broker that shows aborted data and writes no markers cannot be checked at all.
    blind = kt.BrokerCapabilities("blind", hides_aborted=False, hides_open=False,
                                  describe_transactions=False, writes_markers=False)
    with pytest.raises(pytest.skip.Exception, match="cannot be told"):
        kt.committed_view(blind, kafka_broker.bootstrap, topic)
