"""Chaos for a group of targets, one decision per epoch: Kafka, PostgreSQL, S3 and files
(``kafka-postgres-s3-files``), and Kafka, PostgreSQL, a Delta table and an Iceberg table
(``kafka-postgres-delta-iceberg``).

Each run writes a fresh group (``EPOCHS`` x ``PARTITIONS`` tasks, each preparing a
participant in every target) through :mod:`tests.chaos.multi_driver` while faults
are injected: driver SIGKILLs at every coordinator point, writer tasks killed before
or after preparing, unreported speculative twins, and a target's server restarted
(or Kafka's broker SIGKILLed) while participants are prepared or half committed.

While the run goes on, a sampler reads what each target shows and then the state: a
target must never show an epoch that has no decision. After recovery every decided
epoch must be in every target exactly once (rows per epoch, count and checksum), and
nothing may stay prepared in any target; a table must hold no orphan data file and
exactly one log entry / snapshot per epoch.

    python -m tests.chaos.multi              # short: 20 faults per group
    python -m tests.chaos.multi --long       # 200 faults per group: the tables, the seed
    python -m tests.chaos.multi --groups kafka-postgres-delta-iceberg --faults 50
"""

from __future__ import annotations

import collections
import io
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txsink.state import DirectoryStateStore, EpochState
from txsink.targets import target_sink_id

from tests.chaos.driver import row_ids
from tests.chaos.multi_driver import goes_to
from tests.chaos.runner import COLUMNS, PARTITIONS, ROOT, plan_run, render
from tests.chaos.targets import (
    DeltaTarget,
    FilesTarget,
    IcebergTarget,
    KafkaTarget,
    PostgresTarget,
    S3Target,
    Target,
)

EPOCHS = 5
#: Per group: target name -> the chaos target (server) it writes to.
GROUPS: dict[str, dict[str, type[Target]]] = {
    "kafka-postgres-s3-files": {"events": KafkaTarget, "totals": PostgresTarget,
                                "archive": S3Target, "files": FilesTarget},
    "kafka-postgres-delta-iceberg": {"events": KafkaTarget, "totals": PostgresTarget,
                                     "delta": DeltaTarget, "iceberg": IcebergTarget},
}
DEFAULT_GROUP = "kafka-postgres-s3-files"
#: The first group's targets (what the Spark tests of a group use).
TARGETS = GROUPS[DEFAULT_GROUP]
SAMPLE_EVERY_S = 0.5


@dataclass
class TargetTally:
    name: str
    backend: str
    records: int = 0
    lost: int = 0
    duplicated: int = 0
    leftovers: int = 0
    #: Samples in which this target showed an epoch the state had no decision for.
    undecided_visible: int = 0
    #: Decided epochs checked to be in this target exactly once.
    epochs_checked: int = 0
    #: A table: data files no committed version names, and the entries carrying the
    #: marker of the target's sink (one per epoch); None for other targets.
    orphans: int | None = None
    entries: int | None = None


@dataclass
class MultiReport:
    seed: int
    group: str = DEFAULT_GROUP
    runs: int = 0
    epochs: int = 0
    samples: int = 0
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    targets: dict[str, TargetTally] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    skipped: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures and all(
            not (t.lost or t.duplicated or t.leftovers or t.undecided_visible or t.orphans)
            for t in self.targets.values())

    def table(self) -> str:
        if self.skipped:
            return f"multi chaos skipped: {self.skipped}"
        faults = ", ".join(f"{k} {self.faults[k]}" for k in COLUMNS)
        head = (f"multi chaos ({self.group}): seed {self.seed}, {self.runs} runs, "
                f"{self.epochs} epochs "
                f"decided, {sum(self.faults.values())} faults ({faults}); "
                f"{self.samples} samples of the targets during the runs; "
                f"{'ok' if self.ok else 'FAILED'} ({self.seconds:.0f}s)")
        cols = ["target", "backend", "records", "lost", "duplicated", "leftovers",
                "epoch visible without a decision", "epochs exactly once"]
        tables = any(t.entries is not None for t in self.targets.values())
        if tables:
            cols += ["orphan files", "table entries"]
        rows = [[t.name, t.backend, str(t.records), str(t.lost), str(t.duplicated),
                 str(t.leftovers), str(t.undecided_visible), str(t.epochs_checked)]
                + ([str(t.orphans) if t.orphans is not None else "-",
                    str(t.entries) if t.entries is not None else "-"] if tables else [])
                for t in self.targets.values()]
        return head + "\n" + render(cols, rows, [])


