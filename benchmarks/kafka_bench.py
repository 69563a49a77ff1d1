"""Kafka sink benchmark on Apache Kafka (a script, not a test): txsink vs Spark's sink.

One generated DataFrame (``--records`` rows of a key and a ``--value-bytes`` value,
``--partitions`` Spark partitions, cached before timing) is written to the same
broker, ``--rounds`` times each and in turn (after ``--warmup`` rounds not counted), by

* Spark's built-in Kafka sink (``spark-sql-kafka-0-10``, at-least-once; its jars
  resolved once with Maven into the local repository, see ``spark_kafka_jars``);
* txsink's Kafka sink (``df.write.format("txsink")``), exactly-once (each write is
  one epoch, committed by the driver through EndTxn) and at-least-once (each task
  commits its own transaction and keeps its producer for the next write); one sink
  id each for all rounds, so later writes can reuse the Python workers' producers;
* a plain confluent-kafka idempotent producer in this process (the same records,
  collected to Arrow first; no Spark, one core);
* a plain confluent-kafka transactional producer in this process, initialised once,
  one transaction per round (begin, produce, commit): what exactly-once costs
  without txsink.

It prints records/s (median of the rounds), the ratios, txsink's per-epoch commit
latency (decide -> committed, p50/p95, from its state store), the per-participant
open cost (from the committables: how long the background open took, and how long
the task waited for it) of the first and later writes, and the load average. Then
it measures the open cost without Spark (one participant per epoch in this process,
a pause between epochs as a pipeline has: begin_transaction start to the first
batch accepted, first vs later epochs), and
reads the sink's output back with the stream source's per-task read path
(``read_range``) and with a plain consumer.

    uv run python benchmarks/kafka_bench.py [--records 300000] [--rounds 5] [--warmup 1]
        [--json results.json]

Starts a local Apache Kafka (``txsink_kafka.local_broker``; ``TXSINK_KAFKA_VERSION``)
unless ``TXSINK_KAFKA_BOOTSTRAP`` names a broker.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, Producer, TopicPartition
from txsink.model import DeliveryGuarantee, TransactionContext
from txsink.state import DirectoryStateStore
from txsink_kafka import testing as kt
from txsink_kafka.backend import KafkaBackend, close_shared_clients
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


@dataclass
class TxsinkWrite:
    """One txsink write: seconds, commit latency (exactly-once only) and, per
    participant, how long its open took (in the background), how long the task
    waited for it, and whether its producer was kept."""

    seconds: float
    commit_s: float | None
    open_ms: list[float]
    wait_ms: list[float]
    reused: int
    #: Per participant: where its task's time went (exactly-once payloads say it).
    phases: list[dict[str, float]] = field(default_factory=list)


def txsink_sink(df: Any, bootstrap: str, topic: str, markers: str, chk: Path, sink_id: str,
                guarantee: str) -> TxsinkWrite:
    """Write ``df`` once more into ``sink_id`` (its own checkpoint under ``chk``)."""
    started = time.perf_counter()
    (df.write.format("txsink").mode("append").option("backend", "kafka")
     .option("sink_id", sink_id).option("checkpointLocation", str(chk / sink_id))
     .option("guarantee", guarantee)
     .option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
     .option("marker.topic", markers).save())
    elapsed = time.perf_counter() - started
    records = DirectoryStateStore(chk / sink_id / "txsink").records()
    record = records[max(records)]
    assert record.committed_at is not None
    payloads = [c.payload for c in record.committables]
    phases = [{"task_ms": (float(p["prepared_at"]) - float(p["began_at"])) * 1000,
               "open_wait_ms": float(p.get("open_wait_ms", 0.0)),
               "write_ms": float(p["write_ms"]), "flush_ms": float(p["flush_ms"])}
              for p in payloads if "write_ms" in p and "began_at" in p]
    return TxsinkWrite(elapsed, record.committed_at - record.decided_at
                       if guarantee == "exactly_once" else None,
                       [float(p.get("open_ms", 0.0)) for p in payloads],
                       [float(p.get("open_wait_ms", 0.0)) for p in payloads],
                       sum(1 for p in payloads if p.get("reused_producer")), phases)


def breakdown(writes: list[TxsinkWrite]) -> dict[str, float] | None:
    """Where an exactly-once write's time goes, medians over ``writes``: its slowest
    task (waiting for its open, for Spark to hand over rows, producing, flushing), the
    driver's commit, and the rest (Spark's job and task scheduling, the driver's epoch
    bookkeeping before the tasks)."""
    rows = []
    for w in writes:
        if not w.phases or w.commit_s is None:
            continue
        slowest = max(w.phases, key=lambda p: p["task_ms"])
        handed = max(0.0, slowest["task_ms"] - slowest["open_wait_ms"] - slowest["write_ms"]
                     - slowest["flush_ms"])
        rows.append({"write_ms": w.seconds * 1000, "task_ms": slowest["task_ms"],
                     "open_wait_ms": slowest["open_wait_ms"],
                     "rows_from_spark_ms": handed, "produce_ms": slowest["write_ms"],
                     "flush_ms": slowest["flush_ms"], "commit_ms": w.commit_s * 1000,
                     "rest_ms": max(0.0, w.seconds * 1000 - slowest["task_ms"]
                                    - w.commit_s * 1000)})
    if not rows:
        return None
    return {k: round(statistics.median(r[k] for r in rows), 1) for k in rows[0]}


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


def transactional_producer(bootstrap: str, errors: list[str]) -> Any:
    """A plain transactional producer, initialised once, as a long-lived app keeps it."""

    def on_delivery(err: object, msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20,
                         "queue.buffering.max.kbytes": 32768, "on_delivery": on_delivery,
                         "transactional.id": f"bench-plain-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(60)
    return producer


def plain_transactional(producer: Any, errors: list[str], topic: str,
                        batches: list[pa.RecordBatch]) -> float:
    """One transaction (begin, produce, commit) of every record; returns seconds."""
    started = time.perf_counter()
    producer.begin_transaction()
    for b in batches:
        for k, v in zip(b.column("key").to_pylist(), b.column("value").to_pylist(),
                        strict=True):
            while True:
                try:
                    producer.produce(topic, v, k)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.poll(0)
    producer.commit_transaction(120)
    elapsed = time.perf_counter() - started
    assert not errors, errors[:3]
    return elapsed


def open_costs(bootstrap: str, topic: str, markers: str, guarantee: DeliveryGuarantee,
               epochs: int, gap_s: float) -> dict[str, Any]:
    """Per-participant open cost without Spark: one participant per epoch in this
    process, ``gap_s`` between epochs (a pipeline's driver round and scheduling).

    Open: begin_transaction start to the first batch accepted by write(); finish:
    pre_commit + the driver's commit (exactly-once) or finish_in_task.
    """
    sink_id = f"bench-open-{guarantee.value}-{uuid.uuid4().hex[:6]}"
    backend = KafkaBackend.from_options({"kafka.bootstrap.servers": bootstrap,
                                         "topic": topic, "marker.topic": markers})
    backend.preflight(sink_id)
    first = pa.record_batch({"key": pa.array([b"k"] * 1000),
                             "value": pa.array([b"v" * 100] * 1000)})
    opened: list[float] = []
    finished: list[float] = []
    try:
        for epoch in range(epochs):
            ctx = TransactionContext(sink_id, epoch, 0)
            started = time.perf_counter()
            txn = backend.begin_transaction(ctx)
            backend.write(txn, first)
            accepted = time.perf_counter()
            if guarantee.transactional:
                backend.commit(backend.pre_commit(txn))
            else:
                backend.finish_in_task(txn, guarantee)
            opened.append((accepted - started) * 1000)
            finished.append((time.perf_counter() - accepted) * 1000)
            time.sleep(gap_s)
    finally:
        backend.close()
    later = opened[1:]
    return {"first_ms": round(opened[0], 1),
            "later_p50_ms": round(statistics.median(later), 1) if later else None,
            "later_p95_ms": round(percentile(later, 0.95), 1) if later else None,
            "finish_p50_ms": round(statistics.median(finished), 1),
            "epochs": epochs, "gap_s": gap_s, "all_ms": [round(x, 1) for x in opened]}


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


NAMES = {"spark": "Spark's Kafka sink (at-least-once)",
         "txsink": "txsink Kafka sink (exactly-once)",
         "txsink_alo": "txsink Kafka sink (at-least-once)",
         "plain": "plain idempotent producer (1 process, no Spark)",
         "plain_txn": "plain transactional producer (1 process, no Spark, 1 txn/write)"}


def run(bootstrap: str, broker: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run every writer ``--rounds`` times, print the tables, return the results."""
    import pyspark

    coordinates, jars = spark_kafka_jars(args.spark_kafka_version or pyspark.__version__)
    load_before = os.getloadavg()
    spark = make_spark(jars, args.partitions)
    txn_errors: list[str] = []
    txn_producer = transactional_producer(bootstrap, txn_errors)
    try:
        df = generate(spark, args.records, args.value_bytes, args.partitions)
        batches = df.toArrow().to_batches(max_chunksize=10_000)
        topics = {name: f"bench-{name}-{uuid.uuid4().hex[:6]}" for name in NAMES}
        for topic in topics.values():
            kt.create_topic(bootstrap, topic, args.partitions)
        markers = f"bench-markers-{uuid.uuid4().hex[:6]}"
        sinks = {"txsink": f"bench-eo-{uuid.uuid4().hex[:6]}",
                 "txsink_alo": f"bench-alo-{uuid.uuid4().hex[:6]}"}
        guarantees = {"txsink": "exactly_once", "txsink_alo": "at_least_once"}
        seconds: dict[str, list[float]] = {name: [] for name in topics}
        commit_s: list[float] = []
        # Per txsink writer, per write (warm-up first).
        opens: dict[str, list[TxsinkWrite]] = {n: [] for n in sinks}
        with tempfile.TemporaryDirectory(prefix="txsink-kafka-bench-") as chk:
            # Warm-up rounds (JIT, Python workers, imports) are printed, not counted.
            for r in range(-args.warmup, args.rounds):
                # Rotate who goes first so broker warm-up and page cache favour no one.
                order = list(NAMES)
                took: dict[str, float] = {}
                for name in order[r % len(order):] + order[:r % len(order)]:
                    if name == "spark":
                        took[name] = spark_sink(df, bootstrap, topics[name])
                    elif name in sinks:
                        w = txsink_sink(df, bootstrap, topics[name], markers, Path(chk),
                                        sinks[name], guarantees[name])
                        took[name] = w.seconds
                        opens[name].append(w)
                        if r >= 0 and w.commit_s is not None:
                            commit_s.append(w.commit_s)
                    elif name == "plain":
                        took[name] = plain_producer(bootstrap, topics[name], batches)
                    else:
                        took[name] = plain_transactional(txn_producer, txn_errors,
                                                         topics[name], batches)
                if r >= 0:
                    for name, sec in took.items():
                        seconds[name].append(sec)
                label = "warm-up" if r < 0 else f"round {r + 1}/{args.rounds}"
                print(f"{label}: " + ", ".join(f"{n} {sec:.1f}s" for n, sec in took.items()),
                      flush=True)
    finally:
        spark.stop()
        del txn_producer
    gap = args.open_gap_ms / 1000
    direct = {g.value: open_costs(bootstrap, topics["txsink"], markers, g, args.open_epochs,
                                  gap)
              for g in (DeliveryGuarantee.EXACTLY_ONCE, DeliveryGuarantee.AT_LEAST_ONCE)}
    load_after = os.getloadavg()
    writes = args.rounds + args.warmup
    expected = args.records * writes
    # Spark's sink is at-least-once: at least every record; txsink's: exactly, and
    # read_committed sees them all (control records take offsets too).
    assert end_offsets(bootstrap, topics["spark"], "read_uncommitted") >= expected
    assert end_offsets(bootstrap, topics["plain"], "read_uncommitted") == expected
    for name in ("txsink", "txsink_alo", "plain_txn"):
        committed = end_offsets(bootstrap, topics[name], "read_committed")
        assert committed >= expected, (name, committed, expected)
    rate = {n: args.records / statistics.median(sec) for n, sec in seconds.items()}
    commits_ms = [c * 1000 for c in commit_s]
    print(f"\nbroker: {broker}; PySpark {pyspark.__version__}, Spark's sink from "
          f"{coordinates}")
    print(f"records per write: {args.records:,} x {args.value_bytes} B values, "
          f"{args.partitions} partitions, {args.rounds} rounds (median)")
    print(f"load average (1/5/15 min): before {_load(load_before)}, after {_load(load_after)}"
          f" on {os.cpu_count()} cores")
    print("| writer | records/s | vs Spark's Kafka sink | vs plain producer | "
          "vs plain transactional |")
    print("|---|---:|---:|---:|---:|")
    for n in NAMES:
        print(f"| {NAMES[n]} | {rate[n]:,.0f} | {rate[n] / rate['spark']:.2f} | "
              f"{rate[n] / rate['plain']:.2f} | {rate[n] / rate['plain_txn']:.2f} |")
    ratios = {"txsink_vs_spark": rate["txsink"] / rate["spark"],
              "txsink_vs_plain_transactional": rate["txsink"] / rate["plain_txn"],
              "txsink_alo_vs_spark": rate["txsink_alo"] / rate["spark"],
              "txsink_alo_vs_txsink": rate["txsink_alo"] / rate["txsink"],
              "txsink_vs_plain": rate["txsink"] / rate["plain"]}
    print(f"txsink / Spark's Kafka sink = {ratios['txsink_vs_spark']:.2f} (target >= 0.8)")
    print(f"txsink / plain transactional producer = "
          f"{ratios['txsink_vs_plain_transactional']:.2f} (target >= 0.9)")
    print(f"txsink at-least-once / exactly-once = {ratios['txsink_alo_vs_txsink']:.2f}")
    commit = {"p50_ms": percentile(commits_ms, 0.5), "p95_ms": percentile(commits_ms, 0.95),
              "n": len(commits_ms)}
    print(f"txsink per-epoch commit latency (decided -> committed): p50 "
          f"{commit['p50_ms']:.0f} ms, p95 {commit['p95_ms']:.0f} ms (n={commit['n']})")
    spark_open: dict[str, Any] = {}
    for name, per_write in opens.items():
        first = per_write[0]
        later = [ms for w in per_write[1:] for ms in w.open_ms]
        waited = [ms for w in per_write[1:] for ms in w.wait_ms]
        reused = sum(w.reused for w in per_write[1:])
        spark_open[guarantees[name]] = {
            "first_write_open_ms": [round(x, 1) for x in first.open_ms],
            "first_write_wait_ms": [round(x, 1) for x in first.wait_ms],
            "later_open_p50_ms": round(statistics.median(later), 1) if later else None,
            "later_open_p95_ms": round(percentile(later, 0.95), 1) if later else None,
            "later_wait_p50_ms": round(statistics.median(waited), 1) if waited else None,
            "later_wait_p95_ms": round(percentile(waited, 0.95), 1) if waited else None,
            "later_participants": len(later), "later_reused_producers": reused}
        o = spark_open[guarantees[name]]
        print(f"txsink {guarantees[name]} in Spark, per participant: open (background) "
              f"first write {', '.join(f'{x:.0f}' for x in first.open_ms)} ms, later p50 "
              f"{o['later_open_p50_ms']} / p95 {o['later_open_p95_ms']} ms; the task "
              f"waited for it: first {', '.join(f'{x:.0f}' for x in first.wait_ms)} ms, "
              f"later p50 {o['later_wait_p50_ms']} / p95 {o['later_wait_p95_ms']} ms "
              f"({reused} of {len(later)} later participants on a kept producer)")
    split = breakdown(opens["txsink"][1:])
    if split is not None:
        print(f"where an exactly-once write's {split['write_ms']:.0f} ms go (medians): its "
              f"slowest task {split['task_ms']:.0f} ms = open wait {split['open_wait_ms']:.0f}"
              f" + rows handed over by Spark {split['rows_from_spark_ms']:.0f} + producing "
              f"{split['produce_ms']:.0f} + flushing {split['flush_ms']:.0f}; the driver's "
              f"commit {split['commit_ms']:.0f} ms; the rest (Spark's job and task "
              f"scheduling, the epoch's bookkeeping) {split['rest_ms']:.0f} ms; a plain "
              f"transactional producer's write {statistics.median(seconds['plain_txn']) * 1000:.0f}"
              " ms")
    for g, o in direct.items():
        print(f"txsink {g} without Spark ({o['epochs']} epochs, {args.open_gap_ms} ms apart), "
              f"begin_transaction start -> first batch accepted: first {o['first_ms']} ms, "
              f"later p50 {o['later_p50_ms']} ms, p95 {o['later_p95_ms']} ms "
              f"(target <= 10 ms); finish p50 {o['finish_p50_ms']} ms")
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
    return {
        "benchmark": "kafka", "broker": broker, "pyspark": pyspark.__version__,
        "spark_kafka": coordinates, "records": args.records,
        "value_bytes": args.value_bytes, "partitions": args.partitions,
        "rounds": args.rounds, "warmup": args.warmup, "cores": os.cpu_count(),
        "load_average": {"before": list(load_before), "after": list(load_after)},
        "writers": {n: {"label": NAMES[n], "records_per_s": rate[n], "seconds": seconds[n]}
                    for n in NAMES},
        "ratios": ratios, "commit_latency": commit,
        "open_cost": {"spark": spark_open, "direct": direct},
        "exactly_once_breakdown_ms": split,
        "read_back": {"records": plain_n, "plain_consumer_records_per_s": plain_n / plain_s,
                      "source_read_range_records_per_s": source_n / source_s},
    }


def _load(avg: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.1f}" for x in avg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="rounds not counted")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--open-epochs", type=int, default=8,
                        help="epochs of the open-cost measurement without Spark")
    parser.add_argument("--open-gap-ms", type=int, default=100,
                        help="pause between those epochs (a pipeline's driver round)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                        help="also write the results as JSON to PATH")
    parser.add_argument("--spark-kafka-version", default=None,
                        help="spark-sql-kafka-0-10_2.13 release (default: PySpark's, "
                             f"else {SPARK_KAFKA_FALLBACK})")
    args = parser.parse_args()
    external = os.environ.get(kt.ENV_BOOTSTRAP)
    if external:
        results = run(external, f"external at {external}", args)
    else:
        workdir = Path(tempfile.mkdtemp(prefix="txsink-kafka-bench-broker-"))
        kafka = LocalKafka(workdir, heap="1g")
        try:
            kafka.start()
            results = run(kafka.bootstrap, kafka.describe(), args)
        finally:
            close_shared_clients()
            kafka.stop()
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
        print(f"results written to {args.json}")


if __name__ == "__main__":
    main()
