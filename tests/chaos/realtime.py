"""Chaos for Spark Real-time Mode: Kafka in, Kafka or PostgreSQL out, exactly once.

A producer appends records (ids 0, 1, 2, ...) to a two-partition source topic for the
whole run while a driver process runs :func:`txsink.spark.realtime.start_realtime`
(one query per target; ``--together`` puts both targets in one driver) and restarts
a query whenever it fails (as a supervisor would). Seeded faults:

* ``driver-kill``: SIGKILL of the driver's process group (JVM, Python workers); a
  standby driver (JVM and Spark session already up) resumes from the checkpoint;
* ``executor-kill``: SIGKILL of the Python workers that run the ``foreach`` writers
  (local mode's executor side): the real-time batch fails mid-write;
* ``broker-restart``: the Kafka broker (source, and the Kafka target) is SIGKILLed
  and started again;
* ``database-restart`` (PostgreSQL target): an immediate-mode restart (a crash).

After each fault every target must move on (bounded wait) with no id seen twice so
far. At the end the producer stops and each target must reach exactly the appended
ids: every id once, counted by an independent ``read_committed`` consumer / SQL.

    python -m tests.chaos.realtime                    # short: 4 faults per target
    python -m tests.chaos.realtime --long --together  # 100 faults per target, one run
    python -m tests.chaos.realtime --targets postgres --faults 10 --seed 7
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TARGETS = ("kafka", "postgres")
KINDS = {"kafka": ("driver-kill", "executor-kill", "broker-restart"),
         "postgres": ("driver-kill", "executor-kill", "broker-restart", "database-restart")}
SHORT, LONG = 4, 100
RATE = 50  # records per second appended to the source
#: Bounds (not pauses): a driver JVM on a loaded 2-core machine took over 90 s to start.
PROGRESS_TIMEOUT_S = 400.0


@dataclass
class Report:
    target: str
    seed: int
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    appended: int = 0
    visible: int = 0
    lost: int = 0
    duplicated: int = 0
    query_failures: int = 0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: Per kind: seconds from the fault to the target's progress, summed.
    fault_seconds: collections.Counter[str] = field(default_factory=collections.Counter)
    cut_short: str = ""

    def line(self) -> str:
        kinds = ", ".join(f"{k} {n} ({self.fault_seconds[k] / n:.0f}s each)"
                          for k, n in sorted(self.faults.items()))
        return (f"{self.target}: {sum(self.faults.values())} faults ({kinds}); "
                f"{self.appended} appended, {self.visible} visible, lost {self.lost}, "
                f"duplicated {self.duplicated}; {self.query_failures} query failures "
                f"survived; {self.seconds:.0f}s; seed {self.seed}"
                + (f"; stopped early: {self.cut_short}" if self.cut_short else "")
                + (f"; FAILURES: {self.failures}" if self.failures else ""))


# -- the driver (a subprocess) -----------------------------------------------------------


def driver(config_path: str) -> None:
    """Run the real-time query, restarting it after each failure, until killed.

    Starts as a standby: the JVM and the Spark session come up first, the query only
    once the runner creates this process's go file (after it killed the previous
    driver), so a driver kill costs the query's resumption, not a JVM start."""
    from tests.e2e.realtime_harness import make_spark

    cfg = json.loads(Path(config_path).read_text())
    spark = make_spark("chaos-realtime")
    from txsink.spark.realtime import start_realtime

    status = Path(cfg["status"])
    go = Path(f"{cfg['status']}.go-{os.getpid()}")
    while not go.exists():
        time.sleep(0.05)

    def say(line: str) -> None:
        with status.open("a") as f:
            f.write(line + "\n")

    def start(sink: dict[str, Any]) -> Any:
        source = (spark.readStream.format("kafka")
                  .option("kafka.bootstrap.servers", cfg["bootstrap"])
                  .option("subscribe", cfg["source"]).option("startingOffsets", "earliest")
                  .option("failOnDataLoss", "true").load())
        if sink["target"] == "kafka":
            df = source.selectExpr("value", "topic", "partition", "offset")
        else:
            df = source.selectExpr("CAST(CAST(value AS STRING) AS BIGINT) AS id", "topic",
                                   "partition", "offset")
        return start_realtime(df, sink_id=sink["sink_id"], backend=sink["target"],
                              options=sink["options"], checkpoint_location=sink["checkpoint"],
                              query_name=f"chaos_{sink['target']}")

    def first_line(exc: BaseException) -> str:
        return (str(exc).strip().splitlines() or ["?"])[0][:300]

    # One query per target in this session; a failed one is started again (as a
    # supervisor would), the others keep running.
    queries: dict[str, Any] = {}
    while True:
        for sink in cfg["sinks"]:
            target = sink["target"]
            query = queries.get(target)
            if query is not None and query.isActive:
                continue
            if query is not None:
                say(f"failed {target} {first_line(query.exception() or RuntimeError('?'))}")
            try:
                queries[target] = start(sink)
                say(f"started {target}")
            except Exception as exc:  # e.g. the broker is down: try again shortly
                queries.pop(target, None)
                say(f"failed {target} {first_line(exc)}")
        with contextlib.suppress(Exception):  # a failure is handled above, next round
            spark.streams.awaitAnyTermination(1)
        spark.streams.resetTerminated()


