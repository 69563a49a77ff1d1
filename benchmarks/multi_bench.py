"""The cost of one epoch across three systems (a script, not a test).

The same cached DataFrame goes, epoch after epoch, to Kafka (events), PostgreSQL
(totals) and S3 (an archive), the way a ``foreachBatch`` job would write them, in four
ways taking turns epoch by epoch (so each sees the same machine load, and no way
starts on Python workers Spark stopped while the built-in writes ran):

* ``group``: one txsink sink with three targets (``txsink.spark.targets(...).write``):
  one Spark job writes every target from each task, one decision per epoch;
* ``grouped``: grouped writes (``txsink.spark.epoch``): one Spark job per target
  prepares it, the block's end decides once and commits the three;
* ``separate``: three txsink sinks (``df.write.format("txsink")`` three times), each
  exactly once on its own: what a group replaces;
* ``builtin``: Spark's own Kafka sink, JDBC writer and Parquet writer through
  ``s3a://``, at-least-once: what users write without txsink.

It prints records/s per way (records per epoch times epochs over the median round
time), the ratios to ``separate`` and ``builtin``, and the commit latency per epoch
(decided to committed, from the state; for ``separate`` the three sinks' latencies of
an epoch added up, as their writes run one after the other), then checks every output
(record counts). Servers and the Spark session are run_all's own.

    uv run python benchmarks/multi_bench.py [--rows 100000] [--epochs 4] [--rounds 3]
        [--json results.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run_all import BUCKET, Env, environment, rows_frame  # noqa: E402

MODES = ("group", "grouped", "separate", "builtin")
LABELS = {
    "group": "txsink group of 3 targets (one write, one decision per epoch)",
    "grouped": "txsink grouped writes (txsink.spark.epoch: a prepare job per target)",
    "separate": "3 separate txsink sinks (3 writes, 3 decisions per epoch)",
    "builtin": "3 Spark built-in writes (Kafka sink, JDBC, s3a Parquet), at-least-once",
}
EVENTS = ["CAST(id AS STRING) AS key",
          "to_json(named_struct('id', id, 'key', key, 'amount', amount, 'name', name)) "
          "AS value"]
TOTALS = ["id", "key", "amount"]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


class Bench:
    def __init__(self, env: Env, df: Any) -> None:
        import txsink.spark as ts
        from txsink_kafka import testing as kt

        self.env, self.df, self.run = env, df, uuid.uuid4().hex[:6]
        self.dsn = f"host=127.0.0.1 port={env.pg_port} dbname=postgres user={env.pg_user}"
        self.topics = {m: f"multi-{m}-{self.run}" for m in MODES}
        self.tables = {m: f"public.multi_{m}_{self.run}" for m in MODES}
        for m in MODES:
            kt.create_topic(env.kafka_bootstrap, self.topics[m], 2)
        self.markers = f"multi-markers-{self.run}"
        self.states: dict[str, list[Path]] = {m: [] for m in MODES}
        self.groups = {m: ts.targets(f"mb-{m}-{self.run}", self.items(m),
                                     checkpoint_location=str(env.work / "chk" / m))
                       for m in ("group", "grouped")}
        self.states["group"] = [env.work / "chk" / "group" / "txsink"]
        self.states["grouped"] = [env.work / "chk" / "grouped" / "txsink"]
        self.grouped_version = 0

    def kafka(self, mode: str) -> dict[str, str]:
        return {"kafka.bootstrap.servers": self.env.kafka_bootstrap,
                "topic": self.topics[mode], "marker.topic": self.markers}

    def postgres(self, mode: str) -> dict[str, str]:
        return {"dsn": self.dsn, "password": self.env.pg_password,
                "table": self.tables[mode], "create_table": "true"}

    def s3(self, mode: str) -> dict[str, str]:
        return {"bucket": BUCKET, "prefix": f"{self.run}/{mode}",
                "endpoint_url": self.env.s3_endpoint, "region": "us-east-1",
                "addressing_style": "path", "access_key_id": self.env.s3_access_key,
                "secret_access_key": self.env.s3_secret_key}

    def items(self, mode: str) -> list[dict[str, Any]]:
        return [{"name": "events", "backend": "kafka", "select": EVENTS,
                 "options": self.kafka(mode)},
                {"name": "totals", "backend": "postgres", "select": TOTALS,
                 "options": self.postgres(mode)},
                {"name": "archive", "backend": "s3", "options": self.s3(mode)}]

    # -- the four ways of writing one epoch ---------------------------------------------------

    def group(self) -> None:
        self.groups["group"].write(self.df)

    def grouped(self) -> None:
        g = self.groups["grouped"]
        with g.epoch(self.env.spark, version=self.grouped_version) as tx:
            for name in ("events", "totals", "archive"):
                tx.write(self.df, name)  # each target's own select applies
        self.grouped_version += 1

    def separate(self) -> None:
        for backend, frame, options in (
                ("kafka", self.df.selectExpr(*EVENTS), self.kafka("separate")),
                ("postgres", self.df.selectExpr(*TOTALS), self.postgres("separate")),
                ("s3", self.df, self.s3("separate"))):
            sink = f"mb-sep-{backend[:2]}-{self.run}"
            chk = self.env.work / "chk" / sink
            (frame.write.format("txsink").mode("append").option("backend", backend)
             .option("sink_id", sink).option("checkpointLocation", str(chk))
             .options(**options).save())
            if chk / "txsink" not in self.states["separate"]:
                self.states["separate"].append(chk / "txsink")

    def builtin(self) -> None:
        (self.df.selectExpr(*EVENTS).write.format("kafka")
         .option("kafka.bootstrap.servers", self.env.kafka_bootstrap)
         .option("topic", self.topics["builtin"]).save())
        self.df.selectExpr(*TOTALS).write.jdbc(
            f"jdbc:postgresql://127.0.0.1:{self.env.pg_port}/postgres",
            self.tables["builtin"], mode="append",
            properties={"user": self.env.pg_user, "password": self.env.pg_password,
                        "driver": "org.postgresql.Driver"})
        self.df.write.mode("append").parquet(f"s3a://{BUCKET}/{self.run}/builtin")

    # -- what the state says, and what the outputs hold -----------------------------------

    def commit_ms(self, mode: str) -> list[float]:
        """Per epoch, decided to committed (a separate sink's three added up)."""
        from txsink.state import DirectoryStateStore, EpochState

        per_state = []
        for path in self.states[mode]:
            records = sorted(DirectoryStateStore(path).records().values(),
                             key=lambda r: r.epoch)
            per_state.append([1000 * (r.committed_at - r.decided_at) for r in records
                              if r.state is EpochState.COMMITTED and r.committed_at])
        if not per_state:
            return []
        return [sum(values) for values in zip(*per_state, strict=False)]

    def check(self, writes: int) -> dict[str, int]:
        import psycopg
        from kafka_bench import end_offsets

        expected = self.df.count() * writes
        counts = {}
        with psycopg.connect(self.dsn, password=self.env.pg_password, autocommit=True) as c:
            for mode in MODES:
                row = c.execute(f"SELECT count(*) FROM {self.tables[mode]}").fetchone()
                counts[f"postgres {mode}"] = int(row[0]) if row else -1
                assert counts[f"postgres {mode}"] == expected, (mode, row, expected)
        for mode in MODES:
            isolation = "read_uncommitted" if mode == "builtin" else "read_committed"
            got = end_offsets(self.env.kafka_bootstrap, self.topics[mode], isolation)
            counts[f"kafka {mode}"] = got
            assert got >= expected, (mode, got, expected)  # control records take offsets
        return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000, help="records per epoch")
    parser.add_argument("--epochs", type=int, default=4, help="epochs per round and way")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (after a warm-up)")
    parser.add_argument("--quick", action="store_true", help="20,000 rows, 2 epochs, 1 round")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.epochs, args.rounds = 20_000, 2, 1
    seconds: dict[str, list[float]] = {m: [] for m in MODES}
    with contextlib.ExitStack() as stack:
        env = environment(stack, ["kafka", "postgres", "s3"])
        df = rows_frame(env.spark, args.rows, 2)
        bench = Bench(env, df)
        ways: dict[str, Callable[[], None]] = {m: getattr(bench, m) for m in MODES}
        for r in range(-1, args.rounds):  # round -1: warm-up, not counted
            took = dict.fromkeys(MODES, 0.0)
            # The ways take turns epoch by epoch: Spark stops Python workers idle for a
            # minute, and a way that ran all its epochs after a long built-in stretch
            # would pay their start-up alone.
            for _ in range(args.epochs):
                for mode, write in ways.items():
                    started = time.perf_counter()
                    write()
                    took[mode] += time.perf_counter() - started
            label = "warm-up" if r < 0 else f"round {r + 1}/{args.rounds}"
            for mode in MODES:
                if r >= 0:
                    seconds[mode].append(took[mode])
                print(f"  {label:<11} {mode:<9} {took[mode]:7.2f} s  "
                      f"{args.rows * args.epochs / took[mode]:>10,.0f} rec/s per target",
                      flush=True)
        counts = bench.check((args.rounds + 1) * args.epochs)
        commits = {m: bench.commit_ms(m) for m in MODES if m != "builtin"}
        df.unpersist()

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(seconds[b], seconds[a], strict=True))

    result: dict[str, Any] = {
        "rows_per_epoch": args.rows, "epochs": args.epochs, "rounds": args.rounds,
        "quick": args.quick, "versions": env.versions,
        "ways": {m: {"label": LABELS[m], "seconds": seconds[m],
                     "records_per_s": args.rows * args.epochs / statistics.median(seconds[m]),
                     **({"commit_p50_ms": percentile(commits[m], 0.5),
                         "commit_p95_ms": percentile(commits[m], 0.95),
                         "commit_epochs": len(commits[m])} if commits.get(m) else {})}
                 for m in MODES},
        "ratios": {"group_vs_separate": ratio("group", "separate"),
                   "group_vs_builtin": ratio("group", "builtin"),
                   "grouped_vs_separate": ratio("grouped", "separate"),
                   "grouped_vs_builtin": ratio("grouped", "builtin"),
                   "separate_vs_builtin": ratio("separate", "builtin")},
        "counts": counts,
    }
    print(f"\n{args.rows:,} records per epoch per target, {args.epochs} epochs, "
          f"{args.rounds} round(s)")
    for m, w in result["ways"].items():
        commit = (f", commit p50 {w['commit_p50_ms']:.0f} ms p95 {w['commit_p95_ms']:.0f} ms"
                  if "commit_p50_ms" in w else "")
        print(f"  {m:<9} {w['records_per_s']:>10,.0f} rec/s per target{commit}  "
              f"({w['label']})")
    for name, value in result["ratios"].items():
        print(f"  {name}: {value:.2f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
