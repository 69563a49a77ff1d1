"""Transactions that outlive their timeout, on a real broker, per transaction version.

The broker (``short_timeout_kafka`` in conftest.py, one per transaction version) aborts
a prepared transaction within about a second of its ``transaction.timeout.ms``. A
driver that stays down longer than that after deciding an epoch finds participants
aborted; txsink salvages them from the log (their records stay there, aborted, until
retention deletes them), whatever step of the salvage a crash interrupts. Once the
records are gone the loss is loud and exact, and the documented remedy ends the
epoch exactly once.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from timeout_helpers import (
    batch,
    committed_values,
    digest,
    kafka_sink,
    new_backend,
    restart,
    tid,
    wait_until_not_open,
)
from txsink.cli import main as cli_main
from txsink.coordinator import Coordinator, EpochOutcome
from txsink.errors import ParticipantLostError
from txsink.faults import (
    AFTER_DECIDE,
    AFTER_FIRST_COMMIT,
    AFTER_SALVAGE_COMMIT,
    AFTER_SALVAGE_PREPARE,
    AFTER_SALVAGE_RECORD,
    FaultInjector,
    FaultRule,
    InjectedFault,
)
from txsink.model import TransactionContext
from txsink.plugins import build_plugins, get_plugins
from txsink.state import DirectoryStateStore, EpochState
from txsink.writer import write_participant
from txsink_kafka import testing as kt
from txsink_kafka.backend import close_shared_clients
from txsink_kafka.local_broker import LocalKafka

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def write_interleaved(bootstrap: str, topic: str, partitions: int, tag: bytes,
                      *, commit: bool) -> list[bytes]:
    """Another producer's transaction on the same partitions, committed or aborted:
    a salvage must take none of its records."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap,
                         "transactional.id": f"other-{uuid.uuid4().hex[:8]}",
                         "transaction.timeout.ms": 3000})
    producer.init_transactions(30)
    producer.begin_transaction()
    values = [b"%s-%d" % (tag, i) for i in range(6)]
    for i, v in enumerate(values):
        producer.produce(topic, v, b"k", i % partitions)
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)
    return values if commit else []


