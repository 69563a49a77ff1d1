"""Pooled transactional ids on a real broker: bounded, reused, never taken from a decision."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import Broker
from txsink.coordinator import Coordinator, EpochOutcome
from txsink.faults import AFTER_DECIDE, FaultInjector, FaultRule, InjectedFault
from txsink.model import Committable, TransactionContext
from txsink.plugins import build_plugins, get_plugins
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant
from txsink_kafka import testing as kt
from txsink_kafka.backend import KafkaBackend
from txsink_kafka.naming import SinkIds

from tests.long_runs import ENV as LONG_ENV

pytestmark = pytest.mark.integration

#: 200 in the long run (`tox -e e2e-long` sets TXSINK_LONG=1); 60 already shows the
#: bound (per-participant naming would have made 124 ids) in a third of the time.
EPOCHS = 200 if os.environ.get(LONG_ENV) == "1" else 60
PARTITIONS = 2
#: An extra attempt of partition 0 every this many epochs, left as an orphan.
ORPHAN_EVERY = 20


def batch(ids: range) -> pa.RecordBatch:
    return pa.record_batch({"key": pa.array([str(i).encode() for i in ids], pa.binary()),
                            "value": pa.array([b"v%d" % i for i in ids], pa.binary())})


@pytest.fixture
def sink_id() -> str:
    return f"pool-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def backend(kafka_broker: Broker, topic: str, marker_topic: str,
            sink_id: str) -> Iterator[KafkaBackend]:
    """Hand-driven writers in this process: the producer a writer process opens ahead
    of its next participant is off here (the slot each probe picks is the subject);
    :func:`test_producers_opened_ahead_never_take_a_slot_a_decision_holds` has it on."""
    b = get_plugins().create_backend("kafka", {
        "kafka.bootstrap.servers": kafka_broker.bootstrap, "topic": topic,
        "marker.topic": marker_topic, "producer.init.ahead": "false"})
    assert isinstance(b, KafkaBackend)
    b.preflight(sink_id)
    try:
        yield b
    finally:
        b.close()


def prepare(backend: KafkaBackend, sink_id: str, epoch: int, partition: int,
            attempt: int = 0) -> Committable:
    start = epoch * 100 + partition * 10 + attempt
    return write_participant(backend, TransactionContext(sink_id, epoch, partition, attempt),
                             [batch(range(start, start + 1))])


def known_ids(backend: KafkaBackend, sink_id: str) -> set[str]:
    """Every transactional id of the sink the coordinators know, in any state."""
    admin = backend.driver().txn._admin
    listed = admin.list_transactions()
    ids = SinkIds(backend.config.transactional_id_prefix, sink_id)
    return {t.transactional_id for rows in listed.values() for t in rows
            if ids.owns(t.transactional_id)}


@pytest.mark.slow
def test_distinct_transactional_ids_stay_bounded_over_many_epochs(
        backend: KafkaBackend, sink_id: str, topic: str, tmp_path: Path) -> None:
    """Bound: partitions x (1 + attempts open at once) + the preflight id.

    Here one extra attempt overlaps at a time, so 2 x 2 + 1 = 5; the participant
    naming would have made 2 x 200 + 200 / 20 + 1 = 411 over 200 epochs."""
    coord = Coordinator(backend, DirectoryStateStore(tmp_path / "state"), sink_id,
                        plugins=build_plugins())
    coord.start()
    most = 0
    for epoch in range(EPOCHS):
        msgs = [prepare(backend, sink_id, epoch, p) for p in range(PARTITIONS)]
        if epoch % ORPHAN_EVERY == 0:
            # A retried/speculative attempt whose message never reached the driver:
            # it takes the next slot, and the post-commit orphan scan aborts it.
            prepare(backend, sink_id, epoch, 0, attempt=1)
        assert coord.commit_epoch(epoch, msgs) is EpochOutcome.COMMITTED
        if epoch % 50 == 49:
            most = max(most, len(known_ids(backend, sink_id)))
    ids = known_ids(backend, sink_id)
    bound = PARTITIONS * 2 + 1
    print(f"\n{EPOCHS} epochs x {PARTITIONS} partitions: {len(ids)} distinct transactional "
          f"ids on the broker (bound {bound}): {sorted(ids)}")
    assert len(ids) <= bound and most <= bound
    # The orphans were aborted and every epoch is readable exactly once.
    assert backend.broker_transactions(sink_id) == {}
    keys = sorted(int(m.key()) for m in kt.read_topic(backend.config.bootstrap, topic))
    assert keys == sorted(e * 100 + p * 10 for e in range(EPOCHS) for p in range(PARTITIONS))


@pytest.mark.promise("kafka-decided-slot-never-taken", "backend")
def test_a_slot_held_by_a_decided_epoch_is_not_reused_until_recovery_commits_it(
        backend: KafkaBackend, sink_id: str, topic: str, tmp_path: Path) -> None:
    state = DirectoryStateStore(tmp_path / "state")
    crash = FaultInjector([FaultRule(AFTER_DECIDE, 0, "raise")])
    coord = Coordinator(backend, state, sink_id, plugins=build_plugins(), faults=crash)
    coord.start()
    decided = prepare(backend, sink_id, 0, 0)
    with pytest.raises(InjectedFault):
        coord.commit_epoch(0, [decided])
    held = str(decided.payload["transactional_id"])
    assert held.endswith("-p0-t0")
    # A writer that starts before recovery (another engine, a hand-driven test) must
    # not take, and so fence, the slot the decision holds.
    early = prepare(backend, sink_id, 1, 0)
    assert str(early.payload["transactional_id"]).endswith("-p0-t1")
    restarted = Coordinator(backend, state, sink_id, plugins=build_plugins())
    report = restarted.start(up_to_epoch=0)
    assert report.recommitted_epochs == [0]
    assert restarted.commit_epoch(1, [early]) is EpochOutcome.COMMITTED
    # Both slots are free again: the next epoch starts over at t0.
    again = prepare(backend, sink_id, 2, 0)
    assert str(again.payload["transactional_id"]) == held
    assert restarted.commit_epoch(2, [again]) is EpochOutcome.COMMITTED
    keys = sorted(int(m.key()) for m in kt.read_topic(backend.config.bootstrap, topic))
    assert keys == [0, 100, 200]


def test_an_open_transaction_without_a_marker_is_aborted_at_start(
        backend: KafkaBackend, sink_id: str, topic: str, tmp_path: Path) -> None:
    """A writer that registered its transaction and died before its marker: only the
    coordinators' list (ListTransactions) knows it; it still holds readers back."""
    from confluent_kafka import Producer

    tid = f"{backend.config.transactional_id_prefix}-{sink_id}-p1-t0"
    producer = Producer({"bootstrap.servers": backend.config.bootstrap,
                         "transactional.id": tid})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"stray", b"99", partition=0)
    producer.flush(30)
    del producer  # gone without ending its transaction
    assert set(backend.broker_transactions(sink_id) or {}) == {tid}
    assert backend.list_prepared(sink_id) == []  # no marker: no participant to name
    coord = Coordinator(backend, DirectoryStateStore(tmp_path / "state"), sink_id,
                        plugins=build_plugins())
    coord.start()
    assert backend.broker_transactions(sink_id) == {}
    assert kt.read_topic(backend.config.bootstrap, topic) == []