# -- the runner --------------------------------------------------------------------------


class Appender:
    """Appends ids to the source at :data:`RATE` per second until stopped."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                                  "enable.idempotence": True,
                                  "message.timeout.ms": 600_000})
        self.topic = topic
        self.sent = 0
        self.failed: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failed.append(str(err))

    def _run(self) -> None:
        while not self.stop.wait(1 / RATE):
            self.producer.produce(self.topic, str(self.sent).encode(),
                                  partition=self.sent % 2, on_delivery=self._delivered)
            self.sent += 1
            self.producer.poll(0)

    def finish(self) -> int:
        self.stop.set()
        self.thread.join()
        remaining = self.producer.flush(600)
        if remaining or self.failed:
            raise RuntimeError(f"the source producer could not deliver: {self.failed[:3]}")
        return self.sent


class Driver:
    """The active driver process and a standby one (JVM and Spark session started,
    query not yet): a driver kill promotes the standby; the runner spawns the next
    standby once the query moved on."""

    def __init__(self, config: Path, log: Path, status: Path) -> None:
        self.config, self.log, self.status = config, log, status
        self.proc: subprocess.Popen[bytes] | None = None
        self.standby: subprocess.Popen[bytes] | None = None

    def _spawn(self) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "tests.chaos.realtime", "--driver", str(self.config)],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "PYSPARK_PYTHON": sys.executable,
                     "SPARK_LOCAL_IP": "127.0.0.1"})

    def start(self) -> None:
        """Promote the standby (spawning one if there is none)."""
        assert self.proc is None
        self.proc, self.standby = self.standby or self._spawn(), None
        Path(f"{self.status}.go-{self.proc.pid}").touch()

    def spare(self) -> None:
        """Spawn the standby if there is none (after the active driver moved on, so its
        JVM start does not compete with the resumption it would be measured against)."""
        if self.standby is None:
            self.standby = self._spawn()

    def kill(self) -> None:
        from tests.e2e.spark_harness import kill_group

        if self.proc is not None:
            kill_group(self.proc.pid)
            self.proc.wait(30)
            self.proc = None

    def close(self) -> None:
        from tests.e2e.spark_harness import kill_group

        self.kill()
        if self.standby is not None:
            kill_group(self.standby.pid)
            self.standby.wait(30)
            self.standby = None

    def kill_workers(self) -> int:
        """SIGKILL the Python workers (pyspark.daemon and its forks) under this driver.

        Found by parentage, not process group: the daemon puts itself into a process
        group of its own (pyspark/daemon.py), so a group kill never reaches it."""
        assert self.proc is not None
        parent: dict[int, int] = {}
        command: dict[int, bytes] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                command[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])

        def under_driver(pid: int) -> bool:
            while pid > 1:
                pid = parent.get(pid, 0)
                if pid == self.proc.pid:  # type: ignore[union-attr]
                    return True
            return False

        killed = 0
        for pid, cmd in command.items():
            if (b"pyspark.daemon" in cmd or b"pyspark.worker" in cmd) and under_driver(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
        return killed


def wait_for(what: str, probe: Callable[[], int], want: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    seen = probe()
    while seen < want:
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: {seen} of {want} after {timeout_s:.0f}s")
        time.sleep(0.5)
        seen = probe()
    return seen


@contextlib.contextmanager
def _servers(work: Path, targets: list[str]) -> Iterator[tuple[Any, Any]]:
    from txsink_kafka import testing as kt
    from txsink_postgres import testing as pgtesting

    with kt.kafka_for_tests(work / "kafka" / "broker.log", tansu_ok=False) as (_, _, kafka):
        if kafka is None:
            raise RuntimeError("chaos needs a local Apache Kafka it can restart (unset "
                               "TXSINK_KAFKA_BOOTSTRAP)")
        if "postgres" not in targets:
            yield kafka, None
            return
        with pgtesting.LocalPostgres(max_prepared_transactions=0) as pg:
            yield kafka, pg


class TopicTally:
    """A ``read_committed`` consumer that keeps reading the output topic: the count a
    fault's progress is measured by, without reading the whole topic again every poll
    (which, a hundred faults in, took a core of the two)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        self.consumer = Consumer({"bootstrap.servers": bootstrap,
                                  "group.id": f"chaos-tally-{uuid.uuid4().hex[:6]}",
                                  "enable.auto.commit": False,
                                  "isolation.level": "read_committed"})
        parts = self.consumer.list_topics(topic, timeout=60).topics[topic].partitions
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        self.ids: collections.Counter[int] = collections.Counter()

    def count(self) -> int:
        while batch := self.consumer.consume(10_000, 0.2):
            for msg in batch:
                err = msg.error()
                if err is None:
                    self.ids[int(msg.value())] += 1
                elif err.fatal():
                    raise RuntimeError(f"the tally consumer failed: {err}")
        return self.ids.total()

    def duplicated(self) -> int:
        return sum(n - 1 for n in self.ids.values() if n > 1)

    def close(self) -> None:
        self.consumer.close()


