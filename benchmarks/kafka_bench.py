"""Kafka sink benchmark on Apache Kafka (a script, not a test): txsink vs Spark's sink.

One generated DataFrame (``--records`` rows of a key and a ``--value-bytes`` value,
``--partitions`` Spark partitions, cached before timing) is written to the same
broker, ``--rounds`` times each and in turn (after ``--warmup`` rounds not counted), by

* Spark's built-in Kafka sink (``spark-sql-kafka-0-10``, at-least-once; its jars
  resolved once with Maven into the local repository, see ``spark_kafka_jars``);
* txsink's Kafka sink (``df.write.format("txsink")``, exactly-once: each write is
  one epoch, committed by the driver through EndTxn);
* a plain confluent-kafka idempotent producer in this process (the same records,
  collected to Arrow first; no Spark, one core).

It prints records/s (median of the rounds), the ratios, txsink's per-epoch commit
latency (decide -> committed, p50/p95, from its state store), and the load average.
Then it reads the sink's output back with the stream source's per-task read path
(``read_range``) and with a plain consumer.

    uv run python benchmarks/kafka_bench.py [--records 300000] [--rounds 5] [--warmup 1]

Starts a local Apache Kafka (``txsink_kafka.local_broker``; ``TXSINK_KAFKA_VERSION``)
unless ``TXSINK_KAFKA_BOOTSTRAP`` names a broker.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, Producer, TopicPartition
from txsink.state import DirectoryStateStore
from txsink_kafka import testing as kt
from txsink_kafka.backend import close_shared_clients
from txsink_kafka.local_broker import BrokerUnavailable, LocalKafka, maven_classpath

#: Spark's Kafka connector for the installed PySpark first; if Maven Central does not
#: have that release (yet), the newest one checked to run with it.
SPARK_KAFKA_FALLBACK = "4.2.0"


def spark_kafka_jars(spark_version: str) -> tuple[str, list[str]]:
    """(coordinates, jars) of ``spark-sql-kafka-0-10_2.13`` and the dependencies
    PySpark does not ship; cached, so a second run needs no network."""
    import pyspark

    shipped = {_artifact(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    errors = []
    for version in dict.fromkeys([spark_version, SPARK_KAFKA_FALLBACK]):
        coordinates = f"org.apache.spark:spark-sql-kafka-0-10_2.13:{version}"
        try:
            jars = maven_classpath(f"spark-sql-kafka/{version}", [
                ("org.apache.spark", "spark-sql-kafka-0-10_2.13", version)])
        except BrokerUnavailable as exc:
            errors.append(str(exc).splitlines()[0])
            continue
        return coordinates, [j for j in jars if _artifact(Path(j).name) not in shipped]
    raise SystemExit("Spark's Kafka connector could not be resolved: " + "; ".join(errors))


def _artifact(jar_name: str) -> str:
    match = re.match(r"(.+?)-\d", jar_name)
    return match[1] if match else jar_name


def make_spark(jars: list[str], partitions: int) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession
    from txsink.spark import register

    spark = (SparkSession.builder.master(f"local[{partitions}]").appName("kafka-bench")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.memory", "2g")
             .config("spark.jars", ",".join(jars)).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def generate(spark: Any, records: int, value_bytes: int, partitions: int) -> Any:
    pad = max(0, value_bytes - 12)
    df = spark.range(0, records, 1, partitions).selectExpr(
        "CAST(CAST(id AS STRING) AS BINARY) AS key",
        f"CAST(concat(lpad(CAST(id AS STRING), 12, '0'), repeat('x', {pad})) AS BINARY) "
        "AS value").cache()
    assert df.count() == records
    return df


def spark_sink(df: Any, bootstrap: str, topic: str) -> float:
    started = time.perf_counter()
    (df.write.format("kafka").option("kafka.bootstrap.servers", bootstrap)
     .option("topic", topic).save())
    return time.perf_counter() - started


def txsink_sink(df: Any, bootstrap: str, topic: str, markers: str, chk: Path
                ) -> tuple[float, float]:
    """Seconds for the write, and the epoch's commit latency (decided -> committed)."""
    sink_id = f"bench-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    (df.write.format("txsink").mode("append").option("backend", "kafka")
     .option("sink_id", sink_id).option("checkpointLocation", str(chk / sink_id))
     .option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
     .option("marker.topic", markers).save())
    elapsed = time.perf_counter() - started
    (record,) = DirectoryStateStore(chk / sink_id / "txsink").records().values()
    assert record.committed_at is not None
    return elapsed, record.committed_at - record.decided_at


