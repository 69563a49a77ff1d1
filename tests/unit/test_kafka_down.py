"""A Kafka that is down is reported as down (not as a config error), within the time the
message states, in the library's words rather than its error object. Before: "config
error: ... retried for 3s ...: KafkaError{code=_TRANSPORT,val=-195,...}" after 16 s."""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

import pytest
from txsink.errors import ServerUnavailableError
from txsink.plugins import get_plugins

pytest.importorskip("confluent_kafka", reason="the Kafka backend's client is not installed")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_kafka_that_is_down_is_reported_as_down_in_the_time_it_states() -> None:
    bootstrap = f"127.0.0.1:{_closed_port()}"
    backend = get_plugins().create_backend("kafka", {
        "kafka.bootstrap.servers": bootstrap, "topic": "t", "unavailable.retry.s": "3"})
    started = time.monotonic()
    try:
        with pytest.raises(ServerUnavailableError) as caught:
            backend.preflight("down-sink")
    finally:
        backend.close()
    took = time.monotonic() - started
    message = str(caught.value)
    assert f"Kafka at '{bootstrap}' is down or unreachable" in message
    stated = re.search(r"no answer in (\d+)s \(retried for up to 3s", message)
    assert stated, message
    assert took <= int(stated.group(1)) + 1.5, (took, message)
    assert "KafkaError{" not in message and "code=" not in message
    assert caught.value.field == "kafka.bootstrap.servers"


def test_a_group_claim_without_preflight_says_which_target_is_down(tmp_path: Path) -> None:
    """`txsink resolve` and the Python API's first start claim with no preflight: a
    Kafka target that is down was a "config error" (cannot connect ... to reach the
    transaction coordinator) naming no target. It is a server down, naming the target,
    and the group's files target is not claimed. About 1 s."""
    from txsink.group import TargetGroup
    from txsink.targets import parse_targets

    bootstrap = f"127.0.0.1:{_closed_port()}"
    specs = parse_targets([
        {"name": "archive", "backend": "files", "options": {"path": str(tmp_path / "out")}},
        {"name": "events", "backend": "kafka", "options": {
            "kafka.bootstrap.servers": bootstrap, "topic": "t", "request.timeout.s": "0.5",
            "unavailable.retry.s": "0"}}], "g")
    group = TargetGroup.from_specs("g", specs)
    try:
        with pytest.raises(ServerUnavailableError) as caught:
            group.claim_sink("g", "state-1", "/s")
    finally:
        group.close()
    message = str(caught.value)
    assert message.startswith("target 'events' (kafka "), message
    assert f"Kafka at '{bootstrap}' is down or unreachable" in message
    assert "KafkaError{" not in message
    assert caught.value.field == "targets[events].options.kafka.bootstrap.servers"
    assert not (tmp_path / "out").exists()
