"""The Kafka source reports progress to a consumer group for lag monitors.

On a real Apache Kafka: with ``kafka.group.id`` the group's committed offsets follow
Spark's commit log batch by batch, are never ahead of it (not even when the driver
is SIGKILLed after txsink decided an epoch Spark had not yet logged), and reach the
end of the topic once the restarted query caught up. Recovery reads Spark's
checkpoint, not these offsets.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from txsink_kafka import testing as kt

from tests.e2e.spark_harness import DriverSpec, read_files_output, run_driver
from tests.long_runs import long_run

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.integration, pytest.mark.fault]

Offsets = dict[int, int]


@pytest.fixture(scope="module")
def bootstrap() -> Iterator[str]:
    with kt.broker_for_tests() as (address, _):
        yield address


class GroupReader:
    """Reads a consumer group's committed offsets (OffsetFetch) without joining it.

    (Not the Admin API's ``list_consumer_group_offsets``: confluent-kafka 2.16.1
    crashes the process when asked about a group that has no offsets yet.)
    """

    def __init__(self, bootstrap: str, group: str, topic: str, partitions: int) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                  "enable.auto.commit": False})
        self.wanted = [TopicPartition(topic, p) for p in range(partitions)]
        self.lock = threading.Lock()

    def offsets(self) -> Offsets:
        with self.lock:
            got = self.consumer.committed(self.wanted, timeout=30)
        return {tp.partition: tp.offset for tp in got if tp.offset >= 0}

    def close(self) -> None:
        self.consumer.close()


def spark_committed(checkpoint: Path, topic: str) -> Offsets:
    """End offsets of the last batch in Spark's commit log (empty before the first)."""
    commits = [int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")]
    if not commits:
        return {}
    lines = (checkpoint / "offsets" / str(max(commits))).read_text().splitlines()
    source = json.loads(lines[2])  # v1, batch metadata, then one line per source
    return {int(p): o for p, o in source[topic].items()}


def ahead(reported: Offsets, committed: Offsets) -> dict[int, tuple[int, int]]:
    return {p: (o, committed.get(p, -1)) for p, o in reported.items()
            if o > committed.get(p, -1)}


class Watcher(threading.Thread):
    """Polls the group's offsets while a driver runs; records any that run ahead."""

    def __init__(self, group: GroupReader, topic: str, checkpoint: Path) -> None:
        super().__init__(daemon=True)
        self.group = group
        self.topic = topic
        self.checkpoint = checkpoint
        self.done = threading.Event()
        self.violations: list[Any] = []
        self.seen: set[tuple[tuple[int, int], ...]] = set()

    def run(self) -> None:
        while not self.done.wait(0.2):
            try:
                # Group first, then the commit log: a batch committing in between can
                # only make the log newer, so "reported <= logged" must hold.
                reported = self.group.offsets()
                committed = spark_committed(self.checkpoint, self.topic)
            except Exception:  # the checkpoint is being written; try again
                continue
            if ahead(reported, committed):
                self.violations.append((reported, committed))
            self.seen.add(tuple(sorted(reported.items())))


@pytest.mark.promise("kafka-source-offsets-never-ahead", "backend")
@long_run
def test_group_offsets_follow_spark_commits_across_a_driver_crash(
        bootstrap: str, tmp_path: Path) -> None:
    topic = f"lag-{uuid.uuid4().hex[:6]}"
    group = f"pipeline-{uuid.uuid4().hex[:6]}"
    kt.create_topic(bootstrap, topic, partitions=2)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(400):
        producer.produce(topic, json.dumps({"id": i}).encode(), partition=i % 2)
    producer.flush(30)
    checkpoint, out = tmp_path / "chk", tmp_path / "out"
    spec = DriverSpec(
        input_dir=tmp_path, checkpoint=checkpoint, sink_id="lag", options={
            "path": str(out), "format": "jsonl"},
        select=["CAST(get_json_object(CAST(value AS STRING), '$.id') AS LONG) AS id"],
        source={"format": "txsink-kafka", "register": "txsink_kafka.source:register_source",
                "options": {"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
                            "startingOffsets": "earliest", "maxOffsetsPerTrigger": "100",
                            "kafka.group.id": group}})

    reader = GroupReader(bootstrap, group, topic, 2)
    watcher = Watcher(reader, topic, checkpoint)
    watcher.start()
    try:
        run_driver(spec, faults="after-decide@2:kill").check_killed("after-decide@2")
        # Batch 2 was decided by txsink but is not in Spark's commit log: the group
        # holds exactly the end of batch 1, the last batch Spark committed.
        committed = spark_committed(checkpoint, topic)
        assert sum(committed.values()) == 200
        assert reader.offsets() == committed
        run_driver(spec).check()
    finally:
        watcher.done.set()
        watcher.join(10)
        final_reported = reader.offsets()
        reader.close()
    assert watcher.violations == [], "group offsets ran ahead of Spark's commit log"
    final = spark_committed(checkpoint, topic)
    assert final == {0: 200, 1: 200}
    assert final_reported == final
    # The reports moved batch by batch (the watcher saw intermediate positions).
    assert len(watcher.seen) >= 3, watcher.seen
    ids = sorted(r["id"] for r in read_files_output(out))
    assert ids == list(range(400))
