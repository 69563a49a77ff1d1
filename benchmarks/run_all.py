"""All yardsticks in one run: txsink next to Spark's own sinks, on real local servers.

Not a test: a script that starts Apache Kafka, PostgreSQL and SeaweedFS (S3) on
127.0.0.1, one Spark session (``local[2]``) holding the jars of Spark's Kafka sink,
the PostgreSQL JDBC driver and the S3A filesystem (resolved with Maven once, see
``spark_jars``), and times, per target, on one generated DataFrame cached before
timing:

* Kafka: Spark's Kafka sink (at-least-once) vs txsink exactly-once / at-least-once;
* PostgreSQL: Spark's JDBC writer (defaults: ``batchsize`` 1000, no
  ``reWriteBatchedInserts``) vs txsink exactly-once / at-least-once;
* S3: Spark's Parquet writer through ``s3a://`` (default commit protocol) vs txsink,
  on its data source (txsink's Python writer) and on the native path (``writer:
  spark``: Spark's own Parquet writer, each task's file a pending multipart upload);
* files: Spark's Parquet writer to a local directory, a no-op Arrow Python data
  source (``files_bench._DrainWriter``: the floor of any Python sink) and txsink, on
  its data source and on the native path (Spark's writer stages, txsink links).

Each writer runs once as warm-up, then ``--rounds`` times in turn (the timing loop and
the per-round ratios are ``files_bench.compare``); records/s is the median. It prints
progress as it goes. Then it runs the benchmarks that measure the other targets of
the performance issue against baselines of their own, each in a subprocess with
``--json``: ``commit_bench.py`` (driver commit latency vs participants and epochs),
``kafka_bench.py`` (a plain transactional producer, the per-participant open cost),
``postgres_bench.py`` (vectorised vs per-row COPY), ``multi_bench.py`` (one epoch
across Kafka, PostgreSQL and S3: a group of targets vs three separate sinks vs three
Spark built-in writes), ``lake_bench.py``, ``realtime_bench.py`` and ``s3_bench.py``
(:data:`BENCHES` lists them all; the page has a section for each). Every result goes
as JSON into a
results directory (``--keep-results DIR`` keeps it); ``report.py`` then turns that
directory into ``docs/performance.md`` (machine, versions, date, the tables, every
target with its measured value) and ``docs/performance.png`` (ratios vs the Spark
built-in). This module measures; ``report.py`` renders.

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
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))  # the sibling benchmark modules, also when imported

from files_bench import _DrainSource, compare  # noqa: E402
from kafka_bench import end_offsets, generate, spark_sink  # noqa: E402
from report import TABLE_HEAD, TARGETS_HEAD, TITLES, Writer, markdown_rows, render  # noqa: E402

TARGETS = ("kafka", "postgres", "s3", "files")
BUCKET = "txsink-bench"
#: Every benchmark one run measures, by script, with the results file it writes: the
#: page has a section for each (tests/unit/test_bench_report.py checks it).
BENCHES = {"run_all.py": "run.json", "commit_bench.py": "commit.json",
           "kafka_bench.py": "kafka.json", "postgres_bench.py": "postgres.json",
           "multi_bench.py": "multi.json", "lake_bench.py": "lake.json",
           "realtime_bench.py": "realtime.json", "s3_bench.py": "s3.json"}


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

    from txsink.spark import target, targets

    native = targets(f"bench-s3-native-{run}", [target("s3", "s3", **{
        "bucket": BUCKET, "prefix": f"{run}/native", "endpoint_url": env.s3_endpoint,
        "region": "us-east-1", "addressing_style": "path", "writer": "spark",
        "access_key_id": env.s3_access_key, "secret_access_key": env.s3_secret_key})],
        checkpoint_location=str(env.work / "chk" / f"s3-native-{run}"))

    def check(writes: int) -> None:
        import boto3  # type: ignore[import-untyped,unused-ignore]

        client = boto3.client("s3", endpoint_url=env.s3_endpoint, region_name="us-east-1",
                              aws_access_key_id=env.s3_access_key,
                              aws_secret_access_key=env.s3_secret_key)
        for prefix in ("spark", "exactly_once", "at_least_once", "native"):
            pages = client.get_paginator("list_objects_v2").paginate(
                Bucket=BUCKET, Prefix=f"{run}/{prefix}/")
            parquet = [o["Key"] for p in pages for o in p.get("Contents", [])
                       if o["Key"].endswith(".parquet")]
            assert parquet, f"no Parquet objects under {run}/{prefix}/"

    return {"spark": spark_s3a, "txsink": tx("exactly_once"),
            "txsink-native": lambda i: native.write(df),
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

    from txsink.spark import target, targets

    native = targets(f"bench-files-native-{uuid.uuid4().hex[:6]}",
                     [target("files", "files", path=str(out / "native-1"))],
                     checkpoint_location=str(env.work / "chk" / "files-native"))

    def check(writes: int) -> None:
        for name in ("spark", "exactly_once", "at_least_once", "native"):
            assert any(out.glob(f"{name}-*/**/*.parquet")), f"no Parquet files for {name}"
        shutil.rmtree(out, ignore_errors=True)

    return {"spark": spark_parquet, "py-noop": noop, "txsink": tx("exactly_once"),
            "txsink-native": lambda i: native.write(df),
            "txsink-alo": tx("at_least_once")}, check


WRITER_NAMES = {
    "kafka": {"spark": ("Spark Kafka sink (spark-sql-kafka-0-10)", "at-least-once")},
    "postgres": {"spark": ("Spark JDBC writer (batchsize 1000)", "at-least-once")},
    "s3": {"spark": ("Spark Parquet writer via s3a", "at-least-once")},
    "files": {"spark": ("Spark Parquet writer, local dir", "at-least-once"),
              "py-noop": ("no-op Arrow Python data source", "none")},
}
TXSINK_NAMES = {"txsink": ("txsink", "exactly-once"),
                "txsink-native": ("txsink on Spark's own Parquet writer (native path)",
                                  "exactly-once"),
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
MULTI_BENCH = (["--rows", "100000", "--epochs", "4", "--rounds", "3"], ["--quick"])
LAKE_BENCH = ([], ["--quick"])
#: Its Spark part (the native path vs Spark's s3a writer) is the yardstick table's S3 rows.
S3_BENCH = (["--no-spark"], ["--no-spark", "--quick"])
#: ``--breakdown``: where each row's time goes (the page shows it beside the p99).
REALTIME_BENCH = (["--rates", "1000,10000", "--seconds", "20", "--batch", "1 second",
                   "--buffer-size", "512", "--breakdown"],
                  ["--rates", "1000", "--seconds", "10", "--batch", "1 second",
                   "--buffer-size", "512", "--breakdown"])


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
    native_jar: list[str] = []
    if "s3" in targets:
        from txsink_s3.jvm import build

        # The native S3 path's commit protocol (compiled once from backends/s3/jvm).
        native_jar = [str(build())]
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

    classpath = ":".join([*jars.classpath(), *native_jar])
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
        # The native path's pending uploads stay in task memory until task commit (not
        # as objects beside the output): what docs/backends/s3.md advises.
        builder = builder.config(
            "spark.hadoop.fs.s3a.committer.magic.track.commits.in.memory.enabled", "true")
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
    parser.add_argument("--keep-results", type=Path, metavar="DIR",
                        help="keep every benchmark's JSON result in DIR (render the page "
                        "again with benchmarks/report.py DIR)")
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
    out = args.keep_results or Path(tempfile.mkdtemp(prefix="txsink-bench-results-"))
    out.mkdir(parents=True, exist_ok=True)
    notes: dict[str, str] = {"commit_bench": "skipped (--no-commit-bench)"}
    if not args.no_commit_bench:
        notes["commit_bench"] = commit_bench(out / "commit.json", args.quick)[1]
        print(notes["commit_bench"], flush=True)
    if "kafka" in targets and not args.no_library_benches:
        notes["kafka_bench"] = sub_bench("kafka_bench.py", KAFKA_BENCH[args.quick],
                                         out / "kafka.json")[1]
    if "postgres" in targets and not args.no_library_benches:
        notes["postgres_bench"] = sub_bench("postgres_bench.py", POSTGRES_BENCH[args.quick],
                                            out / "postgres.json")[1]
    if {"kafka", "postgres", "s3"} <= set(targets) and not args.no_library_benches:
        notes["multi_bench"] = sub_bench("multi_bench.py", MULTI_BENCH[args.quick],
                                         out / "multi.json")[1]
    if "files" in targets and not args.no_library_benches:
        notes["lake_bench"] = sub_bench("lake_bench.py", LAKE_BENCH[args.quick],
                                        out / "lake.json", timeout_s=3600)[1]
    if {"kafka", "postgres"} <= set(targets) and not args.no_library_benches:
        notes["realtime_bench"] = sub_bench("realtime_bench.py", REALTIME_BENCH[args.quick],
                                            out / "realtime.json")[1]
    if "s3" in targets and not args.no_library_benches:
        notes["s3_bench"] = sub_bench("s3_bench.py", S3_BENCH[args.quick],
                                      out / BENCHES["s3_bench.py"])[1]
    minutes = (time.monotonic() - started) / 60
    info["duration of the run"] = f"{minutes:.1f} min"
    (out / "notes.json").write_text(json.dumps(notes, indent=1))
    (out / "run.json").write_text(json.dumps({
        "info": info, "versions": env.versions, "rounds": rounds, "quick": args.quick,
        "command": command, "loads": loads,
        "sizes": {t: sizes.of(t) for t in results},
        "results": {t: [w.to_dict() for w in ws] for t, ws in results.items()}}, indent=1))
    print(f"\n{TABLE_HEAD}")
    for target, writers in results.items():
        print(markdown_rows(writers, sizes.of(target)))
    goals = render(out, args.out_dir)
    print(f"\n{TARGETS_HEAD}")
    for g in goals:
        print(g.row())
    print(f"\nwrote {args.out_dir / 'performance.md'} and performance.png from the results "
          f"in {out} ({minutes:.1f} min)")
    if not args.keep_results:
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
