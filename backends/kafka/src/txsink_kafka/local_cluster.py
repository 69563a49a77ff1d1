"""A replicated Apache Kafka cluster on 127.0.0.1: three KRaft nodes, for failover tests.

Production Kafka is replicated: a transaction coordinator moves when its broker dies,
partition leaders change under a write, brokers are restarted one by one every week.
:class:`LocalKafkaCluster` runs that on one machine, from the same Maven Central jars
as :class:`~txsink_kafka.local_broker.LocalKafka` (each node *is* one, with its own
ports, data and log). Every node is broker and controller (a three-voter metadata
quorum), and every topic is replicated three times with ``min.insync.replicas=2``:
output topics (``default.replication.factor``), ``__transaction_state``,
``__consumer_offsets`` and txsink's marker and claim topics, which txsink creates with
the cluster's defaults. Transactional producers write with ``acks=all``, so any one
node can die without losing an acknowledged record.

    with LocalKafkaCluster(workdir) as cluster:
        bootstrap = cluster.bootstrap                  # all three nodes
        node = cluster.coordinator_of("my-txn-id")     # FindCoordinator
        cluster.kill(node)                             # SIGKILL its JVM
        cluster.restart(node)                          # same ports and data
        cluster.pause(cluster.leader_of("orders", 0))  # SIGSTOP ...
        cluster.resume_all()                           # ... SIGCONT
        cluster.rolling_restart()                      # one node at a time

Only the node's own JVM is signalled (by its pid), never by name, so other Kafka
processes on the machine are left alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

from txsink_kafka.local_broker import (
    _QUIET,
    BrokerUnavailable,
    LocalKafka,
    _free_port,
    random_cluster_id,
    resolve_classpath,
)

log = logging.getLogger(__name__)

#: The replication every topic of the cluster gets, txsink's included.
REPLICATION_FACTOR = 3
MIN_INSYNC_REPLICAS = 2


def cluster_properties(nodes: int) -> dict[str, str]:
    """``server.properties`` entries of a replicated cluster of ``nodes`` nodes."""
    rf = min(REPLICATION_FACTOR, nodes)
    isr = min(MIN_INSYNC_REPLICAS, rf)
    return {
        "default.replication.factor": str(rf),
        "min.insync.replicas": str(isr),
        "offsets.topic.replication.factor": str(rf),
        "transaction.state.log.replication.factor": str(rf),
        "transaction.state.log.min.isr": str(isr),
        # Enough partitions for the coordinators of different ids to sit on different
        # nodes, few enough to load fast after a failover.
        "transaction.state.log.num.partitions": "6",
        "offsets.topic.num.partitions": "3",
        "unclean.leader.election.enable": "false",
    }


class LocalKafkaCluster:
    """Three (``nodes``) combined broker+controller KRaft nodes on 127.0.0.1.

    :param workdir: where the nodes keep data and logs (``node-<id>/``); a temporary
        directory, removed by :meth:`close`, when not given.
    :param properties: extra ``server.properties`` entries for every node; they
        override the cluster's defaults (:func:`cluster_properties`).
    :param transaction_version: the ``transaction.version`` feature level to format
        with (4.x; ``None`` keeps the release's default).
    """

    def __init__(
        self,
        workdir: str | os.PathLike[str] | None = None,
        *,
        nodes: int = 3,
        version: str | None = None,
        properties: Mapping[str, str] | None = None,
        transaction_version: int | None = None,
        heap: str = "512m",
    ) -> None:
        if nodes < 1:
            raise ValueError(f"a cluster needs at least one node, got nodes={nodes}")
        self._own_workdir = workdir is None
        self.workdir = Path(workdir if workdir is not None
                            else tempfile.mkdtemp(prefix="txsink-kafka-cluster-"))
        voters = {n: _free_port() for n in range(1, nodes + 1)}
        props = {**cluster_properties(nodes), **(properties or {})}
        self.nodes: dict[int, LocalKafka] = {
            n: LocalKafka(self.workdir / f"node-{n}", version=version, properties=props,
                          transaction_version=transaction_version, heap=heap, node_id=n,
                          controller_port=port, voters=voters)
            for n, port in voters.items()}
        self._admin: Any = None
        self._txn: Any = None
        self._kp_admin: Any = None

    # -- what it is ---------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """Every node's listener: clients find the cluster while any one is up."""
        return ",".join(k.bootstrap for k in self.nodes.values())

    @property
    def version(self) -> str:
        return self.node(1).version

    @property
    def transaction_version(self) -> int | None:
        return self.node(1).transaction_version

    def node(self, node_id: int) -> LocalKafka:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise ValueError(f"no node {node_id}; the cluster has nodes "
                             f"{sorted(self.nodes)}") from None

    def describe(self) -> str:
        tv = f", transaction.version={self.transaction_version}" \
            if self.transaction_version is not None else ""
        return (f"Apache Kafka {self.version}{tv}: {len(self.nodes)}-node KRaft cluster "
                f"(local, logs under {self.workdir})")

    def pids(self) -> dict[int, int]:
        """The pid of every running node's JVM."""
        return {n: k.pid for n, k in self.nodes.items() if k.running and k.pid is not None}

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(f"node {n}: {line}" for n, k in self.nodes.items()
                         for line in k.log_tail(lines).splitlines())

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, timeout_s: float = 120.0) -> LocalKafkaCluster:
        """Format (first time), start every node together, and wait until each one is
        registered and the cluster can run transactions."""
        first = self.node(1)
        classpath = first._classpath or resolve_classpath(first.version)  # Maven, once
        for k in self.nodes.values():
            k._classpath = k._classpath or classpath
        if first.cluster_id is None and not (first.workdir / "data" / "meta.properties").exists():
            cluster_id = random_cluster_id(first._java)
            for k in self.nodes.values():
                k.cluster_id = cluster_id
        # Formatting is one JVM per node: side by side. The JVMs themselves are started
        # from this thread (their death signal is tied to it).
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(LocalKafka.prepare, self.nodes.values()))
        try:
            for k in self.nodes.values():
                k.launch()
            deadline = time.monotonic() + timeout_s
            for k in self.nodes.values():
                k.wait_ready(max(1.0, deadline - time.monotonic()))
        except BaseException:
            self.kill_all()
            raise
        log.info("%s up at %s", self.describe(), self.bootstrap)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop every node: SIGTERM to all at once (a node stopped last alone would wait
        for a controller quorum that is gone), SIGKILL what is still up after
        ``timeout_s``."""
        self._close_clients()
        procs = []
        for k in self.nodes.values():
            proc, k.proc = k.proc, None
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            if k.paused:
                proc.send_signal(signal.SIGCONT)
                k.paused = False
            procs.append(proc)
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)

    def kill_all(self) -> None:
        for k in self.nodes.values():
            k.kill()

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the cluster (SIGKILL what has not stopped after ``timeout_s``: the
        three nodes' controlled shutdowns can wait on each other for a controller);
        remove the work directory if this object made it."""
        self.stop(timeout_s)
        for k in self.nodes.values():
            k.close()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalKafkaCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- faults -------------------------------------------------------------------------

    def kill(self, node_id: int) -> None:
        """SIGKILL the node's JVM (a machine crash): no controlled shutdown."""
        self.node(node_id).kill()
        log.info("node %d killed", node_id)

    def stop_node(self, node_id: int, timeout_s: float = 60.0) -> None:
        """Controlled shutdown of one node (SIGTERM): it hands its leaderships over first."""
        self.node(node_id).stop(timeout_s)

    def start_node(self, node_id: int, timeout_s: float = 120.0) -> None:
        """Start a stopped or killed node again, on its ports and data."""
        self.node(node_id).start(timeout_s)

    def restart(self, node_id: int, *, hard: bool = False, timeout_s: float = 120.0) -> None:
        """Stop (SIGKILL when ``hard``) and start the node again, on its ports and data."""
        self.node(node_id).restart(hard=hard, timeout_s=timeout_s)

    def pause(self, node_id: int) -> None:
        """SIGSTOP the node (see :meth:`LocalKafka.pause`); :meth:`resume` it."""
        self.node(node_id).pause()
        log.info("node %d paused", node_id)

    def resume(self, node_id: int) -> None:
        self.node(node_id).resume()
        log.info("node %d resumed", node_id)

    def resume_all(self) -> None:
        for k in self.nodes.values():
            k.resume()

    def restart_dead(self, timeout_s: float = 120.0) -> dict[int, int | None]:
        """Start every node whose JVM is not running: node id -> how the JVM had ended
        (its exit status, negative for a signal: -9 for SIGKILL; None when it was
        stopped through this object)."""
        dead = {n: k.proc.returncode if k.proc is not None else None
                for n, k in self.nodes.items() if not k.running}
        for n, code in dead.items():
            if code not in (None, -signal.SIGKILL, -signal.SIGTERM):
                log.warning("node %d had exited with status %s; starting it again. Its "
                            "output ends:\n%s", n, code, self.output_tail(n))
            self.start_node(n, timeout_s)
        return dead

    def output_tail(self, node_id: int, lines: int = 10) -> str:
        """The last lines of a node's stdout/stderr (why a JVM exited is said there)."""
        try:
            text = (self.node(node_id).workdir / "stdout.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def heal(self, timeout_s: float = 300.0) -> None:
        """Resume paused nodes, start dead ones (again, should one die meanwhile), and
        wait until the cluster is in sync."""
        self.resume_all()
        deadline = time.monotonic() + timeout_s
        while True:
            self.restart_dead(max(1.0, deadline - time.monotonic()))
            problems = self.out_of_sync()
            if not problems:
                return
            if time.monotonic() > deadline:
                raise BrokerUnavailable(f"the cluster did not get back in sync within "
                                        f"{timeout_s:.0f}s: {'; '.join(problems[:5])}")
            time.sleep(0.25)

    def rolling_restart(self, *, timeout_s: float = 180.0) -> None:
        """Restart the nodes one at a time, as an operator rolls a cluster: a controlled
        shutdown, a start, and every partition back in sync before the next node."""
        for n in sorted(self.nodes):
            self.wait_in_sync(timeout_s)
            self.stop_node(n)
            self.start_node(n, timeout_s)
        self.wait_in_sync(timeout_s)

    # -- who does what ------------------------------------------------------------------

    def _metadata_admin(self) -> Any:
        import confluent_kafka.admin as kadmin

        if self._admin is None:
            conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap, "log_level": 0,
                                    "logger": _QUIET}
            self._admin = kadmin.AdminClient(conf)
        return self._admin

    def _txn_client(self) -> Any:
        from txsink_kafka.txn_protocol import TxnCoordinatorClient

        if self._txn is None:
            self._txn = TxnCoordinatorClient({"bootstrap.servers": self.bootstrap},
                                             timeout_s=10.0)
        return self._txn

    def _close_kafka_python_admin(self) -> None:
        admin, self._kp_admin = self._kp_admin, None
        if admin is not None:
            with contextlib.suppress(Exception):
                admin.close()

    def _close_clients(self) -> None:
        txn, self._txn = self._txn, None
        if txn is not None:
            txn.close()
        self._close_kafka_python_admin()
        self._admin = None

    def coordinator_of(self, transactional_id: str, *, timeout_s: float = 60.0) -> int:
        """The node coordinating ``transactional_id`` now (FindCoordinator, asked afresh)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                node: int = self._txn_client().find_coordinator(transactional_id,
                                                                refresh=True)
                if node in self.nodes:
                    return node
                last = f"answered node {node}"
            except Exception as exc:  # coordinator moving, node restarting
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise BrokerUnavailable(f"FindCoordinator({transactional_id!r}) found no "
                                        f"coordinator within {timeout_s:.0f}s: {last}")
            time.sleep(0.2)

    def leader_of(self, topic: str, partition: int, *, timeout_s: float = 60.0) -> int:
        """The node leading ``topic[partition]`` (Metadata)."""
        deadline = time.monotonic() + timeout_s
        while True:
            last = "no leader"
            with contextlib.suppress(Exception):
                md = self._metadata_admin().list_topics(topic, timeout=5)
                tmd = md.topics.get(topic)
                if tmd is not None and tmd.error is None and partition in tmd.partitions:
                    leader = int(tmd.partitions[partition].leader)
                    if leader in self.nodes:
                        return leader
                    last = f"leader {leader}"
                elif tmd is not None and tmd.error is not None:
                    last = str(tmd.error)
            if time.monotonic() > deadline:
                raise BrokerUnavailable(f"no leader of {topic}[{partition}] within "
                                        f"{timeout_s:.0f}s ({last})")
            time.sleep(0.2)

    def active_controller(self, *, timeout_s: float = 60.0) -> int:
        """The leader of the KRaft metadata quorum (DescribeQuorum)."""
        from txsink_kafka.txn_protocol import _kafka

        deadline = time.monotonic() + timeout_s
        while True:
            last = "no answer"
            admin = None
            try:
                admin = _kafka().KafkaAdminClient(bootstrap_servers=self.bootstrap,
                                                  request_timeout_ms=5000,
                                                  client_id="txsink-cluster")
                quorum = admin.describe_metadata_quorum()
                leader = int(quorum["topics"][0]["partitions"][0]["leader_id"])
                if leader in self.nodes:
                    return leader
                last = f"leader {leader}"
            except Exception as exc:
                last = f"{type(exc).__name__}: {exc}"
            finally:
                if admin is not None:
                    with contextlib.suppress(Exception):
                        admin.close()
            if time.monotonic() > deadline:
                raise BrokerUnavailable(f"no active controller within {timeout_s:.0f}s "
                                        f"({last})")
            time.sleep(0.2)

    def _kafka_python_admin(self) -> Any:
        from txsink_kafka.txn_protocol import _kafka

        if self._kp_admin is None:
            self._kp_admin = _kafka().KafkaAdminClient(
                bootstrap_servers=self.bootstrap, request_timeout_ms=5000,
                client_id="txsink-cluster")
        return self._kp_admin

    def view_of(self, node_id: int) -> tuple[set[int], list[str]]:
        """Node ``node_id``'s own metadata (Metadata sent to that node): the brokers
        it lists (a fenced node is not listed), and its partitions short of their
        replica set or without a leader."""
        from kafka.protocol.metadata import MetadataRequest  # type: ignore[import-untyped]

        from txsink_kafka.txn_protocol import send_to_node

        response = send_to_node(self._kafka_python_admin(),
                                MetadataRequest(topics=None, allow_auto_topic_creation=False),
                                node_id)
        brokers = {int(b.node_id) for b in response.brokers}
        behind = []
        for t in response.topics:
            if int(t.error_code):
                behind.append(f"{t.name}: error code {t.error_code}")
                continue
            for part in t.partitions:
                replicas, isr = list(part.replica_nodes), list(part.isr_nodes)
                if int(part.leader_id) < 0 or len(isr) < len(replicas):
                    behind.append(f"{t.name}[{part.partition_index}] leader={part.leader_id} "
                                  f"isr={sorted(isr)} replicas={sorted(replicas)}")
        return brokers, sorted(behind)

    def out_of_sync(self) -> list[str]:
        """What keeps the cluster from being whole, as every running node sees it: a
        node down, paused or not registered, a partition without a leader or with fewer
        in-sync replicas than replicas. Empty when the cluster is whole.

        Every node is asked for its own view: a node resumed after a pause answers
        from a stale metadata cache until it has caught up."""
        problems = [f"node {n} is {'paused' if k.paused else 'not running'}"
                    for n, k in sorted(self.nodes.items()) if k.paused or not k.running]
        if problems:
            return problems
        for n in sorted(self.nodes):
            try:
                brokers, behind = self.view_of(n)
            except Exception as exc:
                self._close_kafka_python_admin()
                return [f"node {n} did not answer: {type(exc).__name__}: {exc}"]
            missing = sorted(set(self.nodes) - brokers)
            if missing:
                return [f"node {n} does not list nodes {missing}"]
            if behind:
                return [f"per node {n}: {b}" for b in behind]
        return []

    def wait_in_sync(self, timeout_s: float = 180.0) -> None:
        """Wait until every node is up and registered and every partition has its whole
        replica set in sync (what a rolling restart waits for between nodes)."""
        deadline = time.monotonic() + timeout_s
        while True:
            last = self.out_of_sync()
            if not last:
                return
            if time.monotonic() > deadline:
                raise BrokerUnavailable(f"the cluster did not get back in sync within "
                                        f"{timeout_s:.0f}s: {'; '.join(last[:5])}")
            time.sleep(0.25)

    def topic_replication(self, topic: str, *, timeout_s: float = 30.0) -> tuple[int, int]:
        """(replication factor, min.insync.replicas) of ``topic`` as the cluster has it."""
        import confluent_kafka.admin as kadmin

        admin = self._metadata_admin()
        config_resource: Any = kadmin.ConfigResource  # type: ignore[attr-defined]
        resource = config_resource(kadmin.ResourceType.TOPIC, topic)  # type: ignore[attr-defined]
        deadline = time.monotonic() + timeout_s
        while True:
            try:  # a node that has not caught up on a new topic does not know it yet
                tmd = admin.list_topics(topic, timeout=10).topics[topic]
                if tmd.error is not None:
                    raise BrokerUnavailable(f"topic {topic!r}: {tmd.error}")
                factor = min(len(p.replicas) for p in tmd.partitions.values())
                entries = admin.describe_configs([resource])[resource].result(10)
                return factor, int(entries["min.insync.replicas"].value)
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


__all__ = ["MIN_INSYNC_REPLICAS", "REPLICATION_FACTOR", "LocalKafkaCluster",
           "cluster_properties"]


def main(argv: list[str] | None = None) -> int:
    """``python -m txsink_kafka.local_cluster``: a three-node cluster until Ctrl-C."""
    import argparse

    from txsink_kafka.local_broker import ENV_VERSION, KAFKA_VERSION

    parser = argparse.ArgumentParser(prog="python -m txsink_kafka.local_cluster",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", default=os.environ.get(ENV_VERSION, KAFKA_VERSION))
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--workdir", help="data and logs (default: a temporary directory)")
    args = parser.parse_args(argv)
    with LocalKafkaCluster(args.workdir, nodes=args.nodes, version=args.version) as cluster:
        print(f"{cluster.describe()} at {cluster.bootstrap}; Ctrl-C stops it", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while all(k.running for k in cluster.nodes.values()):
                time.sleep(1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