def _pg_retry(pg: Any, query: str) -> list[tuple[Any, ...]]:
    import psycopg

    for _ in range(60):  # the database may be restarting
        try:
            with psycopg.connect(pg.dsn, password=pg.password, autocommit=True) as conn:
                return conn.execute(query).fetchall()
        except psycopg.OperationalError:
            time.sleep(1)
    raise AssertionError("PostgreSQL did not come back within 60 s")


@dataclass
class _Output:
    """One target's output, as an independent reader sees it."""

    count: Callable[[], int]  # progress (cheap, polled)
    duplicated: Callable[[], int]  # ids seen more than once so far
    ids: Callable[[], list[int]]  # the final reading: every id, from the start


def _output(target: str, cfg: dict[str, Any], sink: dict[str, Any], pg: Any,
            stack: contextlib.ExitStack) -> _Output:
    import psycopg
    from txsink_kafka import testing as kt

    bootstrap = cfg["bootstrap"]
    if target == "kafka":
        out = sink["options"]["topic"]
        kt.create_topic(bootstrap, out, partitions=2)
        tally = TopicTally(bootstrap, out)
        stack.callback(tally.close)
        return _Output(tally.count, tally.duplicated, lambda: [
            int(m.value()) for m in kt.read_topic(bootstrap, out, timeout_s=300)])
    table = sink["options"]["table"]
    with psycopg.connect(pg.dsn, password=pg.password, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint)")
    return _Output(
        lambda: int(_pg_retry(pg, f"SELECT count(*) FROM {table}")[0][0]),
        lambda: int(_pg_retry(pg, f"SELECT count(*) - count(DISTINCT id) FROM {table}")[0][0]),
        lambda: [r[0] for r in _pg_retry(pg, f"SELECT id FROM {table}")])