@pytest.mark.promise("kafka-salvage", "backend")
@pytest.mark.promise("kafka-salvage-crash-safe", "backend")
def test_a_driver_down_past_the_timeout_salvages_through_every_crash_exactly_once(
        short_timeout_kafka: LocalKafka, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The driver commits one participant of a decided epoch and stays down past
    transaction.timeout.ms: the broker aborts the other. Each restart then crashes at
    the next step of the salvage (replacement prepared, recorded, committed), and the
    driver stays down past the timeout again after the replacement was recorded."""
    bootstrap = short_timeout_kafka.bootstrap
    topic, sink, options, backend = kafka_sink(short_timeout_kafka, "sv", 2)
    state = DirectoryStateStore(tmp_path / "chk" / "txsink")
    expected: list[bytes] = []
    coord = Coordinator(backend, state, sink, plugins=build_plugins(), backend_options=options,
                        faults=FaultInjector([FaultRule(AFTER_FIRST_COMMIT, 0, "raise")]))
    coord.start()
    rows = {0: range(0, 40), 1: range(100, 140)}
    msgs = []
    for p in range(2):
        # Records of other producers between and inside the participants' ranges.
        expected += write_interleaved(bootstrap, topic, 2, b"before%d" % p, commit=True)
        write_interleaved(bootstrap, topic, 2, b"aborted%d" % p, commit=False)
        msgs.append(write_participant(backend, TransactionContext(sink, 0, p),
                                      [batch(rows[p])]))
    expected += [b"v%d" % i for p in range(2) for i in rows[p]]
    assert msgs[1].payload_version == 2 and msgs[1].payload["transaction_version"] == 1
    spans = msgs[1].payload["ranges"][topic]
    assert sum(n for _, _, _, n in spans) == 40
    with pytest.raises(InjectedFault):  # the first participant committed, then death
        coord.commit_epoch(0, msgs)
    expected += write_interleaved(bootstrap, topic, 2, b"after", commit=True)
    wait_until_not_open(backend, [tid(msgs[1])])  # down past transaction.timeout.ms
    backend.close()

    with pytest.raises(InjectedFault):
        restart(options, sink, state, AFTER_SALVAGE_PREPARE)
    record = state.get(0)
    assert record is not None and record.salvaged == ()  # not recorded: an orphan
    with pytest.raises(InjectedFault):
        restart(options, sink, state, AFTER_SALVAGE_RECORD)
    record = state.get(0)
    assert record is not None and record.state is EpochState.DECIDED
    [(first_replacement, original)] = record.salvaged
    assert original == msgs[1].participant
    replacement = next(c for c in record.committables if c.participant == first_replacement)
    assert replacement.rows == 40
    assert replacement.payload["salvage_of"]["participant"] == msgs[1].participant
    check = new_backend(options, sink)
    wait_until_not_open(check, [tid(replacement)])  # down past the timeout again
    check.close()
    with pytest.raises(InjectedFault):
        restart(options, sink, state, AFTER_SALVAGE_COMMIT)
    restart(options, sink, state)

    record = state.get(0)
    assert record is not None and record.state is EpochState.COMMITTED
    assert [o for _, o in record.salvaged] == [msgs[1].participant, first_replacement]
    got = committed_values(bootstrap, topic)
    assert digest(got) == digest(expected), sorted(set(got) ^ set(expected))[:10]
    assert kt.broker_open_transactions(bootstrap, f"txsink-{sink}") == {}
    assert kt.unstable_partitions(bootstrap, [topic, options["marker.topic"]]) == {}
    assert cli_main(["status", str(tmp_path / "chk")]) == 0
    out = capsys.readouterr().out
    assert f"epoch 0: {msgs[1].participant} -> {first_replacement}" in out
    print(f"\n{short_timeout_kafka.describe().split(' (')[0]}: salvaged "
          f"{msgs[1].participant} twice through 3 crashes; {len(got)} records exactly once")


@pytest.mark.promise("kafka-salvage-data-gone-reported", "backend")
def test_records_deleted_by_retention_are_lost_loudly_and_the_remedy_ends_exactly_once(
        short_timeout_kafka: LocalKafka, tmp_path: Path) -> None:
    """The driver commits one participant, stays down past the timeout, and retention
    deletes the segment holding the other's aborted records before it comes back: the
    restart stops with an error naming the epoch, the participant, its offsets and
    why. The remedy in docs/backends/kafka.md (``resolve --abort --force``, then Spark
    replays the batch) writes only the lost partition again."""
    import confluent_kafka.admin as kadmin

    bootstrap = short_timeout_kafka.bootstrap
    topic, sink, options, backend = kafka_sink(short_timeout_kafka, "rt", 1)
    state = DirectoryStateStore(tmp_path / "chk" / "txsink")
    coord = Coordinator(backend, state, sink, plugins=build_plugins(), backend_options=options,
                        faults=FaultInjector([FaultRule(AFTER_FIRST_COMMIT, 0, "raise")]))
    coord.start()
    rows = {0: range(0, 10), 1: range(100, 110)}
    msgs = [write_participant(backend, TransactionContext(sink, 0, p), [batch(rows[p])])
            for p in range(2)]
    with pytest.raises(InjectedFault):
        coord.commit_epoch(0, msgs)
    wait_until_not_open(backend, [tid(msgs[1])])
    [[partition, first, last, count]] = msgs[1].payload["ranges"][topic]
    backend.close()

    admin = kadmin.AdminClient({"bootstrap.servers": bootstrap})

    def retention(ms: str) -> None:
        entry = kadmin.ConfigEntry("retention.ms", ms,
                                   incremental_operation=kadmin.AlterConfigOpType.SET)
        resource = kadmin.ConfigResource(kadmin.ResourceType.TOPIC, topic,
                                         incremental_configs=[entry])
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(30)

    retention("100")  # retention outran the outage
    from confluent_kafka import Consumer, TopicPartition

    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": "txsink-test"})
    deadline = time.monotonic() + 120
    while probe.get_watermark_offsets(TopicPartition(topic, partition), 10,
                                      cached=False)[0] <= last:
        assert time.monotonic() < deadline, "retention did not delete the segment"
        time.sleep(0.3)
    probe.close()
    retention("604800000")

    with pytest.raises(ParticipantLostError) as lost:
        restart(options, sink, state)
    text = str(lost.value)
    print(f"\n{short_timeout_kafka.describe().split(' (')[0]}: {text}")
    assert lost.value.epoch == 0 and lost.value.sink_id == sink
    assert msgs[1].participant in text
    cause = str(lost.value.__cause__)
    assert f"{topic}[{partition}] offsets {first}-{last} ({count} records)" in cause
    assert "retention deleted the segment" in cause and "DATA LOST" in cause
    assert "transaction.timeout.ms" in cause and "resolve" in cause
    record = state.get(0)
    assert record is not None and record.state is EpochState.DECIDED
    assert record.salvaged == ()

    # The documented remedy, as an operator types it.
    close_shared_clients()
    assert cli_main(["resolve", str(tmp_path / "chk"), "--epoch", "0", "--abort",
                     "--force"]) == 0
    replay_backend = new_backend(options, sink)
    try:
        replay = Coordinator(replay_backend, state, sink, plugins=build_plugins(),
                             backend_options=options)
        replay.start()
        again = [write_participant(replay_backend, TransactionContext(sink, 0, p, 7),
                                   [batch(rows[p])]) for p in range(2)]
        assert replay.commit_epoch(0, again) is EpochOutcome.COMMITTED
    finally:
        replay_backend.close()
    # Retention took the committed partition's records too; what the replay wrote is
    # the lost partition, once (the kept one is not written again).
    keys = sorted(int(m.key()) for m in kt.read_topic(bootstrap, topic))
    assert keys == list(rows[1]), keys


def test_a_recreated_marker_topic_cannot_make_a_lost_participant_look_committed(
        short_timeout_kafka: LocalKafka, tmp_path: Path) -> None:
    """Operations suspicion, confirmed: "already committed" compared only the marker's
    offset and key (the pooled transactional id). After the marker topic was recreated
    (or truncated by an unclean election), a later participant of the same pooled id
    had its marker at the same offset, and a re-commit of a decided participant the
    broker had aborted answered ALREADY_COMMITTED: its rows were lost silently. Now it
    is found aborted, and salvaged from the output topic's log."""
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
    wait_until_not_open(backend, [tid(lost)])
    backend.close()
    close_shared_clients()
    recreate_topic(bootstrap, options["marker.topic"])  # its offsets start again at 0
    # A later participant takes the freed pooled id; its marker lands at offset 0.
    later = new_backend(options, sink)
    try:
        newer = write_participant(later, TransactionContext(sink, 1, 0), [batch(range(50, 60))])
        assert tid(newer) == tid(lost)
        assert newer.payload["marker"]["offset"] == 0
        later.commit(newer)
        assert later.is_committed(lost) is False
        Coordinator(later, state, sink, plugins=build_plugins()).start()
    finally:
        later.close()
    record = state.get(0)
    assert record is not None and record.state is EpochState.COMMITTED
    assert [o for _, o in record.salvaged] == [lost.participant]
    assert sorted(int(m.key()) for m in kt.read_topic(bootstrap, topic)) == [
        *range(10), *range(50, 60)]


def recreate_topic(bootstrap: str, name: str) -> None:
    import confluent_kafka.admin as kadmin

    admin = kadmin.AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([name])[name].result(30)
    deadline = time.monotonic() + 60
    while True:
        try:
            kt.create_topic(bootstrap, name, partitions=1, compacted=True)
            return
        except Exception:
            assert time.monotonic() < deadline, f"topic {name} was not deleted"
            time.sleep(0.5)


@pytest.mark.promise("kafka-salvage-data-gone-reported", "backend")
def test_a_deleted_output_topic_is_a_loud_loss(short_timeout_kafka: LocalKafka,
                                                tmp_path: Path) -> None:
    bootstrap = short_timeout_kafka.bootstrap
    topic, sink, options, backend = kafka_sink(short_timeout_kafka, "dt", 1)
    state = DirectoryStateStore(tmp_path / "state")
    coord = Coordinator(backend, state, sink, plugins=build_plugins(),
                        faults=FaultInjector([FaultRule(AFTER_DECIDE, 0, "raise")]))
    coord.start()
    c = write_participant(backend, TransactionContext(sink, 0, 0), [batch(range(5))])
    with pytest.raises(InjectedFault):
        coord.commit_epoch(0, [c])
    wait_until_not_open(backend, [tid(c)])
    backend.close()
    import confluent_kafka.admin as kadmin

    admin: Any = kadmin.AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(30)
    close_shared_clients()
    restarted = get_plugins().create_backend("kafka", options)  # (its preflight would refuse)
    with pytest.raises(ParticipantLostError) as lost:
        Coordinator(restarted, state, sink, plugins=build_plugins()).start()
    restarted.close()
    cause = str(lost.value.__cause__)
    assert c.participant in cause and f"{topic}[0] offsets" in cause
    assert "deleted" in cause, cause
