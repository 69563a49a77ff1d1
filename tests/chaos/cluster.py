"""Chaos on a Spark standalone cluster: real executors, workers and speculation die or stall.

Where :mod:`tests.chaos.runner` plays the engine itself, this mode runs real Spark
streaming queries (:mod:`tests.e2e.spark_harness`) in client mode against a
:class:`~txsink.testing.spark_cluster.SparkStandaloneCluster` (master + 2 workers),
and injects, at random epochs:

* ``executor-kill-writing``: SIGKILL of the executor JVM running a task whose rows
  are written but not prepared (Spark loses the executor and its shuffle files and
  reruns the stage elsewhere);
* ``executor-kill-prepared``: the same right after the task prepared, before its
  committable reached the driver (the participant becomes an orphan);
* ``worker-kill``: SIGKILL of a worker JVM at a random moment of the run (its
  executors exit with it); the worker is started again right away;
* ``driver-kill``: SIGKILL of the driver's process group at a random protocol point;
* ``speculation``: ``spark.speculation=true`` and one task stalling after it
  prepared, so Spark launches a second attempt that wins; the straggler's prepared
  participant must be aborted as an orphan. Counted only when the driver log shows
  that Spark killed an attempt because another succeeded.

Task faults fire once across retries, stage retries and driver restarts
(``TXSINK_FAULTS_ONCE_DIR``). After the faults the query is restarted until it ends;
the output is then compared with the input: records, lost, duplicated, and what is
still prepared (leftovers).

    python -m tests.chaos.cluster                       # short: 1 run per target
    python -m tests.chaos.cluster --runs 4 --seed 7     # the tox ``cluster`` environment
    python -m tests.chaos.cluster --targets files,kafka

Targets are :data:`tests.chaos.targets.TARGETS`: by default files, postgres, s3 and
kafka (one local Apache Kafka broker; the output is read back by an independent
``read_committed`` consumer, leftovers counted from the marker scan, the logs'
transaction markers, ListTransactions and LSO vs HWM of every partition).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from txsink.faults import ONCE_DIR_ENV, OUTLIVED, POINTS, STALL_ENV, fired
from txsink.testing.spark_cluster import SparkStandaloneCluster

from tests.chaos.runner import Tally
from tests.chaos.runner import table as fault_table
from tests.chaos.targets import TARGETS, Target
from tests.e2e.spark_harness import DriverSpec, make_input, run_driver

KINDS = ("executor-kill-writing", "executor-kill-prepared", "worker-kill", "driver-kill",
         "speculation")
DEFAULT_TARGETS = ("files", "postgres", "s3", "kafka")
EPOCHS, ROWS_PER_EPOCH, PARTITIONS = 3, 200, 2
KEYS = 7
DRIVER_TIMEOUT_S = 900
MAX_RESTARTS = 8
STALL_S = 90
WORKER_HOSTS = ("127.0.0.2", "127.0.0.3")
SPECULATION_CONF = {
    "spark.speculation": "true",
    "spark.speculation.interval": "500ms",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.multiplier": "1.5",
    "spark.speculation.minTaskRuntime": "2s",
}


class ClusterReport(Tally):
    """One target's chaos runs on the standalone cluster."""

    @property
    def target(self) -> str:
        return self.name


@dataclass
class ClusterPlan:
    task_rules: list[str]  # TXSINK_FAULTS rules for executors
    driver_rules: list[str]  # TXSINK_FAULTS rules for the driver
    worker_kill_after_s: float | None
    speculation: bool


