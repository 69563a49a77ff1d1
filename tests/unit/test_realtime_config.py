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
    (rt({"sink_id": "rt", "targets": []}), "sink.targets", "non-empty list of targets"),
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


@pytest.mark.promise("realtime-kafka-output-columns-refused", "realtime")
@pytest.mark.parametrize(("columns", "field", "words"), [
    ({"body": "string"}, "value", "has no 'value' column"),
    ({"value": "string", "id": "bigint"}, "id", "would not be written"),
    ({"key": "string", "value": "bigint"}, "value", "cast it to string or binary"),
    # Headers of another shape failed the first write, after the query had started.
    ({"value": "string", "headers": "map<string,string>"}, "headers",
     "column 'headers' is map<string,string>; it must be "
     "array<struct<key:string,value:binary>>"),
    ({"value": "string", "headers": "array<struct<name:string,value:binary>>"}, "headers",
     "must be array<struct<key:string,value:binary>>"),
    ({"value": "string", "headers": "string"}, "headers", "must be array<struct"),
])
def test_kafka_real_time_output_columns_it_would_not_write_are_refused(
        columns: dict[str, str], field: str, words: str) -> None:
    """Without the check a missing 'value' wrote every record empty and other columns
    vanished, silently (the micro-batch Kafka sink refuses both)."""
    from txsink_kafka.realtime import KafkaRealtimeSpec

    spec = KafkaRealtimeSpec("rt", {"topic": "out", "kafka.bootstrap.servers": "b:9092"})
    with pytest.raises(ConfigError, match=words) as info:
        spec.check_columns(columns)
    assert info.value.field == field and "\n" not in str(info.value)
    spec.check_columns({"key": "binary", "value": "string",
                        "headers": "array<struct<key:string,value:binary>>"})


def _progress(start: str, end: str, latest: str) -> dict[str, Any]:
    return {"batchId": 1, "sources": [{"startOffset": start, "endOffset": end,
                                       "latestOffset": latest}]}


@pytest.mark.promise("realtime-unread-partitions-stop", "realtime")
def test_source_partitions_no_task_reads_are_named() -> None:
    """As Spark reported them with four task slots and six source partitions: 0 and 2
    never read (their records waited), the others read or idle."""
    from txsink.spark.realtime import (
        UNREAD_BATCHES,
        local_slots,
        unread_error,
        unread_partitions,
    )

    starved = _progress('{"s": {"0": 0, "1": 100, "2": 0, "3": 7}}',
                        '{"s": {"0": 0, "1": 100, "2": 0, "3": 9}}',
                        '{"s": {"0": 100, "1": 100, "2": 100, "3": 9}}')
    assert unread_partitions([starved] * UNREAD_BATCHES, 2) == ["s-0", "s-2"]
    assert unread_partitions([starved] * (UNREAD_BATCHES - 1), 2) == []  # not yet
    read = _progress('{"s": {"0": 0, "2": 0}}', '{"s": {"0": 50, "2": 0}}',
                     '{"s": {"0": 100, "2": 100}}')
    assert unread_partitions([starved, read, starved], 2) == ["s-2"]
    idle = _progress('{"s": {"0": 5}}', '{"s": {"0": 5}}', '{"s": {"0": 5}}')
    assert unread_partitions([idle] * 5, 0) == [] and unread_partitions([{"sources": []}], 0) == []
    # Enough slots for the four partitions, or slots unknown: no answer. An idle source
    # whose offsets end on a transaction marker looks like `starved` (measured).
    assert unread_partitions([starved] * UNREAD_BATCHES, 4) == []
    assert unread_partitions([starved] * UNREAD_BATCHES, None) == []
    assert [local_slots(m) for m in ("local", "local[2]", "local[3, 4]", "spark://h:7077")] \
        == [1, 2, 3, None]
    error = unread_error(["s-0", "s-2"], "rt")
    assert error.field == "spark.master" and "task slot per source partition" in str(error)
