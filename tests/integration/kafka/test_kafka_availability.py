"""A broker that restarts under a running sink is waited for; a wrong host is not."""

from __future__ import annotations

import gc
import logging
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pytest
from txsink.coordinator import Coordinator, EpochOutcome, RetryPolicy
from txsink.errors import ConfigError
from txsink.hookspecs import hookimpl
from txsink.model import Committable, TransactionContext
from txsink.plugins import build_plugins, get_plugins
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant
from txsink_kafka import testing as kt
from txsink_kafka.backend import KafkaBackend, close_shared_clients
from txsink_kafka.local_broker import LocalKafka

from tests.integration.kafka import conftest as kt_conftest

pytestmark = [pytest.mark.integration, pytest.mark.fault, pytest.mark.slow]

#: Down for longer than one request timeout (3 s here); the broker's own start adds
#: several seconds more. The coordinator gets no retries of its own (see
#: ``NO_RETRY``), so only the backend's bounded waits can ride this out.
DOWN_S = 8
NO_RETRY = RetryPolicy(attempts=1)


@pytest.fixture
def kafka(tmp_path: Path) -> Iterator[LocalKafka]:
    broker = LocalKafka(tmp_path / "kafka")
    try:
        broker.start()
        yield broker
    finally:
        close_shared_clients()
        broker.close()
        gc.collect()  # a socket left unclosed would warn here, failing this test


def restart_later(broker: LocalKafka) -> threading.Thread:
    """Stop the broker now and start it again DOWN_S seconds later (same ports, data)."""
    broker.stop()

    def start() -> None:
        time.sleep(DOWN_S)
        broker.start()

    thread = threading.Thread(target=start)
    thread.start()
    return thread


@pytest.mark.promise("target-restart-retried", "backend")
def test_preflight_writer_and_commit_ride_out_a_broker_restart(
        kafka: LocalKafka, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="txsink_kafka")
    topic, markers = f"t-{uuid.uuid4().hex[:8]}", f"m-{uuid.uuid4().hex[:8]}"
    kt.create_topic(kafka.bootstrap, topic, partitions=2)
    kt.create_topic(kafka.bootstrap, markers, partitions=1, compacted=True)
    sink = f"av-{uuid.uuid4().hex[:8]}"
    options = {"kafka.bootstrap.servers": kafka.bootstrap, "topic": topic,
               "marker.topic": markers, "request.timeout.s": "3",
               "unavailable.retry.s": "180"}
    backend = get_plugins().create_backend("kafka", options)
    assert isinstance(backend, KafkaBackend)
    thread = restart_later(kafka)
    try:
        backend.preflight(sink)  # the query starts while the broker restarts
    finally:
        thread.join()
    # The broker goes away right after the decision, so the commit itself (not the
    # marker scan before the decision) has to ride the restart out.
    restarts: list[threading.Thread] = []

    class RestartOnDecision:
        armed = False

        @hookimpl
        def txsink_epoch_decided(self, sink_id: str, epoch: int,
                                 committables: Sequence[Committable]) -> None:
            if self.armed:
                self.armed = False
                restarts.append(restart_later(kafka))

    on_decision = RestartOnDecision()
    coord = Coordinator(backend, DirectoryStateStore(tmp_path / "state"), sink,
                        plugins=build_plugins(extra_plugins=[("restart", on_decision)]),
                        retry=NO_RETRY)
    coord.start()
    batch = pa.record_batch({"value": pa.array([b"%d" % i for i in range(20)], pa.binary())})
    msgs = [write_participant(backend, TransactionContext(sink, 0, p), [batch])
            for p in range(2)]
    on_decision.armed = True
    try:
        assert coord.commit_epoch(0, msgs) is EpochOutcome.COMMITTED
    finally:
        for thread in restarts:
            thread.join()
    assert restarts, "the broker should have restarted under the commit"
    # A writer task that starts while the broker restarts.
    thread = restart_later(kafka)
    try:
        late = write_participant(backend, TransactionContext(sink, 1, 0), [batch])
    finally:
        thread.join()
    try:
        assert coord.commit_epoch(1, [late]) is EpochOutcome.COMMITTED
    finally:
        backend.close()
    assert len(kt.read_topic(kafka.bootstrap, topic)) == 60
    retries = [r.getMessage() for r in caplog.records if "Kafka unavailable" in r.getMessage()]
    assert any("preflight" in m for m in retries)
    assert any(f"sink={sink} epoch=0" in m and "commit" in m for m in retries)
    assert any(f"sink={sink} epoch=1" in m and "transactional.id" in m for m in retries)
    _a_group_claim_with_its_broker_stopped_says_server_down(kafka, tmp_path)


