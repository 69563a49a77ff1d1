"""Append-to-visible latency of Spark Real-time Mode sinks, in one run.

For every writer and input rate, a fresh source topic (two partitions, broker
``LogAppendTime`` timestamps) is fed at a steady rate while the query runs; each
output row carries its source record's append time, and its visibility time is:

* Kafka targets: when an independent ``read_committed`` consumer (polling with
  ``fetch.wait.max.ms=10``) receives it;
* PostgreSQL: the commit timestamp of the transaction that inserted it
  (``track_commit_timestamp=on``: ``pg_xact_commit_timestamp(xmin)``).

Writers (the same broker, database and Spark session):

* ``txsink-rt-kafka`` / ``txsink-rt-postgres``: ``txsink.spark.realtime`` (exactly once);
* ``spark-rt-kafka``: Spark's own Kafka sink in Real-time Mode (at-least-once);
* ``txsink-mb-kafka``: txsink's micro-batch sink (``format("txsink")``), exactly once,
  Spark's default trigger (the next batch as soon as one ends).

Broker, database, Spark and the producer share the machine's cores, so figures are for
comparison within a run. ``--json PATH`` writes the result for ``report.py``-style
tooling::

    uv run python benchmarks/realtime_bench.py --rates 1000,10000 --seconds 20 \\
        --json out/realtime.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kafka_bench import spark_kafka_jars
from txsink.realtime.writer import DEFAULT_COMMIT_INTERVAL_S
from txsink_kafka import testing as kt

WRITERS = ("txsink-rt-kafka", "txsink-rt-postgres", "spark-rt-kafka", "txsink-mb-kafka")
GUARANTEE = {"txsink-rt-kafka": "exactly-once", "txsink-rt-postgres": "exactly-once",
             "spark-rt-kafka": "at-least-once", "txsink-mb-kafka": "exactly-once"}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def make_spark(jars: list[str], batch: str, buffer_size: int | None = None) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession
    from txsink.config import duration_ms
    from txsink.spark import register

    builder = (SparkSession.builder.master("local[2]").appName("realtime-bench")
               # Spark refuses real-time batches shorter than this (5 s by default).
               .config("spark.sql.streaming.realTimeMode.minBatchDuration",
                     str(min(5000, duration_ms(batch))))
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2"))
    if buffer_size is not None:
        # The JVM's buffered stream to a Python worker: rows for a foreach writer wait in
        # it until it fills (64 KiB by default) or the batch ends.
        builder = builder.config("spark.buffer.size", str(buffer_size))
    spark = builder.config("spark.jars", ",".join(jars)).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


class Feed:
    """Appends records to ``topic`` at ``rate`` per second from a thread."""

    def __init__(self, bootstrap: str, topic: str, rate: int, seconds: float) -> None:
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2})
        self.topic, self.rate, self.seconds = topic, rate, seconds
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        start = time.monotonic()
        while (elapsed := time.monotonic() - start) < self.seconds:
            due = int(elapsed * self.rate)
            while self.sent < due:
                self.producer.produce(self.topic, str(self.sent).encode(),
                                      partition=self.sent % 2)
                self.sent += 1
            self.producer.poll(0)
            time.sleep(0.005)
        self.producer.flush(60)

    def one(self, marker: str) -> None:
        self.producer.produce(self.topic, marker.encode(), partition=0)
        self.producer.flush(30)


class KafkaWatch:
    """``read_committed`` consumer recording (append time, receive time) per record."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                                  "isolation.level": "read_committed",
                                  "enable.auto.commit": False, "fetch.wait.max.ms": 10,
                                  "auto.offset.reset": "earliest"})
        parts = self.consumer.list_topics(topic, timeout=30).topics[topic].partitions
        self.consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            for msg in self.consumer.consume(1000, 0.05):
                if msg.error() is None and msg.value():
                    self.samples.append((float(msg.value()), time.time()))

    def count(self) -> int:
        return len(self.samples)

    def close(self) -> list[tuple[float, float]]:
        self.stop.set()
        self.thread.join(10)
        self.consumer.close()
        return self.samples


