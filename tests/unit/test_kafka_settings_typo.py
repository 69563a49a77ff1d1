"""A misspelt librdkafka setting (``kafka.*``) is refused before Spark starts, naming the
option and what it was likely meant to be. Before: ``kafka.sasl.pasword`` stopped
`txsink run` with a traceback from the admin client (``KafkaError{code=_INVALID_ARG...``),
and ``kafka.trasaction.timeout.ms``, which the admin client is not given, passed the
checks and was first refused by the writer tasks, after Spark started and the sink was
claimed. No broker is needed: the settings are checked before any connection."""

from __future__ import annotations

from pathlib import Path

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


def _pipeline(tmp_path: Path, group: bool) -> Path:
    options = ("{kafka.bootstrap.servers: '127.0.0.1:9', topic: t, "
               "kafka.linger.mss: '5', kafka.sasl.password: s3cr3t-value}")
    sink = (f"""
  sink_id: typo
  targets:
    - name: files
      backend: files
      options: {{path: {tmp_path}/out, format: jsonl}}
    - name: events
      backend: kafka
      options: {options}""" if group else f"""
  backend: kafka
  sink_id: typo
  options: {options}""")
    f = tmp_path / "typo.yaml"
    f.write_text(f"source: {{type: rate}}\ncheckpoint: {tmp_path}/chk\nsink:{sink}\n")
    return f


@pytest.mark.parametrize("group", [False, True], ids=["single", "group"])
def test_validate_refuses_the_typo_run_refuses_with_the_same_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], group: bool) -> None:
    """Before: `txsink validate --no-spark` said ok, and `run` refused the file two
    seconds later. Both now print the same line (with Spark's checks too: it comes before
    Spark starts), and nothing is created."""
    from txsink.cli import main

    f = _pipeline(tmp_path, group)
    said = {}
    for argv in (["validate", "--no-spark"], ["validate"], ["run"]):
        assert main([*argv, str(f)]) == 1
        captured = capsys.readouterr()
        assert captured.out == ""
        said[" ".join(argv)] = captured.err
    field = "sink.targets[events].options.kafka.linger.mss" if group else \
        "sink.options.kafka.linger.mss"
    assert said["validate --no-spark"].startswith(f"txsink: config error: {field}: "), said
    assert "did you mean 'kafka.linger.ms'?" in said["validate --no-spark"]
    assert "s3cr3t-value" not in said["validate --no-spark"]
    assert said["validate --no-spark"] == said["validate"] == said["run"], said
    assert not (tmp_path / "chk").exists() and not (tmp_path / "out").exists()
