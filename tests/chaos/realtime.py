"""Chaos for Spark Real-time Mode: Kafka in, Kafka or PostgreSQL out, exactly once.

A producer appends records (ids 0, 1, 2, ...) to a two-partition source topic for the
whole run while a driver process runs :func:`txsink.spark.realtime.start_realtime`
and restarts its query whenever it fails (as a supervisor would). Seeded faults:

* ``driver-kill``: SIGKILL of the driver's process group (JVM, Python workers); a new
  driver resumes from the checkpoint;
* ``executor-kill``: SIGKILL of the Python workers that run the ``foreach`` writers
  (local mode's executor side): the real-time batch fails mid-write;
* ``broker-restart``: the Kafka broker (source, and the Kafka target) is SIGKILLed
  and started again;
* ``database-restart`` (PostgreSQL target): an immediate-mode restart (a crash).

After each fault the target must move on (bounded wait). At the end the producer
stops, the target must reach exactly the appended ids: every id once, counted by an
independent ``read_committed`` consumer / SQL.

    python -m tests.chaos.realtime                    # short: 4 faults per target
    python -m tests.chaos.realtime --long             # 100 faults per target
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

    def line(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.faults.items()))
        return (f"{self.target}: {sum(self.faults.values())} faults ({kinds}); "
                f"{self.appended} appended, {self.visible} visible, lost {self.lost}, "
                f"duplicated {self.duplicated}; {self.query_failures} query failures "
                f"survived; {self.seconds:.0f}s; seed {self.seed}"
                + (f"; FAILURES: {self.failures}" if self.failures else ""))


# -- the driver (a subprocess) -----------------------------------------------------------


def driver(config_path: str) -> None:
    """Run the real-time query, restarting it after each failure, until killed."""
    from tests.e2e.realtime_harness import make_spark

    cfg = json.loads(Path(config_path).read_text())
    spark = make_spark("chaos-realtime")
    from txsink.spark.realtime import start_realtime

    status = Path(cfg["status"])
    while True:
        source = (spark.readStream.format("kafka")
                  .option("kafka.bootstrap.servers", cfg["bootstrap"])
                  .option("subscribe", cfg["source"]).option("startingOffsets", "earliest")
                  .option("failOnDataLoss", "true").load())
        if cfg["target"] == "kafka":
            df = source.selectExpr("value", "topic", "partition", "offset")
            options = {"topic": cfg["out"], "kafka.bootstrap.servers": cfg["bootstrap"],
                       "progress.topic": cfg["progress"]}
        else:
            df = source.selectExpr("CAST(CAST(value AS STRING) AS BIGINT) AS id", "topic",
                                   "partition", "offset")
            options = {"dsn": cfg["dsn"], "password": cfg["password"], "table": cfg["table"]}
        try:
            query = start_realtime(df, sink_id=cfg["sink_id"], backend=cfg["target"],
                                   options=options, checkpoint_location=cfg["checkpoint"])
            with status.open("a") as f:
                f.write("started\n")
            query.awaitTermination()
        except Exception as exc:  # the query failed: say so, start it again
            with status.open("a") as f:
                f.write("failed " + (str(exc).strip().splitlines() or ["?"])[0][:300] + "\n")
            time.sleep(1)  # back-off before the restart, as a supervisor's


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
    def __init__(self, config: Path, log: Path) -> None:
        self.config, self.log = config, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.chaos.realtime", "--driver", str(self.config)],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "PYSPARK_PYTHON": sys.executable,
                     "SPARK_LOCAL_IP": "127.0.0.1"})

    def kill(self) -> None:
        from tests.e2e.spark_harness import kill_group

        if self.proc is not None:
            kill_group(self.proc.pid)
            self.proc.wait(30)
            self.proc = None

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
def _servers(work: Path, target: str) -> Iterator[tuple[Any, Any]]:
    from txsink_kafka import testing as kt
    from txsink_postgres import testing as pgtesting

    with kt.kafka_for_tests(work / "kafka" / "broker.log", tansu_ok=False) as (_, _, kafka):
        if kafka is None:
            raise RuntimeError("chaos needs a local Apache Kafka it can restart (unset "
                               "TXSINK_KAFKA_BOOTSTRAP)")
        if target != "postgres":
            yield kafka, None
            return
        with pgtesting.LocalPostgres(max_prepared_transactions=0) as pg:
            yield kafka, pg


def run_target(target: str, faults: int, seed: int, work: Path,
               kinds: list[str] | None = None) -> Report:
    import psycopg
    from txsink_kafka import testing as kt

    report = Report(target, seed)
    rng = random.Random(f"{seed}-{target}")
    started = time.monotonic()
    tag = uuid.uuid4().hex[:6]
    with _servers(work, target) as (kafka, pg):
        bootstrap = kafka.bootstrap
        cfg: dict[str, Any] = {"target": target, "bootstrap": bootstrap,
                               "source": f"chaos-src-{tag}", "out": f"chaos-out-{tag}",
                               "progress": f"chaos-{tag}-progress", "sink_id": f"chaos-{tag}",
                               "checkpoint": str(work / "checkpoint"),
                               "status": str(work / "status.log")}
        kt.create_topic(bootstrap, cfg["source"], partitions=2)
        if target == "kafka":
            kt.create_topic(bootstrap, cfg["out"], partitions=2)

            def ids() -> list[int]:
                return [int(m.value()) for m in kt.read_topic(bootstrap, cfg["out"],
                                                                timeout_s=120)]
        else:
            cfg.update(dsn=pg.dsn, password=pg.password, table="public.chaos")
            with psycopg.connect(pg.dsn, password=pg.password, autocommit=True) as conn:
                conn.execute("CREATE TABLE public.chaos (id bigint)")

            def ids() -> list[int]:
                for _ in range(60):  # the database may be restarting
                    try:
                        with psycopg.connect(pg.dsn, password=pg.password,
                                             autocommit=True) as conn:
                            return [r[0] for r in conn.execute("SELECT id FROM public.chaos")]
                    except psycopg.OperationalError:
                        time.sleep(1)
                raise AssertionError("PostgreSQL did not come back within 60 s")

        config = work / "driver.json"
        config.write_text(json.dumps(cfg))
        drv = Driver(config, work / "driver.log")
        appender = Appender(bootstrap, cfg["source"])
        drv.start()
        try:
            wait_for("first rows", lambda: len(ids()), 1, PROGRESS_TIMEOUT_S)
            for _ in range(faults):
                kind = rng.choice(kinds or KINDS[target])
                before = len(ids())
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
                report.faults[kind] += 1
                wait_for(f"progress after {kind}", lambda: len(ids()), before + RATE,
                         PROGRESS_TIMEOUT_S)
            report.appended = appender.finish()
            wait_for("every appended record", lambda: len(ids()), report.appended,
                     PROGRESS_TIMEOUT_S)
        except AssertionError as exc:
            report.failures.append(str(exc))
            if not appender.stop.is_set():
                report.appended = appender.finish()
        finally:
            drv.kill()
        got = ids()
        counts = collections.Counter(got)
        report.visible = len(got)
        report.duplicated = sum(n - 1 for n in counts.values() if n > 1)
        report.lost = sum(1 for i in range(report.appended) if i not in counts)
        status = Path(cfg["status"])
        report.query_failures = sum(1 for line in status.read_text().splitlines()
                                    if line.startswith("failed")) if status.exists() else 0
    report.seconds = time.monotonic() - started
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="chaos for Spark Real-time Mode")
    parser.add_argument("--driver", help=argparse.SUPPRESS)
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--faults", type=int)
    parser.add_argument("--long", action="store_true", help=f"{LONG} faults per target")
    parser.add_argument("--kinds", help="only these fault kinds (comma-separated)")
    parser.add_argument("--seed", type=int, default=int(os.environ.get("TXSINK_CHAOS_SEED",
                                                                       "2026")))
    args = parser.parse_args(argv)
    if args.driver:
        driver(args.driver)
        return 0
    faults = args.faults or (LONG if args.long else SHORT)
    ok = True
    for target in args.targets.split(","):
        with tempfile.TemporaryDirectory(prefix=f"chaos-rt-{target}-") as tmp:
            report = run_target(target, faults, args.seed, Path(tmp),
                                kinds=args.kinds.split(",") if args.kinds else None)
        print(report.line(), flush=True)
        ok = ok and not report.failures and report.lost == report.duplicated == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
