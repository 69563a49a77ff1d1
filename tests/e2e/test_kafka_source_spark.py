"""The txsink-kafka stream source in real Spark on Apache Kafka, and aborted upstream
transactions never reaching txsink's Kafka sink."""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from txsink_kafka import testing as kt

from tests.long_runs import long_run

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("kafka-broker") / "broker.log"
    with kt.kafka_for_tests(log, tansu_ok=False) as (address, _, _):
        yield address


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession
    from txsink.spark import register
    from txsink_kafka.source import register_source

    session = (SparkSession.builder.master("local[2]").appName("txsink-kafka-source")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.host", "127.0.0.1").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    register_source(session)
    try:
        yield session
    finally:
        session.stop()
        _stop_jvm()


def _stop_jvm() -> None:
    """session.stop() leaves the JVM running until pytest exits: end it now."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    gateway.shutdown()
    if proc is not None:
        if proc.stdin is not None:
            proc.stdin.close()  # the gateway JVM exits when its stdin closes
        try:
            proc.wait(15)
        except Exception:
            proc.kill()
            proc.wait(15)
    SparkContext._gateway = None
    SparkContext._jvm = None


def produce(bootstrap: str, topic: str, records: list[tuple[int, int]], *,
            transactional: bool = True, abort: bool = False) -> None:
    """(partition, id) records; committed (or aborted) in one transaction."""
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap}
    if transactional:
        conf["transactional.id"] = f"src-test-{uuid.uuid4().hex[:8]}"
    p = Producer(conf)
    if transactional:
        p.init_transactions(30)
        p.begin_transaction()
    for partition, i in records:
        p.produce(topic, json.dumps({"id": i}).encode(), str(i).encode(), partition,
                  headers=[("h", str(i).encode())])
    p.flush(30)
    if transactional:
        (p.abort_transaction if abort else p.commit_transaction)(30)


def run_available_now(spark: Any, bootstrap: str, topic: str, chk: Path,
                      **options: str) -> list[Any]:
    reader = (spark.readStream.format("txsink-kafka")
              .option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic))
    for k, v in options.items():
        reader = reader.option(k, v)
    rows: list[Any] = []

    def collect(frame: Any, batch_id: int) -> None:
        rows.extend(r.asDict() for r in frame.collect())

    query = (reader.load().writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(chk)).trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    return rows


def test_source_reads_committed_records_with_the_kafka_schema(
        spark: Any, bootstrap: str, tmp_path: Path) -> None:
    topic = f"src-{uuid.uuid4().hex[:6]}"
    kt.create_topic(bootstrap, topic, partitions=2)
    produce(bootstrap, topic, [(i % 2, i) for i in range(100)])
    produce(bootstrap, topic, [(0, 1000 + i) for i in range(10)], abort=True)
    rows = run_available_now(spark, bootstrap, topic, tmp_path / "chk",
                             startingOffsets="earliest", includeHeaders="true")
    reader = spark.readStream.format("txsink-kafka").option(
        "kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
    spark_kafka = ["key", "value", "topic", "partition", "offset", "timestamp",
                   "timestampType"]
    assert reader.load().schema.fieldNames() == spark_kafka
    assert reader.option("includeHeaders", "true").load().schema.fieldNames() == [
        *spark_kafka, "headers"]
    ids = sorted(json.loads(r["value"])["id"] for r in rows)
    log = kt.scan_log(bootstrap, topic)
    committed = sorted(json.loads(r.value or b"")["id"] for r in log.records)
    assert committed == list(range(100)) and log.aborted_records == 10
    assert ids == committed
    sample = next(r for r in rows if json.loads(r["value"])["id"] == 7)
    assert sample["key"] == b"7" and sample["topic"] == topic and sample["partition"] == 1
    assert sample["headers"][0]["key"] == "h" and sample["headers"][0]["value"] == b"7"
    assert sample["timestamp"] is not None

    # A restart from the checkpoint reads only what came after, including a new partition.
    from confluent_kafka.admin import AdminClient, NewPartitions  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result(30)
    more = [(i % 3, 200 + i) for i in range(30)]
    produce(bootstrap, topic, more)
    again = run_available_now(spark, bootstrap, topic, tmp_path / "chk",
                              includeHeaders="true")
    assert sorted(json.loads(r["value"])["id"] for r in again) == [i for _, i in more]


def test_starting_offsets_latest_and_json(spark: Any, bootstrap: str, tmp_path: Path) -> None:
    topic = f"src-{uuid.uuid4().hex[:6]}"
    kt.create_topic(bootstrap, topic, partitions=2)
    produce(bootstrap, topic, [(i % 2, i) for i in range(20)])
    assert run_available_now(spark, bootstrap, topic, tmp_path / "a") == []  # latest
    rows = run_available_now(spark, bootstrap, topic, tmp_path / "b",
                             startingOffsets=json.dumps({topic: {"0": 5, "1": -1}}))
    assert sorted(json.loads(r["value"])["id"] for r in rows) == [10, 12, 14, 16, 18]


@pytest.mark.promise("kafka-source-replays-exact", "backend")
@long_run
def test_aborted_upstream_transactions_never_reach_the_sink(
        spark: Any, bootstrap: str, tmp_path: Path) -> None:
    """One upstream transactional producer commits and aborts in turn over both
    partitions, and leaves its last transaction open while the query runs: txsink's
    source -> Spark -> txsink's Kafka sink must deliver the committed records once
    each, none of the aborted ones, and the open transaction's records only after it
    commits (the source stops at the last stable offset; it does not wait or skip)."""
    from txsink.spark import register

    register(spark)
    upstream = f"src-up-{uuid.uuid4().hex[:6]}"
    output = f"src-out-{uuid.uuid4().hex[:6]}"
    kt.create_topic(bootstrap, upstream, partitions=2)
    kt.create_topic(bootstrap, output, partitions=2)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                         "transactional.id": f"src-up-{uuid.uuid4().hex[:8]}",
                         # It keeps a transaction open while the query runs: more than
                         # librdkafka's default 60 s on a loaded machine.
                         "transaction.timeout.ms": 600_000})
    producer.init_transactions(30)
    committed: list[int] = []
    aborted: list[int] = []
    for t in range(8):
        ids = list(range(t * 25, t * 25 + 25))
        producer.begin_transaction()
        for i in ids:
            producer.produce(upstream, json.dumps({"id": i}).encode(), str(i).encode(), i % 2)
        producer.flush(30)
        if t % 2:
            producer.abort_transaction(30)
            aborted += ids
        else:
            producer.commit_transaction(30)
            committed += ids
    late = list(range(1000, 1020))
    producer.begin_transaction()
    for i in late:
        producer.produce(upstream, json.dumps({"id": i}).encode(), str(i).encode(), i % 2)
    producer.flush(30)
    sink_id = f"src-sink-{uuid.uuid4().hex[:6]}"

    def run_query() -> None:
        query = (spark.readStream.format("txsink-kafka")
                 .option("kafka.bootstrap.servers", bootstrap).option("subscribe", upstream)
                 .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "60")
                 .load().selectExpr("key", "value")
                 .writeStream.format("txsink").option("backend", "kafka")
                 .option("sink_id", sink_id).option("checkpointLocation", str(tmp_path / "c"))
                 .option("kafka.bootstrap.servers", bootstrap).option("topic", output)
                 .option("marker.topic", f"{output}-markers")
                 .trigger(availableNow=True).start())
        query.awaitTermination(300)
        assert query.exception() is None, query.exception()

    def output_ids() -> list[int]:
        return sorted(json.loads(m.value())["id"] for m in kt.read_topic(bootstrap, output))

    run_query()
    # Several micro-batches (epochs) ran; the open transaction held the source back.
    assert output_ids() == sorted(committed)
    producer.commit_transaction(30)
    run_query()
    assert output_ids() == sorted(committed + late)
    assert not set(aborted) & set(output_ids())
    # The aborted records are in the upstream log, only their abort markers hide them.
    log = kt.scan_log(bootstrap, upstream)
    assert log.aborted_records == len(aborted) and not log.open_transactions
    out_log = kt.scan_log(bootstrap, output)
    assert not out_log.open_transactions


@pytest.mark.promise("kafka-source-offset-options-refused", "backend")
def test_bad_source_options(spark: Any, bootstrap: str) -> None:
    from txsink.errors import ConfigError
    from txsink_kafka.source import SourceSettings

    with pytest.raises(ConfigError, match="startingOffsets"):
        SourceSettings.parse({"kafka.bootstrap.servers": bootstrap, "subscribe": "t",
                              "startingOffsets": "{bad"})
    with pytest.raises(ConfigError, match=r"enable\.auto\.commit"):
        SourceSettings.parse({"kafka.bootstrap.servers": bootstrap, "subscribe": "t",
                              "kafka.enable.auto.commit": "true"})
    with pytest.raises(ConfigError, match=r"group\.id' is empty"):
        SourceSettings.parse({"kafka.bootstrap.servers": bootstrap, "subscribe": "t",
                              "kafka.group.id": " "})
    reporting = SourceSettings.parse({"kafka.bootstrap.servers": bootstrap, "subscribe": "t",
                                      "kafka.group.id": "lag-report"})
    assert reporting.report_group == "lag-report"
    # Readers on executors never use the report group.
    assert reporting.consumer_config()["group.id"] == "txsink-source"
