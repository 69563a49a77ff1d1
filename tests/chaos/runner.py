"""Seeded, reproducible fault injection across backends.

Each run writes a fresh sink (``EPOCHS`` x ``PARTITIONS`` participants) through
:mod:`tests.chaos.driver` while faults are injected at random protocol points:

* ``driver-kill``: SIGKILL of the driver at a random coordinator point;
* ``task-dies-after-prepare`` / ``task-dies-before-prepare``: a writer process is
  killed and the task retried (the prepared one becomes an orphan);
* ``speculative-twin``: a second attempt of a task prepares too, and loses;
* ``server-restart``: the driver is killed mid-protocol and the backend's server is
  restarted before the pipeline resumes (prepared data must survive it);
* ``server-kill``: the same, but the server is SIGKILLed (for servers that can be:
  Kafka's broker JVM); a target's server faults alternate kill, restart, kill, ...
* a table format's own (Delta Lake, Iceberg, :mod:`tests.chaos.lake`): another writer
  appending or compacting between our read of the table and our commit
  (``concurrent-append``, ``concurrent-compact``), and the log / catalog write failing
  after it took effect (``commit-unknown``).

A target may bring faults of its own kinds instead: ``kafka-cluster`` fails over a
three-node Kafka cluster under the protocol (:mod:`tests.chaos.failover`).

After the faults the pipeline is resumed to completion and its output compared
with the input: record count, per-key checksum, lost and duplicated records, and
prepared participants left behind; for a table, also the data files no committed
version names (orphans) and the entries per epoch (exactly one). The same seed
replays the same plan.

    python -m tests.chaos                 # short mode: 20 faults per backend
    python -m tests.chaos --long          # 200 faults per backend
    python -m tests.chaos --backends postgres --seed 7
    python -m tests.chaos --backends kafka-cluster --long   # tox -e kafka-cluster-long
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from txsink.faults import AFTER_DECIDE, POINTS

from tests.chaos import driver
from tests.chaos.lake import KINDS as LAKE_KINDS
from tests.chaos.targets import DEFAULT_TARGETS, TARGETS, Target, digest, new_run_name

ROOT = Path(__file__).resolve().parents[2]
EPOCHS, PARTITIONS = 5, 3
TASK_KINDS = ("task-dies-after-prepare", "task-dies-before-prepare", "speculative-twin")
KINDS = ("driver-kill", *TASK_KINDS, "server-restart")
#: Table columns: the kinds drawn, and the SIGKILL variant of a server restart.
COLUMNS = (*KINDS, "server-kill")


@dataclass
class Tally:
    """What chaos runs add up, per target: faults by kind, records, and what was wrong."""

    name: str
    seed: int
    runs: int = 0
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    records: int = 0
    lost: int = 0
    duplicated: int = 0
    leftovers: int = 0
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None
    seconds: float = 0.0
    #: Protocol steps a crash fired at: coordinator points and task fault kinds.
    points: collections.Counter[str] = field(default_factory=collections.Counter)
    #: Tables: data files no committed version names, and the log entries / snapshots
    #: carrying the sink's marker (one per epoch).
    orphans: int = 0
    entries: int = 0
    epochs: int = 0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.leftovers or self.orphans
                    or self.failures)

    def count(self, got_ids: Iterable[int], wanted: set[int]) -> None:
        """Add one run's output (ids, each as often as a reader sees it) to the tally."""
        counts = collections.Counter(got_ids)
        self.records += len(wanted)
        self.lost += sum(1 for i in wanted if counts[i] == 0)
        self.duplicated += sum(c - 1 for i, c in counts.items() if c > 1 and i in wanted)
        self.duplicated += sum(c for i, c in counts.items() if i not in wanted)


class Report(Tally):
    """One backend's chaos runs in a single process (``python -m tests.chaos``)."""

    @property
    def backend(self) -> str:
        return self.name

    @property
    def note(self) -> str | None:
        return "; ".join(self.notes) or None

    @note.setter
    def note(self, value: str | None) -> None:
        self.notes = [value] if value else []