def wait_for(probe: Callable[[], int], want: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while probe() < want:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@contextlib.contextmanager
def services(work: Path) -> Iterator[tuple[str, Any]]:
    from txsink_postgres import testing as pgtesting

    with kt.kafka_for_tests(work / "kafka" / "broker.log", tansu_ok=False) as (bootstrap, _, _):
        pg = pgtesting.LocalPostgres(max_prepared_transactions=16)
        pg.start()
        try:
            pg.restart(track_commit_timestamp="on")
            yield bootstrap, pg
        finally:
            pg.stop()


def measure(spark: Any, bootstrap: str, pg: Any, writer: str, rate: int, seconds: float,
            work: Path, batch: str, commit_interval: float) -> dict[str, Any]:
    import psycopg
    from txsink.spark.realtime import start_realtime

    tag = uuid.uuid4().hex[:6]
    src, out = f"rb-src-{tag}", f"rb-out-{tag}"
    kt.create_topic(bootstrap, src, partitions=2,
                    config={"message.timestamp.type": "LogAppendTime"})
    kt.create_topic(bootstrap, out, partitions=2)
    table = f"public.rb_{tag}"
    with psycopg.connect(pg.dsn, password=pg.password, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (value text)")
    source = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", src).option("startingOffsets", "earliest").load())
    stamped = source.selectExpr("CAST(CAST(timestamp AS DOUBLE) AS STRING) AS value",
                                "topic", "partition", "offset")
    chk = str(work / f"chk-{tag}")
    if writer == "txsink-rt-kafka":
        query = start_realtime(stamped, sink_id=f"rb-{tag}", backend="kafka", options={
            "topic": out, "kafka.bootstrap.servers": bootstrap,
            "progress.topic": f"rb-{tag}-progress"}, checkpoint_location=chk, trigger=batch,
            commit_interval=commit_interval)
    elif writer == "txsink-rt-postgres":
        query = start_realtime(stamped, sink_id=f"rb-{tag}", backend="postgres", options={
            "dsn": pg.dsn, "password": pg.password, "table": table},
            checkpoint_location=chk, trigger=batch, commit_interval=commit_interval)
    elif writer == "spark-rt-kafka":
        query = (stamped.select("value").writeStream.format("kafka").outputMode("update")
                 .option("kafka.bootstrap.servers", bootstrap).option("topic", out)
                 .option("checkpointLocation", chk).trigger(realTime=batch).start())
    else:
        markers = f"rb-{tag}-markers"
        kt.create_topic(bootstrap, markers, compacted=True)
        query = (stamped.select("value").writeStream.format("txsink")
                 .option("backend", "kafka").option("sink_id", f"rb-{tag}")
                 .option("kafka.bootstrap.servers", bootstrap).option("topic", out)
                 .option("marker.topic", markers).option("checkpointLocation", chk).start())

    def pg_count() -> int:
        with psycopg.connect(pg.dsn, password=pg.password, autocommit=True) as conn:
            return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])

    watch = KafkaWatch(bootstrap, out) if writer != "txsink-rt-postgres" else None
    count = watch.count if watch is not None else pg_count
    feed = Feed(bootstrap, src, rate, seconds)
    try:
        feed.one("warmup")  # the first row seen: the query runs and the path is warm
        if not wait_for(count, 1, 300):
            raise RuntimeError(f"{writer}: the warm-up record never became visible")
        feed.thread.start()
        feed.thread.join()
        complete = wait_for(count, feed.sent + 1, 120)
    finally:
        query.stop()
    error = query.exception()
    if watch is not None:
        samples = watch.close()
    else:
        with psycopg.connect(pg.dsn, password=pg.password, autocommit=True) as conn:
            samples = [(float(v), ts.timestamp()) for v, ts in conn.execute(
                f"SELECT value, pg_xact_commit_timestamp(xmin) FROM {table}")]
    start_cut = min(a for a, _ in samples) + 1.0  # the warm-up record and the first second
    lat = [seen - appended for appended, seen in samples if appended > start_cut]
    return {"writer": writer, "guarantee": GUARANTEE[writer], "rate": rate,
            "seconds": seconds, "sent": feed.sent, "visible": len(samples) - 1,
            "complete": complete, "error": str(error) if error else None,
            "samples": len(lat), "p50_s": round(percentile(lat, 0.5), 4) if lat else None,
            "p99_s": round(percentile(lat, 0.99), 4) if lat else None,
            "max_s": round(max(lat), 4) if lat else None,
            "mean_s": round(statistics.fmean(lat), 4) if lat else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="1000,10000")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--batch", default="5 seconds", help="real-time batch length")
    parser.add_argument("--writers", default=",".join(WRITERS))
    parser.add_argument("--commit-interval", type=float, default=DEFAULT_COMMIT_INTERVAL_S,
                        help="txsink real-time commit interval in seconds")
    parser.add_argument("--buffer-size", type=int, default=None,
                        help="spark.buffer.size in bytes (Spark's default: 65536)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rates = [int(r) for r in args.rates.split(",")]
    writers = [w for w in args.writers.split(",") if w]
    import pyspark

    coordinates, jars = spark_kafka_jars(pyspark.__version__)
    results: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="realtime-bench-") as tmp, \
            services(Path(tmp)) as (bootstrap, pg):
        spark = make_spark(jars, args.batch, args.buffer_size)
        try:
            for rate in rates:
                for writer in writers:
                    row = measure(spark, bootstrap, pg, writer, rate, args.seconds,
                                  Path(tmp), args.batch, args.commit_interval)
                    print(json.dumps(row), flush=True)
                    results.append(row)
        finally:
            spark.stop()
    ratios = {}
    for rate in rates:
        base = next((r["p99_s"] for r in results
                     if r["writer"] == "spark-rt-kafka" and r["rate"] == rate), None)
        for r in results:
            if r["rate"] == rate and base and r["p99_s"] is not None:
                ratios[f"{r['writer']}@{rate}"] = round(r["p99_s"] / base, 2)
    doc = {"info": {"machine": platform.machine(), "cpus": os.cpu_count(),
                    "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                    "pyspark": pyspark.__version__, "connector": coordinates,
                    "batch": args.batch, "seconds": args.seconds,
                    "spark_buffer_size": args.buffer_size,
                    "commit_interval_s": args.commit_interval,
                    "command": " ".join(["benchmarks/realtime_bench.py", *(argv or sys.argv[1:])])},
           "results": results, "p99_ratio_to_spark_at_least_once": ratios,
           "goal_p99_s": 1.0}
    print(json.dumps(doc["p99_ratio_to_spark_at_least_once"]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
