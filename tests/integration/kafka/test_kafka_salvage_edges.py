"""Salvage at its edges, on a real broker: compressed output, a driver that was
superseded while salvaging, an output topic that was deleted and recreated.

* Compression: the records of an aborted participant are read back with a raw Fetch
  and decoded by kafka-python, which needs a library per codec; lz4 and snappy were
  missing ("Libraries for lz4 compression codec not found"), so the epoch stayed
  DECIDED until retention turned it into a loss.
* A superseded driver: a driver whose lease another one took while it salvaged left
  its replacement transaction open (its decision record was refused), holding
  ``read_committed`` readers back until the transaction timeout. A fenced driver
  mutates nothing: what it opened is aborted.
* A recreated output topic: other records now sit at the participant's offsets, and
  the salvage found no end of its producer's transaction there, so it said "still
  open; salvage waits" on every restart, forever. Now it is the documented DATA LOST,
  and the documented remedy ends the epoch exactly once.
"""

from __future__ import annotations

import time
from pathlib import Path

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
from txsink.errors import FencedError, ParticipantLostError
from txsink.faults import (
    AFTER_DECIDE,
    AFTER_SALVAGE_PREPARE,
    FaultInjector,
    FaultRule,
    InjectedFault,
)
from txsink.model import TransactionContext
from txsink.plugins import build_plugins
from txsink.state import DirectoryStateStore, EpochState
from txsink.writer import write_participant
from txsink_kafka import testing as kt
from txsink_kafka.backend import close_shared_clients
from txsink_kafka.local_broker import LocalKafka

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CODECS = ("gzip", "snappy", "lz4", "zstd")


def test_salvage_reads_back_every_compression_codec(short_timeout_kafka: LocalKafka,
                                                     tmp_path: Path) -> None:
    """One decided epoch, one participant per codec (``kafka.compression.type``), the
    driver down past the timeout: the restart salvages all four, exactly once."""
    bootstrap = short_timeout_kafka.bootstrap
    topic, sink, options, backend = kafka_sink(short_timeout_kafka, "cz", 1)
    state = DirectoryStateStore(tmp_path / "state")
    coord = Coordinator(backend, state, sink, plugins=build_plugins(),
                        backend_options=options,
                        faults=FaultInjector([FaultRule(AFTER_DECIDE, 0, "raise")]))
    coord.start()
    msgs, expected = [], []
    for p, codec in enumerate(CODECS):
        writer = new_backend({**options, "kafka.compression.type": codec}, sink)
        try:
            rows = range(p * 100, p * 100 + 50)
            msgs.append(write_participant(writer, TransactionContext(sink, 0, p),
                                          [batch(rows)]))
            expected += [b"v%d" % i for i in rows]
        finally:
            writer.close()
    with pytest.raises(InjectedFault):
        coord.commit_epoch(0, msgs)
    wait_until_not_open(backend, [tid(c) for c in msgs])
    backend.close()

    restart(options, sink, state)
    record = state.get(0)
    assert record is not None and record.state is EpochState.COMMITTED
    assert sorted(o for _, o in record.salvaged) == sorted(c.participant for c in msgs)
    got = committed_values(bootstrap, topic)
    assert digest(got) == digest(expected), sorted(set(got) ^ set(expected))[:10]
    assert kt.broker_open_transactions(bootstrap, f"txsink-{sink}") == {}


def recreate(bootstrap: str, topic: str) -> None:
    """Delete ``topic`` and create it again (offsets start at 0 again)."""
    import confluent_kafka.admin as kadmin

    admin = kadmin.AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + 60
    while True:
        try:
            kt.create_topic(bootstrap, topic, partitions=1)
            return
        except Exception:  # still being deleted
            assert time.monotonic() < deadline, f"topic {topic} was not deleted"
            time.sleep(0.2)


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for v in values:
        producer.produce(topic, v, b"other", 0)
    assert producer.flush(30) == 0


