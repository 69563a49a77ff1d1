"""A real Kafka broker for the Kafka backend tests.

By default a local Apache Kafka (``txsink_kafka.local_broker``, jars from Maven
Central) is started once per session and stopped at the end, also when tests fail;
its log is in the session's temporary directory, and a failing test's report names
it (``tests/conftest.py``). ``TXSINK_KAFKA_BOOTSTRAP`` names
an external broker, ``TXSINK_KAFKA_TESTCONTAINERS=1`` starts ``apache/kafka`` in
Docker, ``TXSINK_KAFKA_BROKER=tansu`` runs against Tansu. The ``broker_caps``
fixture probes what the broker can show.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from txsink_kafka import testing as kt


@dataclass(frozen=True)
class Broker:
    bootstrap: str
    name: str


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    log = Path(tmp_path_factory.mktemp("kafka")) / "broker.log"
    with kt.broker_for_tests(log) as (bootstrap, name):
        yield Broker(bootstrap, name)


@pytest.fixture(scope="session")
def broker_caps(kafka_broker: Broker) -> kt.BrokerCapabilities:
    """What the broker shows. Apache Kafka must show everything, so that no test can
    skip for a missing capability on it; only Tansu, chosen explicitly, lacks some."""
    caps = kt.probe_broker(kafka_broker.bootstrap, kafka_broker.name)
    print(f"\nKafka broker {kafka_broker.name}: {caps}")
    if not kt.tansu_selected():
        assert (caps.hides_aborted, caps.hides_open, caps.describe_transactions,
                caps.writes_markers) == (True, True, True, True), caps
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
    kt.create_topic(kafka_broker.bootstrap, name, partitions=1, compacted=True)
    return name
