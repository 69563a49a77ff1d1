"""Spark Real-time Mode with short batches and kept Kafka producers, attacked the way
users combine things: more source partitions than the Python workers keep apart (so
workers swap source partitions between batches and fence each other's kept producers),
a restarted query in the same session, a reset checkpoint, a second query on the same
sink id, a broker restart while producers are idle. Counted by an independent
``read_committed`` consumer: every source record exactly once, or a loud failure.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from txsink.realtime import StoredPosition
from txsink_kafka import testing as kt
from txsink_kafka.realtime import KafkaPositionTarget, KafkaRealtimeSpec

from tests.e2e.realtime_harness import make_spark, stop_jvm
from tests.long_runs import long_run

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.integration, long_run]

REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 4


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    log = tmp_path_factory.mktemp("kafka-broker") / "broker.log"
    with kt.kafka_for_tests(log, tansu_ok=False) as (address, _, handle):
        yield address, handle


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    # The Python workers import this module (the claim-counting target below).
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    session = make_spark("txsink-realtime-attack", cores=PARTITIONS, **{
        "spark.buffer.size": "512",
        "spark.sql.streaming.realTimeMode.minBatchDuration": "1000"})
    try:
        yield session
    finally:
        session.stop()
        stop_jvm()


class CountingTarget(KafkaPositionTarget):
    """Writes one line per claim (pid, source partition) so the test can tell that
    workers swapped source partitions (claims beyond one per partition)."""

    def claim(self) -> StoredPosition:
        stored = super().claim()
        with open(self.spec.claims_file, "a") as f:  # type: ignore[attr-defined]
            f.write(f"{os.getpid()} {self.source.partition} {stored.offset}\n")
        return stored


class CountingSpec(KafkaRealtimeSpec):
    claims_file = ""

    def __call__(self, source: Any) -> Any:
        return CountingTarget(self, source)


def produce(bootstrap: str, topic: str, ids: range) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
    for i in ids:
        p.produce(topic, str(i).encode(), str(i).encode(), i % PARTITIONS)
    assert p.flush(30) == 0


def out_counts(bootstrap: str, topic: str) -> Counter[int]:
    return Counter(int(m.value()) for m in kt.read_topic(bootstrap, topic))


def wait_exact(bootstrap: str, topic: str, n: int, query: Any | None = None,
               timeout_s: float = 180) -> Counter[int]:
    """Until every id below ``n`` is visible (bounded), failing at once on a duplicate,
    a stray id, or the query's own failure."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = out_counts(bootstrap, topic)
        dups = {i: c for i, c in got.items() if c > 1}
        stray = {i for i in got if not 0 <= i < n}
        assert not dups, f"duplicated ids: {sorted(dups.items())[:20]} ({len(dups)})"
        assert not stray, f"ids never appended: {sorted(stray)[:20]}"
        if len(got) == n:
            return got
        if query is not None and not query.isActive:
            raise AssertionError(f"query ended: {query.exception()}; {len(got)} of {n}")
        if query is not None:
            from txsink.spark.realtime import unread_partitions

            # A healthy query (a slot per source partition) is never taken for a starved
            # one, on this loaded machine with one-second batches.
            assert not unread_partitions(query.recentProgress, PARTITIONS), \
                query.recentProgress[-3:]
        if time.monotonic() > deadline:
            missing = sorted(set(range(n)) - set(got))
            raise AssertionError(f"{len(got)} of {n} visible after {timeout_s}s; "
                                 f"missing {missing[:20]} ({len(missing)})")
        time.sleep(0.5)


def start(spark: Any, bootstrap: str, src: str, out: str, sink_id: str, chk: Path,
          claims: Path, select: tuple[str, ...] = ("key", "value", "topic", "partition",
                                                  "offset"), **kw: Any) -> Any:
    from txsink.spark import realtime as rt

    df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
          .option("subscribe", src).option("startingOffsets", "earliest")
          .options(**kw.get("source_options", {})).load()
          .selectExpr(*select))
    spec = CountingSpec(sink_id, {"topic": out, "kafka.bootstrap.servers": bootstrap,
                                  "progress.topic": f"{sink_id}-progress"})
    spec.claims_file = str(claims)
    spec.prepare()
    rows = rt.check_pipeline(df)
    query = (df.writeStream.outputMode("update")
             .foreach(rt.RealtimeForeachWriter([("", spec, None)], rt.POSITION_COLUMNS, 0.25,
                                               rows, sink_id))
             .option("checkpointLocation", str(chk))
             .trigger(realTime=kw.get("trigger", "1 second"))
             .start())
    return query


def claim_lines(claims: Path) -> list[tuple[int, int, int]]:
    if not claims.exists():
        return []
    return [tuple(map(int, line.split())) for line in claims.read_text().splitlines()]  # type: ignore[misc]


