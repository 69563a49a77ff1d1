"""The txsink-kafka stream source in real Spark, and Kafka -> Spark -> Kafka exactly once."""

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

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(scope="module")
def bootstrap() -> Iterator[str]:
    with kt.broker_for_tests() as (address, _):
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
    caps = kt.probe_broker(bootstrap, f"at {bootstrap}")
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
    if caps.hides_aborted:
        assert ids == committed
    else:
        # Tansu 0.6 shows aborted records to read_committed consumers, librdkafka's
        # included: the source gets the committed records and the aborted ones, each
        # exactly once (what the log holds, markers aside).
        assert ids == sorted(json.loads(r.value or b"")["id"] for r in log.uncommitted)
        assert ids == [*range(100), *range(1000, 1010)]
    sample = next(r for r in rows if json.loads(r["value"])["id"] == 7)
    assert sample["key"] == b"7" and sample["topic"] == topic and sample["partition"] == 1
    assert sample["headers"][0]["key"] == "h" and sample["headers"][0]["value"] == b"7"
    assert sample["timestamp"] is not None

    # A restart from the checkpoint reads only what came after, including a new partition.
    from confluent_kafka.admin import AdminClient, NewPartitions  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        admin.create_partitions([NewPartitions(topic, 3)])[topic].result(30)
        added = True
    except Exception:  # Tansu may not support CreatePartitions
        added = False
    more = [(i % (3 if added else 2), 200 + i) for i in range(30)]
    produce(bootstrap, topic, more)
    again = run_available_now(spark, bootstrap, topic, tmp_path / "chk",
                              includeHeaders="true")
    assert sorted(json.loads(r["value"])["id"] for r in again) == [i for _, i in more]


def test_starting_offsets_latest_and_json(spark: Any, bootstrap: str, tmp_path: Path) -> None:
    topic = f"src-{uuid.uuid4().hex[:6]}"
    kt.create_topic(bootstrap, topic, partitions=2)
    # (Transactional: Tansu 0.6 reports a wrong end offset after a plain multi-record
    # batch, while a transaction ends with a one-record marker batch.)
    produce(bootstrap, topic, [(i % 2, i) for i in range(20)])
    assert run_available_now(spark, bootstrap, topic, tmp_path / "a") == []  # latest
    rows = run_available_now(spark, bootstrap, topic, tmp_path / "b",
                             startingOffsets=json.dumps({topic: {"0": 5, "1": -1}}))
    assert sorted(json.loads(r["value"])["id"] for r in rows) == [10, 12, 14, 16, 18]


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
