"""Kafka sink behaviour beyond the conformance kit, against a live broker."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import Broker
from test_kafka_conformance import broker_open_participants
from txsink.backend import CommitOutcome
from txsink.coordinator import Coordinator, EpochOutcome
from txsink.errors import (
    ConfigError,
    FencedError,
    ParticipantLostError,
    RetriableCommitError,
    ServerUnavailableError,
)
from txsink.model import Committable, DeliveryGuarantee, TransactionContext
from txsink.plugins import build_plugins, get_plugins
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant
from txsink_kafka import backend as kb
from txsink_kafka import testing as kt
from txsink_kafka import writer as kwriter
from txsink_kafka.backend import KafkaBackend
from txsink_kafka.txn_protocol import EndTxnResult, TxnProtocolError, UnsupportedByBrokerError

pytestmark = pytest.mark.integration


def batch(ids: range | list[int]) -> pa.RecordBatch:
    return pa.record_batch({
        "key": pa.array([str(i).encode() for i in ids], pa.binary()),
        "value": pa.array([f"v{i}".encode() for i in ids], pa.binary()),
    })


@pytest.fixture
def sink_id() -> str:
    return f"ks-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def options(kafka_broker: Broker, topic: str, marker_topic: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": kafka_broker.bootstrap, "topic": topic,
            "marker.topic": marker_topic}


@pytest.fixture
def backend(options: dict[str, str], sink_id: str) -> Iterator[KafkaBackend]:
    b = get_plugins().create_backend("kafka", options)
    assert isinstance(b, KafkaBackend)
    b.preflight(sink_id)
    try:
        yield b
    finally:
        b.close()


def prepare(backend: KafkaBackend, sink_id: str, epoch: int, partition: int,
            ids: range | list[int], attempt: int = 0) -> Committable:
    return write_participant(backend, TransactionContext(sink_id, epoch, partition, attempt),
                             [batch(ids)])


def coordinator(backend: KafkaBackend, tmp_path: Path, sink_id: str) -> Coordinator:
    return Coordinator(backend, DirectoryStateStore(tmp_path / "state"), sink_id,
                       plugins=build_plugins())


def keys(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[int]:
    """Keys a real consumer with ``isolation`` gets (Tansu shows it aborted records)."""
    return sorted(int(m.key()) for m in kt.read_topic(bootstrap, topic, isolation=isolation))


def committed_keys(caps: kt.BrokerCapabilities, bootstrap: str, topic: str) -> list[int]:
    """Keys read_committed readers are entitled to: the broker's filter on Kafka, the
    log's transaction markers on Tansu."""
    return sorted(int(r.key or b"") for r in kt.committed_view(caps, bootstrap, topic))


@pytest.mark.promise("kafka-read-committed-exactly-once", "backend")
def test_read_uncommitted_sees_at_once_read_committed_only_after_the_epoch_commits(
        backend: KafkaBackend, sink_id: str, topic: str, tmp_path: Path,
        broker_caps: kt.BrokerCapabilities) -> None:
    """The source document's observation: with a long trigger interval the records are
    in the topic right away, but read_committed consumers see them only at the commit."""
    bootstrap = backend.config.bootstrap

    def committed() -> list[int]:
        seen = committed_keys(broker_caps, bootstrap, topic)
        if broker_caps.hides_open:  # and a real read_committed consumer agrees
            assert keys(bootstrap, topic) == seen
        return seen

    coord = coordinator(backend, tmp_path, sink_id)
    coord.start()
    msgs = [prepare(backend, sink_id, 0, p, range(p * 100, p * 100 + 100)) for p in range(2)]
    assert keys(bootstrap, topic, "read_uncommitted") == list(range(200))
    assert committed() == []
    time.sleep(1.0)  # the trigger interval goes by: still nothing for read_committed
    assert committed() == []
    # Two participants, each with records in both partitions.
    assert len(kt.scan_log(bootstrap, topic).open_producer_ids) == 2
    assert coord.commit_epoch(0, msgs) is EpochOutcome.COMMITTED
    assert committed() == list(range(200))
    assert kt.scan_log(bootstrap, topic).open_transactions == []


def test_abort_and_discard_end_the_transactions_on_the_broker(
        backend: KafkaBackend, sink_id: str, topic: str,
        broker_caps: kt.BrokerCapabilities) -> None:
    c = prepare(backend, sink_id, 0, 0, range(50))
    txn = backend.begin_transaction(TransactionContext(sink_id, 0, 1))
    backend.write(txn, batch(range(50, 60)))
    assert broker_open_participants(backend, sink_id) == {c.participant, txn.ctx.participant}
    # What `txsink status` shows as pending: from the marker scan.
    assert [p.participant for p in backend.list_prepared(sink_id)] == [c.participant,
                                                                       txn.ctx.participant]
    backend.abort(c)
    backend.discard(txn)
    backend.abort(c)  # twice is harmless
    assert broker_open_participants(backend, sink_id) == set()
    assert backend.open_markers(sink_id) == {}
    assert committed_keys(broker_caps, backend.config.bootstrap, topic) == []
    # The data was in the topic: only the abort markers keep it from readers.
    assert len(keys(backend.config.bootstrap, topic, "read_uncommitted")) == 60