def trickle(bootstrap: str, src: str, ids: range, chunks: int, pause_s: float) -> None:
    step = max(1, len(ids) // chunks)
    for lo in range(ids.start, ids.stop, step):
        produce(bootstrap, src, range(lo, min(lo + step, ids.stop)))
        time.sleep(pause_s)


def test_short_batches_swapping_workers_restart_and_reset_stay_exact(
        spark: Any, broker: tuple[str, Any], tmp_path: Path) -> None:
    bootstrap, _ = broker
    tag = uuid.uuid4().hex[:6]
    src, out, sink_id = f"rta-src-{tag}", f"rta-out-{tag}", f"rta-{tag}"
    kt.create_topic(bootstrap, src, partitions=PARTITIONS)
    kt.create_topic(bootstrap, out, partitions=2)
    claims = tmp_path / "claims.txt"

    produce(bootstrap, src, range(0, 400))
    query = start(spark, bootstrap, src, out, sink_id, tmp_path / "chk", claims)
    wait_exact(bootstrap, out, 400, query)
    trickle(bootstrap, src, range(400, 2400), chunks=40, pause_s=0.4)
    wait_exact(bootstrap, out, 2400, query)
    first = claim_lines(claims)
    query.stop()
    assert query.exception() is None, query.exception()
    print(f"run 1: {len(first)} claims by {len({c[0] for c in first})} workers")

    # The same session again (same Python workers, their pools still hold run 1's
    # producers): a new run claims afresh; the old producers must not interfere.
    query = start(spark, bootstrap, src, out, sink_id, tmp_path / "chk", claims)
    trickle(bootstrap, src, range(2400, 3200), chunks=16, pause_s=0.4)
    wait_exact(bootstrap, out, 3200, query)
    query.stop()
    assert query.exception() is None, query.exception()
    # Neither run left a transaction open (run 1's producers still sit in the pools).
    assert kt.broker_open_transactions(bootstrap, f"txsink-rt.{sink_id}.") == {}
    assert kt.unstable_partitions(bootstrap, [out, f"{sink_id}-progress"]) == {}

    # A reset checkpoint replays everything: the target skips what it holds.
    query = start(spark, bootstrap, src, out, sink_id, tmp_path / "chk-reset", claims)
    trickle(bootstrap, src, range(3200, 3600), chunks=8, pause_s=0.4)
    got = wait_exact(bootstrap, out, 3600, query)
    query.stop()
    assert query.exception() is None, query.exception()
    assert sum(got.values()) == 3600 and sum(got) == sum(range(3600))
    every = claim_lines(claims)
    print(f"all runs: {len(every)} claims by {len({c[0] for c in every})} workers")


def produce_n(bootstrap: str, topic: str, ids: range, partitions: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
    for i in ids:
        p.produce(topic, str(i).encode(), str(i).encode(), i % partitions)
    assert p.flush(30) == 0


def test_two_queries_on_one_sink_id_and_a_broker_restart_between_batches(
        spark: Any, broker: tuple[str, Any], tmp_path: Path) -> None:
    """Two queries (own checkpoints) on the same sink id with kept producers: each
    source record once, or a query fails saying it was fenced. Then a broker restart
    while the kept producers are idle: exact, or a loud failure and a restart."""
    bootstrap, kafka = broker
    tag = uuid.uuid4().hex[:6]
    src, out, sink_id = f"rtb-src-{tag}", f"rtb-out-{tag}", f"rtb-{tag}"
    kt.create_topic(bootstrap, src, partitions=2)
    kt.create_topic(bootstrap, out, partitions=2)
    claims = tmp_path / "claims.txt"
    produce_n(bootstrap, src, range(0, 200), 2)
    q1 = start(spark, bootstrap, src, out, sink_id, tmp_path / "chk1", claims)
    q2 = start(spark, bootstrap, src, out, sink_id, tmp_path / "chk2", claims)
    for lo in range(200, 1200, 50):
        produce_n(bootstrap, src, range(lo, lo + 50), 2)
        time.sleep(0.4)
    deadline = time.monotonic() + 180
    while len(out_counts(bootstrap, out)) < 1200 and (q1.isActive or q2.isActive):
        assert time.monotonic() < deadline, len(out_counts(bootstrap, out))
        time.sleep(0.5)
    failures = []
    for q in (q1, q2):
        if not q.isActive:
            failures.append(str(q.exception()))
        q.stop()
    print(f"two queries: {len(claim_lines(claims))} claims; {len(failures)} failed")
    got = out_counts(bootstrap, out)
    assert not {i for i, c in got.items() if c > 1}, "duplicates with two queries"
    for failure in failures:
        assert "FencedError" in failure and "fenced by a newer instance" in failure, failure

    q = start(spark, bootstrap, src, out, sink_id, tmp_path / "chk1", claims)
    wait_exact(bootstrap, out, 1200, q)
    produce_n(bootstrap, src, range(1200, 1400), 2)
    wait_exact(bootstrap, out, 1400, q)
    time.sleep(2)  # let batches end so the producers sit idle in the pools
    if kafka is None:
        q.stop()
        pytest.skip("an external broker cannot be restarted by the test")
    kafka.restart(hard=True)
    produce_n(bootstrap, src, range(1400, 1600), 2)
    restarts = 0
    deadline = time.monotonic() + 240
    while True:
        got = out_counts(bootstrap, out)
        assert not {i for i, c in got.items() if c > 1}, "duplicates after a broker restart"
        if len(got) == 1600:
            break
        assert time.monotonic() < deadline, f"{len(got)} of 1600 after a broker restart"
        if not q.isActive:
            restarts += 1
            print(f"query failed after the broker restart: {q.exception()}")
            q = start(spark, bootstrap, src, out, sink_id, tmp_path / "chk1", claims)
        time.sleep(0.5)
    q.stop()
    print(f"broker restart: {restarts} query restarts needed")
    assert sum(got) == sum(range(1600))


@pytest.mark.promise("realtime-record-rows-one-commit", "realtime")
def test_explode_with_kept_producers_keeps_each_records_rows_together_once(
        spark: Any, broker: tuple[str, Any], tmp_path: Path) -> None:
    """rows_per_record='many': three rows per record (an explode), short batches, workers
    swapping source partitions (fenced kept producers claimed again while a record's
    rows wait), a restart: every record's three rows exactly once."""
    bootstrap, _ = broker
    tag = uuid.uuid4().hex[:6]
    src, out, sink_id = f"rtx-src-{tag}", f"rtx-out-{tag}", f"rtx-{tag}"
    kt.create_topic(bootstrap, src, partitions=PARTITIONS)
    kt.create_topic(bootstrap, out, partitions=2)
    claims = tmp_path / "claims.txt"
    select = ("key", "CAST(CAST(CAST(value AS STRING) AS BIGINT) * 3 + part AS STRING) AS value",
              "topic", "partition", "offset")

    def begin(chk: str) -> Any:
        from txsink.spark import realtime as rt

        df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", src).option("startingOffsets", "earliest").load()
              .selectExpr("*", "explode(array(0, 1, 2)) AS part").selectExpr(*select))
        assert rt.check_pipeline(df) == "many"
        spec = CountingSpec(sink_id, {"topic": out, "kafka.bootstrap.servers": bootstrap,
                                      "progress.topic": f"{sink_id}-progress"})
        spec.claims_file = str(claims)
        spec.prepare()
        return (df.writeStream.outputMode("update")
                .foreach(rt.RealtimeForeachWriter([("", spec, None)], rt.POSITION_COLUMNS,
                                                  0.1, "many", spec.sink_id))
                .option("checkpointLocation", str(tmp_path / chk))
                .trigger(realTime="1 second").start())

    produce(bootstrap, src, range(0, 300))
    query = begin("chk")
    wait_exact(bootstrap, out, 900, query)
    trickle(bootstrap, src, range(300, 1500), chunks=30, pause_s=0.4)
    wait_exact(bootstrap, out, 4500, query)
    query.stop()
    assert query.exception() is None, query.exception()
    query = begin("chk")
    trickle(bootstrap, src, range(1500, 1800), chunks=6, pause_s=0.4)
    got = wait_exact(bootstrap, out, 5400, query)
    query.stop()
    assert query.exception() is None, query.exception()
    assert sum(got) == sum(range(5400))
    print(f"explode: {len(claim_lines(claims))} claims")


def test_more_source_partitions_than_task_slots_are_named_not_silent(
        spark: Any, broker: tuple[str, Any], tmp_path: Path) -> None:
    """local[4] and a six-partition source: Spark's Real-time Mode leaves two partitions
    unread batch after batch without an error (measured: 400 of 600 records in 120 s).
    Every record must arrive, or ``unread_partitions`` must name the unread ones."""
    from txsink.spark.realtime import unread_partitions

    bootstrap, _ = broker
    tag = uuid.uuid4().hex[:6]
    src, out, sink_id = f"rts-src-{tag}", f"rts-out-{tag}", f"rts-{tag}"
    kt.create_topic(bootstrap, src, partitions=PARTITIONS + 2)
    kt.create_topic(bootstrap, out, partitions=2)
    produce_n(bootstrap, src, range(0, 600), PARTITIONS + 2)
    query = start(spark, bootstrap, src, out, sink_id, tmp_path / "chk",
                  tmp_path / "claims.txt")
    try:
        deadline = time.monotonic() + 120
        unread: list[str] = []
        while len(out_counts(bootstrap, out)) < 600 and query.isActive and not unread:
            assert time.monotonic() < deadline, "neither every record nor a name"
            time.sleep(1)
            unread = unread_partitions(query.recentProgress, PARTITIONS)
        got = out_counts(bootstrap, out)
        print(f"slots: {len(got)} of 600 visible; unread {unread}")
        assert not {i for i, c in got.items() if c > 1}
        if len(got) < 600:
            assert unread, f"{len(got)} of 600 and no partition named"
            named = {int(name.rsplit("-", 1)[1]) for name in unread}
            assert not [i for i in got if i % (PARTITIONS + 2) in named]  # truly unread
    finally:
        query.stop()


@pytest.mark.promise("realtime-unread-partitions-stop", "realtime")
def test_txsink_run_stops_naming_the_slots_when_partitions_go_unread(
        broker: tuple[str, Any], tmp_path: Path) -> None:
    """``txsink run`` with ``local[2]`` (the example pipeline's) and a four-partition
    source: it must stop with an error saying a task slot per source partition is
    needed, not run on while two partitions stay unread."""
    import subprocess
    import sys

    import yaml

    from tests.e2e.realtime_harness import connector_jars

    bootstrap, _ = broker
    tag = uuid.uuid4().hex[:6]
    src, out = f"rtr-src-{tag}", f"rtr-out-{tag}"
    kt.create_topic(bootstrap, src, partitions=4)
    kt.create_topic(bootstrap, out, partitions=1)
    produce_n(bootstrap, src, range(0, 400), 4)
    pipeline = tmp_path / "rt.yaml"
    pipeline.write_text(yaml.safe_dump({
        "name": "slots", "source": {"type": "spark", "format": "kafka", "options": {
            "kafka.bootstrap.servers": bootstrap, "subscribe": src,
            "startingOffsets": "earliest"}},
        "transform": "SELECT key, value, topic, partition, `offset` FROM source",
        "sink": {"backend": "kafka", "sink_id": f"rtr-{tag}", "options": {
            "topic": out, "kafka.bootstrap.servers": bootstrap,
            "progress.topic": f"rtr-{tag}-progress"}},
        "checkpoint": str(tmp_path / "chk"), "trigger": {"real_time": "1 second"},
        "spark": {"master": "local[2]", "conf": {"spark.ui.enabled": "false",
                                                 "spark.jars": ",".join(connector_jars())}}}))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.run([sys.executable, "-m", "txsink.cli", "run", str(pipeline),
                           "--timeout", "300"], env=env, capture_output=True, text=True,
                          timeout=420)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-3000:]
    assert "task slot per source partition" in text, text[-3000:]
    got = out_counts(bootstrap, out)
    assert not {i for i, c in got.items() if c > 1} and len(got) < 400


