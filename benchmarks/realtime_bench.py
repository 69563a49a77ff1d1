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

#: The source topic's partitions (one task slot each on local[2]).
PARTITIONS = 2
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
                                      partition=self.sent % PARTITIONS)
                self.sent += 1
            self.producer.poll(0)
            time.sleep(0.005)
        self.producer.flush(60)

    def warm_up(self) -> int:
        """One record into each source partition (each is claimed before the measured
        records come); how many."""
        for partition in range(PARTITIONS):
            self.producer.produce(self.topic, b"warm-up", partition=partition)
        self.producer.flush(30)
        return PARTITIONS


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
        self.samples: list[tuple[str, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            for msg in self.consumer.consume(1000, 0.05):
                if msg.error() is None and msg.value():
                    self.samples.append((msg.value().decode(), time.time()))

    def count(self) -> int:
        return len(self.samples)

    def close(self) -> list[tuple[str, float]]:
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
            work: Path, batch: str, commit_interval: float,
            trace: Path | None = None) -> dict[str, Any]:
    import psycopg
    from txsink.spark.realtime import start_realtime

    tag = uuid.uuid4().hex[:6]
    src, out = f"rb-src-{tag}", f"rb-out-{tag}"
    kt.create_topic(bootstrap, src, partitions=PARTITIONS,
                    config={"message.timestamp.type": "LogAppendTime"})
    kt.create_topic(bootstrap, out, partitions=2)
    table = f"public.rb_{tag}"
    with psycopg.connect(pg.dsn, password=pg.password, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (value text)")
    source = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", src).option("startingOffsets", "earliest").load())
    # Each output row says when its record was appended and where it was read (the
    # breakdown joins it with the writers' trace by source partition and offset).
    stamped = source.selectExpr(
        "concat_ws(' ', CAST(CAST(timestamp AS DOUBLE) AS STRING), CAST(partition AS STRING), "
        "CAST(offset AS STRING)) AS value", "topic", "partition", "offset")
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
        # The first rows seen: the query runs, and every source partition is claimed.
        warm = feed.warm_up()
        if not wait_for(count, warm, 300):
            raise RuntimeError(f"{writer}: the warm-up records never became visible")
        feed.thread.start()
        feed.thread.join()
        complete = wait_for(count, feed.sent + warm, 120)
    finally:
        query.stop()
    error = query.exception()
    if watch is not None:
        raw = watch.close()
    else:
        with psycopg.connect(pg.dsn, password=pg.password, autocommit=True) as conn:
            raw = [(str(v), ts.timestamp()) for v, ts in conn.execute(
                f"SELECT value, pg_xact_commit_timestamp(xmin) FROM {table}")]
    samples = [Sample.parse(value, seen) for value, seen in raw]
    start_cut = max(sorted(s.appended for s in samples)[:warm]) + 1.0  # warm-up, first second
    kept = [s for s in samples if s.appended > start_cut]
    lat = [s.latency for s in kept]
    row = {"writer": writer, "guarantee": GUARANTEE[writer], "rate": rate,
           "seconds": seconds, "sent": feed.sent, "visible": len(samples) - warm,
           "distinct": len({(s.partition, s.offset) for s in samples}),
           "complete": complete, "error": str(error) if error else None,
           "samples": len(lat), "p50_s": round(percentile(lat, 0.5), 4) if lat else None,
           "p99_s": round(percentile(lat, 0.99), 4) if lat else None,
           "max_s": round(max(lat), 4) if lat else None,
           "mean_s": round(statistics.fmean(lat), 4) if lat else None,
           "loadavg": [round(x, 2) for x in os.getloadavg()]}
    if trace is not None and writer.startswith("txsink-rt"):
        row["breakdown"] = breakdown(kept, read_trace(trace, src))
    return row


class Sample:
    """One visible output row: its record's append time and source position, and when
    a reader saw it."""

    __slots__ = ("appended", "offset", "partition", "seen")

    def __init__(self, appended: float, partition: int, offset: int, seen: float) -> None:
        self.appended, self.partition, self.offset, self.seen = appended, partition, offset, seen

    @classmethod
    def parse(cls, value: str, seen: float) -> Sample:
        parts = value.split()
        if len(parts) == 3:
            return cls(float(parts[0]), int(parts[1]), int(parts[2]), seen)
        return cls(float(parts[0]), -1, -1, seen)  # a row of another shape

    @property
    def latency(self) -> float:
        return self.seen - self.appended


def read_trace(folder: Path, topic: str) -> dict[tuple[int, int], dict[str, float]]:
    """(source partition, offset) -> when the row reached the writer, when its task
    opened, when its commit began and ended (``TXSINK_REALTIME_TRACE``'s lines)."""
    out: dict[tuple[int, int], dict[str, float]] = {}
    for path in folder.glob("writer-*.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if "offsets" not in rec or not str(rec["source"]).startswith(f"{topic}-"):
                continue
            for offset, arrived in zip(rec["offsets"], rec["arrivals"], strict=True):
                out[(int(rec["partition"]), int(offset))] = {
                    "opened": rec["opened"], "arrived": arrived, "began": rec["began"],
                    "ended": rec["ended"]}
    return out


#: The stages of a row's way from append to visible, in order (``breakdown``).
STAGES = ("batch boundary", "Spark to the Python writer", "waiting for the commit",
          "the commit (records, marker, EndTxn)", "commit end to visible")


def breakdown(samples: list[Sample],
              trace: dict[tuple[int, int], dict[str, float]]) -> dict[str, Any]:
    """Where each row's time went, from the writers' trace: p50/p99 of each stage over
    every row, and the mean of each stage over the slowest 1 % of rows (what makes the
    p99). A row appended before its task opened waited for the batch boundary first."""
    parts: list[tuple[float, list[float]]] = []
    for s in samples:
        t = trace.get((s.partition, s.offset))
        if t is None:
            continue
        boundary = max(0.0, t["opened"] - s.appended)
        parts.append((s.latency, [boundary, t["arrived"] - s.appended - boundary,
                                  t["began"] - t["arrived"], t["ended"] - t["began"],
                                  s.seen - t["ended"]]))
    if not parts:
        return {"rows": 0}
    slow = sorted(parts, key=lambda p: p[0])[int(0.99 * len(parts)):]
    first = min(s.appended for s in samples)
    # When the slowest rows were appended (seconds into the run): one stall, or many?
    when = sorted({round(t - first, 1) for t in (
        s.appended for s in samples if s.latency >= slow[0][0])})
    return {"rows": len(parts), "slowest_appended_at_s": when[:40], "stages": {
        name: {"p50_s": round(percentile([p[1][i] for p in parts], 0.5), 4),
               "p99_s": round(percentile([p[1][i] for p in parts], 0.99), 4),
               "slowest_1pct_mean_s": round(statistics.fmean(p[1][i] for p in slow), 4)}
        for i, name in enumerate(STAGES)},
        "slowest_1pct_total_mean_s": round(statistics.fmean(p[0] for p in slow), 4)}


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
    parser.add_argument("--breakdown", action="store_true",
                        help="trace txsink's writers (TXSINK_REALTIME_TRACE) and break each "
                        "row's latency down by stage")
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
        trace = None
        if args.breakdown:
            from txsink.spark.realtime import TRACE_ENV

            # A folder given in the variable is kept (for a closer look); else a temporary one.
            trace = Path(os.environ.get(TRACE_ENV) or Path(tmp) / "trace")
            trace.mkdir(parents=True, exist_ok=True)
            os.environ[TRACE_ENV] = str(trace)  # before Spark: its Python workers inherit it
        spark = make_spark(jars, args.batch, args.buffer_size)
        try:
            for rate in rates:
                for writer in writers:
                    row = measure(spark, bootstrap, pg, writer, rate, args.seconds,
                                  Path(tmp), args.batch, args.commit_interval, trace)
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
           "goal_p99_s": 0.5, "goal_ratio_to_spark": 3.0}
    print(json.dumps(doc["p99_ratio_to_spark_at_least_once"]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