@dataclass
class Plan:
    driver_faults: list[tuple[int, str, str]]  # (epoch, point, "" | server fault kind)
    task_faults: dict[str, str]  # "epoch:partition" -> kind
    #: Faults of the target's own kinds (see Target.plan_faults), fired by the driver.
    failover: list[dict[str, object]] = field(default_factory=list)
    #: A table's own faults (tests.chaos.lake): "epoch" -> kind.
    lake: dict[str, str] = field(default_factory=dict)


def plan_run(rng: random.Random, faults: int, can_restart: bool, can_kill: bool = False,
             server_faults: int = 0, lake_kinds: Sequence[str] = (),
             points: Sequence[str] = POINTS) -> Plan:
    """``server_faults``: how many the target had before this run (kill comes first).
    ``lake_kinds``: a table's own kinds, drawn with the others (one per epoch).
    ``points``: the driver's crash points, in protocol order."""
    kinds = [k for k in KINDS if can_restart or k != "server-restart"] + list(lake_kinds)
    driver_faults: list[tuple[int, str, str]] = []
    task_faults: dict[str, str] = {}
    lake: dict[str, str] = {}
    for n in range(faults):
        kind = rng.choice(kinds)
        if can_kill and server_faults == 0 and n == 0:
            kind = "server-restart"  # every run of such a target kills its server once
        epoch = rng.randrange(EPOCHS)
        if kind in lake_kinds:
            free = [e for e in range(EPOCHS) if str(e) not in lake]
            lake[str(rng.choice(free))] = kind
        elif kind in TASK_KINDS:
            free = [f"{e}:{p}" for e in range(EPOCHS) for p in range(PARTITIONS)
                    if f"{e}:{p}" not in task_faults]
            task_faults[rng.choice(free)] = kind
        elif kind == "driver-kill":
            driver_faults.append((epoch, rng.choice(points), ""))
        else:  # the server goes down while participants are prepared or half committed
            kill = can_kill and server_faults % 2 == 0
            server_faults += 1
            driver_faults.append((epoch, rng.choice(POINTS[:3]),
                                  "server-kill" if kill else "server-restart"))
    driver_faults.sort(key=lambda f: (f[0], points.index(f[1])))
    return Plan(driver_faults, task_faults, lake=lake)


def plan_every_point(can_restart: bool, can_kill: bool = False,
                     lake_kinds: Sequence[str] = (),
                     points: Sequence[tuple[int, str]] | None = None) -> Plan:
    """One crash at every protocol step, in one run of ``EPOCHS`` epochs: the driver
    killed at each coordinator point (one per epoch, in protocol order), a writer killed
    before and after its prepare, and a speculative twin. A target with a server has it
    go down (SIGKILL where it can be killed) with a decided epoch still uncommitted.
    What the default run keeps of chaos (``test_a_crash_at_every_protocol_step``).
    ``points``: the (epoch, point) deaths when they are not one coordinator point per
    epoch (a target with crash points of its own)."""
    assert len(POINTS) <= EPOCHS
    driver_faults = [(epoch, point, "") for epoch, point in
                     (points or list(enumerate(POINTS)))]
    if can_restart:  # the server goes down with a decided epoch not committed
        at = [p for _, p, _ in driver_faults].index(AFTER_DECIDE)
        epoch, point, _ = driver_faults[at]
        driver_faults[at] = (epoch, point, "server-kill" if can_kill else "server-restart")
    task_faults = {"0:1": "task-dies-before-prepare", "2:0": "task-dies-after-prepare",
                   "3:2": "speculative-twin"}
    # A table's own faults: a compaction racing the commit that recovery makes after the
    # driver died past the decision, a log write failing after success just before the
    # driver dies with the epoch not yet marked, another writer's append at the last.
    lake = {"1": "concurrent-compact", "3": "commit-unknown", "4": "concurrent-append"}
    return Plan(driver_faults, task_faults, lake=lake if lake_kinds else {})


