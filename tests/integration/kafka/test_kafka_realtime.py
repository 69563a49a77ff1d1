"""The Kafka real-time target: records and the progress marker in one transaction,
fencing by transactional.id, and the progress read back after a claim."""

from __future__ import annotations

import uuid

import pytest
from conftest import Broker
from txsink.errors import ConfigError, FencedError
from txsink.realtime import PositionWriter, SourcePartition
from txsink_kafka import testing as kt
from txsink_kafka.backend import KafkaBackend
from txsink_kafka.realtime import KafkaRealtimeSpec

pytestmark = [pytest.mark.integration]

SRC = SourcePartition("orders", 1)


def make_spec(broker: Broker, topic: str) -> KafkaRealtimeSpec:
    sink = f"rt-{uuid.uuid4().hex[:8]}"
    spec = KafkaBackend.realtime_target(sink, {
        "topic": topic, "kafka.bootstrap.servers": broker.bootstrap,
        "progress.topic": f"{sink}-progress"})
    assert isinstance(spec, KafkaRealtimeSpec)
    spec.prepare()
    return spec


def values(broker: Broker, topic: str) -> list[int]:
    return sorted(int(m.value()) for m in kt.read_topic(broker.bootstrap, topic))


@pytest.mark.promise("realtime-replay-skipped", "realtime")
def test_records_and_progress_commit_together_and_a_replay_is_skipped(
        kafka_broker: Broker, topic: str) -> None:
    if kt.tansu_selected():
        pytest.skip(kt.TANSU_CANNOT)
    spec = make_spec(kafka_broker, topic)
    w = PositionWriter(spec, commit_interval_s=0.0)
    for off in range(10):
        w.add(SRC, off, {"value": str(off)})
    w.close()
    assert spec.stored_positions() == {SRC: 9}
    replay = PositionWriter(spec, commit_interval_s=60)
    for off in range(5, 15):
        replay.add(SRC, off, {"value": str(off)})
    replay.flush()
    replay.add(SRC, 15, {"value": "15"})
    replay.close(RuntimeError("killed"))  # offset 15 aborted: never visible
    assert values(kafka_broker, topic) == list(range(15))
    assert replay.stats.skipped == 5 and spec.stored_positions() == {SRC: 14}


def test_a_full_producer_queue_writes_each_record_once(
        kafka_broker: Broker, topic: str) -> None:
    """A write larger than the producer's local queue (BufferError part-way through)
    waits for room and goes on from the record that did not fit: the records queued
    before it are not produced a second time."""
    if kt.tansu_selected():
        pytest.skip(kt.TANSU_CANNOT)
    sink = f"rt-{uuid.uuid4().hex[:8]}"
    spec = KafkaBackend.realtime_target(sink, {
        "topic": topic, "kafka.bootstrap.servers": kafka_broker.bootstrap,
        "progress.topic": f"{sink}-progress", "kafka.queue.buffering.max.messages": "7"})
    spec.prepare()
    w = PositionWriter(spec, commit_interval_s=60)
    for off in range(50):
        w.add(SRC, off, {"value": str(off)})
    w.close()  # one write of 50 rows through a queue of 7
    assert values(kafka_broker, topic) == list(range(50))
    assert spec.stored_positions() == {SRC: 49}


@pytest.mark.promise("realtime-two-drivers-fenced", "realtime")
def test_a_second_writer_fences_the_first(kafka_broker: Broker, topic: str) -> None:
    if kt.tansu_selected():
        pytest.skip(kt.TANSU_CANNOT)
    spec = make_spec(kafka_broker, topic)
    old = PositionWriter(spec, commit_interval_s=60)
    old.add(SRC, 0, {"value": "100"})
    new = PositionWriter(spec, commit_interval_s=60)
    new.add(SRC, 0, {"value": "0"})
    with pytest.raises(FencedError):
        old.close()
    new.close()
    assert values(kafka_broker, topic) == [0]


@pytest.mark.promise("realtime-progress-topic-compacted", "realtime")
def test_a_progress_topic_that_is_not_compacted_is_refused(
        kafka_broker: Broker, topic: str) -> None:
    progress = f"p-{uuid.uuid4().hex[:8]}"
    kt.create_topic(kafka_broker.bootstrap, progress)
    spec = KafkaBackend.realtime_target("rt-x", {
        "topic": topic, "kafka.bootstrap.servers": kafka_broker.bootstrap,
        "progress.topic": progress})
    with pytest.raises(ConfigError, match="must be compacted"):
        spec.prepare()