class Group:
    """A group's servers, and what a run's targets show. ``share``: a started group
    whose servers of the same kind (Kafka, PostgreSQL) this one uses as they are
    (neither started nor stopped here)."""

    def __init__(self, name: str = DEFAULT_GROUP, share: Group | None = None) -> None:
        self.name = name
        self.servers: dict[str, Target] = {}
        self.shared: set[str] = set()
        for target, cls in GROUPS[name].items():
            theirs = share.servers.get(target) if share is not None else None
            if theirs is not None and type(theirs) is cls:
                self.servers[target] = theirs
                self.shared.add(target)
            else:
                self.servers[target] = cls()

    @property
    def unavailable(self) -> str | None:
        missing = [f"{n}: {s.unavailable}" for n, s in self.servers.items() if s.unavailable]
        return "; ".join(missing) or None

    def start(self) -> None:
        for name, s in self.servers.items():
            if name not in self.shared:
                s.start()

    def stop(self) -> None:
        for name, s in self.servers.items():
            if name in self.shared:
                continue
            try:
                s.stop()
            except Exception as exc:  # stop the others anyway
                print(f"stopping {s.name} failed: {exc}", file=sys.stderr)

    def items(self, run: str) -> list[dict[str, Any]]:
        out = []
        for name, server in self.servers.items():
            item: dict[str, Any] = {"name": name, "backend": server.name,
                                    "options": server.options(run)}
            if name == "totals":
                item["epoch_column"] = "txsink_epoch"
            out.append(item)
        return out

    # -- what a reader sees: (epoch, id) of every row, with repeats ------------------------

    def rows(self, name: str, options: dict[str, str], sink_id: str) -> list[tuple[int, int]]:
        sid = target_sink_id(sink_id, name)
        server = self.servers[name]
        if server.name in ("delta", "iceberg"):
            from tests.chaos import lake

            return lake.epoch_rows(server.name, options)
        if server.name == "files":
            import pyarrow.parquet as pq

            out: list[tuple[int, int]] = []
            for f in sorted(Path(options["path"]).glob("part-*.parquet")):
                epoch = int(f.name[5:15])
                out += [(epoch, i) for i in pq.read_table(f, columns=["id"]).column(
                    "id").to_pylist()]
            return out
        if server.name == "postgres":
            import psycopg

            assert isinstance(server, PostgresTarget)
            try:
                with psycopg.connect(server.server.url_with_password) as conn:
                    rows = conn.execute(
                        f"SELECT txsink_epoch, id FROM {options['table']}").fetchall()
            except psycopg.errors.UndefinedTable:
                return []
            return [(int(e), int(i)) for e, i in rows]
        if server.name == "s3":
            import pyarrow.parquet as pq

            assert isinstance(server, S3Target)
            client = server.server.client()
            base = f"{options['prefix']}/{sid}/"
            out = []
            for page in client.get_paginator("list_objects_v2").paginate(
                    Bucket=server.bucket, Prefix=base):
                for obj in page.get("Contents", []):
                    key = str(obj["Key"])
                    if not key.endswith(".parquet") or "/epoch=" not in key:
                        continue
                    epoch = int(key[len(base):].split("/", 1)[0].split("=", 1)[1])
                    body = client.get_object(Bucket=server.bucket, Key=key)["Body"].read()
                    ids = pq.read_table(io.BytesIO(body), columns=["id"]).column("id")
                    out += [(epoch, i) for i in ids.to_pylist()]
            return out
        from txsink_kafka.reader import read_up_to_cut, record_epoch

        assert isinstance(server, KafkaTarget)
        # What a read_committed reader of the cut's helper gets (every epoch: no cut);
        # librdkafka's own log stays quiet while the broker is being restarted.
        read = read_up_to_cut({"bootstrap.servers": server.bootstrap, "log_level": "0"},
                              options["topic"], cut=2**62)
        return [(_epoch_or(record_epoch(m)), int(m.value() or b"-1")) for m in read.records]

    def leftovers(self, name: str, options: dict[str, str], sink_id: str) -> int:
        return self.servers[name].leftovers(options, target_sink_id(sink_id, name))


def _epoch_or(epoch: int | None) -> int:
    """A record without the header counts as epoch -1 (which no decision names)."""
    return -1 if epoch is None else epoch


def expected(name: str) -> dict[int, list[int]]:
    return {e: sorted(i for p in range(PARTITIONS) for i in row_ids(e, p) if goes_to(name, i))
            for e in range(EPOCHS)}


