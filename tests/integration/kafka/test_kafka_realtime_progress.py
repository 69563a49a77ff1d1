"""What operators and other writers do to a real-time Kafka target's progress topic, on
a real broker (no Spark: the position writer driven directly, as a task drives it).

Each case once lost or duplicated records: a tombstone crashed every claim and ``txsink
status`` (``KeyError: 'offset'``); ``cleanup.policy=compact,delete`` was accepted, so
positions could expire; partitions added to the topic moved every marker (the claim
found none and the replay wrote everything again); a claim read only to the last
stable offset, so markers committed after another sink's open transaction were missed;
a position of a recreated source topic, or of another output topic under the same sink
id, was used to skip records.
"""

from __future__ import annotations

import json
import pickle
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
)
from conftest import Broker
from txsink.errors import ConfigError, FencedError, TxsinkError
from txsink.realtime import PositionWriter, SourcePartition
from txsink_kafka import realtime as rt
from txsink_kafka import testing as kt
from txsink_kafka.backend import KafkaBackend

pytestmark = [pytest.mark.integration]

SRC = SourcePartition("orders", 0)
T = TypeVar("T")


@pytest.fixture(autouse=True)
def _apache_kafka() -> None:
    if kt.tansu_selected():
        pytest.skip(kt.TANSU_CANNOT)


def make_spec(broker: Broker, topic: str, progress: str, sink: str | None = None
              ) -> rt.KafkaRealtimeSpec:
    spec = KafkaBackend.realtime_target(sink or f"rt-{uuid.uuid4().hex[:8]}", {
        "topic": topic, "kafka.bootstrap.servers": broker.bootstrap, "progress.topic": progress})
    assert isinstance(spec, rt.KafkaRealtimeSpec)
    spec.prepare()
    return spec


def write(spec: rt.KafkaRealtimeSpec, offsets: range, source: SourcePartition = SRC
          ) -> PositionWriter:
    w = PositionWriter(spec, commit_interval_s=0.0)
    for off in offsets:
        w.add(source, off, {"value": str(off)})
    w.close()
    return w


def values(broker: Broker, topic: str) -> list[int]:
    return sorted(int(m.value()) for m in kt.read_topic(broker.bootstrap, topic))


def progress(tag: str = "p") -> str:
    return f"{tag}-{uuid.uuid4().hex[:8]}"


