"""A sink id belongs to one query: the claim holds against age, traffic and races."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import Broker
from txsink.coordinator import Coordinator
from txsink.errors import ConfigError, SinkOwnedError
from txsink.group import TargetGroup
from txsink.model import TransactionContext
from txsink.plugins import build_plugins, get_plugins
from txsink.state import DirectoryStateStore
from txsink.targets import parse_targets
from txsink.writer import write_participant
from txsink_kafka.backend import KafkaBackend, close_shared_clients

pytestmark = pytest.mark.integration


def make(options: dict[str, str], **extra: str) -> KafkaBackend:
    b = get_plugins().create_backend("kafka", {**options, **extra})
    assert isinstance(b, KafkaBackend)
    return b


def start(backend: KafkaBackend, state: Path, sink_id: str) -> None:
    Coordinator(backend, DirectoryStateStore(state), sink_id, plugins=build_plugins()).start()


@pytest.fixture
def options(kafka_broker: Broker, topic: str, marker_topic: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": kafka_broker.bootstrap, "topic": topic,
            "marker.topic": marker_topic, "orphan.scan.records": "5",
            "claim.topic": f"c-{uuid.uuid4().hex[:8]}"}


@pytest.mark.promise("kafka-sink-owner", "backend")
def test_the_claim_holds_after_other_sinks_filled_the_marker_partition(
        options: dict[str, str], tmp_path: Path) -> None:
    sink = f"cl-{uuid.uuid4().hex[:8]}"
    first = make(options)
    first.preflight(sink)
    start(first, tmp_path / "a", sink)
    # Other sinks share the marker partition: far more than orphan.scan.records markers.
    batch = pa.record_batch({"value": pa.array([b"x"], pa.binary())})
    for i in range(8):
        other = f"other-{i}-{uuid.uuid4().hex[:6]}"
        c = write_participant(first, TransactionContext(other, 0, 0), [batch])
        first.commit(c)
    first.close()
    close_shared_clients()  # the second query runs in another driver process
    second = make(options)
    try:
        with pytest.raises(ConfigError, match="already written by another query") as info:
            start(second, tmp_path / "b", sink)
        assert str(tmp_path / "a") in str(info.value)
        start(second, tmp_path / "a", sink)  # the owner itself restarts fine
    finally:
        second.close()


def race(options: dict[str, str], tmp_path: Path, sink: str) -> list[str]:
    """Two queries (own clients, own states) start on ``sink`` at the same moment."""
    backends = [make(options, **{"kafka.client.id": f"q{i}"}) for i in range(2)]
    backends[0].preflight(sink)
    barrier = threading.Barrier(2)
    outcomes = ["", ""]

    def claim(i: int) -> None:
        barrier.wait()
        try:
            start(backends[i], tmp_path / f"{sink}-{i}", sink)
            outcomes[i] = "won"
        except ConfigError as exc:
            outcomes[i] = f"refused: {exc}"

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for b in backends:
        b.close()
    return outcomes


def test_of_two_queries_claiming_at_once_exactly_one_wins(
        options: dict[str, str], tmp_path: Path) -> None:
    for round_ in range(4):
        outcomes = race(options, tmp_path, f"race-{round_}-{uuid.uuid4().hex[:6]}")
        assert sorted(o.split(":")[0] for o in outcomes) == ["refused", "won"], outcomes


def _topics(bootstrap: str) -> set[str]:
    import confluent_kafka.admin as kadmin

    return set(kadmin.AdminClient({"bootstrap.servers": bootstrap}).list_topics(
        timeout=30).topics)


def test_a_kafka_target_of_another_query_leaves_the_files_target_unclaimed(
        kafka_broker: Broker, options: dict[str, str], tmp_path: Path) -> None:
    """The files target comes first: before the group checked every claim, it was
    claimed and kept bound to a state the refused run then deleted. The check writes
    no claim and creates no claim topic; with owner.takeover the group claims both."""
    sink = f"grp-{uuid.uuid4().hex[:8]}"

    def group(**extra: str) -> TargetGroup:
        items = [{"name": "files", "backend": "files",
                  "options": {"path": str(tmp_path / "out")}},
                 {"name": "events", "backend": "kafka", "options": {**options, **extra}}]
        return TargetGroup.from_specs(sink, parse_targets(items, sink))

    refused = group()
    events = refused.members["events"].backend
    assert isinstance(events, KafkaBackend)
    try:
        events.check_claim(f"{sink}--events", "state-new", "/new")
        assert options["claim.topic"] not in _topics(kafka_broker.bootstrap)
        events.claim_sink(f"{sink}--events", "state-old", "/old")  # another query's
        with pytest.raises(SinkOwnedError, match="already written by another query") as info:
            refused.claim_sink(sink, "state-new", "/new")
        assert info.value.owner_state == "/old"
        assert not (tmp_path / "out" / "_txsink" / "state.json").exists()
        claims = events.admin._read_claims(f"{sink}--events")
        assert [c.state_id for c in claims] == ["state-old"]
    finally:
        refused.close()
    taking_over = group(**{"owner.takeover": "true"})
    try:
        taking_over.claim_sink(sink, "state-new", "/new")
    finally:
        taking_over.close()
    assert (tmp_path / "out" / "_txsink" / "state.json").exists()


def test_a_check_before_the_topics_exist_finds_no_owner_and_creates_nothing(
        kafka_broker: Broker, options: dict[str, str], tmp_path: Path) -> None:
    """A check (read-only) before the preflight that creates the claim and marker
    topics: no claim topic is no claim, and no marker topic is no owner record of an
    older release. The scan of the missing marker partition waited out "Unknown
    partition" for unavailable.retry.s and raised the client's KafkaException."""
    sink = f"early-{uuid.uuid4().hex[:8]}"
    fresh = {**options, "claim.topic": f"c-{uuid.uuid4().hex[:8]}",
             "marker.topic": f"m-{uuid.uuid4().hex[:8]}", "unavailable.retry.s": "2"}
    items = [{"name": "files", "backend": "files", "options": {"path": str(tmp_path / "out")}},
             {"name": "events", "backend": "kafka", "options": fresh}]
    group = TargetGroup.from_specs(sink, parse_targets(items, sink))
    try:
        group.check_claim(sink, "state-new", "/new")
    finally:
        group.close()
    topics = _topics(kafka_broker.bootstrap)
    assert fresh["claim.topic"] not in topics and fresh["marker.topic"] not in topics
    assert not (tmp_path / "out").exists()