def test_a_transactional_source_with_an_aborted_transaction_idles_exactly(
        spark: Any, broker: tuple[str, Any], tmp_path: Path) -> None:
    """The source written by a transactional producer (a txsink Kafka output chained
    into the next pipeline), read ``read_committed``, with an aborted transaction between
    two committed ones, then idle: the committed ids once, none of the aborted, and the
    idle partitions (offsets ending on a transaction marker) never taken for unread."""
    from txsink.spark.realtime import unread_partitions

    bootstrap, _ = broker
    tag = uuid.uuid4().hex[:6]
    src, out, sink_id = f"rtt-src-{tag}", f"rtt-out-{tag}", f"rtt-{tag}"
    kt.create_topic(bootstrap, src, partitions=2)
    kt.create_topic(bootstrap, out, partitions=1)
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"src-{tag}"})
    p.init_transactions(30)
    for lo, commit in ((0, True), (1000, False), (100, True)):
        p.begin_transaction()
        for i in range(lo, lo + 100):
            p.produce(src, str(i).encode(), str(i).encode(), i % 2)
        if commit:
            p.commit_transaction(30)
        else:
            p.flush(30)
            p.abort_transaction(30)
    query = start(spark, bootstrap, src, out, sink_id, tmp_path / "chk",
                  tmp_path / "claims.txt",
                  source_options={"kafka.isolation.level": "read_committed"})
    try:
        got = wait_exact(bootstrap, out, 200, query)
        for _ in range(6):  # idle batches on offsets that end on a marker
            time.sleep(1)
            assert not unread_partitions(query.recentProgress, PARTITIONS)
        assert query.isActive and sum(got) == sum(range(200))
    finally:
        query.stop()