def expected_rows() -> list[tuple[int, str]]:
    return [(i, f"k{i % 13}") for e in range(EPOCHS) for p in range(PARTITIONS)
            for i in driver.row_ids(e, p)]


def run_once(target: Target, plan: Plan, report: Report, workdir: Path) -> None:
    name = new_run_name()
    sink_id = f"chaos-{name}"
    options = target.options(name)
    state = workdir / name
    spec = {"backend": target.name, "options": options, "sink_id": sink_id,
            "state": str(state), "epochs": EPOCHS, "partitions": PARTITIONS,
            "kind": target.kind, "task_faults": plan.task_faults,
            "failover": plan.failover, "lake_faults": plan.lake}
    spec_file = workdir / f"{name}.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXSINK_FAULTS")}
    segments: list[tuple[int, str, str] | None] = [*plan.driver_faults, None]
    for i, fault in enumerate(segments):
        spec["run"] = i
        spec_file.write_text(json.dumps(spec))
        run_env = dict(env)
        if fault is not None:
            run_env["TXSINK_FAULTS"] = f"{fault[1]}@{fault[0]}:kill"
        done = target.run_driver([sys.executable, "-m", "tests.chaos.driver", str(spec_file)],
                                 run_env, state, timeout_s=600)
        if fault is not None and done.returncode == -signal.SIGKILL:
            report.faults[fault[2] or "driver-kill"] += 1
            report.points[fault[1]] += 1
            if fault[2]:
                target.restart_server(hard=fault[2] == "server-kill")
            continue
        if done.returncode != 0:
            report.failures.append(f"run {name} segment {i}: exit {done.returncode}: "
                                   f"{done.stderr.strip()[-1500:]}")
            return
    log = state / "faults.log"
    for line in (log.read_text().split() if log.exists() else []):
        kind = line.split("@")[0]
        report.faults[kind] += 1
        if kind not in LAKE_KINDS:
            report.points[kind] += 1
    report.faults.update(target.faults_fired(state))
    got = target.read(options, sink_id)
    want = expected_rows()
    report.count((i for i, _ in got), {i for i, _ in want})
    if digest(got) != digest(want) and not (report.lost or report.duplicated):
        report.failures.append(f"run {name}: per-key checksums differ")
    report.leftovers += target.leftovers(options, sink_id)
    check = target.table_check(options, sink_id, EPOCHS)
    if check is not None:
        orphans, entries, problems = check
        report.orphans += orphans
        report.entries += entries
        report.epochs += EPOCHS
        report.failures += [f"run {name}: {p}" for p in problems]


def run_backend(name: str, *, faults: int, seed: int, faults_per_run: int | None = None,
                progress: Callable[[str], None] = lambda s: None,
                cluster: object | None = None, every_point: bool = False) -> Report:
    """``cluster``: a running Kafka cluster for the ``kafka-cluster`` target to use
    (and leave running) instead of starting its own. ``every_point``: one run of
    :func:`plan_every_point` instead of random faults."""
    report = Report(name, seed)
    target = TARGETS[name]()
    if cluster is not None:
        target.cluster = cluster  # type: ignore[attr-defined]
    faults_per_run = faults_per_run or getattr(target, "faults_per_run", 4)
    if target.unavailable:
        report.skipped = target.unavailable
        return report
    started = time.monotonic()
    rng = random.Random(f"{seed}-{name}")
    target.start()
    try:
        if target.unavailable:  # found out by probing the live server
            report.skipped = target.unavailable
            return report
        report.note = target.note
        with tempfile.TemporaryDirectory(prefix=f"txsink-chaos-{name}-") as tmp:
            while sum(report.faults.values()) < faults and report.runs < faults:
                own = None if every_point else target.plan_faults(rng, faults_per_run)
                lake_kinds = getattr(target, "lake_kinds", ())
                if every_point:
                    plan = plan_every_point(target.can_restart, target.can_kill_server,
                                            lake_kinds, target.every_point)
                elif own is not None:
                    plan = Plan([], {}, own)
                else:
                    plan = plan_run(rng, faults_per_run, target.can_restart,
                                    target.can_kill_server,
                                    report.faults["server-restart"]
                                    + report.faults["server-kill"], lake_kinds,
                                    target.points)
                try:
                    run_once(target, plan, report, Path(tmp))
                except Exception as exc:  # the harness or a server: fail the report,
                    import traceback  # so that the target keeps its logs

                    report.failures.append(f"run {report.runs + 1}: {type(exc).__name__}: "
                                           f"{exc}\n{traceback.format_exc()[-3000:]}")
                report.runs += 1
                progress(f"{name}: run {report.runs}, {sum(report.faults.values())}/{faults} "
                         f"faults, lost={report.lost} dup={report.duplicated} "
                         f"leftovers={report.leftovers} orphans={report.orphans}")
                if report.failures or every_point:
                    break
    finally:
        target.failed = not report.ok
        target.stop()
        report.note = target.note
        report.seconds = time.monotonic() - started
    return report


