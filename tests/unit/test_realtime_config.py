"""Pipeline files with ``trigger: {real_time: ...}``: checked against the backend's
real-time target, one-line errors naming the field (no JVM, no server)."""

from __future__ import annotations

from typing import Any

import pytest
from txsink.config import parse_pipeline
from txsink.errors import ConfigError


def rt(sink: dict[str, Any], trigger: Any = "5 seconds") -> dict[str, Any]:
    return {"source": {"type": "spark", "format": "kafka",
                       "options": {"kafka.bootstrap.servers": "b:9092", "subscribe": "in"}},
            "transform": "SELECT key, value, topic, partition, offset FROM source",
            "sink": sink, "checkpoint": "/tmp/chk", "trigger": {"real_time": trigger}}


KAFKA = {"backend": "kafka", "sink_id": "rt",
         "options": {"topic": "out", "kafka.bootstrap.servers": "b:9092",
                     "progress.topic": "p", "commit_interval": "200 milliseconds"}}


def test_a_real_time_pipeline_parses_with_the_real_time_target_options() -> None:
    cfg = parse_pipeline(rt(KAFKA))
    assert (cfg.trigger.kind, cfg.trigger.interval) == ("real_time", "5 seconds")
    assert cfg.sink.options["progress.topic"] == "p"  # a real-time option, not a batch one
    pg = parse_pipeline(rt({"backend": "postgres", "sink_id": "rt", "options": {
        "dsn": "host=db", "table": "public.t", "password": "pw"}}))
    assert pg.sink.safe_options()["password"] == "***"


@pytest.mark.parametrize(("data", "field", "words"), [
    (rt(KAFKA, trigger="soon"), "trigger.real_time", "must be a duration"),
    (rt({**KAFKA, "options": {**KAFKA["options"], "commit_interval": "0 ms"}}),
     "sink.options.commit_interval", "positive duration"),
    (rt({**KAFKA, "guarantee": "at_least_once"}), "sink.guarantee", "exactly once only"),
    (rt({"backend": "files", "sink_id": "rt", "options": {"path": "/tmp/x"}}),
     "sink.backend", "has no real-time target"),
    (rt({"backend": "kafka", "sink_id": "rt", "options": {"topic": "out"}}),
     "sink.options.kafka.bootstrap.servers", "is required"),
    (rt({"sink_id": "rt", "targets": []}), "sink.targets", "one target"),
])
def test_bad_real_time_pipelines_name_the_field(data: dict[str, Any], field: str,
                                                words: str) -> None:
    with pytest.raises(ConfigError, match=words) as info:
        parse_pipeline(data)
    assert info.value.field == field and "\n" not in str(info.value)


def test_a_real_time_pipeline_gets_spark_settings_for_latency_unless_it_sets_them() -> None:
    from txsink.spark.pipeline import MIN_BATCH_CONF, realtime_defaults

    assert realtime_defaults(parse_pipeline(rt(KAFKA))) == {"spark.buffer.size": "512"}
    short = realtime_defaults(parse_pipeline(rt(KAFKA, trigger="1 second")))
    assert short == {"spark.buffer.size": "512", MIN_BATCH_CONF: "1000"}
    own = rt(KAFKA, trigger="500 milliseconds")
    own["spark"] = {"conf": {"spark.buffer.size": "4096"}}
    assert realtime_defaults(parse_pipeline(own)) == {MIN_BATCH_CONF: "500"}
    micro = {**rt(KAFKA), "trigger": {"processing_time": "1 second"}}
    micro["sink"] = {"backend": "kafka", "sink_id": "mb", "options": {
        "topic": "out", "kafka.bootstrap.servers": "b:9092"}}
    assert realtime_defaults(parse_pipeline(micro)) == {}