def test_restart_fences_orphans_of_every_epoch(
        backend: KafkaBackend, sink_id: str, topic: str, tmp_path: Path,
        broker_caps: kt.BrokerCapabilities) -> None:
    coord = coordinator(backend, tmp_path, sink_id)
    coord.start()
    loser = prepare(backend, sink_id, 0, 0, range(10), attempt=7)
    winner = prepare(backend, sink_id, 0, 0, range(10), attempt=8)
    undecided = prepare(backend, sink_id, 1, 0, range(10, 20), attempt=9)
    assert coord.commit_epoch(0, [winner]) is EpochOutcome.COMMITTED
    # The post-commit scan fenced epoch 0's loser, not epoch 1 (it may still be writing).
    # (Tansu 0.6 keeps the last stable offset at the first of overlapping transactions
    # until all end, so the broker's view is checked once nothing is left open.)
    assert set(backend.open_markers(sink_id)) == {str(undecided.payload["transactional_id"])}
    assert loser.participant not in backend.open_markers(sink_id)
    coordinator(backend, tmp_path, sink_id).start()
    assert broker_open_participants(backend, sink_id) == set()
    assert committed_keys(broker_caps, backend.config.bootstrap, topic) == list(range(10))


def test_orphan_scan_of_a_new_process_finds_old_participants(
        options: dict[str, str], sink_id: str) -> None:
    """A fresh driver (no scan cursor) finds open participants in the marker tail."""
    first = get_plugins().create_backend("kafka", options)
    assert isinstance(first, KafkaBackend)
    first.preflight(sink_id)
    c = prepare(first, sink_id, 4, 2, range(5), attempt=3)
    fresh = KafkaBackend(first.config)
    fresh.shared.close()
    kb.close_shared_clients()  # forget every cursor, as a restarted driver would
    aborted = fresh.abort_orphans(sink_id, protected=set(), up_to_epoch=None)
    assert [a.participant for a in aborted] == [c.participant]
    assert broker_open_participants(fresh, sink_id) == set()
    fresh.close()


@pytest.mark.parametrize("pause_s", [0.0, 1.0], ids=["at-once", "after-a-pause"])
def test_a_second_writer_with_the_same_sink_id_is_fenced(
        options: dict[str, str], sink_id: str, pause_s: float) -> None:
    """Two queries with one sink id derive the same transactional ids: the first
    writer is fenced and fails with an error that names the likely cause. (Pooled
    ids are probed, so there the second writer takes a free slot instead.)

    Right after the fence librdkafka's produce() answers only "Local: Fatal error",
    and the cause comes from the next poll as a bare KafkaError; after a pause the
    cause is raised by the first call. Either way it must be a FencedError."""
    backend = get_plugins().create_backend(
        "kafka", {**options, "transactional.id.naming": "participant"})
    assert isinstance(backend, KafkaBackend)
    ctx = TransactionContext(sink_id, 3, 0, 0)
    first = backend.begin_transaction(ctx)
    backend.write(first, batch(range(10)))
    second = backend.begin_transaction(ctx)  # the other query's task
    # Its first write waits for its open (in the background), which fenced the first:
    # the first fails at its next write or at the latest when it prepares.
    backend.write(second, batch(range(20, 30)))

    time.sleep(pause_s)

    def go_on() -> None:
        backend.write(first, batch(range(10, 20)))
        backend.pre_commit(first)

    with pytest.raises(FencedError, match="sink id"):
        go_on()
    c = backend.pre_commit(second)
    assert backend.commit(c) is CommitOutcome.COMMITTED


