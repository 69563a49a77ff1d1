"""A misspelt librdkafka setting (``kafka.*``) is refused before Spark starts, naming the
option and what it was likely meant to be. Before: ``kafka.sasl.pasword`` stopped
`txsink run` with a traceback from the admin client (``KafkaError{code=_INVALID_ARG...``),
and ``kafka.trasaction.timeout.ms``, which the admin client is not given, passed the
checks and was first refused by the writer tasks, after Spark started and the sink was
claimed. No broker is needed: the settings are checked before any connection."""

from __future__ import annotations

import pytest
from txsink.errors import ConfigError
from txsink.plugins import get_plugins

pytest.importorskip("confluent_kafka", reason="the Kafka backend's client is not installed")


@pytest.mark.promise("kafka-unknown-setting-refused", "backend")
@pytest.mark.parametrize(("typo", "meant"), [
    ("kafka.sasl.pasword", "kafka.sasl.password"),
    ("kafka.trasaction.timeout.ms", "kafka.transaction.timeout.ms"),
])
def test_a_misspelt_librdkafka_setting_is_refused_by_name(typo: str, meant: str) -> None:
    backend = get_plugins().create_backend("kafka", {
        "kafka.bootstrap.servers": "127.0.0.1:9", "topic": "t", typo: "s3cr3t-value"})
    try:
        with pytest.raises(ConfigError) as caught:
            backend.preflight("typo-sink")
    finally:
        backend.close()
    message = str(caught.value)
    assert caught.value.field == typo
    assert f"did you mean '{meant}'?" in message, message
    assert "s3cr3t-value" not in message and "KafkaError{" not in message


def test_a_misspelt_bootstrap_servers_is_named_in_the_required_error() -> None:
    """Every ``kafka.*`` key is handed to librdkafka, so ``kafka.bootstrap.server`` was
    no unknown option, and the missing one's error gave no hint."""
    with pytest.raises(ConfigError) as caught:
        get_plugins().create_backend("kafka", {
            "kafka.bootstrap.server": "127.0.0.1:9", "topic": "t"})
    assert caught.value.field == "kafka.bootstrap.servers"
    assert ("'kafka.bootstrap.server' is given: did you mean 'kafka.bootstrap.servers'?"
            in str(caught.value)), str(caught.value)
