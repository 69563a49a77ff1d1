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


def kafka_sink(kafka: LocalKafka, prefix: str, partitions: int
               ) -> tuple[str, str, dict[str, str], KafkaBackend]:
    """A fresh topic, compacted marker topic and sink id on ``kafka``, and a backend for
    them whose preflight ran: ``(topic, sink, options, backend)``."""
    topic, markers = f"t-{uuid.uuid4().hex[:8]}", f"m-{uuid.uuid4().hex[:8]}"
    kt.create_topic(kafka.bootstrap, topic, partitions=partitions)
    kt.create_topic(kafka.bootstrap, markers, partitions=1, compacted=True)
    sink = f"{prefix}-{uuid.uuid4().hex[:8]}"
    options = {"kafka.bootstrap.servers": kafka.bootstrap, "topic": topic,
               "marker.topic": markers, "kafka.transaction.timeout.ms": str(TIMEOUT_MS)}
    backend = get_plugins().create_backend("kafka", options)
    assert isinstance(backend, KafkaBackend)
    backend.preflight(sink)
    return topic, sink, options, backend


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
    topic, sink, options, backend = kafka_sink(short_timeout_kafka, "to", 2)
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


def test_the_documented_remedy_after_a_timeout_ends_the_epoch_exactly_once(
        short_timeout_kafka: LocalKafka, tmp_path: Path) -> None:
    """Operations hole 4. The driver commits one participant of a decided epoch, then
    stays down past transaction.timeout.ms: the broker aborts the other. The remedy in
    docs/backends/kafka.md (``resolve --abort --force``, then Spark replays the batch)
    wrote the committed participant a second time, and the resolve said all its rows
    were dropped."""
    import subprocess
    import sys

    from txsink.coordinator import EpochOutcome
    from txsink.faults import AFTER_FIRST_COMMIT

    bootstrap = short_timeout_kafka.bootstrap
    topic, sink, options, backend = kafka_sink(short_timeout_kafka, "fr", 2)
    state = DirectoryStateStore(tmp_path / "chk" / "txsink")
    crash = FaultInjector([FaultRule(AFTER_FIRST_COMMIT, 0, "raise")])
    coord = Coordinator(backend, state, sink, plugins=build_plugins(), faults=crash,
                        backend_options=options)
    coord.start()
    rows = {0: range(0, 10), 1: range(100, 110)}
    msgs = [write_participant(backend, TransactionContext(sink, 0, p), [batch(rows[p])])
            for p in range(2)]
    with pytest.raises(InjectedFault):  # one participant committed, then the driver dies
        coord.commit_epoch(0, msgs)
    wait_until_not_open(backend, [str(msgs[1].payload["transactional_id"])])
    backend.close()
    close_shared_clients()
    restarted = get_plugins().create_backend("kafka", options)
    try:
        with pytest.raises(ParticipantLostError):
            Coordinator(restarted, state, sink, plugins=build_plugins()).start()
    finally:
        restarted.close()
    close_shared_clients()

    # The documented remedy, as an operator types it.
    proc = subprocess.run([sys.executable, "-m", "txsink.cli", "resolve",
                           str(tmp_path / "chk"), "--epoch", "0", "--abort", "--force"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert ("1 participant(s) (10 row(s)) were committed already and stay visible"
            in proc.stdout), proc.stdout
    assert "1 participant(s), 10 row(s) dropped" in proc.stdout, proc.stdout

    # Spark replays the batch: both partitions write again; only the lost one counts.
    replay_backend = get_plugins().create_backend("kafka", options)
    try:
        replay = Coordinator(replay_backend, state, sink, plugins=build_plugins(),
                             backend_options=options)
        replay.start()
        again = [write_participant(replay_backend, TransactionContext(sink, 0, p, 7),
                                   [batch(rows[p])]) for p in range(2)]
        assert replay.commit_epoch(0, again) is EpochOutcome.COMMITTED
    finally:
        replay_backend.close()
    keys = sorted(int(m.key()) for m in kt.read_topic(bootstrap, topic))
    assert keys == [*rows[0], *rows[1]], keys  # each row exactly once


def test_a_recreated_marker_topic_cannot_make_a_lost_participant_look_committed(
        short_timeout_kafka: LocalKafka, tmp_path: Path) -> None:
    """Operations suspicion, confirmed: "already committed" compared only the marker's
    offset and key (the pooled transactional id). After the marker topic was recreated
    (or truncated by an unclean election), a later participant of the same pooled id
    had its marker at the same offset, and a re-commit of a decided participant the
    broker had aborted answered ALREADY_COMMITTED: its rows were lost silently."""
    import confluent_kafka.admin as kadmin

    bootstrap = short_timeout_kafka.bootstrap
    topic, sink, options, backend = kafka_sink(short_timeout_kafka, "rc", 1)
    state = DirectoryStateStore(tmp_path / "state")
    coord = Coordinator(backend, state, sink, plugins=build_plugins(),
                        faults=FaultInjector([FaultRule(AFTER_DECIDE, 0, "raise")]))
    coord.start()
    lost = write_participant(backend, TransactionContext(sink, 0, 0), [batch(range(10))])
    with pytest.raises(InjectedFault):
        coord.commit_epoch(0, [lost])
    assert lost.payload["marker"]["offset"] == 0
    wait_until_not_open(backend, [str(lost.payload["transactional_id"])])
    backend.close()
    close_shared_clients()
    # The marker topic is recreated: its offsets start again at 0.
    markers = options["marker.topic"]
    admin = kadmin.AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([markers])[markers].result(30)
    deadline = time.monotonic() + 60
    while True:
        try:
            kt.create_topic(bootstrap, markers, partitions=1, compacted=True)
            break
        except Exception:
            assert time.monotonic() < deadline, "the marker topic was not deleted"
            time.sleep(0.5)
    # A later participant takes the freed pooled id; its marker lands at offset 0.
    later = get_plugins().create_backend("kafka", options)
    try:
        newer = write_participant(later, TransactionContext(sink, 1, 0), [batch(range(50, 60))])
        assert newer.payload["transactional_id"] == lost.payload["transactional_id"]
        assert newer.payload["marker"]["offset"] == 0
        later.commit(newer)
        with pytest.raises(ParticipantLostError):
            Coordinator(later, state, sink, plugins=build_plugins()).start()
    finally:
        later.close()
    record = state.get(0)
    assert record is not None and record.state.value == "decided"  # never called committed
    assert sorted(int(m.key()) for m in kt.read_topic(bootstrap, topic)) == list(range(50, 60))
