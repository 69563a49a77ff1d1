"""Option parsing of the Kafka sink: no broker needed."""

from __future__ import annotations

import logging

import pytest
from txsink.errors import ConfigError
from txsink.model import TransactionContext
from txsink.plugins import get_plugins
from txsink_kafka.backend import KafkaBackend
from txsink_kafka.txn_protocol import kafka_python_config

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092", "topic": "out"}


def make(**extra: str) -> KafkaBackend:
    b = get_plugins().create_backend("kafka", {**BASE, **extra})
    assert isinstance(b, KafkaBackend)
    return b


def test_defaults_and_transactional_id() -> None:
    b = make()
    assert b.config.transaction_timeout_ms == 600_000
    ctx = TransactionContext("orders", 12, 3, 7)
    assert b.transactional_id(ctx) == "txsink-orders-e12-p3-a7"
    assert make(**{"transactional.id.prefix": "team.a"}).transactional_id(ctx) == \
        "team.a-orders-e12-p3-a7"


def test_bootstrap_is_required() -> None:
    with pytest.raises(ConfigError) as info:
        get_plugins().create_backend("kafka", {"topic": "x"})
    assert info.value.field == "kafka.bootstrap.servers"


@pytest.mark.parametrize("key", ["transactional.id", "enable.idempotence", "acks", "debug"])
def test_reserved_producer_settings(key: str) -> None:
    with pytest.raises(ConfigError, match="cannot be set") as info:
        make(**{f"kafka.{key}": "x"})
    assert info.value.field == f"kafka.{key}"


@pytest.mark.promise("kafka-timeout-checked", "backend")
def test_timeout_below_trigger_interval_is_an_error_with_numbers() -> None:
    with pytest.raises(ConfigError, match=r"30000 ms.*60000 ms") as info:
        make(**{"kafka.transaction.timeout.ms": "30000", "trigger.interval.ms": "60000"})
    assert info.value.field == "kafka.transaction.timeout.ms"


def test_timeout_close_to_trigger_interval_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="txsink_kafka"):
        make(**{"kafka.transaction.timeout.ms": "90000", "trigger.interval.ms": "60000"})
    assert any("leaves only 30000 ms" in r.getMessage() for r in caplog.records)


def test_bad_timeout_value() -> None:
    with pytest.raises(ConfigError, match="must be an integer"):
        make(**{"kafka.transaction.timeout.ms": "soon"})


def test_unknown_option_is_rejected() -> None:
    with pytest.raises(ConfigError, match="unknown option"):
        make(**{"topc": "x"})


def test_secrets_stay_out_of_descriptions_and_are_declared() -> None:
    b = make(**{"kafka.security.protocol": "sasl_ssl", "kafka.sasl.mechanism": "PLAIN",
                "kafka.sasl.username": "u", "kafka.sasl.password": "hunter2-secret"})
    assert b.secret_values() == ["hunter2-secret"]
    assert "hunter2" not in b.describe()
    assert "kafka.sasl.password" not in b.safe_options({**BASE, "kafka.sasl.password": "p"})
    assert "hunter2" not in repr(b.config)
    kp = kafka_python_config(b.config.connection())
    assert kp["security_protocol"] == "SASL_SSL"
    assert kp["sasl_plain_password"] == "hunter2-secret"


def test_backend_pickles_without_clients() -> None:
    import pickle

    b = make()
    again = pickle.loads(pickle.dumps(b))
    assert again.config == b.config


def test_participant_timeout_is_the_transaction_timeout() -> None:
    """Metrics compare the oldest prepared participant with this."""
    assert make().participant_timeout_s() == 600
    assert make(**{"kafka.transaction.timeout.ms": "90000"}).participant_timeout_s() == 90