def decided_epochs(state: Path) -> set[int] | None:
    """Epochs with a decision (DECIDED or COMMITTED, pruned ones by the watermark)."""
    store = DirectoryStateStore(state)
    if not (state / "meta.json").exists():
        return set()
    states = store.states()
    meta = store.read_meta()
    decided = {e for e, s in states.items() if s is not EpochState.RESERVED}
    if meta is not None:
        decided |= set(range(meta.committed_watermark + 1))
    return decided


class Sampler(threading.Thread):
    """Reads every target, then the state, until stopped: counts epochs a target shows
    without a decision. Target first: a decision found after the target showed the
    epoch was there before it (decisions are never taken back)."""

    def __init__(self, group: Group, report: MultiReport) -> None:
        super().__init__(daemon=True, name="multi-chaos-sampler")
        self.group = group
        self.report = report
        self.current: tuple[list[dict[str, Any]], str, Path] | None = None
        self.stopped = threading.Event()
        self.errors: collections.Counter[str] = collections.Counter()

    def finish(self) -> None:
        """Stop and wait for the sampler: it must not judge anything after the report is
        printed (once it did, after a 60-second join timed out on a loaded machine)."""
        self.current = None
        self.stopped.set()
        self.join()

    def run(self) -> None:
        while not self.stopped.wait(SAMPLE_EVERY_S):
            current = self.current
            if current is None:
                continue
            items, sink_id, state = current
            shown: dict[str, set[int]] = {}
            for item in items:
                try:
                    shown[item["name"]] = {e for e, _ in self.group.rows(
                        item["name"], item["options"], sink_id)}
                except Exception as exc:  # a server being restarted: sample it next time
                    self.errors[type(exc).__name__] += 1
            decided = decided_epochs(state / "txsink")
            if decided is None or self.current is not current:
                # The run ended while this sample was read (a slow read on a loaded
                # machine): its state may be gone already, so the sample says nothing.
                continue
            self.report.samples += 1
            for name, epochs in shown.items():
                bad = sorted(epochs - decided)
                if bad:
                    self.report.targets[name].undecided_visible += 1
                    self.report.failures.append(
                        f"target {name} showed epoch(s) {bad} with no decision in {state}")


def run_once(group: Group, plan: Any, report: MultiReport, workdir: Path,
             sampler: Sampler) -> None:
    import uuid

    name = uuid.uuid4().hex[:8]
    sink_id = f"mc-{name}"
    items = group.items(name)
    state = workdir / name
    spec = {"targets": items, "sink_id": sink_id, "state": str(state), "epochs": EPOCHS,
            "partitions": PARTITIONS, "task_faults": plan.task_faults}
    spec_file = workdir / f"{name}.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXSINK_FAULTS")}
    sampler.current = (items, sink_id, state)
    rng = random.Random(f"{report.seed}-{report.runs}")
    for i, fault in enumerate([*plan.driver_faults, None]):
        spec["run"] = i
        spec_file.write_text(json.dumps(spec))
        run_env = dict(env)
        if fault is not None:
            run_env["TXSINK_FAULTS"] = f"{fault[1]}@{fault[0]}:kill"
        done = subprocess.run([sys.executable, "-m", "tests.chaos.multi_driver",
                               str(spec_file)], cwd=ROOT, env=run_env, capture_output=True,
                              text=True, timeout=900, check=False)
        if fault is not None and done.returncode == -signal.SIGKILL:
            kind = fault[2] or "driver-kill"
            report.faults[kind] += 1
            if kind == "server-kill":
                group.servers["events"].restart_server(hard=True)
            elif kind == "server-restart":
                victim = rng.choice([n for n, s in group.servers.items() if s.can_restart])
                group.servers[victim].restart_server(hard=False)
            continue
        if done.returncode != 0:
            report.failures.append(f"run {name} segment {i}: exit {done.returncode}: "
                                   f"{done.stderr.strip()[-2000:]}")
            sampler.current = None
            return
    sampler.current = None
    log = state / "faults.log"
    for line in (log.read_text().split() if log.exists() else []):
        report.faults[line.split("@")[0]] += 1
    decided = decided_epochs(state / "txsink") or set()
    report.epochs += len(decided)
    if decided != set(range(EPOCHS)):
        report.failures.append(f"run {name}: decided epochs {sorted(decided)} after recovery")
    for item in items:
        t = report.targets[item["name"]]
        got = group.rows(item["name"], item["options"], sink_id)
        want = expected(item["name"])
        wanted_ids = {i for ids in want.values() for i in ids}
        counts = collections.Counter(i for _, i in got)
        t.records += len(wanted_ids)
        t.lost += sum(1 for i in wanted_ids if counts[i] == 0)
        t.duplicated += sum(c - 1 for i, c in counts.items() if c > 1 and i in wanted_ids)
        t.duplicated += sum(c for i, c in counts.items() if i not in wanted_ids)
        by_epoch: dict[int, list[int]] = collections.defaultdict(list)
        for e, i in got:
            by_epoch[e].append(i)
        for e in sorted(decided):
            if sorted(by_epoch.get(e, [])) == want.get(e):
                t.epochs_checked += 1
            else:
                report.failures.append(f"run {name}: epoch {e} in target {item['name']} is "
                                       f"not exactly its rows ({len(by_epoch.get(e, []))} "
                                       f"row(s), want {len(want.get(e, []))})")
        t.leftovers += group.leftovers(item["name"], item["options"], sink_id)
        check = group.servers[item["name"]].table_check(
            item["options"], target_sink_id(sink_id, item["name"]), EPOCHS)
        if check is not None:
            orphans, entries, problems = check
            t.orphans = (t.orphans or 0) + orphans
            t.entries = (t.entries or 0) + entries
            report.failures += [f"run {name}: target {item['name']}: {p}" for p in problems]