@pytest.mark.promise("realtime-kept-producer-fenced-reclaims", "realtime")
def test_a_kept_producer_fenced_while_idle_is_claimed_again_on_a_real_broker(
        kafka_broker: Broker, topic: str) -> None:
    """The broker's answer to a kept producer that another worker fenced between two
    batches must read as fenced (so the writer claims again), and the rows the other
    worker committed meanwhile must not appear twice."""
    if kt.tansu_selected():
        pytest.skip(kt.TANSU_CANNOT)
    from txsink.realtime import SessionPool

    spec = make_spec(kafka_broker, topic)
    mine, theirs = SessionPool(), SessionPool()
    try:
        w = PositionWriter(spec, commit_interval_s=60, run="r", pool=mine)
        for off in range(3):
            w.add(SRC, off, {"value": str(off)})
        w.close()
        assert len(mine) == 1  # kept, idle, with a committed transaction behind it
        other = PositionWriter(spec, commit_interval_s=60, run="r", pool=theirs)
        for off in range(3, 6):
            other.add(SRC, off, {"value": str(off)})
        other.close()
        again = PositionWriter(spec, commit_interval_s=60, run="r", pool=mine)
        for off in range(3, 8):
            again.add(SRC, off, {"value": str(off)})
        again.close()
        assert values(kafka_broker, topic) == list(range(8))
        assert again.stats.skipped == 3 and spec.stored_positions() == {SRC: 7}
    finally:
        mine.clear()
        theirs.clear()


def test_a_full_producer_queue_in_a_transaction_does_not_send_rows_twice(
        kafka_broker: Broker, topic: str) -> None:
    """librdkafka's local queue (``queue.buffering.max.messages``) filling up in the
    middle of one commit's rows (a backlog, a long commit interval, an explode) makes
    ``produce`` raise BufferError: the rows already queued must not be queued again."""
    if kt.tansu_selected():
        pytest.skip(kt.TANSU_CANNOT)
    sink = f"rt-{uuid.uuid4().hex[:8]}"
    spec = KafkaBackend.realtime_target(sink, {
        "topic": topic, "kafka.bootstrap.servers": kafka_broker.bootstrap,
        "progress.topic": f"{sink}-progress", "kafka.queue.buffering.max.messages": "7",
        "kafka.linger.ms": "50"})
    spec.prepare()
    w = PositionWriter(spec, commit_interval_s=60)
    for off in range(50):
        w.add(SRC, off, {"value": str(off)})
    w.close()
    assert values(kafka_broker, topic) == list(range(50))
    assert spec.stored_positions() == {SRC: 49}


class Counted:
    """A real target, counting the transactions it was asked to write."""

    def __init__(self, spec: KafkaRealtimeSpec, writes: list[str], name: str) -> None:
        self.spec, self.writes, self.name = spec, writes, name

    def __call__(self, source: SourcePartition) -> object:
        target = self.spec(source)
        write = target.write

        def counted(rows: object) -> None:
            self.writes.append(self.name)
            write(rows)  # type: ignore[arg-type]

        target.write = counted  # type: ignore[method-assign]
        return target


def test_a_kept_producer_that_lost_its_partition_claims_again_before_it_writes(
        kafka_broker: Broker, topic: str) -> None:
    """Spark gives the next batch's task of a source partition to whichever Python worker
    is free: a kept producer of the other worker has been fenced meanwhile. It must learn
    it when the task takes it (its marker committed again, alone: the broker refuses a
    fenced producer) and be claimed again then, before a row is handed to it (at its
    first commit, it cost a commit interval and a failed commit); nothing is written
    twice."""
    if kt.tansu_selected():
        pytest.skip(kt.TANSU_CANNOT)
    from txsink.realtime import SessionPool

    spec = make_spec(kafka_broker, topic)
    mine, theirs = SessionPool(), SessionPool()
    writes: list[str] = []
    try:
        w = PositionWriter(Counted(spec, writes, "first"), commit_interval_s=60, run="r",
                           pool=mine)
        for off in range(3):
            w.add(SRC, off, {"value": str(off)})
        w.close()
        # Kept and still the newest claim: taken again without a claim.
        held = PositionWriter(Counted(spec, writes, "unused"), commit_interval_s=60,
                              run="r", pool=mine)
        held.add(SRC, 3, {"value": "3"})
        held.close()
        other = PositionWriter(Counted(spec, writes, "other"), commit_interval_s=60,
                               run="r", pool=theirs)
        for off in range(4, 6):
            other.add(SRC, off, {"value": str(off)})
        other.close()
        again = PositionWriter(Counted(spec, writes, "again"), commit_interval_s=60,
                               run="r", pool=mine)
        for off in range(4, 8):
            again.add(SRC, off, {"value": str(off)})
        again.close()
        assert values(kafka_broker, topic) == list(range(8))
        assert again.stats.skipped == 2 and spec.stored_positions() == {SRC: 7}
        # One transaction per writer: the kept one (first's producer) wrote offset 3,
        # and the stale one was claimed again before a row was handed to it.
        assert writes == ["first", "first", "other", "again"], writes
        assert again.stats.commits == 1
    finally:
        mine.clear()
        theirs.clear()
