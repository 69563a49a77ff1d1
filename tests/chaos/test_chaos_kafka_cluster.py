"""Kafka as production runs it: a three-node KRaft cluster, failing over under commits.

One :class:`~txsink_kafka.local_cluster.LocalKafkaCluster` for the module (started
once): the replication of every topic txsink uses, a driver-side regression found by
the failover chaos, then the chaos short mode (one fault of each failover kind; the
long mode, 200 faults, is ``tox -e kafka-cluster-long``, which prints the table).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from txsink.coordinator import Coordinator
from txsink.model import TransactionContext
from txsink.plugins import get_plugins
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant
from txsink_kafka import testing as kt
from txsink_kafka.backend import KafkaBackend, close_shared_clients
from txsink_kafka.local_cluster import (
    MIN_INSYNC_REPLICAS,
    REPLICATION_FACTOR,
    LocalKafkaCluster,
)

from tests.chaos.failover import KINDS
from tests.chaos.runner import run_backend, table
from tests.long_runs import chaos_run

pytestmark = [pytest.mark.integration, pytest.mark.fault, pytest.mark.slow, chaos_run]

SEED = int(os.environ.get("TXSINK_CHAOS_SEED", "2026"))
#: One fault of each kind (the planner deals kinds from a shuffled deck).
FAULTS = int(os.environ.get("TXSINK_CHAOS_CLUSTER_FAULTS", str(len(KINDS))))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafkaCluster]:
    if os.environ.get(kt.ENV_BOOTSTRAP):
        pytest.skip(f"{kt.ENV_BOOTSTRAP} names an external cluster; these tests kill nodes "
                    "of a local one")
    if kt.tansu_selected():
        pytest.skip(f"{kt.ENV_BROKER}=tansu: failover needs replicated Apache Kafka "
                    f"({kt.TANSU_CANNOT})")
    started = time.monotonic()
    with LocalKafkaCluster(tmp_path_factory.mktemp("kafka-cluster")) as running:
        print(f"\n{running.describe()}: started in {time.monotonic() - started:.1f}s")
        try:
            yield running
        finally:
            close_shared_clients()


def _sink(cluster: LocalKafkaCluster, **extra: str) -> tuple[KafkaBackend, dict[str, str]]:
    run = uuid.uuid4().hex[:8]
    topic = f"out-{run}"
    kt.create_topic(cluster.bootstrap, topic, partitions=3)
    options = {"kafka.bootstrap.servers": cluster.bootstrap, "topic": topic,
               "marker.topic": f"markers-{run}", **extra}
    backend = get_plugins().create_backend("kafka", options)
    assert isinstance(backend, KafkaBackend)
    return backend, options


def test_every_topic_txsink_uses_has_three_replicas_and_min_isr_two(
        cluster: LocalKafkaCluster) -> None:
    backend, options = _sink(cluster)
    try:
        backend.preflight("replicated")  # creates the marker and claim topics
    finally:
        backend.close()
    # A consumer group's first commit creates __consumer_offsets (the Kafka source
    # commits its progress there).
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "replicated",
                         "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(options["topic"], 0, 0)], asynchronous=False)
    finally:
        consumer.close()
    for topic in (options["topic"], options["marker.topic"], "txsink-claims",
                  "__transaction_state", "__consumer_offsets"):
        assert cluster.topic_replication(topic) == (REPLICATION_FACTOR, MIN_INSYNC_REPLICAS), \
            topic


def test_preflight_warns_when_txsinks_topics_are_less_replicated_than_the_output(
        cluster: LocalKafkaCluster, caplog: pytest.LogCaptureFixture) -> None:
    run = uuid.uuid4().hex[:8]
    # marker.replication.factor=1: txsink creates its topics with one replica.
    backend, options = _sink(cluster, **{"marker.replication.factor": "1",
                                         "claim.topic": f"claims-{run}"})
    with caplog.at_level("WARNING", logger="txsink_kafka"):
        try:
            backend.preflight("under-replicated")
        finally:
            backend.close()
    warned = [r.getMessage() for r in caplog.records if "replica" in r.getMessage()]
    assert len(warned) == 2, warned
    for topic, field in ((options["marker.topic"], "marker.topic"),
                         (f"claims-{run}", "claim.topic")):
        assert cluster.topic_replication(topic)[0] == 1
        assert any(f"topic {topic} (option '{field}') has 1 replica(s)" in w
                   and "output topic" in w for w in warned), warned
    # The remedy: topics created as replicated as the output (here: by txsink with the
    # cluster's defaults, or by hand with the same settings) are not warned about.
    caplog.clear()
    backend, options = _sink(cluster)
    kt.create_topic(cluster.bootstrap, options["marker.topic"], compacted=True)
    with caplog.at_level("WARNING", logger="txsink_kafka"):
        try:
            backend.preflight("replicated-by-hand")
        finally:
            backend.close()
    assert not [r for r in caplog.records if "replica" in r.getMessage()]


def test_driver_reads_ride_out_the_marker_leader_dying(
        cluster: LocalKafkaCluster, tmp_path: Path) -> None:
    """Regression: librdkafka never refreshed the metadata of a partition its (never
    assigned) offsets consumer asked about, so after the marker partition's leader died
    every commit check and orphan scan of the driver failed ("Local: Timed out", then
    "Unknown partition") for minutes, also once the node was back."""
    backend, options = _sink(cluster, **{"request.timeout.s": "20"})
    sink = f"leader-{uuid.uuid4().hex[:6]}"
    backend.preflight(sink)
    coordinator = Coordinator(backend, DirectoryStateStore(tmp_path / "state"), sink,
                              backend_options=options)
    coordinator.start()
    rows = pa.record_batch({"value": pa.array([b"%d" % i for i in range(10)])})
    committable = write_participant(backend, TransactionContext(sink, 0, 0, 0), [rows])
    coordinator.commit_epoch(0, [committable])
    # The driver's clients know the marker partition's leader now.
    assert backend.is_committed(committable)
    leader = cluster.leader_of(options["marker.topic"], 0)
    cluster.kill(leader)
    try:
        started = time.monotonic()
        assert backend.is_committed(committable)
        assert backend.holds_epoch(sink, 0)
        assert backend.list_prepared(sink) == []
        assert time.monotonic() - started < 60
    finally:
        backend.close()
        cluster.start_node(leader)
        cluster.wait_in_sync()
    assert sorted(int(m.value()) for m in kt.read_topic(cluster.bootstrap,
                                                        options["topic"])) == list(range(10))


def test_failover_chaos_short_mode(cluster: LocalKafkaCluster,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Every failover kind at least once on the live cluster: nothing lost, nothing
    duplicated, nothing left open (``tox -e kafka-cluster-long`` runs 200 faults)."""
    cluster.wait_in_sync()
    report = run_backend("kafka-cluster", faults=FAULTS, seed=SEED, cluster=cluster)
    with capsys.disabled():
        print(f"\n{table([report], KINDS)}")
    assert report.skipped is None
    assert report.failures == []
    assert sum(report.faults.values()) >= FAULTS
    if len(KINDS) <= FAULTS:
        assert all(report.faults[kind] >= 1 for kind in KINDS), report.faults
    assert (report.lost, report.duplicated, report.leftovers) == (0, 0, 0), (
        f"reproduce with: python -m tests.chaos --backends kafka-cluster --seed {SEED} "
        f"--faults {FAULTS}")
    assert report.records > 0
    assert not any("without being fenced" in n for n in report.notes), report.notes