def plan_run(rng: random.Random, faults: int) -> ClusterPlan:
    task: list[str] = []
    driver: list[str] = []
    worker: float | None = None
    speculation = False
    used_task_epochs: set[int] = set()
    for _ in range(faults):
        kind = rng.choice(KINDS)
        epoch = rng.randrange(EPOCHS)
        if kind in ("executor-kill-writing", "executor-kill-prepared", "speculation"):
            free = [e for e in range(EPOCHS) if e not in used_task_epochs]
            if not free:
                continue
            epoch = rng.choice(free)
            used_task_epochs.add(epoch)
            if kind == "speculation":
                speculation = True
                task.append(f"task-after-pre-commit@{epoch}:stall")
            else:
                point = ("task-before-pre-commit" if kind == "executor-kill-writing"
                         else "task-after-pre-commit")
                task.append(f"{point}@{epoch}:kill-jvm")
        elif kind == "driver-kill":
            rule = f"{rng.choice(POINTS)}@{epoch}:kill"
            if rule not in driver:
                driver.append(rule)
        elif worker is None:
            worker = rng.uniform(15, 60)
    return ClusterPlan(task, driver, worker, speculation)


def _kind_of(marker: str) -> str:
    point, _, action = marker.partition(":")
    if action == "stall":
        return "stall"
    if action == "kill-jvm":
        return ("executor-kill-writing" if point.startswith("task-before")
                else "executor-kill-prepared")
    return "driver-kill"


def _expected_ids() -> list[int]:
    return list(range(EPOCHS * ROWS_PER_EPOCH))


def run_once(cluster: SparkStandaloneCluster, target: Target, plan: ClusterPlan,
             report: ClusterReport, workdir: Path, rng: random.Random) -> None:
    name = f"{report.runs}-{rng.randrange(16**8):08x}"
    sink_id = f"cl-{name}"
    once = workdir / name / "fired"
    once.mkdir(parents=True)
    make_input(workdir / name / "in", files=EPOCHS, rows_per_file=ROWS_PER_EPOCH, keys=KEYS)
    options = target.options(name.replace("-", "_"))
    spec = DriverSpec(input_dir=workdir / name / "in", checkpoint=workdir / name / "chk",
                      sink_id=sink_id, backend=target.name, options=options,
                      partitions=PARTITIONS, master=cluster.master_url)
    if target.kind == "kafka":
        spec.select = ["CAST(key AS STRING) AS key", "CAST(id AS STRING) AS value"]
    rules = ",".join(plan.task_rules + plan.driver_rules)
    conf = cluster.driver_conf()
    conf.pop("spark.master")
    conf[f"spark.executorEnv.{ONCE_DIR_ENV}"] = str(once)
    conf[f"spark.executorEnv.{STALL_ENV}"] = str(STALL_S)
    if rules:
        # Driver-side Python workers get spark.executorEnv too: same rules everywhere.
        conf["spark.executorEnv.TXSINK_FAULTS"] = rules
    if plan.speculation:
        conf.update(SPECULATION_CONF)
    spec.conf = conf
    env = {ONCE_DIR_ENV: str(once), STALL_ENV: str(STALL_S)}
    worker_killed = threading.Event()
    output = ""
    for restart in range(MAX_RESTARTS):
        stop = threading.Event()
        killer = None
        if plan.worker_kill_after_s is not None and not worker_killed.is_set():
            index = rng.randrange(len(cluster.workers))
            killer = threading.Thread(
                target=_kill_worker_later,
                args=(cluster, index, plan.worker_kill_after_s, stop, worker_killed),
                daemon=True)
            killer.start()
        done = run_driver(spec, faults=rules or None, timeout_s=DRIVER_TIMEOUT_S,
                          env={**os.environ, **env})
        stop.set()
        if killer is not None:
            killer.join(300)
        output += done.output
        if done.killed:
            continue
        if done.returncode != 0 or "TXSINK-DRIVER-DONE" not in done.output:
            report.failures.append(f"run {name} (restart {restart}): exit {done.returncode}: "
                                   f"{done.output.strip()[-1500:]}")
            return
        break
    else:
        report.failures.append(f"run {name}: did not finish in {MAX_RESTARTS} driver runs")
        return
    for marker in fired(once):
        kind = _kind_of(marker)
        if kind == "stall":
            # The stalled attempt is killed by Spark only when another attempt of the
            # task succeeded; one that slept to its end was not outrun.
            # (A killed worker may have taken the straggler with it: then only Spark's
            # log counts.)
            outlived = OUTLIVED in (once / marker).read_text()
            if ((not outlived and not worker_killed.is_set())
                    or re.search(r"another attempt succeeded", output)):
                report.faults["speculation"] += 1
            else:
                report.notes.append(f"run {name}: a task stalled but Spark launched no "
                                    "winning speculative attempt")
        else:
            report.faults[kind] += 1
    if worker_killed.is_set():
        report.faults["worker-kill"] += 1
    got = target.read(options, sink_id)
    report.count((int(i) for i, _ in got), set(_expected_ids()))
    wrong_keys = [i for i, k in got if str(k) not in (str(i % KEYS), f"k{i % KEYS}")]
    if wrong_keys:
        report.failures.append(f"run {name}: rows with the wrong key, e.g. id {wrong_keys[0]}")
    report.leftovers += target.leftovers(options, sink_id)