def run(targets: list[str], faults: int, seed: int, work: Path,
        kinds: list[str] | None = None, plan: list[str] | None = None,
        servers: tuple[Any, Any] | None = None,
        max_seconds: float | None = None) -> list[Report]:
    """One driver with one real-time query per target, fed by one source, and faults
    until every target has had ``faults`` of its kinds (a fault hits every target it
    can: a database restart is no fault of a Kafka target). ``plan`` fixes the faults
    in order instead of drawing them; ``servers`` reuses a running (Kafka, PostgreSQL).
    After ``max_seconds`` no new fault starts (the report says so); the run still ends
    with the full count."""
    reports = {t: Report(t, seed) for t in targets}
    rng = random.Random(f"{seed}-{'+'.join(targets)}")
    drawn = [k for k in dict.fromkeys(k for t in targets for k in KINDS[t])
             if kinds is None or k in kinds]
    started = time.monotonic()
    tag = uuid.uuid4().hex[:6]
    with (contextlib.nullcontext(servers) if servers else _servers(work, targets)) as (
            kafka, pg), contextlib.ExitStack() as stack:
        from txsink_kafka import testing as kt

        bootstrap = kafka.bootstrap
        sinks = {"kafka": {"target": "kafka", "sink_id": f"chaos-{tag}-kafka",
                           "checkpoint": str(work / "checkpoint-kafka"),
                           "options": {"topic": f"chaos-out-{tag}",
                                       "kafka.bootstrap.servers": bootstrap,
                                       "progress.topic": f"chaos-{tag}-progress"}}}
        if pg is not None:
            sinks["postgres"] = {"target": "postgres", "sink_id": f"chaos-{tag}-pg",
                                 "checkpoint": str(work / "checkpoint-postgres"),
                                 "options": {"dsn": pg.dsn, "password": pg.password,
                                             "table": f"public.chaos_{tag}"}}
        cfg: dict[str, Any] = {"bootstrap": bootstrap, "source": f"chaos-src-{tag}",
                               "status": str(work / "status.log"),
                               "sinks": [sinks[t] for t in targets]}
        kt.create_topic(bootstrap, cfg["source"], partitions=2)
        outputs = {t: _output(t, cfg, sinks[t], pg, stack) for t in targets}
        config = work / "driver.json"
        config.write_text(json.dumps(cfg))
        drv = Driver(config, work / "driver.log", Path(cfg["status"]))
        stack.callback(drv.close)
        appender = Appender(bootstrap, cfg["source"])
        drv.start()

        def moved_on(what: str, want: dict[str, int]) -> dict[str, int]:
            return {t: wait_for(f"{t}: {what}", outputs[t].count, want[t],
                                PROGRESS_TIMEOUT_S) for t in targets}

        try:
            moved_on("first rows", dict.fromkeys(targets, 1))
            drv.spare()
            n = 0

            def more() -> bool:
                if plan is not None:
                    return n < len(plan)
                if max_seconds is not None and time.monotonic() - started > max_seconds:
                    for r in reports.values():
                        r.cut_short = f"time limit of {max_seconds:.0f}s reached"
                    return False
                return any(sum(r.faults.values()) < faults for r in reports.values())

            while more():
                kind = plan[n] if plan is not None else rng.choice(drawn)
                n += 1
                began = time.monotonic()
                before = {t: outputs[t].count() for t in targets}
                if kind == "driver-kill":
                    drv.kill()
                    drv.start()
                elif kind == "executor-kill":
                    if drv.kill_workers() == 0:
                        kind = "executor-kill (no worker running)"
                elif kind == "broker-restart":
                    kafka.restart(hard=True)  # SIGKILL, then start again
                else:
                    pg.restart(mode="immediate")
                seen = moved_on(f"progress after {kind}",
                                {t: before[t] + RATE for t in targets})
                took = time.monotonic() - began
                twice = {t: outputs[t].duplicated() for t in targets}
                for t in targets:
                    if kind in KINDS[t] or kind.startswith("executor-kill"):
                        reports[t].faults[kind] += 1
                        reports[t].fault_seconds[kind] += took
                print(f"fault {n} {kind}: moved on after {took:.1f}s; " + "; ".join(
                    f"{t} {seen[t]} visible, {twice[t]} duplicated so far" for t in targets),
                    file=sys.stderr, flush=True)
                if any(twice.values()):
                    raise AssertionError(f"duplicated after fault {n} ({kind}): {twice}")
                drv.spare()
            appended = appender.finish()
            moved_on("every appended record", dict.fromkeys(targets, appended))
        except AssertionError as exc:
            for r in reports.values():
                r.failures.append(str(exc))
            if not appender.stop.is_set():
                appender.finish()
        finally:
            drv.close()
        status = Path(cfg["status"])
        lines = status.read_text().splitlines() if status.exists() else []
        for t in targets:
            r = reports[t]
            r.appended = appender.sent
            got = outputs[t].ids()
            counts = collections.Counter(got)
            r.visible = len(got)
            r.duplicated = sum(n - 1 for n in counts.values() if n > 1)
            r.lost = sum(1 for i in range(r.appended) if i not in counts)
            r.query_failures = sum(1 for line in lines if line.startswith(f"failed {t} "))
    for r in reports.values():
        r.seconds = time.monotonic() - started
    return [reports[t] for t in targets]


def run_target(target: str, faults: int, seed: int, work: Path,
               kinds: list[str] | None = None) -> Report:
    """:func:`run` for one target."""
    return run([target], faults, seed, work, kinds=kinds)[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="chaos for Spark Real-time Mode")
    parser.add_argument("--driver", help=argparse.SUPPRESS)
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--faults", type=int)
    parser.add_argument("--long", action="store_true", help=f"{LONG} faults per target")
    parser.add_argument("--kinds", help="only these fault kinds (comma-separated)")
    parser.add_argument("--max-minutes", type=float,
                        help="start no fault after this long (then count as usual)")
    parser.add_argument("--together", action="store_true",
                        help="every target in one run: one driver, one query per target, "
                             "each fault hitting every target it can")
    parser.add_argument("--seed", type=int, default=int(os.environ.get("TXSINK_CHAOS_SEED",
                                                                       "2026")))
    args = parser.parse_args(argv)
    if args.driver:
        driver(args.driver)
        return 0
    faults = args.faults or (LONG if args.long else SHORT)
    targets = args.targets.split(",")
    kinds = args.kinds.split(",") if args.kinds else None
    ok = True
    for group in [targets] if args.together else [[t] for t in targets]:
        with tempfile.TemporaryDirectory(prefix=f"chaos-rt-{'-'.join(group)}-") as tmp:
            reports = run(group, faults, args.seed, Path(tmp), kinds=kinds,
                          max_seconds=args.max_minutes * 60 if args.max_minutes else None)
        for report in reports:
            print(report.line(), flush=True)
            ok = ok and not report.failures and report.lost == report.duplicated == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