def test_sink_ids_tell_apart_sinks_whose_names_share_a_prefix() -> None:
    a, ap = SinkIds("txsink", "a"), SinkIds("txsink", "a-p0")
    assert a.owns("txsink-a-p3-t1") and not ap.owns("txsink-a-p3-t1")
    assert ap.owns("txsink-a-p0-p1-t2") and not a.owns("txsink-a-p0-p1-t2")
    assert a.owns("txsink-a-e4-p1-a9") and a.participant_of("txsink-a-e4-p1-a9") == \
        "a-e4-p1-a9"
    assert a.partition_of("txsink-a-p3-t1") == 3 and a.participant_of("txsink-a-p3-t1") is None
    assert not a.owns("txsink-ab-p0-t0") and not a.owns("other-a-p0-t0")


def test_two_attempts_that_chose_the_same_slot_still_end_exactly_once(
        backend: KafkaBackend, sink_id: str, topic: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Speculation: attempt 1 of a partition asks DescribeTransactions while attempt 0
    has not added a partition yet, so both take slot t0; attempt 1's InitProducerId then
    lands after attempt 0 prepared, and the broker aborts attempt 0's transaction. Spark
    hands the driver attempt 0's message. Before salvage the decided epoch stopped with
    DATA AT RISK; now attempt 0's records are written again, attempt 1 is an orphan,
    and every row is there once."""
    import logging

    from txsink_kafka import writer as kwriter

    coord = Coordinator(backend, DirectoryStateStore(tmp_path / "state"), sink_id,
                        plugins=build_plugins())
    coord.start()
    rows = batch(range(10))
    first = write_participant(backend, TransactionContext(sink_id, 0, 0, 0), [rows])
    slot = str(first.payload["transactional_id"])
    assert slot.endswith("-p0-t0")
    # What the second attempt's probe saw before the first one added its partitions.
    monkeypatch.setattr(kwriter, "acquire_pooled_id", lambda *args, **kwargs: slot)
    second = write_participant(backend, TransactionContext(sink_id, 0, 0, 1), [rows])
    monkeypatch.undo()
    assert second.payload["transactional_id"] == slot
    with caplog.at_level(logging.WARNING, logger="txsink"):
        assert coord.commit_epoch(0, [first]) is EpochOutcome.COMMITTED
    assert any("salvaged" in r.getMessage() for r in caplog.records)
    # The next start aborts the second attempt, which no decision names.
    Coordinator(backend, DirectoryStateStore(tmp_path / "state"), sink_id,
                plugins=build_plugins()).start()
    assert backend.broker_transactions(sink_id) == {}
    keys = sorted(int(m.key()) for m in kt.read_topic(backend.config.bootstrap, topic))
    assert keys == list(range(10))


@pytest.mark.promise("kafka-init-ahead-never-fences", "backend")
def test_producers_opened_ahead_never_take_a_slot_a_decision_holds(
        kafka_broker: Broker, topic: str, marker_topic: str, sink_id: str,
        tmp_path: Path) -> None:
    """With ``producer.init.ahead`` (the default): the producer each writer process opens
    for its next participant probes like any writer, so a slot whose transaction is
    prepared, decided or not, is never initialised (fenced); over many epochs the ids
    stay bounded (one more per partition: the one opened ahead); every row once."""
    from txsink_kafka import backend as kb
    b = get_plugins().create_backend("kafka", {
        "kafka.bootstrap.servers": kafka_broker.bootstrap, "topic": topic,
        "marker.topic": marker_topic})
    assert isinstance(b, KafkaBackend)
    b.preflight(sink_id)
    kb.close_kept_producers()
    try:
        state = DirectoryStateStore(tmp_path / "state")
        crash = FaultInjector([FaultRule(AFTER_DECIDE, 0, "raise")])
        coord = Coordinator(b, state, sink_id, plugins=build_plugins(), faults=crash)
        coord.start()
        decided = prepare(b, sink_id, 0, 0)
        with pytest.raises(InjectedFault):
            coord.commit_epoch(0, [decided])
        held = str(decided.payload["transactional_id"])
        for epoch in range(1, 4):  # writers while the decided slot waits for recovery
            c = prepare(b, sink_id, epoch, 0)
            assert c.payload["transactional_id"] != held
            assert c.payload.get("open_ms") is not None
            assert b.commit(c).value in ("committed", "already-committed")
        assert held in (b.broker_transactions(sink_id) or {})  # still open, not fenced
        restarted = Coordinator(b, state, sink_id, plugins=build_plugins())
        assert restarted.start(up_to_epoch=0).recommitted_epochs == [0]
        for epoch in range(4, 30):
            msgs = [prepare(b, sink_id, epoch, p) for p in range(PARTITIONS)]
            assert restarted.commit_epoch(epoch, msgs) is EpochOutcome.COMMITTED
        assert kb.PRODUCER_COUNTS["warmed"] > 0 and kb.PRODUCER_COUNTS["reused"] > 0
        ids = known_ids(b, sink_id)
        assert len(ids) <= PARTITIONS * 3 + 1, sorted(ids)
        assert b.broker_transactions(sink_id) == {}
        keys = sorted(int(m.key()) for m in kt.read_topic(b.config.bootstrap, topic))
        assert keys == sorted([0, 100, 200, 300] + [e * 100 + p * 10 for e in range(4, 30)
                                                    for p in range(PARTITIONS)])
    finally:
        kb.close_kept_producers()
        b.close()


@pytest.mark.promise("kafka-pool-exhausted-named", "backend")
def test_a_writer_that_finds_every_slot_open_fails_naming_them(
        kafka_broker: Broker, topic: str, marker_topic: str, sink_id: str) -> None:
    from txsink.errors import TxsinkError

    small = get_plugins().create_backend("kafka", {
        "kafka.bootstrap.servers": kafka_broker.bootstrap, "topic": topic,
        "marker.topic": marker_topic, "transactional.id.pool.size": "1"})
    assert isinstance(small, KafkaBackend)
    try:
        small.preflight(sink_id)
        held = prepare(small, sink_id, 0, 0)  # prepared: its transaction stays open
        with pytest.raises(TxsinkError, match="all 1 pooled transactional ids") as err:
            prepare(small, sink_id, 0, 0, attempt=1)  # another attempt of partition 0
        assert str(held.payload["transactional_id"]) in str(err.value)
        assert "transactional.id.pool.size" in str(err.value)
        small.abort(held)
    finally:
        small.close()


def test_an_epoch_whose_first_commit_landed_and_whose_id_was_opened_again_recovers(
        backend: KafkaBackend, kafka_broker: Broker, sink_id: str, topic: str,
        tmp_path: Path) -> None:
    """Seen in the default run (Spark driver killed after an epoch's first commit): the
    worker's producer opened ahead for the next task took the committed participant's
    slot again (``init_transactions``, its producer epoch bumped). The restart's
    EndTxn for that participant was refused as fenced, and its begin marker stayed
    hidden behind the epoch's other participant, still open on the same marker
    partition, which was only committed after the first one: every restart stopped
    the same way, until the transaction timeout aborted the other (its rows lost)."""
    from confluent_kafka import Producer
    from txsink.faults import AFTER_FIRST_COMMIT

    state = DirectoryStateStore(tmp_path / "state")
    crash = FaultInjector([FaultRule(AFTER_FIRST_COMMIT, 0, "raise")])
    coord = Coordinator(backend, state, sink_id, plugins=build_plugins(), faults=crash)
    coord.start()
    # Partition 1 begins first, so its open transaction hides partition 0's begin marker.
    later = prepare(backend, sink_id, 0, 1)
    msgs = [prepare(backend, sink_id, 0, 0), later]
    with pytest.raises(InjectedFault):
        coord.commit_epoch(0, msgs)
    committed = [c for c in msgs if backend.is_committed(c)]
    assert len(committed) == 1  # the first commit landed, the other is still open
    ahead = Producer({"bootstrap.servers": kafka_broker.bootstrap,
                      "transactional.id": str(committed[0].payload["transactional_id"])})
    ahead.init_transactions(30)  # the slot opened again, as a producer opened ahead does
    restarted = Coordinator(backend, state, sink_id, plugins=build_plugins())
    assert restarted.start(up_to_epoch=0).recommitted_epochs == [0]
    assert backend.broker_transactions(sink_id) == {}
    keys = sorted(int(m.key()) for m in kt.read_topic(backend.config.bootstrap, topic))
    assert keys == [0, 10]
    del ahead


@pytest.mark.parametrize("end_marker", ["written", "lost"])
def test_a_reopened_slots_commit_is_confirmed_beside_another_sinks_open_transaction(
        backend: KafkaBackend, kafka_broker: Broker, sink_id: str, topic: str,
        marker_topic: str, tmp_path: Path, end_marker: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """As above, with the transaction that hides the begin marker another sink's: sinks
    share the marker topic (``txsink-markers``, one partition, by default), and a sink
    whose driver is gone leaves its prepared participant open until the transaction
    timeout. Every restart of this sink stopped (the epoch DECIDED, its commit 'not
    readable yet') until then; the commit that landed is confirmed by its end marker,
    or, where the driver died before writing it, by its records' control records."""
    from confluent_kafka import Producer
    from txsink.faults import AFTER_FIRST_COMMIT

    neighbour = get_plugins().create_backend("kafka", {
        "kafka.bootstrap.servers": kafka_broker.bootstrap, "topic": topic,
        "marker.topic": marker_topic, "producer.init.ahead": "false"})
    assert isinstance(neighbour, KafkaBackend)
    other = f"{sink_id}-other"
    neighbour.preflight(other)
    try:
        waiting = prepare(neighbour, other, 0, 0)  # its driver is gone: stays open
        state = DirectoryStateStore(tmp_path / "state")
        crash = FaultInjector([FaultRule(AFTER_FIRST_COMMIT, 0, "raise")])
        coord = Coordinator(backend, state, sink_id, plugins=build_plugins(), faults=crash)
        coord.start()
        msgs = [prepare(backend, sink_id, 0, 0)]
        with pytest.raises(InjectedFault):
            coord.commit_epoch(0, msgs)
        ahead = Producer({"bootstrap.servers": kafka_broker.bootstrap,
                          "transactional.id": str(msgs[0].payload["transactional_id"])})
        ahead.init_transactions(30)  # the slot opened again, as a producer opened ahead does
        if end_marker == "lost":  # the driver died between EndTxn and the end marker
            from txsink_kafka.committer import KafkaCommitter

            monkeypatch.setattr(KafkaCommitter, "ended_as_committed",
                                lambda *args, **kwargs: False)
        restarted = Coordinator(backend, state, sink_id, plugins=build_plugins())
        assert restarted.start(up_to_epoch=0).recommitted_epochs == [0]
        assert backend.broker_transactions(sink_id) == {}
        del ahead
        neighbour.abort(waiting)
        assert [int(m.key()) for m in kt.read_topic(backend.config.bootstrap, topic)] == [0]
    finally:
        neighbour.close()