@pytest.mark.promise("wrong-credentials-fail-at-once", "backend")
def test_a_wrong_host_is_a_config_error_at_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="txsink_kafka")
    backend = get_plugins().create_backend(
        "kafka", {"kafka.bootstrap.servers": "no-such-broker.invalid:9092", "topic": "t"})
    with pytest.raises(ConfigError, match="no host that resolves") as info:
        backend.preflight("wrong-host")
    assert info.value.field == "kafka.bootstrap.servers"
    assert not [r for r in caplog.records if "Kafka unavailable" in r.getMessage()]


def test_the_marker_scan_waits_for_a_partition_the_client_does_not_know_yet(
        kafka_broker: kt_conftest.Broker, caplog: pytest.LogCaptureFixture) -> None:
    """A broker just back from a restart can answer metadata before it knows the marker
    partition's leader: the recovery scan got ``_UNKNOWN_PARTITION`` and the query
    start failed (CI, after the restart above). The same answer comes for a partition
    that appears a few seconds later; the scan must wait for it, not fail."""
    caplog.set_level(logging.WARNING, logger="txsink_kafka")
    topic, markers = f"t-{uuid.uuid4().hex[:8]}", f"m-{uuid.uuid4().hex[:8]}"
    kt.create_topic(kafka_broker.bootstrap, topic, partitions=1)
    backend = get_plugins().create_backend("kafka", {
        "kafka.bootstrap.servers": kafka_broker.bootstrap, "topic": topic,
        "marker.topic": markers, "request.timeout.s": "3", "unavailable.retry.s": "60"})
    sink = f"av-{uuid.uuid4().hex[:8]}"
    later = threading.Timer(3, lambda: kt.create_topic(kafka_broker.bootstrap, markers,
                                                       partitions=1, compacted=True))
    later.start()
    try:
        assert backend.open_markers(sink) == {}
    finally:
        later.join()
        backend.close()
        close_shared_clients()
    waits = [r.getMessage() for r in caplog.records if "marker scan" in r.getMessage()]
    assert waits, "the scan should have waited for the unknown partition"
    assert all(f"sink={sink}" in m and "unavailable.retry.s" in m for m in waits)


def _a_group_claim_with_its_broker_stopped_says_server_down(
        kafka: LocalKafka, tmp_path: Path) -> None:
    """(Run at the end of the restart test, on its broker: about 4 s, no broker of its
    own.) The driver's Kafka clients are up (an earlier claim) and the broker stops: a
    group's check (a new state's start, `txsink resolve`) and claim raised the client's
    KafkaException as it came ("KafkaError{code=_TRANSPORT,...}", a traceback from the
    CLI), and the claim path read a broker that did not answer as a claim topic to
    create ("cannot create topic ..."). Both are a server down naming the target, and
    the files target of the new state is not claimed."""
    from txsink.errors import ServerUnavailableError
    from txsink.group import TargetGroup
    from txsink.targets import parse_targets

    topic = f"t-{uuid.uuid4().hex[:8]}"
    kt.create_topic(kafka.bootstrap, topic, partitions=1)

    def group(out: str) -> TargetGroup:
        return TargetGroup.from_specs("g", parse_targets([
            {"name": "archive", "backend": "files", "options": {"path": str(tmp_path / out)}},
            {"name": "events", "backend": "kafka", "options": {
                "kafka.bootstrap.servers": kafka.bootstrap, "topic": topic,
                "request.timeout.s": "1", "unavailable.retry.s": "0"}}], "g"))

    first = group("first")
    try:
        first.preflight("g")  # as every start does first: the claim and marker topics
        first.claim_sink("g", "state-1", "/one")  # the driver clients are up now
        kafka.stop()
        for action in ("check_claim", "claim_sink"):
            second = group("second")
            try:
                with pytest.raises(ServerUnavailableError) as caught:
                    getattr(second, action)("g", "state-2", "/two")
            finally:
                second.close()
            message = str(caught.value)
            assert message.startswith("target 'events' (kafka "), (action, message)
            assert "is down or unreachable" in message, (action, message)
            assert "KafkaError{" not in message, (action, message)
            assert not (tmp_path / "second").exists()
    finally:
        first.close()