def kinds_of(target: str) -> tuple[str, ...]:
    """The fault kinds (table columns) of a target's runs."""
    return TARGETS[target].kinds or COLUMNS if target in TARGETS else COLUMNS


def table(reports: Sequence[Tally], kinds: Sequence[str] = COLUMNS,
          first: str = "backend") -> str:
    """The fault table of chaos runs: one row per target, then the notes."""
    cols = [first, "runs", *kinds, "records", "lost", "duplicated", "leftovers", "seed",
            "result"]
    rows = []
    for r in reports:
        if r.skipped:
            rows.append([r.name, "-", *["-"] * len(kinds), "-", "-", "-", "-", str(r.seed),
                         f"skipped: {r.skipped}"])
            continue
        rows.append([r.name, str(r.runs), *[str(r.faults[k]) for k in kinds],
                     str(r.records), str(r.lost), str(r.duplicated), str(r.leftovers),
                     str(r.seed), ("ok" if r.ok else "FAILED") + f" ({r.seconds:.0f}s)"])
    notes = [f"{r.name}: {n}" for r in reports if not r.skipped for n in r.notes]
    notes += [f"{r.name}: {r.entries} table entries carry the sink's marker for {r.epochs} "
              f"epochs (one each: {'yes' if r.entries == r.epochs and r.ok else 'NO'}), "
              f"{r.orphans} orphan data files" for r in reports if r.epochs]
    return render(cols, rows, notes)


def render(cols: list[str], rows: list[list[str]], notes: list[str]) -> str:
    """A plain-text table with aligned columns, then the notes (shared by chaos modes)."""
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(cols)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))

    return "\n".join([line(cols), line(["-" * w for w in widths]), *map(line, rows), *notes])


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default=",".join(DEFAULT_TARGETS),
                    help=f"comma-separated, from {', '.join(TARGETS)} (default: "
                         f"{','.join(DEFAULT_TARGETS)})")
    ap.add_argument("--faults", type=int, default=20, help="faults per backend (default 20)")
    ap.add_argument("--long", action="store_true", help="200 faults per backend")
    ap.add_argument("--seed", type=int, default=None, help="seed (default: random, printed)")
    args = ap.parse_args(argv)
    # SIGTERM (kill PID, a CI time limit) unwinds like ^C, so the servers it started stop.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    seed = args.seed if args.seed is not None else random.randrange(10**6)
    faults = 200 if args.long else args.faults
    print(f"chaos: seed {seed}, {faults} faults per backend", flush=True)
    reports = [run_backend(b.strip(), faults=faults, seed=seed,
                           progress=lambda s: print(s, flush=True))
               for b in args.backends.split(",") if b.strip()]
    for kinds in dict.fromkeys(kinds_of(r.name) for r in reports):
        print(table([r for r in reports if kinds_of(r.name) == kinds], kinds))
    for r in reports:
        for f in r.failures:
            print(f"{r.backend}: {f}")
        if not r.ok:
            print(f"reproduce: python -m tests.chaos --backends {r.backend} --seed {r.seed} "
                  f"--faults {faults}")
    return 0 if all(r.ok for r in reports) else 1