@pytest.mark.promise("kafka-commit-confirmed", "backend")
def test_commit_is_reported_only_once_the_markers_reached_every_partition(
        options: dict[str, str], sink_id: str, topic: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Kafka answers EndTxn before it writes the commit markers, and a broker restarting
    then has dropped them (chaos, 2026-11): the transaction stayed open in the
    partitions and a later InitProducerId of the pooled id aborted it, after the
    participant had been reported committed. Here the coordinator "accepts" the commit
    without sending it: commit() must not say committed, nor write a committed end
    marker, until the transaction is closed on the marker and data partitions."""
    backend = get_plugins().create_backend("kafka", {**options, "request.timeout.s": "2"})
    assert isinstance(backend, KafkaBackend)
    backend.preflight(sink_id)
    try:
        c = prepare(backend, sink_id, 0, 0, range(10))
        txn = backend.driver().txn
        real_end_txn = txn.end_txn
        monkeypatch.setattr(txn, "end_txn", lambda *a, **k: EndTxnResult.OK)
        with pytest.raises(RetriableCommitError, match=r"still open on .*\[0\]") as err:
            backend.commit(c)
        assert topic in str(err.value) and backend.config.marker_topic in str(err.value)
        tid, identity, (mtopic, mpart, moffset) = backend.committer.payload(c)
        assert not backend.committer.ended_as_committed(mtopic, mpart, moffset, tid, identity)
        assert kt.read_topic(backend.config.bootstrap, topic) == []  # open: nothing yet
        monkeypatch.setattr(txn, "end_txn", real_end_txn)
        assert backend.commit(c) is CommitOutcome.COMMITTED
        assert keys(backend.config.bootstrap, topic) == list(range(10))
        assert backend.committer.ended_as_committed(mtopic, mpart, moffset, tid, identity)
    finally:
        backend.close()


@pytest.mark.promise("kafka-commit-confirmed", "backend")
def test_commit_markers_unconfirmed_while_the_broker_does_not_answer(
        options: dict[str, str], sink_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A DescribeProducers that fails (a broker restarting) is no confirmation; one the
    broker cannot answer at all (older than 2.8, no READ on the topic) is not waited for."""
    backend = get_plugins().create_backend("kafka", {**options, "request.timeout.s": "1"})
    assert isinstance(backend, KafkaBackend)
    backend.preflight(sink_id)
    try:
        txn = backend.driver().txn

        def restarting(partitions: list[tuple[str, int]]) -> None:
            raise TxnProtocolError("DescribeProducers failed: NodeNotReadyError")

        monkeypatch.setattr(txn, "transaction_starts", restarting)
        c = prepare(backend, sink_id, 0, 0, range(5))
        with pytest.raises(RetriableCommitError, match="not confirmed"):
            backend.commit(c)

        def unsupported(partitions: list[tuple[str, int]]) -> None:
            raise UnsupportedByBrokerError("DescribeProducers is not answered")

        monkeypatch.setattr(txn, "transaction_starts", unsupported)
        later = prepare(backend, sink_id, 1, 0, range(5, 10))
        assert backend.commit(later) is CommitOutcome.COMMITTED
        # The first one's EndTxn went through: its retry finds it committed.
        assert backend.commit(c) in (CommitOutcome.COMMITTED, CommitOutcome.ALREADY_COMMITTED)
        assert keys(backend.config.bootstrap, backend.config.topic or "") == list(range(10))
    finally:
        backend.close()


@pytest.mark.promise("kafka-aborted-participant-reported", "backend")
def test_fenced_participant_is_reported_as_lost_not_committed(
        backend: KafkaBackend, sink_id: str, broker_caps: kt.BrokerCapabilities) -> None:
    c = prepare(backend, sink_id, 0, 0, range(10))
    backend.driver().txn.init_producer_id(str(c.payload["transactional_id"]), 60_000)
    # The fence aborted the transaction: abort markers in the data and marker topics.
    bootstrap, topic = backend.config.bootstrap, backend.config.topic
    assert topic is not None
    data = kt.scan_log(bootstrap, topic)
    assert data.records == [] and data.aborted_records == 10 and not data.open_transactions
    assert {m.commit for m in data.markers} == {False}
    assert kt.open_sink_transactions(bootstrap, sink_id, backend.config.marker_topic,
                                     [topic]) == {}
    if kt.tansu_selected():
        pytest.skip("Tansu shows aborted records to read_committed readers: commit() "
                    "decides 'already committed' by the begin marker's visibility to "
                    "them, so there a fenced participant's commit returns "
                    "ALREADY_COMMITTED instead of raising ParticipantLostError")
    with pytest.raises(ParticipantLostError, match="DATA AT RISK"):
        backend.commit(c)


@pytest.mark.promise("kafka-salvage", "backend")
def test_a_fenced_participant_is_salvaged_as_it_was_written(
        kafka_broker: Broker, marker_topic: str, sink_id: str,
        broker_caps: kt.BrokerCapabilities) -> None:
    """Same topics, partitions, keys, values, headers and timestamps; nothing else."""
    broker_caps.require("hides_aborted")
    bootstrap = kafka_broker.bootstrap
    first, second = f"t-{uuid.uuid4().hex[:8]}", f"t-{uuid.uuid4().hex[:8]}"
    kt.create_topic(bootstrap, first, partitions=3)
    kt.create_topic(bootstrap, second, partitions=1)
    b = get_plugins().create_backend("kafka", {"kafka.bootstrap.servers": bootstrap,
                                               "marker.topic": marker_topic})
    assert isinstance(b, KafkaBackend)
    header_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    rows = pa.record_batch({
        "key": pa.array([b"a", None, b"c", b"d"], pa.binary()),
        "value": pa.array(["x", "y", "z", "w"], pa.string()),
        "topic": pa.array([first, first, second, first]),
        "partition": pa.array([2, 1, None, 2], pa.int32()),
        "headers": pa.array([[{"key": "h", "value": b"1"}], None, [], None], header_type),
    })
    try:
        b.preflight(sink_id)
        c = write_participant(b, TransactionContext(sink_id, 0, 0), [rows])
        # A coordinator that lost it, or another query: the transaction is aborted.
        b.driver().txn.init_producer_id(str(c.payload["transactional_id"]), 60_000)
        with pytest.raises(ParticipantLostError):
            b.commit(c)
        again = b.salvage(c, TransactionContext(sink_id, 0, 0, 10**13 + 1))
        assert again.rows == 4 and again.participant.endswith("-a10000000000001")
        assert again.payload["salvage_of"]["participant"] == c.participant
        assert again.payload["transactional_id"] == f"txsink-{again.participant}"
        assert b.commit(again) is CommitOutcome.COMMITTED
        got = {(m.topic(), m.partition(), m.key(), m.value(), tuple(m.headers() or ()))
               for t in (first, second) for m in kt.read_topic(bootstrap, t)}
        assert got == {(first, 2, b"a", b"x", (("h", b"1"),)), (first, 1, None, b"y", ()),
                       (second, 0, b"c", b"z", ()), (first, 2, b"d", b"w", ())}
        # The timestamps are the original records' (read_uncommitted shows both).
        stamps: dict[tuple[str, int, bytes | None], set[int]] = {}
        for t in (first, second):
            for m in kt.read_topic(bootstrap, t, isolation="read_uncommitted"):
                stamps.setdefault((t, m.partition(), m.key()), set()).add(m.timestamp()[1])
        assert len(stamps) == 4 and all(len(s) == 1 for s in stamps.values()), stamps
        assert sum(len(kt.read_topic(bootstrap, t, isolation="read_uncommitted"))
                   for t in (first, second)) == 8  # the aborted originals and the copies
    finally:
        b.close()


@pytest.mark.promise("kafka-old-committables-read", "backend")
def test_a_committable_written_before_salvage_still_commits_and_cannot_be_salvaged(
        backend: KafkaBackend, sink_id: str, broker_caps: kt.BrokerCapabilities) -> None:
    """Payload version 1 (no offsets, no transaction version): what a state written by
    the release before salvage holds."""
    def as_v1(c: Committable) -> Committable:
        old = {k: v for k, v in c.payload.items() if k not in (
            "ranges", "transaction_version", "broker_transaction_version")}
        return Committable.from_bytes(replace(c, payload=old, payload_version=1).to_bytes())

    c = as_v1(prepare(backend, sink_id, 0, 0, range(10)))
    assert c.payload_version == 1
    assert backend.commit(c) is CommitOutcome.COMMITTED
    assert backend.commit(c) is CommitOutcome.ALREADY_COMMITTED
    assert keys(backend.config.bootstrap, str(backend.config.topic)) == list(range(10))
    broker_caps.require("hides_aborted")
    lost = as_v1(prepare(backend, sink_id, 1, 0, range(20, 30)))
    backend.driver().txn.init_producer_id(str(lost.payload["transactional_id"]), 60_000)
    with pytest.raises(ParticipantLostError, match="holds no offsets"):
        backend.salvage(lost, TransactionContext(sink_id, 1, 0, 10**13 + 2))


@pytest.mark.promise("kafka-timeout-checked", "backend")
def test_commit_warns_when_a_prepared_transaction_nears_its_timeout(
        backend: KafkaBackend, sink_id: str, caplog: pytest.LogCaptureFixture) -> None:
    c = prepare(backend, sink_id, 0, 0, range(10))
    timeout_ms = int(c.payload["transaction_timeout_ms"])
    old = replace(c, payload={**c.payload,
                              "began_at": time.time() - 0.9 * timeout_ms / 1000})
    with caplog.at_level(logging.WARNING, logger="txsink_kafka"):
        assert backend.commit(old) is CommitOutcome.COMMITTED
    assert any("data at risk" in r.getMessage() and c.participant in r.getMessage()
               for r in caplog.records)


def test_topic_partition_and_headers_columns(
        kafka_broker: Broker, marker_topic: str, sink_id: str) -> None:
    first = f"t-{uuid.uuid4().hex[:8]}"
    second = f"t-{uuid.uuid4().hex[:8]}"
    kt.create_topic(kafka_broker.bootstrap, first, partitions=3)
    kt.create_topic(kafka_broker.bootstrap, second, partitions=1)
    b = get_plugins().create_backend("kafka", {"kafka.bootstrap.servers":
                                               kafka_broker.bootstrap,
                                               "marker.topic": marker_topic})
    header_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    rows = pa.record_batch({
        "key": pa.array([b"a", None, b"c"], pa.binary()),
        "value": pa.array(["x", "y", "z"], pa.string()),
        "topic": pa.array([first, first, second]),
        "partition": pa.array([2, 1, None], pa.int32()),
        "headers": pa.array([[{"key": "h", "value": b"1"}], None, []], header_type),
    })
    try:
        c = write_participant(b, TransactionContext(sink_id, 0, 0), [rows])
        assert sorted(c.payload["topics"]) == sorted([first, second])
        assert b.commit(c) is CommitOutcome.COMMITTED
        got = {(m.topic(), m.partition(), m.key(), m.value(), tuple(m.headers() or ()))
               for t in (first, second) for m in kt.read_topic(kafka_broker.bootstrap, t)}
        assert got == {(first, 2, b"a", b"x", (("h", b"1"),)), (first, 1, None, b"y", ()),
                       (second, 0, b"c", b"z", ())}
    finally:
        b.close()


# -- bad input: clear errors before any data is written ---------------------------------


def test_unreachable_brokers(sink_id: str) -> None:
    b = get_plugins().create_backend("kafka", {"kafka.bootstrap.servers": "127.0.0.1:1",
                                               "topic": "t", "request.timeout.s": "2"})
    with pytest.raises(ServerUnavailableError, match="is down or unreachable") as info:
        b.preflight(sink_id)
    assert info.value.field == "kafka.bootstrap.servers"


def test_missing_topic(options: dict[str, str], sink_id: str) -> None:
    b = get_plugins().create_backend("kafka", {**options, "topic": "no-such-topic-here"})
    with pytest.raises(ConfigError, match="does not exist") as info:
        b.preflight(sink_id)
    assert info.value.field == "topic"


@pytest.mark.promise("kafka-timeout-checked", "backend")
def test_transaction_timeout_above_the_broker_maximum(
        options: dict[str, str], sink_id: str) -> None:
    b = get_plugins().create_backend("kafka", {**options,
                                               "kafka.transaction.timeout.ms": "3600000"})
    error: ConfigError | None = None
    try:
        b.preflight(sink_id)
    except ConfigError as exc:
        error = exc
    finally:
        b.close()
    if error is None and kt.tansu_selected():
        pytest.skip("Tansu accepted transaction.timeout.ms=3600000: it has no "
                    "transaction.max.timeout.ms (Apache Kafka rejects it above 900000)")
    assert error is not None, "the broker accepted transaction.timeout.ms=3600000"
    assert error.field == "kafka.transaction.timeout.ms"
    assert "transaction.max.timeout.ms" in str(error)


def test_no_value_column(backend: KafkaBackend, sink_id: str) -> None:
    txn = backend.begin_transaction(TransactionContext(sink_id, 0, 0))
    try:
        with pytest.raises(ConfigError, match="no 'value' column"):
            backend.write(txn, pa.record_batch({"id": pa.array([1])}))
    finally:
        backend.discard(txn)


@pytest.mark.promise("kafka-sink-owner", "backend")
def test_a_second_query_with_the_same_sink_id_fails_at_start(
        options: dict[str, str], sink_id: str, tmp_path: Path) -> None:
    first = get_plugins().create_backend("kafka", options)
    second = get_plugins().create_backend("kafka", options)
    assert isinstance(first, KafkaBackend) and isinstance(second, KafkaBackend)
    try:
        Coordinator(first, DirectoryStateStore(tmp_path / "a"), sink_id,
                    plugins=build_plugins()).start()
        c = prepare(first, sink_id, 0, 0, range(5))
        with pytest.raises(ConfigError, match="already written by another query") as info:
            Coordinator(second, DirectoryStateStore(tmp_path / "b"), sink_id,
                        plugins=build_plugins()).start()
        assert info.value.field == "sink_id"
        assert str(tmp_path / "a") in str(info.value)
        # The second query aborted nothing of the first: its participant still commits.
        assert first.commit(c) is CommitOutcome.COMMITTED
        # The first query restarting from its own state is still the owner.
        Coordinator(first, DirectoryStateStore(tmp_path / "a"), sink_id,
                    plugins=build_plugins()).start()
        # Once the first query is gone for good, a takeover is explicit.
        taker = get_plugins().create_backend("kafka", {**options, "owner.takeover": "true"})
        Coordinator(taker, DirectoryStateStore(tmp_path / "b"), sink_id,
                    plugins=build_plugins()).start()
        with pytest.raises(ConfigError, match="already written by another query"):
            Coordinator(first, DirectoryStateStore(tmp_path / "a"), sink_id,
                        plugins=build_plugins()).start()
    finally:
        first.close()
        second.close()


def test_committed_participant_stays_committed_after_its_begin_marker_is_compacted(
        backend: KafkaBackend, sink_id: str) -> None:
    """Compaction keeps only the newest record per key: after a commit, the begin
    marker (the commit marker read by read_committed) goes, the end marker stays."""
    c = prepare(backend, sink_id, 0, 0, range(10))
    other = prepare(backend, sink_id, 0, 1, range(10, 20))
    assert backend.commit(c) is CommitOutcome.COMMITTED
    backend.abort(other)
    # Compaction comes much later: by then the coordinator has written the abort's
    # markers (Kafka writes them after answering EndTxn), so nothing holds the marker
    # partition's last stable offset back.
    marker_topic = str(c.payload["marker"]["topic"])
    deadline = time.monotonic() + 60
    while kt.unstable_partitions(backend.config.bootstrap, [marker_topic]):
        assert time.monotonic() < deadline, "the abort's markers were never written"
        time.sleep(0.1)
    # As if compacted: the begin marker's offset now holds another participant's record.
    marker = dict(c.payload["marker"])
    marker["offset"] = int(other.payload["marker"]["offset"])
    moved = replace(c, payload={**c.payload, "marker": marker})
    assert backend.commit(moved) is CommitOutcome.ALREADY_COMMITTED


def test_a_reused_participant_name_is_tracked_per_producer_epoch(
        backend: KafkaBackend, sink_id: str, tmp_path: Path) -> None:
    """A restarted Spark query starts task attempt ids at 0 again, so participant
    names (and transactional ids) repeat: the old use's end must not end the new one."""
    old = prepare(backend, sink_id, 5, 0, range(5))
    backend.commit(old)
    new = prepare(backend, sink_id, 5, 0, range(5, 10))  # same name, next producer epoch
    assert new.participant == old.participant
    assert (new.payload["producer_id"], new.payload["producer_epoch"]) != (
        old.payload["producer_id"], old.payload["producer_epoch"])
    assert set(backend.open_markers(sink_id)) == {str(new.payload["transactional_id"])}
    backend.abort(new)
    assert backend.open_markers(sink_id) == {}
    # Re-committing the old one stays idempotent. (Checked once nothing is open:
    # Tansu 0.6 holds the last stable offset at the log start while any transaction
    # is open on the partition.)
    assert backend.commit(old) is CommitOutcome.ALREADY_COMMITTED


def _until_ended(backend: KafkaBackend, tid: str) -> None:
    """Wait until the coordinator shows ``tid``'s last transaction complete, as it is
    by the time a pipeline's next epoch starts (its end markers take a few ms)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        info = backend.driver().txn.describe_transactions([tid]).get(tid)
        if info is not None and not info.is_open:
            return
        time.sleep(0.02)
    raise AssertionError(f"{tid} still open")


def test_at_least_once_tasks_of_a_worker_reuse_its_producer(
        backend: KafkaBackend, sink_id: str, topic: str,
        broker_caps: kt.BrokerCapabilities) -> None:
    """at_least_once: one init_transactions for the worker's pooled id, then each
    task only begins a transaction on the kept producer; every row arrives once."""
    kb.close_kept_producers()
    before = dict(kb.PRODUCER_COUNTS)
    done = []
    for epoch in range(3):
        ctx = TransactionContext(sink_id, epoch, 0)
        ids = range(epoch * 100, epoch * 100 + 100)
        done.append(write_participant(backend, ctx, [batch(ids)],
                                      DeliveryGuarantee.AT_LEAST_ONCE))
        _until_ended(backend, str(done[-1].payload["transactional_id"]))
    counts = {k: kb.PRODUCER_COUNTS[k] - before.get(k, 0)
              for k in ("init_transactions", "reused")}
    assert counts == {"init_transactions": 1, "reused": 2}
    # One pooled id, one producer id and epoch: the same producer throughout.
    used = {(c.payload["transactional_id"], c.payload["producer_id"],
             c.payload["producer_epoch"]) for c in done}
    assert used == {(f"{backend.config.transactional_id_prefix}-{sink_id}-p0-t0",
                     done[0].payload["producer_id"], done[0].payload["producer_epoch"])}
    assert committed_keys(broker_caps, backend.config.bootstrap, topic) == list(range(300))
    # Each task's end marker went out with its data: no participant looks open.
    assert backend.open_markers(sink_id) == {}
    assert backend.list_prepared(sink_id) == []
    assert broker_open_participants(backend, sink_id) == set()


def test_a_kept_producer_whose_id_was_taken_over_is_replaced(
        backend: KafkaBackend, sink_id: str, topic: str,
        broker_caps: kt.BrokerCapabilities) -> None:
    """Another writer initialised the id (bumping its epoch) after this worker kept a
    producer for it: the next task notices and opens a new producer, not a fenced one."""
    kb.close_kept_producers()
    first = write_participant(backend, TransactionContext(sink_id, 0, 0), [batch(range(10))],
                              DeliveryGuarantee.AT_LEAST_ONCE)
    tid = str(first.payload["transactional_id"])
    _until_ended(backend, tid)
    backend.driver().txn.init_producer_id(tid, backend.config.transaction_timeout_ms)
    before = dict(kb.PRODUCER_COUNTS)
    second = write_participant(backend, TransactionContext(sink_id, 1, 0),
                               [batch(range(10, 20))], DeliveryGuarantee.AT_LEAST_ONCE)
    assert kb.PRODUCER_COUNTS["init_transactions"] - before.get("init_transactions", 0) == 1
    assert kb.PRODUCER_COUNTS["reused"] == before.get("reused", 0)
    assert second.payload["producer_epoch"] != first.payload["producer_epoch"] or \
        second.payload["producer_id"] != first.payload["producer_id"]
    assert committed_keys(broker_caps, backend.config.bootstrap, topic) == list(range(20))
    assert backend.list_prepared(sink_id) == []


def test_exactly_once_never_reuses_a_prepared_producer_and_opens_the_next_ahead(
        backend: KafkaBackend, sink_id: str, topic: str,
        broker_caps: kt.BrokerCapabilities) -> None:
    """A prepared producer's transaction is ended by the driver, after which librdkafka
    refuses to begin on it: each exactly_once participant needs a producer with
    ``init_transactions`` done. The writer process initialises it between tasks, on a
    slot with no open transaction, so the next participant only begins and writes its
    marker; every row once, each participant on its own producer epoch."""
    kb.close_kept_producers()
    before = dict(kb.PRODUCER_COUNTS)
    done = []
    for epoch in range(3):
        c = prepare(backend, sink_id, epoch, 0, range(epoch * 10, epoch * 10 + 10))
        assert backend.commit(c) is CommitOutcome.COMMITTED
        _until_ended(backend, str(c.payload["transactional_id"]))
        done.append(c)
    deadline = time.monotonic() + 30  # the one ahead of a next task that never comes
    while kwriter._WARMING and time.monotonic() < deadline:
        time.sleep(0.01)
    counts = {k: kb.PRODUCER_COUNTS[k] - before.get(k, 0)
              for k in ("init_transactions", "warmed", "reused")}
    # One producer opened by the first task, one ahead of each later task (and of the
    # task after the last): three inits, the later two participants on warmed ones.
    assert counts == {"init_transactions": 4, "warmed": 3, "reused": 2}, counts
    identities = [(c.payload["transactional_id"], c.payload["producer_id"],
                   c.payload["producer_epoch"]) for c in done]
    assert len(set(identities)) == 3  # never a prepared producer again
    assert all(float(c.payload["open_ms"]) >= 0 for c in done)
    assert committed_keys(broker_caps, backend.config.bootstrap, topic) == list(range(30))
    assert backend.list_prepared(sink_id) == []
    assert broker_open_participants(backend, sink_id) == set()
    # The producer kept for the next participant holds no transaction; closing it is all.
    assert len(kwriter._PRODUCERS) == 1
    kb.close_kept_producers()


def test_exactly_once_without_opening_ahead_opens_each_producer_in_the_task(
        kafka_broker: Broker, topic: str, sink_id: str) -> None:
    """``producer.init.ahead=false``: no producer is initialised between tasks."""
    b = get_plugins().create_backend("kafka", {
        "kafka.bootstrap.servers": kafka_broker.bootstrap, "topic": topic,
        "producer.init.ahead": "false"})
    assert isinstance(b, KafkaBackend)
    b.preflight(sink_id)
    try:
        kb.close_kept_producers()
        before = dict(kb.PRODUCER_COUNTS)
        for epoch in range(2):
            c = prepare(b, sink_id, epoch, 0, range(epoch * 10, epoch * 10 + 10))
            assert b.commit(c) is CommitOutcome.COMMITTED
        assert kb.PRODUCER_COUNTS["init_transactions"] - before.get("init_transactions", 0) \
            == 2
        assert kb.PRODUCER_COUNTS["warmed"] == before.get("warmed", 0)
        assert not kwriter._PRODUCERS and not kwriter._WARMING
    finally:
        b.close()


@pytest.mark.promise("kafka-marker-topics-compacted", "backend")
@pytest.mark.parametrize("policy", ["delete", "compact,delete"])
def test_an_existing_marker_topic_that_is_not_compacted_is_refused(
        kafka_broker: Broker, topic: str, sink_id: str, policy: str) -> None:
    """Operations suspicion, confirmed: an existing claim or marker topic was used as it
    was; with cleanup.policy=delete, retention removes live markers and claims, and so
    it does with compact,delete (accepted before: "compact" was in the list)."""
    plain = f"m-{uuid.uuid4().hex[:10]}"
    kt.create_topic(kafka_broker.bootstrap, plain, partitions=1,
                    config={"cleanup.policy": policy})
    b = get_plugins().create_backend("kafka", {"kafka.bootstrap.servers":
                                               kafka_broker.bootstrap, "topic": topic,
                                               "marker.topic": plain})
    try:
        with pytest.raises(ConfigError, match=rf"cleanup\.policy={policy}:") as err:
            b.preflight(sink_id)
    finally:
        b.close()
    assert err.value.field == "marker.topic"
    assert (f"kafka-configs.sh --bootstrap-server {kafka_broker.bootstrap.split(',')[0]} "
            f"--alter --entity-type topics --entity-name {plain} --add-config "
            "cleanup.policy=compact") in str(err.value)


def test_an_orphan_marker_without_producer_id_never_fences_a_live_writer(
        backend: KafkaBackend, sink_id: str, topic: str, kafka_broker: Broker) -> None:
    """Operations suspicion, confirmed: a begin marker written before librdkafka reported
    the producer id (-1) made orphan cleanup fence its pooled id unconditionally, which
    aborted whatever live participant used the id by then. Now no such marker is written
    (the open fails instead), and one from an older release is left to the broker's
    transaction timeout."""
    from confluent_kafka import Producer
    from txsink_kafka.markers import BEGIN, Marker, marker_partition

    live = prepare(backend, sink_id, 5, 0, range(10))
    tid = str(live.payload["transactional_id"])
    legacy = Marker(BEGIN, tid, sink_id, 3, 0, 9)  # an older release's: producer id -1
    key, value = legacy.encode()
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    producer.produce(backend.config.marker_topic, value, key,
                     marker_partition(sink_id, backend.shared.marker_partitions or 1))
    assert producer.flush(30) == 0
    aborted = backend.abort_orphans(sink_id, protected=set(), up_to_epoch=4)
    assert [c.participant for c in aborted] == []
    assert backend.commit(live) is CommitOutcome.COMMITTED  # the live writer was not fenced
    assert keys(kafka_broker.bootstrap, topic) == list(range(10))


@pytest.mark.promise("kafka-old-committables-read", "backend")
def test_committable_payload_versions() -> None:
    """Version 1 is read with no offsets (never salvaged); an unknown one is refused."""
    from txsink.errors import StateError
    from txsink_kafka.clients import PAYLOAD_VERSION, decode_payload

    old = decode_payload(1, {"transactional_id": "t", "producer_id": 1})
    assert old["ranges"] is None and old["transaction_version"] == 1
    assert old["transactional_id"] == "t"
    assert decode_payload(PAYLOAD_VERSION, {"ranges": {}}) == {"ranges": {}}
    with pytest.raises(StateError, match="payload version 9"):
        decode_payload(9, {})


#: Topic configs of a marker topic the log cleaner compacts within seconds: a new
#: segment every 100 ms, cleaned as soon as anything in it is dirty.
EAGER_COMPACTION = {"segment.ms": "100", "min.cleanable.dirty.ratio": "0.001",
                    "min.compaction.lag.ms": "0", "delete.retention.ms": "0"}


@pytest.mark.promise("kafka-compacted-markers-ask-output", "backend")
def test_a_committed_participant_whose_markers_were_compacted_away_stays_committed(
        kafka_broker: Broker, sink_id: str, tmp_path: Path) -> None:
    """Markers are keyed by the pooled transactional id in a compacted topic: once the
    slot is used again, compaction removes the older participant's begin and end
    markers. Committing that participant again (its decision restored from an older
    copy of the state) found neither, was refused by the coordinator and reported
    DATA AT RISK for data that was committed; the records' own control records now
    say it was committed."""
    bootstrap = kafka_broker.bootstrap
    out, mtopic = f"t-{uuid.uuid4().hex[:8]}", f"m-{uuid.uuid4().hex[:8]}"
    kt.create_topic(bootstrap, out, partitions=1)
    kt.create_topic(bootstrap, mtopic, compacted=True, config=EAGER_COMPACTION)
    b = get_plugins().create_backend("kafka", {"kafka.bootstrap.servers": bootstrap,
                                               "topic": out, "marker.topic": mtopic})
    assert isinstance(b, KafkaBackend)
    try:
        b.preflight(sink_id)
        coord = coordinator(b, tmp_path, sink_id)
        coord.start()
        first = prepare(b, sink_id, 0, 0, range(10))
        assert coord.commit_epoch(0, [first]) is EpochOutcome.COMMITTED
        tid, identity, (_, mpart, moffset) = b.payload(first)
        epoch = 1
        deadline = time.monotonic() + 180
        # Later epochs reuse the slot (every other one: the producer initialised ahead
        # of each next participant takes the other slot while this one is prepared);
        # the cleaner (every log.cleaner.backoff.ms, 15 s by default) then keeps only
        # the newest marker of the key.
        reused = 0
        while True:
            c = prepare(b, sink_id, epoch, 0, range(10 * epoch, 10 * epoch + 10))
            reused += c.payload["transactional_id"] == tid
            assert coord.commit_epoch(epoch, [c]) is EpochOutcome.COMMITTED
            epoch += 1
            gone = b.committer.marker_status(first) == kb.MarkerStatus.MISSING
            if gone and not b.committer.ended_as_committed(mtopic, mpart, moffset, tid,
                                                           identity):
                break
            assert time.monotonic() < deadline, "the log cleaner never compacted the markers"
            time.sleep(1.0)
        assert reused
        assert b.commit(first) is CommitOutcome.ALREADY_COMMITTED
        assert b.is_committed(first) is True
        assert keys(bootstrap, out) == list(range(10 * epoch))
        # A participant the broker aborted is still told apart: not committed.
        lost = prepare(b, sink_id, epoch, 0, range(1000, 1010))
        b.driver().txn.init_producer_id(str(lost.payload["transactional_id"]), 60_000)
        assert b.salvager.committed_in_log(lost) is False
        with pytest.raises(ParticipantLostError):
            b.commit(lost)
    finally:
        b.close()