def once_it_works(call: Callable[[], T], seconds: float = 60.0) -> T:
    """``call()``, tried again until it stops raising: a topic just deleted cannot be
    created again at once (the broker is still removing it)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return call()
        except Exception:
            assert time.monotonic() < deadline
            time.sleep(0.5)


@pytest.mark.promise("realtime-deleted-position-is-no-position", "realtime")
def test_a_tombstone_means_no_position_in_claims_and_status(
        kafka_broker: Broker, topic: str) -> None:
    """A tombstone for a marker's key (what an operator deleting a position writes) is
    "no position": ``stored_positions`` (``txsink status``) answers without it, and the
    next claim starts from nothing instead of raising ``KeyError: 'offset'``."""
    spec = make_spec(kafka_broker, topic, progress())
    write(spec, range(10))
    assert spec.stored_positions() == {SRC: 9}
    p = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    p.produce(spec.progress_topic, None, rt.progress_key(spec.sink_id, SRC), partition=0)
    assert p.flush(30) == 0
    assert spec.stored_positions() == {}
    again = write(spec, range(10, 15))  # the claim reads "no position"
    assert again.stats.written == 5 and again.stats.skipped == 0
    assert spec.stored_positions() == {SRC: 14}
    assert values(kafka_broker, topic) == list(range(15))


def test_a_record_without_an_offset_is_no_position_not_offset_zero(
        kafka_broker: Broker, topic: str) -> None:
    spec = make_spec(kafka_broker, topic, progress())
    p = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    p.produce(spec.progress_topic, b"{}", rt.progress_key(spec.sink_id, SRC), partition=0)
    assert p.flush(30) == 0
    assert spec.stored_positions() == {}
    write(spec, range(3))
    assert values(kafka_broker, topic) == [0, 1, 2]


@pytest.mark.promise("realtime-progress-topic-compacted", "realtime")
@pytest.mark.parametrize("policy", ["compact,delete", "delete", "delete,compact"])
def test_a_progress_topic_with_retention_is_refused_naming_the_fix_which_works(
        kafka_broker: Broker, topic: str, policy: str) -> None:
    """``compact,delete`` with a retention deletes stored positions (a replay then writes
    everything again): only ``compact`` is accepted. The refusal names the topic and the
    command; making the topic compacted only (what that command does) is accepted."""
    name = progress()
    kt.create_topic(kafka_broker.bootstrap, name, compacted=True)
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})

    def set_policy(value: str, **extra: str) -> None:
        entries = [ConfigEntry("cleanup.policy", value,
                               incremental_operation=AlterConfigOpType.SET)]
        entries += [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                    for k, v in extra.items()]
        for f in admin.incremental_alter_configs(
                [ConfigResource("topic", name, incremental_configs=entries)]).values():
            f.result(30)

    set_policy(policy, **{"retention.ms": "60000"})
    with pytest.raises(ConfigError) as info:
        make_spec(kafka_broker, topic, name)
    text = str(info.value)
    assert info.value.field == "progress.topic" and f"cleanup.policy={policy}" in text
    assert (f"kafka-configs.sh --bootstrap-server {kafka_broker.bootstrap.split(',')[0]} "
            f"--alter --entity-type topics --entity-name {name} --add-config "
            "cleanup.policy=compact") in text
    set_policy("compact")  # the command's effect
    make_spec(kafka_broker, topic, name)


@pytest.mark.promise("realtime-progress-markers-in-partition-0", "realtime")
def test_partitions_added_to_the_progress_topic_do_not_move_the_markers(
        kafka_broker: Broker, topic: str) -> None:
    name = progress()
    kt.create_topic(kafka_broker.bootstrap, name, partitions=1, compacted=True)
    spec = make_spec(kafka_broker, topic, name)
    write(spec, range(10))
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    admin.create_partitions([NewPartitions(name, 8)])[name].result(30)
    deadline = time.monotonic() + 30
    while len(admin.list_topics(name, timeout=10).topics[name].partitions) < 8:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    replay = write(make_spec(kafka_broker, topic, name, spec.sink_id), range(12))
    assert replay.stats.skipped == 10 and replay.stats.written == 2
    assert values(kafka_broker, topic) == list(range(12))
    assert spec.stored_positions() == {SRC: 11}


@pytest.mark.promise("realtime-progress-markers-in-partition-0", "realtime")
def test_a_marker_an_older_release_placed_by_key_hash_is_found_and_moved(
        kafka_broker: Broker, topic: str) -> None:
    """Markers of releases before partition pinning live where the key hashed to (and
    hold only the offset): still read, and the next commit moves the marker to
    partition 0 and leaves a tombstone where it was, in one transaction."""
    name = progress()
    kt.create_topic(kafka_broker.bootstrap, name, partitions=4, compacted=True)
    sink, old = "", 0
    while old == 0:  # a sink id whose key an older release hashed to another partition
        sink = f"rt-{uuid.uuid4().hex[:8]}"
        old = rt.legacy_partition(rt.progress_key(sink, SRC), 4)
    key = rt.progress_key(sink, SRC)
    p = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    p.produce(name, json.dumps({"offset": 6}).encode(), key, partition=old)
    assert p.flush(30) == 0
    spec = make_spec(kafka_broker, topic, name, sink)
    assert spec.stored_positions() == {SRC: 6}
    w = write(spec, range(10))
    assert w.stats.skipped == 7 and values(kafka_broker, topic) == [7, 8, 9]
    placed = rt.ProgressReader(spec).read_placed([key])
    assert placed[key][0] == 0 and placed[key][1] is not None and placed[key][1].offset == 9
    assert rt.ProgressReader(spec).locations([key]) == {key: {0, old}}  # a tombstone at old


def test_two_live_legacy_markers_of_one_key_are_refused_not_guessed(
        kafka_broker: Broker, topic: str) -> None:
    name = progress()
    kt.create_topic(kafka_broker.bootstrap, name, partitions=3, compacted=True)
    sink = f"rt-{uuid.uuid4().hex[:8]}"
    key = rt.progress_key(sink, SRC)
    p = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    p.produce(name, json.dumps({"offset": 6}).encode(), key, partition=1)
    p.produce(name, json.dumps({"offset": 9}).encode(), key, partition=2)
    assert p.flush(30) == 0
    spec = make_spec(kafka_broker, topic, name, sink)
    with pytest.raises(TxsinkError, match="partitions were added to it"):
        spec.stored_positions()
    assert values(kafka_broker, topic) == []


def open_other_transaction(broker: Broker, spec: rt.KafkaRealtimeSpec) -> Producer:
    """Another pipeline's transaction, open on the shared progress topic."""
    other = Producer({"bootstrap.servers": broker.bootstrap,
                      "transactional.id": f"other-{uuid.uuid4().hex}"})
    other.init_transactions(30)
    other.begin_transaction()
    other.produce(spec.progress_topic, b'{"offset": 1}', b'["other","t",0]', partition=0)
    assert other.flush(30) == 0
    return other