def plain_producer(bootstrap: str, topic: str, batches: list[pa.RecordBatch]) -> float:
    """A plain idempotent producer, the sink's producer settings; returns seconds."""
    errors: list[str] = []

    def on_delivery(err: object, msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "acks": "all", "linger.ms": 20, "queue.buffering.max.kbytes": 32768,
                         "on_delivery": on_delivery})
    started = time.perf_counter()
    for b in batches:
        for k, v in zip(b.column("key").to_pylist(), b.column("value").to_pylist(),
                        strict=True):
            while True:
                try:
                    producer.produce(topic, v, k)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.05)
        producer.poll(0)
    while producer.flush(1.0):
        pass
    elapsed = time.perf_counter() - started
    assert not errors, errors[:3]
    return elapsed


def end_offsets(bootstrap: str, topic: str, isolation: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench",
                         "isolation.level": isolation})
    try:
        md = consumer.list_topics(topic, timeout=30)
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), 30)[1]
                   for p in md.topics[topic].partitions)
    finally:
        consumer.close()


def plain_read(bootstrap: str, topic: str, partition: int, until: int) -> tuple[int, float]:
    from confluent_kafka import KafkaError

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, partition, 0)])
    count = 0
    started = time.perf_counter()
    done = False
    while not done:
        for msg in consumer.consume(5000, 0.2):
            err = msg.error()
            if err is not None:
                done = err.code() == KafkaError._PARTITION_EOF
                if done:
                    break
                raise RuntimeError(err.str())
            count += 1
            if (msg.offset() or 0) >= until - 1:
                done = True
                break
    elapsed = time.perf_counter() - started
    consumer.close()
    return count, elapsed


