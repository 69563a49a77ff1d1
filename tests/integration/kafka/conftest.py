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

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


#: transaction.timeout.ms of the sinks on the short-timeout broker (its maximum).
SHORT_TIMEOUT_MS = 3000


def transaction_versions() -> list[int | None]:
    """The transaction versions to run the timeout and salvage tests with: the one
    ``TXSINK_KAFKA_TRANSACTION_VERSION`` names (tox ``kafka-tv1`` runs every Kafka test
    on version 1), else version 2, 4.x's default (the default run's time budget: a
    second short-timeout broker and every test twice cost it about 90 s); Kafka 3.9
    (tox ``kafka39``) has only its own (the feature cannot be set there)."""
    from txsink_kafka.local_broker import ENV_TRANSACTION_VERSION, ENV_VERSION, KAFKA_VERSION

    if os.environ.get(ENV_TRANSACTION_VERSION):
        return [int(os.environ[ENV_TRANSACTION_VERSION])]
    if (os.environ.get(ENV_VERSION) or KAFKA_VERSION).startswith("3."):
        return [None]
    return [2]


@pytest.fixture(scope="session", params=transaction_versions(),
                ids=lambda tv: "tv-default" if tv is None else f"tv{tv}")
def short_timeout_kafka(request: pytest.FixtureRequest,
                        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """An Apache Kafka of its own whose coordinator aborts a transaction within about a
    second of its ``transaction.timeout.ms`` (at most :data:`SHORT_TIMEOUT_MS`), and
    whose retention runs every half second from the start (``retention.ms`` is set per
    topic by the tests that want records deleted). Shared by the timeout and salvage
    tests, one per transaction version."""
    from txsink_kafka.backend import close_shared_clients
    from txsink_kafka.local_broker import LocalKafka

    kafka = LocalKafka(tmp_path_factory.mktemp("short-timeout-kafka"),
                       transaction_version=request.param, properties={
                           "transaction.max.timeout.ms": str(SHORT_TIMEOUT_MS),
                           "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
                           "log.retention.check.interval.ms": "500",
                           "log.initial.task.delay.ms": "0",
                       })
    try:
        kafka.start()
        yield kafka
    finally:
        close_shared_clients()
        kafka.close()