def _kill_worker_later(cluster: SparkStandaloneCluster, index: int, delay: float,
                       stop: threading.Event, killed: threading.Event) -> None:
    if stop.wait(delay):
        return  # the driver run ended first
    cluster.kill_worker(index)
    killed.set()
    cluster.restart_worker(index)


def run_target(cluster: SparkStandaloneCluster, name: str, *, runs: int, seed: int,
               faults_per_run: int = 3, progress: object = print) -> ClusterReport:
    report = ClusterReport(name, seed)
    target = TARGETS[name]()
    if target.unavailable:
        report.skipped = target.unavailable
        return report
    started = time.monotonic()
    rng = random.Random(f"{seed}-cluster-{name}")
    target.start()
    try:
        if target.unavailable:
            report.skipped = target.unavailable
            return report
        if target.note:
            report.notes.append(target.note)
        with tempfile.TemporaryDirectory(prefix=f"txsink-chaos-cluster-{name}-") as tmp:
            while report.runs < runs:
                plan = plan_run(rng, faults_per_run)
                run_once(cluster, target, plan, report, Path(tmp), rng)
                report.runs += 1
                if callable(progress):
                    progress(f"{name}: run {report.runs}/{runs}, faults "
                             f"{dict(report.faults)}, lost={report.lost} "
                             f"dup={report.duplicated} leftovers={report.leftovers}")
                if report.failures:
                    break
    finally:
        target.stop()
        report.seconds = time.monotonic() - started
    return report


def table(reports: list[ClusterReport]) -> str:
    return fault_table(reports, KINDS, first="target")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.chaos.cluster", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default=",".join(DEFAULT_TARGETS),
                    help=f"comma-separated, from {', '.join(TARGETS)} "
                         f"(default: {','.join(DEFAULT_TARGETS)})")
    ap.add_argument("--runs", type=int, default=1, help="pipeline runs per target (default 1)")
    ap.add_argument("--faults", type=int, default=3, help="faults planned per run (default 3)")
    ap.add_argument("--seed", type=int, default=None, help="seed (default: random, printed)")
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(10**6)
    print(f"chaos cluster: seed {seed}, {args.runs} run(s) per target, {args.faults} "
          "fault(s) planned per run", flush=True)
    reports = []
    # Distinct loopback hosts: Spark never speculates a task on a host that runs it.
    with SparkStandaloneCluster(workers=2, cores=1, memory="1g",
                                worker_hosts=WORKER_HOSTS) as cluster:
        for name in filter(None, (t.strip() for t in args.targets.split(","))):
            reports.append(run_target(cluster, name, runs=args.runs, seed=seed,
                                      faults_per_run=args.faults,
                                      progress=lambda s: print(s, flush=True)))
    print(table(reports))
    for r in reports:
        for f in r.failures:
            print(f"{r.target}: {f}")
        if not r.ok:
            print(f"reproduce: python -m tests.chaos.cluster --targets {r.target} "
                  f"--seed {r.seed} --runs {args.runs} --faults {args.faults}")
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