def source_read(bootstrap: str, topic: str, partition: int, until: int) -> tuple[int, float]:
    from txsink_kafka.source import KafkaInputPartition, SourceSettings, read_range

    settings = SourceSettings.parse({"kafka.bootstrap.servers": bootstrap, "subscribe": topic})
    started = time.perf_counter()
    count = sum(b.num_rows for b in read_range(
        settings, KafkaInputPartition(topic, partition, 0, until)))
    return count, time.perf_counter() - started


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(bootstrap: str, broker: str, args: argparse.Namespace) -> None:
    import pyspark

    coordinates, jars = spark_kafka_jars(args.spark_kafka_version or pyspark.__version__)
    load_before = os.getloadavg()
    spark = make_spark(jars, args.partitions)
    try:
        df = generate(spark, args.records, args.value_bytes, args.partitions)
        batches = df.toArrow().to_batches(max_chunksize=10_000)
        topics = {name: f"bench-{name}-{uuid.uuid4().hex[:6]}"
                  for name in ("spark", "txsink", "plain")}
        for topic in topics.values():
            kt.create_topic(bootstrap, topic, args.partitions)
        markers = f"bench-markers-{uuid.uuid4().hex[:6]}"
        seconds: dict[str, list[float]] = {name: [] for name in topics}
        commit_s: list[float] = []
        with tempfile.TemporaryDirectory(prefix="txsink-kafka-bench-") as chk:
            # Warm-up rounds (JIT, Python workers, imports) are printed, not counted.
            for r in range(-args.warmup, args.rounds):
                # Rotate who goes first so broker warm-up and page cache favour no one.
                order = ["spark", "txsink", "plain"]
                took: dict[str, float] = {}
                for name in order[r % 3:] + order[:r % 3]:
                    if name == "spark":
                        took[name] = spark_sink(df, bootstrap, topics[name])
                    elif name == "txsink":
                        took[name], commit = txsink_sink(df, bootstrap, topics[name], markers,
                                                         Path(chk))
                        if r >= 0:
                            commit_s.append(commit)
                    else:
                        took[name] = plain_producer(bootstrap, topics[name], batches)
                if r >= 0:
                    for name, s in took.items():
                        seconds[name].append(s)
                label = "warm-up" if r < 0 else f"round {r + 1}/{args.rounds}"
                print(f"{label}: " + ", ".join(f"{n} {s:.1f}s" for n, s in took.items()),
                      flush=True)
    finally:
        spark.stop()
    load_after = os.getloadavg()
    expected = args.records * (args.rounds + args.warmup)
    # Spark's sink is at-least-once: at least every record; txsink's: exactly, and
    # read_committed sees them all (control records take offsets too).
    assert end_offsets(bootstrap, topics["spark"], "read_uncommitted") >= expected
    assert end_offsets(bootstrap, topics["plain"], "read_uncommitted") == expected
    committed = end_offsets(bootstrap, topics["txsink"], "read_committed")
    assert committed >= expected, (committed, expected)
    rate = {n: args.records / statistics.median(s) for n, s in seconds.items()}
    commits_ms = [c * 1000 for c in commit_s]
    print(f"\nbroker: {broker}; PySpark {pyspark.__version__}, Spark's sink from "
          f"{coordinates}")
    print(f"records per write: {args.records:,} x {args.value_bytes} B values, "
          f"{args.partitions} partitions, {args.rounds} rounds (median)")
    print(f"load average (1/5/15 min): before {_load(load_before)}, after {_load(load_after)}"
          f" on {os.cpu_count()} cores")
    print("| writer | records/s | vs Spark's Kafka sink | vs plain producer |")
    print("|---|---:|---:|---:|")
    names = {"spark": "Spark's Kafka sink (at-least-once)",
             "txsink": "txsink Kafka sink (exactly-once)",
             "plain": "plain idempotent producer (1 process, no Spark)"}
    for n in ("spark", "txsink", "plain"):
        print(f"| {names[n]} | {rate[n]:,.0f} | {rate[n] / rate['spark']:.2f} | "
              f"{rate[n] / rate['plain']:.2f} |")
    print(f"txsink / Spark's Kafka sink = {rate['txsink'] / rate['spark']:.2f} "
          "(target >= 0.8)")
    print(f"txsink per-epoch commit latency (decided -> committed): p50 "
          f"{percentile(commits_ms, 0.5):.0f} ms, p95 {percentile(commits_ms, 0.95):.0f} ms "
          f"(n={len(commits_ms)})")
    partition = 0
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench",
                       "isolation.level": "read_committed"})
    try:
        until = reader.get_watermark_offsets(TopicPartition(topics["txsink"], partition),
                                             30)[1]
    finally:
        reader.close()
    plain_n, plain_s = plain_read(bootstrap, topics["txsink"], partition, until)
    source_n, source_s = source_read(bootstrap, topics["txsink"], partition, until)
    assert plain_n == source_n, (plain_n, source_n)
    print(f"read back one partition ({plain_n:,} records): plain consumer "
          f"{plain_n / plain_s:,.0f} records/s, txsink source read_range "
          f"{source_n / source_s:,.0f} records/s (ratio {plain_s / source_s:.2f})")


def _load(avg: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.1f}" for x in avg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="rounds not counted")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--spark-kafka-version", default=None,
                        help="spark-sql-kafka-0-10_2.13 release (default: PySpark's, "
                             f"else {SPARK_KAFKA_FALLBACK})")
    args = parser.parse_args()
    external = os.environ.get(kt.ENV_BOOTSTRAP)
    if external:
        run(external, f"external at {external}", args)
        return
    workdir = Path(tempfile.mkdtemp(prefix="txsink-kafka-bench-broker-"))
    kafka = LocalKafka(workdir, heap="1g")
    try:
        kafka.start()
        run(kafka.bootstrap, kafka.describe(), args)
    finally:
        close_shared_clients()
        kafka.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
