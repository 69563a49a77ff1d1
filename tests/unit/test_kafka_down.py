"""A Kafka that is down is reported as down (not as a config error), within the time the
message states, in the library's words rather than its error object. Before: "config
error: ... retried for 3s ...: KafkaError{code=_TRANSPORT,val=-195,...}" after 16 s."""

from __future__ import annotations

import re
import socket
import time

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
