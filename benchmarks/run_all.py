"""All yardsticks in one run: txsink next to Spark's own sinks, on real local servers.

Not a test: a script that starts Apache Kafka, PostgreSQL and SeaweedFS (S3) on
127.0.0.1, one Spark session (``local[2]``) holding the jars of Spark's Kafka sink,
the PostgreSQL JDBC driver and the S3A filesystem (resolved with Maven once, see
``spark_jars``), and times, per target, on one generated DataFrame cached before
timing:

* Kafka: Spark's Kafka sink (at-least-once) vs txsink exactly-once / at-least-once;
* PostgreSQL: Spark's JDBC writer (defaults: ``batchsize`` 1000, no
  ``reWriteBatchedInserts``) vs txsink exactly-once / at-least-once;
* S3: Spark's Parquet writer through ``s3a://`` (default commit protocol) vs txsink;
* files: Spark's Parquet writer to a local directory, a no-op Arrow Python data
  source (``files_bench._DrainWriter``: the floor of any Python sink) and txsink.

Each writer runs once as warm-up, then ``--rounds`` times in turn (the timing loop and
the per-round ratios are ``files_bench.compare``); records/s is the median. It prints
progress as it goes. Then it runs the benchmarks that measure the other targets of
the performance issue against baselines of their own, each in a subprocess with
``--json``: ``commit_bench.py`` (driver commit latency vs participants and epochs),
``kafka_bench.py`` (a plain transactional producer, the per-participant open cost)
and ``postgres_bench.py`` (vectorised vs per-row COPY). Last it writes
``docs/performance.md`` (machine, versions, date, the tables, every target with its
measured value) and ``docs/performance.png`` (ratios vs the Spark built-in).

    uv run python benchmarks/run_all.py [--quick] [--rounds N] [--only kafka,files]
    uvx --with tox-uv tox -e bench -- [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))  # the sibling benchmark modules, also when imported

from files_bench import _DrainSource, compare  # noqa: E402
from kafka_bench import end_offsets, generate, spark_sink  # noqa: E402

TARGETS = ("kafka", "postgres", "s3", "files")
TITLES = {"kafka": "Kafka", "postgres": "PostgreSQL", "s3": "S3", "files": "files"}
#: txsink exactly-once / Spark built-in (at-least-once), from the issue.
TARGET_RATIO = {"kafka": 0.8, "postgres": 0.8, "s3": 0.8, "files": 0.85}
#: txsink exactly-once / the no-op Arrow Python writer (files only).
NOOP_TARGET = 0.9
BUCKET = "txsink-bench"


@dataclass(frozen=True)
class Sizes:
    """Records per write, per target; chosen so one write takes seconds, not less."""

    kafka: int
    postgres: int
    s3: int
    files: int

    def of(self, target: str) -> int:
        return int(getattr(self, target))


#: The full run: a write takes 5-25 s; about 20 minutes on 2 shared cores.
FULL = Sizes(kafka=1_000_000, postgres=300_000, s3=3_000_000, files=8_000_000)
#: ``--quick``: a smoke run of a few minutes, ratios not to be quoted.
QUICK = Sizes(kafka=100_000, postgres=50_000, s3=300_000, files=500_000)


@dataclass
class Writer:
    """One row of the table: a writer of a target and its timings."""

    target: str
    key: str            # the label given to files_bench.compare
    name: str
    guarantee: str
    seconds: list[float] = field(default_factory=list)
    cpu_load: list[float] = field(default_factory=list)
    vs_builtin: float | None = None   # median of per-round ratios, from compare
    vs_noop: float | None = None

    def rate(self, rows: int) -> float:
        return rows / statistics.median(self.seconds)


@dataclass
class Env:
    """The servers and the session every target writes through."""

    spark: Any
    work: Path
    kafka_bootstrap: str
    pg_port: int
    pg_user: str
    pg_password: str
    s3_endpoint: str
    s3_access_key: str
    s3_secret_key: str
    versions: dict[str, str]


# -- the targets ------------------------------------------------------------------------


def rows_frame(spark: Any, rows: int, partitions: int) -> Any:
    """The table-shaped data of files_bench (id, key, amount, name), cached."""
    df = (spark.range(0, rows, 1, partitions)
          .selectExpr("id", "CAST(id % 1000 AS INT) AS key", "CAST(id AS DOUBLE) * 0.5 AS amount",
                      "concat('customer-', CAST(id % 50000 AS STRING)) AS name")
          .cache())
    assert df.count() == rows
    return df


def txsink_write(env: Env, df: Any, backend: str, guarantee: str,
                 options: dict[str, str]) -> None:
    """One batch write through ``format("txsink")``: one epoch, a fresh sink id."""
    sink_id = f"bench-{backend}-{guarantee[:1]}-{uuid.uuid4().hex[:8]}"
    (df.write.format("txsink").mode("append").option("backend", backend)
     .option("sink_id", sink_id).option("guarantee", guarantee)
     .option("checkpointLocation", str(env.work / "chk" / sink_id))
     .options(**options).save())


def kafka_writers(env: Env, df: Any) -> tuple[dict[str, Callable[[int], None]],
                                              Callable[[int], None]]:
    from txsink_kafka import testing as kt

    topics = {k: f"bench-{k}-{uuid.uuid4().hex[:6]}" for k in ("spark", "txsink", "alo")}
    for topic in topics.values():
        kt.create_topic(env.kafka_bootstrap, topic, 2)
    markers = f"bench-markers-{uuid.uuid4().hex[:6]}"

    def tx(key: str, guarantee: str) -> Callable[[int], None]:
        return lambda i: txsink_write(env, df, "kafka", guarantee, {
            "kafka.bootstrap.servers": env.kafka_bootstrap, "topic": topics[key],
            "marker.topic": markers})

    def check(writes: int) -> None:
        expected = df.count() * writes
        for key, isolation in (("spark", "read_uncommitted"), ("txsink", "read_committed"),
                               ("alo", "read_uncommitted")):
            got = end_offsets(env.kafka_bootstrap, topics[key], isolation)
            assert got >= expected, (key, got, expected)  # control records take offsets

    def spark_kafka(i: int) -> None:
        spark_sink(df, env.kafka_bootstrap, topics["spark"])

    return {"spark": spark_kafka,
            "txsink": tx("txsink", "exactly_once"),
            "txsink-alo": tx("alo", "at_least_once")}, check


def postgres_writers(env: Env, df: Any) -> tuple[dict[str, Callable[[int], None]],
                                                 Callable[[int], None]]:
    import psycopg

    dsn = f"host=127.0.0.1 port={env.pg_port} dbname=postgres user={env.pg_user}"
    suffix = uuid.uuid4().hex[:6]
    # public.<name>: the user's own schema (search_path "$user") is txsink's marker schema.
    tables = {k: f"public.bench_{k}_{suffix}" for k in ("spark", "txsink", "alo")}
    with psycopg.connect(dsn, password=env.pg_password, autocommit=True) as conn:
        for t in tables.values():
            conn.execute(f"CREATE TABLE {t} (id bigint, key integer, "
                         "amount double precision, name text)")
    url = f"jdbc:postgresql://127.0.0.1:{env.pg_port}/postgres"
    props = {"user": env.pg_user, "password": env.pg_password,
             "driver": "org.postgresql.Driver"}

    def spark_jdbc(i: int) -> None:
        df.write.jdbc(url, tables["spark"], mode="append", properties=props)

    def tx(key: str, guarantee: str) -> Callable[[int], None]:
        return lambda i: txsink_write(env, df, "postgres", guarantee, {
            "dsn": dsn, "password": env.pg_password, "table": tables[key]})

    def check(writes: int) -> None:
        expected = df.count() * writes
        with psycopg.connect(dsn, password=env.pg_password, autocommit=True) as conn:
            for key, t in tables.items():
                row = conn.execute(f"SELECT count(*) FROM {t}").fetchone()
                assert row is not None and row[0] >= expected, (key, row, expected)
                conn.execute(f"DROP TABLE {t}")

    return {"spark": spark_jdbc, "txsink": tx("txsink", "exactly_once"),
            "txsink-alo": tx("alo", "at_least_once")}, check


def s3_writers(env: Env, df: Any) -> tuple[dict[str, Callable[[int], None]],
                                           Callable[[int], None]]:
    run = uuid.uuid4().hex[:6]

    def spark_s3a(i: int) -> None:
        df.write.mode("overwrite").parquet(f"s3a://{BUCKET}/{run}/spark/{i + 1}")

    def tx(guarantee: str) -> Callable[[int], None]:
        return lambda i: txsink_write(env, df, "s3", guarantee, {
            "bucket": BUCKET, "prefix": f"{run}/{guarantee}", "endpoint_url": env.s3_endpoint,
            "region": "us-east-1", "addressing_style": "path",
            "access_key_id": env.s3_access_key, "secret_access_key": env.s3_secret_key})

    def check(writes: int) -> None:
        import boto3  # type: ignore[import-untyped,unused-ignore]

        client = boto3.client("s3", endpoint_url=env.s3_endpoint, region_name="us-east-1",
                              aws_access_key_id=env.s3_access_key,
                              aws_secret_access_key=env.s3_secret_key)
        for prefix in ("spark", "exactly_once", "at_least_once"):
            pages = client.get_paginator("list_objects_v2").paginate(
                Bucket=BUCKET, Prefix=f"{run}/{prefix}/")
            parquet = [o["Key"] for p in pages for o in p.get("Contents", [])
                       if o["Key"].endswith(".parquet")]
            assert parquet, f"no Parquet objects under {run}/{prefix}/"

    return {"spark": spark_s3a, "txsink": tx("exactly_once"),
            "txsink-alo": tx("at_least_once")}, check


def files_writers(env: Env, df: Any) -> tuple[dict[str, Callable[[int], None]],
                                              Callable[[int], None]]:
    out = env.work / "files"
    env.spark.dataSource.register(_DrainSource)

    def spark_parquet(i: int) -> None:
        df.write.mode("overwrite").parquet(str(out / f"spark-{i + 1}"))

    def noop(i: int) -> None:
        df.write.format(_DrainSource.name()).mode("append").save()

    def tx(guarantee: str) -> Callable[[int], None]:
        return lambda i: txsink_write(env, df, "files", guarantee, {
            "path": str(out / f"{guarantee}-{i + 1}"), "format": "parquet"})

    def check(writes: int) -> None:
        for name in ("spark", "exactly_once", "at_least_once"):
            assert any(out.glob(f"{name}-*/**/*.parquet")), f"no Parquet files for {name}"
        shutil.rmtree(out, ignore_errors=True)

    return {"spark": spark_parquet, "py-noop": noop, "txsink": tx("exactly_once"),
            "txsink-alo": tx("at_least_once")}, check


WRITER_NAMES = {
    "kafka": {"spark": ("Spark Kafka sink (spark-sql-kafka-0-10)", "at-least-once")},
    "postgres": {"spark": ("Spark JDBC writer (batchsize 1000)", "at-least-once")},
    "s3": {"spark": ("Spark Parquet writer via s3a", "at-least-once")},
    "files": {"spark": ("Spark Parquet writer, local dir", "at-least-once"),
              "py-noop": ("no-op Arrow Python data source", "none")},
}
TXSINK_NAMES = {"txsink": ("txsink", "exactly-once"),
                "txsink-alo": ("txsink", "at-least-once")}
FACTORIES = {"kafka": kafka_writers, "postgres": postgres_writers, "s3": s3_writers,
             "files": files_writers}


def run_target(env: Env, target: str, rows: int, rounds: int) -> list[Writer]:
    """Warm up, time every writer ``rounds`` times in turn; print as it goes."""
    partitions = 2
    print(f"\n== {TITLES[target]}: {rows:,} records per write, {rounds} rounds "
          f"(after one warm-up) ==", flush=True)
    df = (generate(env.spark, rows, 100, partitions) if target == "kafka"
          else rows_frame(env.spark, rows, partitions))
    try:
        sinks, check = FACTORIES[target](env, df)
        writers: dict[str, Writer] = {}
        for key in sinks:
            name, guarantee = {**WRITER_NAMES[target], **TXSINK_NAMES}[key]
            writers[key] = Writer(target, key, name, guarantee)

        def timed(key: str, fn: Callable[[int], None]) -> Callable[[int], None]:
            def run(i: int) -> None:
                started = time.perf_counter()
                fn(i)
                took = time.perf_counter() - started
                load = os.getloadavg()[0]
                if i >= 0:
                    writers[key].seconds.append(took)
                    writers[key].cpu_load.append(load)
                label = "warm-up" if i < 0 else f"round {i + 1}/{rounds}"
                print(f"  {label:<11} {key:<11} {took:7.2f} s  {rows / took:>12,.0f} rec/s"
                      f"  (load {load:.1f})", flush=True)
            return run

        ratios = compare(TITLES[target], {k: timed(k, fn) for k, fn in sinks.items()},
                         rounds, rows)
        check(rounds + 1)
    finally:
        df.unpersist()
    for label, ratio in ratios:
        # compare's labels: "<title>, <key>/spark" and "<title>, txsink/py-noop"
        pair = label.rsplit(", ", 1)[1]
        num, den = pair.split("/")
        if den == "spark":
            writers[num].vs_builtin = ratio
        elif num in writers:
            writers[num].vs_noop = ratio
    print(markdown_rows(list(writers.values()), rows), flush=True)
    return list(writers.values())


# -- output -----------------------------------------------------------------------------


def verdict(w: Writer) -> tuple[str, str]:
    """(target text, met text) of a row; only txsink exactly-once has targets."""
    if w.key != "txsink":
        return "", ""
    goal = TARGET_RATIO[w.target]
    texts = [f"≥ {goal:.2f} of Spark"]
    met = w.vs_builtin is not None and w.vs_builtin >= goal
    if w.target == "files":
        texts.append(f"≥ {NOOP_TARGET:.2f} of no-op")
        met = met and w.vs_noop is not None and w.vs_noop >= NOOP_TARGET
    return ", ".join(texts), "yes" if met else "**no**"


def markdown_rows(writers: list[Writer], rows: int) -> str:
    out = []
    for w in writers:
        builtin = "1.00 (baseline)" if w.key == "spark" else (
            f"{w.vs_builtin:.2f}" if w.vs_builtin is not None else "")
        noop = f"{w.vs_noop:.2f}" if w.vs_noop is not None else ""
        goal, met = verdict(w)
        runs = ", ".join(f"{s:.1f}" for s in w.seconds)
        out.append(f"| {TITLES[w.target]} | {w.name} | {w.guarantee} | {rows:,} | "
                   f"{w.rate(rows):,.0f} | {builtin} | {noop} | {goal} | {met} | {runs} |")
    return "\n".join(out)


TABLE_HEAD = ("| target | writer | guarantee | records per write | records/s (median) | "
              "vs Spark built-in | vs no-op writer | target | met | seconds per round |\n"
              "|---|---|---|---:|---:|---:|---:|---|---|---|")


def chart(results: dict[str, list[Writer]], path: Path, subtitle: str) -> None:
    """Bars of each writer's throughput relative to the Spark built-in of its target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = [("txsink", "txsink exactly-once", "#1f77b4"),
              ("txsink-alo", "txsink at-least-once", "#9ecae1"),
              ("py-noop", "no-op Arrow Python writer", "#bbbbbb")]
    targets = list(results)
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    width = 0.26
    for n, (key, label, color) in enumerate(series):
        xs, ys = [], []
        for t, target in enumerate(targets):
            w = next((w for w in results[target] if w.key == key), None)
            if w is not None and w.vs_builtin is not None:
                xs.append(t + (n - 1) * width)
                ys.append(w.vs_builtin)
        if xs:
            bars = ax.bar(xs, ys, width, label=label, color=color)
            ax.bar_label(bars, fmt="%.2f", fontsize=8)
    ax.axhline(1.0, color="#444444", linewidth=0.8, label="Spark built-in = 1")
    ax.axhline(0.8, color="#d62728", linestyle="--", linewidth=1.2, label="target 0.8")
    if "files" in targets:
        t = targets.index("files")
        ax.hlines(0.85, t - 1.5 * width, t + 1.5 * width, colors="#d62728",
                  linestyles=":", linewidth=1.5, label="files target 0.85")
    ax.set_xticks(range(len(targets)), [TITLES[t] for t in targets])
    ax.set_ylabel("throughput / Spark's own sink (same run)")
    ax.set_title("txsink vs Spark's built-in sinks\n" + subtitle, fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def machine() -> dict[str, str]:
    cpu = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                   cpu)
    ram = "unknown"
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        kib = next((int(ln.split()[1]) for ln in f if ln.startswith("MemTotal")), 0)
        ram = f"{kib / 1024 / 1024:.1f} GiB"
    return {"CPU": f"{os.cpu_count()} cores ({cpu})", "RAM": ram,
            "OS": f"{platform.system()} {platform.release()}"}