@pytest.mark.promise("kafka-recreated-topic-detected", "backend")
def test_a_recreated_output_topic_is_a_loud_loss_and_the_remedy_ends_exactly_once(
        short_timeout_kafka: LocalKafka, tmp_path: Path) -> None:
    bootstrap = short_timeout_kafka.bootstrap
    topic, sink, options, backend = kafka_sink(short_timeout_kafka, "rt", 1)
    state = DirectoryStateStore(tmp_path / "chk" / "txsink")
    coord = Coordinator(backend, state, sink, plugins=build_plugins(),
                        backend_options=options,
                        faults=FaultInjector([FaultRule(AFTER_DECIDE, 0, "raise")]))
    coord.start()
    rows = range(10)
    lost = write_participant(backend, TransactionContext(sink, 0, 0), [batch(rows)])
    with pytest.raises(InjectedFault):
        coord.commit_epoch(0, [lost])
    wait_until_not_open(backend, [tid(lost)])
    backend.close()
    close_shared_clients()
    recreate(bootstrap, topic)
    # The recreated topic is written again (another application, or a pipeline
    # started on it) past the participant's offsets.
    others = [b"other-%d" % i for i in range(30)]
    produce(bootstrap, topic, others)

    for _ in range(2):  # every restart says the same, none waits
        with pytest.raises(ParticipantLostError) as loss:
            restart(options, sink, state)
        cause = str(loss.value.__cause__)
        assert "DATA LOST" in cause and lost.participant in cause, cause
        assert f"{topic}[0] offsets 0-9 (10 records)" in cause, cause
        assert "recreated" in cause and "resolve" in cause, cause
    record = state.get(0)
    assert record is not None and record.state is EpochState.DECIDED

    # The documented remedy (docs/backends/kafka.md, "Salvage"), as an operator types
    # it: resolve, then the restarted query replays the batch.
    close_shared_clients()
    assert cli_main(["resolve", str(tmp_path / "chk"), "--epoch", "0", "--abort",
                     "--force"]) == 0
    replay_backend = new_backend(options, sink)
    try:
        replay = Coordinator(replay_backend, state, sink, plugins=build_plugins(),
                             backend_options=options)
        replay.start()
        again = write_participant(replay_backend, TransactionContext(sink, 0, 0, 7),
                                  [batch(rows)])
        assert replay.commit_epoch(0, [again]) is EpochOutcome.COMMITTED
    finally:
        replay_backend.close()
    got = committed_values(bootstrap, topic)
    expected = others + [b"v%d" % i for i in rows]
    assert digest(got) == digest(expected), sorted(set(got) ^ set(expected))[:10]
    assert kt.unstable_partitions(bootstrap, [topic]) == {}


@pytest.mark.promise("kafka-salvage-crash-safe", "backend")
def test_a_driver_superseded_while_salvaging_leaves_no_transaction_open(
        short_timeout_kafka: LocalKafka, tmp_path: Path) -> None:
    """A restarted driver salvages a decided epoch; while its replacement is prepared
    (not yet recorded) a second driver takes the lease. The first one's record of the
    replacement is refused (FencedError): it must end the replacement it opened, so no
    transaction of the sink stays open; the second driver then salvages exactly once."""
    bootstrap = short_timeout_kafka.bootstrap
    topic, sink, options, backend = kafka_sink(short_timeout_kafka, "fz", 1)
    state = DirectoryStateStore(tmp_path / "state")
    coord = Coordinator(backend, state, sink, plugins=build_plugins(),
                        backend_options=options,
                        faults=FaultInjector([FaultRule(AFTER_DECIDE, 0, "raise")]))
    coord.start()
    rows = range(20)
    lost = write_participant(backend, TransactionContext(sink, 0, 0), [batch(rows)])
    with pytest.raises(InjectedFault):
        coord.commit_epoch(0, [lost])
    wait_until_not_open(backend, [tid(lost)])
    backend.close()
    close_shared_clients()

    def superseded(point: str, epoch: int | None) -> None:
        if point == AFTER_SALVAGE_PREPARE:  # a second driver starts right now
            DirectoryStateStore(tmp_path / "state").acquire("the-second-driver")

    zombie_backend = new_backend(options, sink)
    try:
        with pytest.raises(FencedError):
            Coordinator(zombie_backend, state, sink, plugins=build_plugins(),
                        backend_options=options,
                        faults=FaultInjector(callback=superseded)).start()
    finally:
        zombie_backend.close()
    assert kt.broker_open_transactions(bootstrap, f"txsink-{sink}") == {}
    assert kt.unstable_partitions(bootstrap, [topic]) == {}
    record = state.get(0)
    assert record is not None and record.state is EpochState.DECIDED
    assert record.salvaged == ()

    restart(options, sink, state)  # the second driver's start
    record = state.get(0)
    assert record is not None and record.state is EpochState.COMMITTED
    got = committed_values(bootstrap, topic)
    assert digest(got) == digest([b"v%d" % i for i in rows])