def write_around(spec: rt.KafkaRealtimeSpec, broker: Broker) -> Producer:
    """Offsets 0-4 committed, another transaction opened, 5-9 committed after it (the
    session claimed before it opened, as a running task's has)."""
    w = PositionWriter(spec, commit_interval_s=0.0)
    for off in range(5):
        w.add(SRC, off, {"value": str(off)})
    other = open_other_transaction(broker, spec)
    for off in range(5, 10):
        w.add(SRC, off, {"value": str(off)})
    w.close()
    return other


@pytest.mark.promise("realtime-claim-reads-to-log-end", "realtime")
def test_a_claim_reads_markers_committed_behind_another_writers_open_transaction(
        kafka_broker: Broker, topic: str) -> None:
    """Another pipeline's transaction open on the shared progress topic pins its last
    stable offset; markers this sink committed after it must still be read (else a
    restart takes an old position and writes the records after it again)."""
    spec = make_spec(kafka_broker, topic, progress())
    other = write_around(spec, kafka_broker)
    ends = threading.Timer(2.0, lambda: other.abort_transaction(30))
    ends.start()
    try:
        started = time.monotonic()
        assert spec.stored_positions() == {SRC: 9}  # waited for it to end, then read on
        assert time.monotonic() - started >= 1.0
    finally:
        ends.join()
    replay = write(spec, range(12))
    assert replay.stats.skipped == 10
    assert values(kafka_broker, topic) == list(range(12))