def run_multi(*, faults: int, seed: int, faults_per_run: int = 4,
              progress: Callable[[str], None] = lambda s: None,
              group: Group | None = None, start: bool = False) -> MultiReport:
    """``group``: servers already started (left running), or with ``start`` started and
    stopped here; no group: the first group's, started and stopped here."""
    own = group is None or start
    group = group or Group()
    report = MultiReport(seed, group.name)
    report.targets = {n: TargetTally(n, s.name) for n, s in group.servers.items()}
    if group.unavailable:
        report.skipped = group.unavailable
        return report
    started = time.monotonic()
    rng = random.Random(f"{seed}-multi" if group.name == DEFAULT_GROUP
                        else f"{seed}-multi-{group.name}")
    if own:
        group.start()
    sampler = Sampler(group, report)
    sampler.start()
    try:
        if group.unavailable:
            report.skipped = group.unavailable
            return report
        with tempfile.TemporaryDirectory(prefix="txsink-chaos-multi-") as tmp:
            while sum(report.faults.values()) < faults and report.runs < faults:
                plan = plan_run(rng, faults_per_run, True, True,
                                report.faults["server-restart"] + report.faults["server-kill"])
                run_once(group, plan, report, Path(tmp), sampler)
                report.runs += 1
                progress(f"multi: run {report.runs}, {sum(report.faults.values())}/{faults} "
                         f"faults, {report.samples} samples, " + ", ".join(
                             f"{t.name} lost={t.lost} dup={t.duplicated} "
                             f"left={t.leftovers} undecided={t.undecided_visible}"
                             for t in report.targets.values()))
                if report.failures:
                    break
    finally:
        sampler.finish()
        for s in group.servers.values():
            s.failed = not report.ok
        if own:
            group.stop()
        report.seconds = time.monotonic() - started
    return report


def main(argv: Iterable[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tests.chaos.multi", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--faults", type=int, default=20, help="faults per group (default 20)")
    ap.add_argument("--long", action="store_true", help="200 faults per group")
    ap.add_argument("--groups", default=",".join(GROUPS),
                    help=f"comma-separated, from {', '.join(GROUPS)} (default: all)")
    ap.add_argument("--seed", type=int, default=None, help="seed (default: random, printed)")
    args = ap.parse_args(list(argv) if argv is not None else None)
    # SIGTERM (kill PID, a CI time limit) unwinds like ^C, so the servers it started stop.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    seed = args.seed if args.seed is not None else random.randrange(10**6)
    faults = 200 if args.long else args.faults
    print(f"multi chaos: seed {seed}, {faults} faults per group", flush=True)
    reports = [run_multi(faults=faults, seed=seed, group=Group(name.strip()),
                         progress=lambda s: print(s, flush=True), start=True)
               for name in args.groups.split(",") if name.strip()]
    for report in reports:
        print(report.table())
        for f in report.failures[:20]:
            print(f"failure: {f}")
        if not report.ok:
            print(f"reproduce: python -m tests.chaos.multi --groups {report.group} "
                  f"--seed {seed} --faults {faults}")
    return 0 if all(r.ok or r.skipped for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