def _first_line(cmd: list[str]) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    text = (done.stdout + done.stderr).strip()
    return text.splitlines()[0] if text else "unknown"


def git_state() -> str:
    rev = _first_line(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True, text=True, check=False).stdout.strip()
    return f"{rev}{' (with uncommitted changes)' if dirty else ' (clean)'}"


def sub_bench(script_name: str, args: list[str], out: Path,
              timeout_s: int = 1200) -> tuple[Any, str]:
    """Run a sibling benchmark script with ``--json out``; (its JSON or None, note)."""
    script = HERE / script_name
    where = f"benchmarks/{script_name}"
    if not script.exists():
        return None, f"{where} does not exist (yet): section skipped"
    print(f"\n== {where} {' '.join(args)} ==", flush=True)
    try:
        done = subprocess.run([sys.executable, str(script), "--json", str(out), *args],
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return None, f"{where} took over {timeout_s // 60} minutes: section skipped"
    if done.returncode != 0 or not out.exists():
        return None, f"{where} failed (exit {done.returncode})"
    return json.loads(out.read_text()), f"from `{where} --json` in the same run"


def commit_bench(out: Path, quick: bool) -> tuple[list[dict[str, Any]] | None, str]:
    """Driver commit latency per epoch vs participants and vs epochs; (rows, note)."""
    rows, note = sub_bench("commit_bench.py", ["--quick"] if quick else [], out)
    return rows, note


#: Sizes of the benchmarks without Spark's built-in sinks: (full, quick).
KAFKA_BENCH = (["--records", "300000", "--rounds", "5"],
               ["--records", "50000", "--rounds", "1", "--open-epochs", "4"])
POSTGRES_BENCH = (["--epochs", "10", "--rows", "100000"], ["--epochs", "3", "--rows", "20000"])


@dataclass
class Target:
    """One target of the performance issue, its measured value and whether it holds."""

    item: str
    measure: str
    value: float | None
    goal: float
    higher_is_better: bool
    unit: str = ""
    source: str = ""

    def met(self) -> bool | None:
        if self.value is None:
            return None
        return self.value >= self.goal if self.higher_is_better else self.value <= self.goal

    def row(self) -> str:
        sign = "≥" if self.higher_is_better else "≤"
        value = "not measured" if self.value is None else f"{self.value:,.2f}{self.unit}"
        met = {True: "yes", False: "**no**", None: "-"}[self.met()]
        return (f"| {self.item} | {self.measure} | {value} | {sign} {self.goal:g}{self.unit} "
                f"| {met} | {self.source} |")


def miss_notes(goals: list[Target], results: dict[str, list[Writer]],
               kafka: dict[str, Any] | None) -> list[str]:
    """Why each missed target was missed, with this run's own figures where they say it."""
    notes: list[str] = []
    missed = {g.measure for g in goals if g.met() is False}

    def rate(target: str, key: str) -> Writer | None:
        return next((w for w in results.get(target, []) if w.key == key), None)

    if any(m.startswith("files: txsink exactly-once / Spark") for m in missed):
        noop = rate("files", "py-noop")
        if noop is not None and noop.vs_builtin is not None:
            notes.append(
                f"* files against Spark's Parquet writer: the no-op Arrow Python writer, "
                f"which takes every batch Spark hands to Python and writes nothing, reaches "
                f"{noop.vs_builtin:.2f} of Spark's writer in this run. That hand-over from "
                "the JVM to a Python worker is paid by every Python data source before it "
                "writes a byte, so no Python sink can reach 0.85 here; txsink's own share "
                "(encoding, fsyncs, the two-phase commit) is the distance to the no-op "
                "writer, the first row of this table.")
    writers = (kafka or {}).get("writers", {})
    if any("plain transactional" in m for m in missed) and {"spark", "plain_txn"} <= set(
            writers):
        spark = writers["spark"]["records_per_s"]
        plain = writers["plain_txn"]["records_per_s"]
        notes.append(
            f"* Kafka against a plain transactional producer: Spark's own Kafka sink "
            f"reaches {spark / plain:.2f} of it in the same benchmark. The plain producers "
            "run in one process on records collected before the clock starts, with no "
            "Spark scan or Arrow hand-over, while Spark's executors, their Python workers, "
            "the producers' threads and the broker share the two cores: the gap is "
            "Spark's, not the transaction protocol's.")
    if any(m.startswith("exactly_once:") for m in missed):
        notes.append(
            "* Kafka exactly-once open cost: an exactly-once participant's transaction stays "
            "open after `pre_commit` until the driver ends it with `EndTxn`, and librdkafka "
            "can neither begin another transaction on that producer nor initialise it twice "
            "(and initialising the id early would abort the prepared transaction), so every "
            "participant pays a new producer, `init_transactions` and its begin marker "
            "(see docs/backends/kafka.md). An at-least-once worker keeps its producer "
            "between tasks instead: its rows in the table above.")
    if any(m.startswith("s3: commit p50 per epoch") for m in missed):
        notes.append(
            "* S3 at 128 participants: each participant is one `CompleteMultipartUpload`; the "
            "requests overlap on the server, but botocore builds, signs and parses each one "
            "under the GIL, and the local SeaweedFS runs on the same two cores (see "
            "docs/backends/s3.md, *Commit cost per epoch*).")
    if any(m.startswith("files: commit p50 epochs") for m in missed):
        notes.append(
            "* files over 500 epochs: the output directory, which gains a file per "
            "participant per epoch, is no longer listed per commit (`holds_epoch` looks "
            "for the epoch's marker; the listing took 0.12 ms at epochs 10-30 and 1.8 ms "
            "at 480-500). What still differs between the two windows: the state's "
            "listing holds 10-30 records early and the 100 retained ones late, and every "
            "fsync of the run gets slower as the filesystem fills: in a profile of this "
            "benchmark, writing the state's meta file (the same small write and fsync "
            "each epoch) took 0.97 ms at epochs 10-30 and 1.48 ms at 480-500. The ratio "
            "varies from run to run (1.11 in a run of `commit_bench.py --only files` "
            "alone on the same machine).")
    reuse = (kafka or {}).get("open_cost", {}).get("spark", {}).get("at_least_once", {})
    if any(m.startswith("at_least_once: how long a Spark task") for m in missed) and reuse:
        notes.append(
            f"* Kafka at-least-once in Spark: a Python worker reuses its producer only when "
            f"Spark hands it a task of the same partition again (Spark does not pin "
            f"partitions to workers); in this run {reuse.get('later_reused_producers')} of "
            f"{reuse.get('later_participants')} later participants found one, and the "
            "others opened a new producer.")
    return notes


TARGETS_HEAD = ("| item | measure | value | target | met | from |\n"
                "|---|---|---:|---|---|---|")


def targets_of(results: dict[str, list[Writer]], commit: list[dict[str, Any]] | None,
            kafka: dict[str, Any] | None, postgres: dict[str, Any] | None) -> list[Target]:
    """Every target of the performance issue, from this run's measurements."""
    out: list[Target] = []
    for target, writers in results.items():
        for w in writers:
            if w.key != "txsink":
                continue
            out.append(Target("5. yardsticks", f"{TITLES[target]}: txsink exactly-once / "
                              "Spark built-in (at-least-once)", w.vs_builtin,
                              TARGET_RATIO[target], True, source="run_all (Spark)"))
            if target == "files":
                out.append(Target("1. files encoding", "files: txsink exactly-once / no-op "
                                  "Arrow Python writer", w.vs_noop, NOOP_TARGET, True,
                                  source="run_all (Spark)"))
    for row in commit or []:
        backend, n, epoch = row.get("backend"), row.get("participants"), row.get("epoch")
        if epoch is None and n == 128:
            out.append(Target("2. commit cost", f"{backend}: commit p50 per epoch, 128 "
                              "participants", float(row["p50_ms"]),
                              200.0 if backend == "s3" else 50.0, False, " ms",
                              "commit_bench"))
    for backend in dict.fromkeys(r.get("backend") for r in commit or []):
        windows = [r for r in commit or [] if r.get("backend") == backend and r.get("epoch")]
        if len(windows) == 2:
            early, late = windows
            out.append(Target("2. commit cost", f"{backend}: commit p50 epochs {late['epoch']}"
                              f" / epochs {early['epoch']} (8 participants)",
                              float(late["p50_ms"]) / float(early["p50_ms"]), 1.2, False,
                              source="commit_bench"))
    if postgres is not None:
        ratios = postgres.get("ratios", {})
        out.append(Target("3. PostgreSQL COPY", "txsink vectorised (CSV) COPY / per-row "
                          "binary COPY", ratios.get("txsink_vs_txsink_rows"), 2.0, True,
                          source="postgres_bench"))
    if kafka is not None:
        out.append(Target("4. Kafka fixed cost", "txsink exactly-once / plain transactional "
                          "producer (no Spark)",
                          kafka.get("ratios", {}).get("txsink_vs_plain_transactional"), 0.9,
                          True, source="kafka_bench"))
        opens = kafka.get("open_cost", {})
        for guarantee, o in opens.get("direct", {}).items():
            out.append(Target("4. Kafka fixed cost", f"{guarantee}: open cost per participant "
                              "after the first epoch, p50 (begin_transaction to the first "
                              "batch accepted, no Spark)", o.get("later_p50_ms"), 10.0, False,
                              " ms", "kafka_bench"))
        for guarantee, o in opens.get("spark", {}).items():
            out.append(Target("4. Kafka fixed cost", f"{guarantee}: how long a Spark task "
                              "waited for its participant's open after the first write, p50",
                              o.get("later_wait_p50_ms"), 10.0, False, " ms", "kafka_bench"))
    return sorted(out, key=lambda t: t.item)


def write_doc(path: Path, results: dict[str, list[Writer]], sizes: Sizes, rounds: int,
              info: dict[str, str], versions: dict[str, str], loads: list[float],
              commit: tuple[list[dict[str, Any]] | None, str], quick: bool,
              command: str, goals: list[Target],
              libs: dict[str, tuple[dict[str, Any] | None, str]]) -> None:
    lines = ["# Performance", ""]
    if quick:
        lines += ["!!! warning", "    A `--quick` smoke run: sizes too small for stable "
                  "ratios. Regenerate with the full command below before quoting.", ""]
    lines += [
        "txsink next to the sinks users would otherwise use: Spark's own Kafka sink, JDBC "
        "writer and Parquet writer (through `s3a://` and to a local directory), all "
        "at-least-once, written by the same Spark session on the same machine in the same "
        "run as txsink's exactly-once and at-least-once writes. Every number on this page "
        "comes from one run of:", "",
        "```sh", command, "```", "",
        "(equivalently `uv run python benchmarks/run_all.py`, run from a clean checkout). "
        "It starts its own Apache Kafka, PostgreSQL and SeaweedFS on 127.0.0.1, resolves "
        "Spark's connector jars with Maven into `~/.m2` on the first run, and writes this "
        "page and `docs/performance.png`.", "",
        "## Result", "",
        "![txsink throughput relative to Spark's built-in sinks](performance.png)", "",
        TABLE_HEAD,
    ]
    for target, writers in results.items():
        lines.append(markdown_rows(writers, sizes.of(target)))
    lines += [
        "", "*vs Spark built-in* is the median, over the rounds, of the ratio of the two "
        "writers' times within one round (writers of a round run back to back, so they see "
        "the same machine load); *records/s* is records per write over the median time. "
        "Targets (from the performance issue): txsink exactly-once at least 0.8 of each Spark "
        "built-in at-least-once sink; for files at least 0.85 of Spark's Parquet writer and "
        "0.9 of the no-op Python writer.", "",
        "## How it was measured", "",
        f"* One Spark session, `local[2]`, bound to 127.0.0.1; every target writes one "
        f"generated DataFrame in 2 partitions, cached before timing. Each writer runs once "
        f"as warm-up, then {rounds} timed round(s), the writers in the same order each "
        "round.",
        "* Kafka: `key` and a 100-byte `value` (binary) into a 2-partition topic per writer. "
        "txsink's exactly-once write commits one Kafka transaction per task through the "
        "driver's EndTxn.",
        "* PostgreSQL (fsync on): `id bigint, key integer, amount double precision, "
        "name text` into a table per writer. Spark's JDBC writer with its defaults "
        "(`batchsize` 1000, `reWriteBatchedInserts` off); txsink with its defaults "
        "(`COPY`, prepared transactions for exactly-once).",
        "* S3 (SeaweedFS): the same four columns as snappy Parquet. Spark's writer through "
        "hadoop-aws `s3a://` with Spark's default commit protocol (FileOutputCommitter, "
        "rename by copy); txsink with multipart uploads completed at commit.",
        "* files: the same four columns as snappy Parquet into a local directory; the "
        "no-op writer is a Python Arrow data source that reads every batch and writes "
        "nothing (`files_bench._DrainWriter`), the floor of any Python sink.",
        "* The output of every writer is checked after the rounds (record counts in Kafka "
        "and PostgreSQL, Parquet objects/files present for S3 and files).",
        "",
        "Sizes (records per write): " + ", ".join(
            f"{TITLES[t]} {sizes.of(t):,}" for t in results) + ".", "",
        "## Machine and versions", "",
        "| | |", "|---|---|",
    ]
    for k, v in {**info, **versions}.items():
        lines.append(f"| {k} | {v} |")
    if loads:
        lines.append(f"| load average (1 min) during the timed writes | min {min(loads):.1f}, "
                     f"median {statistics.median(loads):.1f}, max {max(loads):.1f} "
                     f"(the machine is shared; {os.cpu_count()} cores) |")
    lines += ["", "## Every target of the performance issue", "",
              "The Spark rows repeat the table above; the others come from the benchmarks "
              "this command runs after it (without Spark's built-in sinks), each against a "
              "baseline measured in that same benchmark.", "", TARGETS_HEAD]
    lines += [g.row() for g in goals]
    notes = miss_notes(goals, results, libs.get("kafka_bench", (None, ""))[0])
    if notes:
        lines += ["", "### Why the missed targets were missed", "", *notes]
    for name, (data, note) in libs.items():
        if data is None:
            lines += ["", f"{name}: not measured in this run: {note}."]
    kafka = libs.get("kafka_bench", (None, ""))[0]
    if kafka is not None:
        lines += ["", "### Kafka against plain producers (`benchmarks/kafka_bench.py`)", "",
                  "Its own broker and Spark session; "
                  f"{kafka['records']:,} records of {kafka['value_bytes']} B per write, "
                  f"{kafka['partitions']} partitions, median of {kafka['rounds']} round(s); "
                  "the plain producers run in one process, without Spark, on the same "
                  "records collected to Arrow first.", "",
                  "| writer | records/s | vs Spark's Kafka sink |", "|---|---:|---:|"]
        spark_rate = kafka["writers"]["spark"]["records_per_s"]
        for w in kafka["writers"].values():
            lines.append(f"| {w['label']} | {w['records_per_s']:,.0f} | "
                         f"{w['records_per_s'] / spark_rate:.2f} |")
        commit_ms = kafka.get("commit_latency", {})
        lines += ["", f"Per-epoch commit latency (decided to committed): p50 "
                  f"{commit_ms.get('p50_ms', float('nan')):.0f} ms, p95 "
                  f"{commit_ms.get('p95_ms', float('nan')):.0f} ms."]
    pg = libs.get("postgres_bench", (None, ""))[0]
    if pg is not None:
        rates = pg["rows_per_s"]
        lines += ["", "### PostgreSQL without Spark (`benchmarks/postgres_bench.py`)", "",
                  f"{pg['epochs']} epochs of {pg['rows_per_epoch']:,} rows (`bigint, text, "
                  "double precision, timestamptz`), fsync on, the three writers alternating "
                  "per epoch.", "", "| writer | rows/s |", "|---|---:|",
                  f"| plain autocommit binary COPY, row by row | {rates['plain_copy']:,.0f} |",
                  f"| txsink, `copy_format=auto` (Arrow batches as CSV) | "
                  f"{rates['txsink']:,.0f} |",
                  f"| txsink, `copy_format=binary` (row by row) | "
                  f"{rates['txsink_rows']:,.0f} |"]
    rows, note = commit
    lines += ["", "## Commit latency", ""]
    if rows:
        lines += [f"Per-epoch commit latency ({note}).", "",
                  "| backend | participants | epoch | p50 ms | p95 ms |",
                  "|---|---:|---:|---:|---:|"]
        for r in rows:
            lines.append(f"| {r.get('backend')} | {r.get('participants')} "
                         f"| {r.get('epoch') or 'all'} "
                         f"| {float(r.get('p50_ms', 'nan')):.1f} "
                         f"| {float(r.get('p95_ms', 'nan')):.1f} |")
    else:
        lines.append(f"Not measured in this run: {note}.")
    path.write_text("\n".join(lines) + "\n")


# -- servers and session ----------------------------------------------------------------


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def environment(stack: contextlib.ExitStack[Any], targets: list[str]) -> Env:
    """Start the servers the targets need and one Spark session; stop all at the end."""
    import pyspark
    from spark_jars import resolve
    from txsink.testing.s3a import s3a_conf

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    # Python workers unpickle files_bench._DrainSource by reference: they need this dir.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    versions = {"Python": platform.python_version(),
                "Java": _first_line(["java", "-version"]),
                "PySpark": pyspark.__version__}
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        versions["txsink"] = version("txsink")
        versions["pyarrow"] = version("pyarrow")
    print("resolving Spark's connector jars (Maven, cached in ~/.m2) ...", flush=True)
    jars = resolve(pyspark.__version__)
    work = Path(tempfile.mkdtemp(prefix="txsink-run-all-"))
    stack.callback(shutil.rmtree, work, ignore_errors=True)

    bootstrap, pg_port, pg_user, pg_password = "", 0, "", ""
    s3_endpoint, s3_key, s3_secret = "", "", ""
    if "kafka" in targets:
        from txsink_kafka.backend import close_shared_clients
        from txsink_kafka.local_broker import LocalKafka

        kafka = LocalKafka(heap="1g")
        stack.callback(kafka.close)
        stack.callback(close_shared_clients)  # before the broker goes (LIFO)
        kafka.start()
        bootstrap = kafka.bootstrap
        versions["Kafka"] = f"Apache Kafka {kafka.version} (local KRaft node)"
        versions["Spark Kafka sink"] = jars.coordinates["kafka"]
        print(f"started {kafka.describe()}", flush=True)
    if "postgres" in targets:
        import psycopg
        from txsink_postgres.testing import LocalPostgres

        pg = LocalPostgres(fsync=True)
        stack.callback(pg.stop)
        pg.start()
        pg_port, pg_user, pg_password = pg.port, pg.user, pg.password
        with psycopg.connect(pg.dsn, password=pg.password) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        versions["PostgreSQL"] = f"{row[0] if row else '?'} (local, fsync on)"
        versions["JDBC driver"] = jars.coordinates["postgres"]
        print(f"started PostgreSQL {versions['PostgreSQL']} on 127.0.0.1:{pg.port}", flush=True)
    if "s3" in targets:
        from txsink_s3.testing import LocalSeaweedFS

        weed = LocalSeaweedFS()
        stack.callback(weed.cleanup)
        weed.start()
        weed.client().create_bucket(Bucket=BUCKET)
        s3_endpoint, s3_key, s3_secret = weed.endpoint_url, weed.access_key, weed.secret_key
        versions["SeaweedFS"] = _first_line([weed.binary, "version"])
        versions["S3A"] = jars.coordinates["s3a"] + " (+ AWS SDK v2 bundle)"
        print(f"started SeaweedFS S3 at {weed.endpoint_url}", flush=True)

    from pyspark.sql import SparkSession
    from txsink.spark import register

    classpath = ":".join(jars.classpath())
    builder = (SparkSession.builder.master("local[2]").appName("txsink-run-all")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.log.level", "ERROR")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.memory", "3g")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.extraClassPath", classpath)
               .config("spark.executor.extraClassPath", classpath))
    if "s3" in targets:
        for key, value in s3a_conf([], endpoint_url=s3_endpoint, access_key=s3_key,
                                   secret_key=s3_secret).items():
            if not key.endswith("extraClassPath"):
                builder = builder.config(key, value)
    spark = builder.getOrCreate()
    stack.callback(spark.stop)
    register(spark)
    versions["Spark"] = spark.version
    return Env(spark, work, bootstrap, pg_port, pg_user, pg_password, s3_endpoint, s3_key,
              s3_secret, versions)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: small sizes, 1 round (a few minutes)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="timed rounds per writer (default 5; 1 with --quick)")
    parser.add_argument("--only", default=",".join(TARGETS),
                        help=f"comma-separated subset of {','.join(TARGETS)}")
    parser.add_argument("--records", type=int, default=None,
                        help="records per write for every target (overrides the sizes)")
    parser.add_argument("--out-dir", type=Path, default=REPO / "docs",
                        help="where performance.md and performance.png go")
    parser.add_argument("--no-commit-bench", action="store_true",
                        help="skip benchmarks/commit_bench.py even if it exists")
    parser.add_argument("--no-library-benches", action="store_true",
                        help="skip kafka_bench.py and postgres_bench.py (the targets "
                             "measured without Spark's built-in sinks)")
    args = parser.parse_args(argv)
    targets = [t for t in args.only.split(",") if t]
    unknown = set(targets) - set(TARGETS)
    if unknown:
        parser.error(f"unknown targets: {', '.join(sorted(unknown))}")
    sizes = QUICK if args.quick else FULL
    if args.records:
        sizes = Sizes(*(args.records for _ in TARGETS))
    rounds = args.rounds or (1 if args.quick else 5)
    command = "uvx --with tox-uv tox -e bench" + (" -- --quick" if args.quick else "")
    if argv is None and sys.argv[1:] and sys.argv[1:] != ["--quick"]:
        command = "uv run python benchmarks/run_all.py " + " ".join(sys.argv[1:])

    signal.signal(signal.SIGTERM, _interrupt)
    started = time.monotonic()
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    info = {"date": date, **machine(), "checkout": git_state()}
    results: dict[str, list[Writer]] = {}
    with contextlib.ExitStack() as stack:
        env = environment(stack, targets)
        for target in targets:
            results[target] = run_target(env, target, sizes.of(target), rounds)
    loads = [x for ws in results.values() for w in ws for x in w.cpu_load]
    commit: tuple[list[dict[str, Any]] | None, str] = (None, "skipped (--no-commit-bench)")
    libs: dict[str, tuple[dict[str, Any] | None, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if not args.no_commit_bench:
            commit = commit_bench(Path(tmp) / "commit.json", args.quick)
            print(commit[1], flush=True)
        if "kafka" in targets and not args.no_library_benches:
            libs["kafka_bench"] = sub_bench("kafka_bench.py", KAFKA_BENCH[args.quick],
                                            Path(tmp) / "kafka.json")
        if "postgres" in targets and not args.no_library_benches:
            libs["postgres_bench"] = sub_bench("postgres_bench.py",
                                               POSTGRES_BENCH[args.quick],
                                               Path(tmp) / "postgres.json")
    goals = targets_of(results, commit[0], libs.get("kafka_bench", (None, ""))[0],
                       libs.get("postgres_bench", (None, ""))[0])
    minutes = (time.monotonic() - started) / 60
    info["duration of the run"] = f"{minutes:.1f} min"
    print(f"\n{TABLE_HEAD}")
    for target, writers in results.items():
        print(markdown_rows(writers, sizes.of(target)))
    print(f"\n{TARGETS_HEAD}")
    for g in goals:
        print(g.row())
    args.out_dir.mkdir(parents=True, exist_ok=True)
    chart(results, args.out_dir / "performance.png",
          f"{date}, {os.cpu_count()} cores, {'quick run' if args.quick else f'{rounds} rounds'}")
    write_doc(args.out_dir / "performance.md", results, sizes, rounds, info,
              env.versions, loads, commit, args.quick, command, goals, libs)
    print(f"\nwrote {args.out_dir / 'performance.md'} and performance.png "
          f"({minutes:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