@pytest.mark.promise("realtime-claim-reads-to-log-end", "realtime")
def test_a_transaction_that_stays_open_is_a_loud_error_naming_the_way_out(
        kafka_broker: Broker, topic: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = make_spec(kafka_broker, topic, progress())
    other = write_around(spec, kafka_broker)
    monkeypatch.setattr(rt, "READ_TIMEOUT_S", 2.0)
    try:
        with pytest.raises(TxsinkError, match="find-hanging") as info:
            spec.stored_positions()
        assert "hides the markers after it" in str(info.value)
    finally:
        other.abort_transaction(30)


@pytest.mark.promise("realtime-reset-fences-and-deletes-positions", "cli")
def test_a_zombie_writer_is_fenced_by_the_claim_after_its_positions_were_deleted(
        kafka_broker: Broker, topic: str) -> None:
    """Start over while a task of the dead driver still writes: ``delete_positions``
    (``txsink reset``) fences it, and it adds nothing to the new run's output."""
    spec = make_spec(kafka_broker, topic, progress())
    zombie = PositionWriter(spec, commit_interval_s=0.0)
    for off in range(5):
        zombie.add(SRC, off, {"value": str(off)})
    assert spec.delete_positions() == [
        f"{SRC}: offset 4 (tombstone in {spec.progress_topic})"]
    assert spec.stored_positions() == {}
    # The next run: a new driver prepares the target again (its own generation).
    fresh = write(make_spec(kafka_broker, topic, spec.progress_topic, spec.sink_id),
                  range(100, 103))
    assert fresh.stats.written == 3
    with pytest.raises(FencedError):
        zombie.add(SRC, 5, {"value": "5"})
    zombie.close(RuntimeError("task killed"))
    assert values(kafka_broker, topic) == [*range(5), 100, 101, 102]
    assert spec.stored_positions() == {SRC: 102}


@pytest.mark.promise("realtime-reset-fences-old-run", "realtime")
def test_a_task_of_the_old_run_claiming_after_a_reset_is_refused_and_writes_nothing(
        kafka_broker: Broker, topic: str) -> None:
    """docs/realtime.md's start-over while a task of the dead driver that had not claimed
    its source partition yet still runs (it holds no producer a reset could fence): once
    it claimed after the reset, fencing the new run, and committed its old batch's
    position over the new run's, which then skipped its records below it. Now its run
    (the progress partition's end when its driver prepared the target) is not past the
    reset record: the claim is refused before its init_transactions, fences nothing and
    writes nothing."""
    name = progress()
    old = make_spec(kafka_broker, topic, name)
    first = PositionWriter(old, commit_interval_s=0.0)
    for off in range(2):
        first.add(SRC, off, {"value": str(100 + off)})
    # The old run's task of the next batch, shipped to its executor, not claimed yet.
    zombie = PositionWriter(pickle.loads(pickle.dumps(old)), commit_interval_s=0.0)
    assert old.delete_positions() == [f"{SRC}: offset 1 (tombstone in {name})"]
    first.close(RuntimeError("driver killed"))
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    admin.delete_topics([topic])[topic].result(30)
    # The target emptied: the output topic deleted and created again.
    once_it_works(lambda: kt.create_topic(kafka_broker.bootstrap, topic))
    new = make_spec(kafka_broker, topic, name, old.sink_id)
    assert old.run is not None and new.run is not None and new.run > old.run
    fresh = PositionWriter(new, commit_interval_s=0.0)
    fresh.add(SRC, 0, {"value": "0"})
    with pytest.raises(FencedError, match=r"started before the sink's positions were "
                                          r"deleted \(txsink reset"):
        zombie.add(SRC, 2, {"value": "102"})
    zombie.close(RuntimeError("task failed"))
    for off in range(1, 4):  # the new run's producer was not fenced by the refused claim
        fresh.add(SRC, off, {"value": str(off)})
    fresh.close()
    assert values(kafka_broker, topic) == list(range(4))
    # The reset record is no position: status and the checks before a start skip it.
    assert new.stored_positions() == {SRC: 3}
    # Every source partition: a task of the old run on another one is refused too.
    late = PositionWriter(pickle.loads(pickle.dumps(old)), commit_interval_s=0.0)
    with pytest.raises(FencedError, match="this task belongs to a run"):
        late.add(SourcePartition("orders", 1), 0, {"value": "200"})
    late.close(RuntimeError("task failed"))
    assert values(kafka_broker, topic) == list(range(4))
    assert new.stored_positions() == {SRC: 3}


@pytest.mark.promise("realtime-deleted-position-is-no-position", "realtime")
def test_a_tombstone_by_hand_fences_nothing_as_the_docs_say(
        kafka_broker: Broker, topic: str) -> None:
    """docs/realtime.md: a Kafka tombstone written by hand does not fence the task that
    still holds the source partition; its next commit writes the marker again (so the
    docs send operators to ``txsink reset``, which fences first)."""
    spec = make_spec(kafka_broker, topic, progress())
    zombie = PositionWriter(spec, commit_interval_s=0.0)
    for off in range(3):
        zombie.add(SRC, off, {"value": str(off)})
    p = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    p.produce(spec.progress_topic, None, rt.progress_key(spec.sink_id, SRC), partition=0)
    assert p.flush(30) == 0
    assert spec.stored_positions() == {}
    zombie.add(SRC, 3, {"value": "3"})
    zombie.close()
    assert spec.stored_positions() == {SRC: 3}


@pytest.mark.promise("realtime-recreated-source-topic-refused", "realtime")
def test_a_position_of_a_recreated_source_topic_is_refused_at_the_claim(
        kafka_broker: Broker, topic: str) -> None:
    spec = make_spec(kafka_broker, topic, progress())
    write(spec, range(10), SourcePartition("orders", 0, "id-before"))
    assert spec.stored()[SRC].topic_id == "id-before"
    w = PositionWriter(spec, commit_interval_s=0.0)
    with pytest.raises(ConfigError) as info:
        w.add(SourcePartition("orders", 0, "id-after"), 0, {"value": "0"})
    w.close(info.value)
    text = str(info.value)
    assert "source topic 'orders' is not the topic whose offsets sink" in text
    assert "txsink reset PIPELINE_FILE --source-topic orders" in text and "\n" not in text
    assert values(kafka_broker, topic) == list(range(10))
    # A writer that knows no id (a topic found after the start) keeps the recorded one.
    write(spec, range(10, 12))
    assert spec.stored()[SRC].topic_id == "id-before"


@pytest.mark.promise("realtime-sink-id-reused-refused", "realtime")
def test_a_sink_id_reused_for_another_topic_is_refused_at_the_claim(
        kafka_broker: Broker, topic: str) -> None:
    name = progress()
    spec = make_spec(kafka_broker, topic, name)
    write(spec, range(10))
    other = f"{topic}-b"
    kt.create_topic(kafka_broker.bootstrap, other)
    moved = make_spec(kafka_broker, other, name, spec.sink_id)
    w = PositionWriter(moved, commit_interval_s=0.0)
    with pytest.raises(ConfigError) as info:
        w.add(SRC, 0, {"value": "0"})
    w.close(info.value)
    assert info.value.field == "sink.options.topic"
    assert (f"sink {spec.sink_id!r} moved: its stored positions recorded topic {topic!r}, "
            f"this run has {other!r}") in str(info.value)
    assert values(kafka_broker, other) == []


@pytest.mark.promise("realtime-reset-fences-and-deletes-positions", "cli")
def test_the_start_over_runbook_with_txsink_reset_lands_every_record_once(
        kafka_broker: Broker, topic: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """docs/realtime.md, "To start over", step by step on a Kafka target (the run is the
    writer a task drives): stop the query; ``txsink reset FILE``; empty the target
    (delete and recreate the output topic); run again from the earliest offsets. Before,
    the documented way (a tombstone by hand) crashed every claim."""
    from txsink.cli import main

    name = progress()
    spec = make_spec(kafka_broker, topic, name)
    write(spec, range(10))
    checkpoint = tmp_path / "chk"
    (checkpoint / "offsets").mkdir(parents=True)
    file = tmp_path / "rt.json"
    file.write_text(json.dumps({
        "source": {"type": "spark", "format": "kafka", "options": {
            "kafka.bootstrap.servers": kafka_broker.bootstrap, "subscribe": SRC.topic}},
        "sink": {"backend": "kafka", "sink_id": spec.sink_id, "options": {
            "topic": topic, "kafka.bootstrap.servers": kafka_broker.bootstrap,
            "progress.topic": name}},
        "checkpoint": str(checkpoint), "trigger": {"real_time": "5 seconds"}}))
    assert main(["reset", str(file), "--yes"]) == 0
    out = capsys.readouterr().out
    assert (f"target (kafka topic {topic}): the stored positions of sink id {spec.sink_id}: "
            f"{SRC} offset 9") in out
    assert "The rows the targets hold stay" in out and "empty the tables and topics now" in out
    assert f"deleted {SRC}: offset 9 (tombstone in {name})" in out
    assert f"deleted checkpoint {checkpoint}" in out and not checkpoint.exists()
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + 60
    while True:  # then empty the target: the topic deleted and created again
        try:
            kt.create_topic(kafka_broker.bootstrap, topic, partitions=2)
            break
        except Exception:
            assert time.monotonic() < deadline
            time.sleep(0.5)
    assert main(["status", str(file)]) == 0
    assert "no position stored yet" in capsys.readouterr().out
    # the next run (a driver that prepares the target again), from the earliest offsets
    again = write(make_spec(kafka_broker, topic, name, spec.sink_id), range(10))
    assert again.stats.written == 10 and again.stats.skipped == 0
    assert values(kafka_broker, topic) == list(range(10))
    assert main(["status", str(file)]) == 0
    assert f"{SRC}: offset 9" in capsys.readouterr().out


def test_a_target_feeds_a_source_of_its_cluster_under_other_broker_names(
        kafka_broker: Broker, topic: str) -> None:
    """Bootstrap lists that share no broker name may still reach one cluster: the
    feedback check then compares cluster ids (the source's, as Spark's client reads it)."""
    from tests.unit.test_realtime_group import Reads

    spec = make_spec(kafka_broker, topic, progress())
    cluster = spec.cluster_id()
    assert cluster
    assert spec.feeds(Reads("broker-b.example:9092", subscribe=[topic], cluster=cluster))
    assert not spec.feeds(Reads("broker-b.example:9092", subscribe=[topic],
                                cluster="another-cluster"))
    assert not spec.feeds(Reads("broker-b.example:9092", subscribe=[topic]))  # unknown


def test_a_progress_topic_deleted_and_recreated_is_no_position_for_a_warm_reader(
        kafka_broker: Broker, topic: str) -> None:
    """The progress topic deleted and created again (a start over by hand) while a
    worker process's warm reader of it lives (Python workers outlive a query stopped
    and started again in one Spark application): the new topic holds no position, so
    a claim must find none, as ``txsink status`` and the checks before a start do,
    not the position the reader remembered from the old topic (its records were then
    skipped)."""
    name = progress()
    spec = make_spec(kafka_broker, topic, name)
    write(spec, range(5))
    assert write(spec, range(5)).stats.skipped == 5  # a replay: its claim read offset 4
    assert spec.stored()[SRC].offset == 4
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    for future in admin.delete_topics([name]).values():
        future.result(30)
    deadline = time.monotonic() + 60
    while name in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
        time.sleep(0.2)
    again = make_spec(kafka_broker, topic, name, sink=spec.sink_id)  # creates it anew
    assert again.stored() == {}
    w = write(again, range(5))
    assert (w.stats.written, w.stats.skipped) == (5, 0)
    assert again.stored()[SRC].offset == 4


@pytest.mark.promise("realtime-reset-fences-old-run", "realtime")
def test_a_task_of_a_run_before_the_progress_topic_was_recreated_is_refused_after_a_reset(
        kafka_broker: Broker, topic: str) -> None:
    """The start-over by hand and by the runbook together: the progress topic deleted
    (every position gone), then ``txsink reset``, while a task of the dead driver that
    had not claimed yet still runs. The reset must fence it as docs/realtime.md says."""
    name = progress()
    old = make_spec(kafka_broker, topic, name)
    first = PositionWriter(old, commit_interval_s=0.0)
    for off in range(20):  # the old run's markers: its progress log grows
        first.add(SRC, off, {"value": str(100 + off)})
    first.close(RuntimeError("driver killed"))
    # A later run of the old pipeline, prepared at the log's end, its task not claimed.
    old = make_spec(kafka_broker, topic, name, old.sink_id)
    zombie = PositionWriter(pickle.loads(pickle.dumps(old)), commit_interval_s=0.0)
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    for t in (name, topic):  # positions and output gone: the topics deleted
        admin.delete_topics([t])[t].result(30)
    once_it_works(lambda: kt.create_topic(kafka_broker.bootstrap, topic))
    # The progress topic made again by the next driver's prepare.
    new = once_it_works(lambda: make_spec(kafka_broker, topic, name, old.sink_id))
    new.delete_positions()  # txsink reset, as the runbook says
    new = make_spec(kafka_broker, topic, name, old.sink_id)
    fresh = PositionWriter(new, commit_interval_s=0.0)
    fresh.add(SRC, 0, {"value": "0"})
    with pytest.raises(FencedError, match="before it was deleted and created again"):
        zombie.add(SRC, 20, {"value": "120"})
    zombie.close(RuntimeError("task failed"))
    for off in range(1, 4):
        fresh.add(SRC, off, {"value": str(off)})
    fresh.close()
    assert values(kafka_broker, topic) == list(range(4))
    assert new.stored_positions() == {SRC: 3}
