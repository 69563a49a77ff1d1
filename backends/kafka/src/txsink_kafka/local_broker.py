"""A real Apache Kafka broker on 127.0.0.1, run from Maven Central artifacts.

For tests, examples and benchmarks on machines without Docker: the broker's jars
(``org.apache.kafka:kafka_2.13`` and its runtime dependencies) are resolved once
into the local Maven repository by ``mvn``, so later runs need no network. One
process is both KRaft controller and broker; its log directory is on disk, so a
restart (clean or SIGKILL) keeps every partition and the transaction state, as a
production broker would.

    with LocalKafka(workdir) as kafka:
        bootstrap = kafka.bootstrap
        kafka.kill()      # SIGKILL the JVM
        kafka.start()     # same ports, same data
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

log = logging.getLogger(__name__)

#: The newest 4.x release and the newest 3.9.x (the oldest line txsink supports).
KAFKA_VERSION = "4.4.0"
KAFKA_39_VERSION = "3.9.2"
#: Selects the version the tests' broker runs (e.g. ``3.9.2``).
ENV_VERSION = "TXSINK_KAFKA_VERSION"
#: ``transaction.version`` feature level set when storage is formatted (4.x only).
ENV_TRANSACTION_VERSION = "TXSINK_KAFKA_TRANSACTION_VERSION"
#: Where resolved classpaths are cached (default ``~/.cache/txsink/kafka``).
ENV_CACHE = "TXSINK_KAFKA_CACHE"

#: slf4j 1.x bindings: log4j 2 for Kafka 4.x, reload4j (log4j 1) for 3.9.
_LOG4J2_VERSION = "2.25.5"


class BrokerUnavailable(RuntimeError):
    """The broker could not be resolved or started here; the message says why."""


#: Lowest port :func:`_free_port` picks.
_LOWEST_PORT = 10_000


def _ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for ports given to outgoing connections and to bind(0)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _free_port() -> int:
    """A free port on 127.0.0.1 below the kernel's ephemeral range.

    A node restarted after a kill must get its port back (clients and the other nodes
    know it by it). A port from bind(0) is ephemeral: while the node is down, the
    kernel may give it to any process's outgoing connection, and the restart then
    fails with "Address already in use". Ports below the range are handed out only
    to whoever binds them by number.
    """
    low, _ = _ephemeral_ports()
    if low - _LOWEST_PORT >= 1000:
        rng = random.SystemRandom()
        for _ in range(100):
            port = rng.randrange(_LOWEST_PORT, low)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        found: int = s.getsockname()[1]
        return found


def _cache_dir() -> Path:
    base = os.environ.get(ENV_CACHE)
    if base:
        return Path(base)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "txsink" / "kafka"


def _broker_artifacts(version: str) -> list[tuple[str, str, str]]:
    deps = [("org.apache.kafka", "kafka_2.13", version)]
    if version.startswith("3."):
        deps.append(("org.slf4j", "slf4j-reload4j", "1.7.36"))
    else:
        deps.append(("org.apache.logging.log4j", "log4j-slf4j-impl", _LOG4J2_VERSION))
    return deps


def _pom(name: str, artifacts: list[tuple[str, str, str]]) -> str:
    body = "".join(
        f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>" for g, a, v in artifacts)
    return ('<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0'
            f'</modelVersion><groupId>txsink</groupId><artifactId>{name}-classpath'
            f'</artifactId><version>1</version><dependencies>{body}</dependencies>'
            '</project>\n')


def maven_classpath(name: str, artifacts: list[tuple[str, str, str]], *,
                    timeout_s: float = 600.0) -> list[str]:
    """The jars of ``artifacts`` (group, artifact, version) with their runtime
    dependencies, resolving them with Maven into the local repository on first use.

    The jar list is cached under ``name``; it is reused while every jar is still in
    the local Maven repository, so a second run starts without Maven or network.
    """
    cache = _cache_dir() / name
    cp_file = cache / "classpath.txt"
    if cp_file.exists():
        jars = cp_file.read_text().strip().split(os.pathsep)
        if jars and jars[0] and all(Path(j).exists() for j in jars):
            return jars
    mvn = shutil.which("mvn")
    coordinates = ", ".join(":".join(a) for a in artifacts)
    if mvn is None:
        raise BrokerUnavailable(
            f"{coordinates}: Maven (`mvn`) must be on PATH to fetch the jars once from "
            "Maven Central; install Maven, or name a running broker with "
            "TXSINK_KAFKA_BOOTSTRAP")
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "pom.xml").write_text(_pom(name.replace("/", "-"), artifacts))
    tmp_out = cache / f"classpath.{os.getpid()}.tmp"
    log.info("resolving %s from Maven Central (first run only)", coordinates)
    try:
        proc = subprocess.run(
            [mvn, "-q", "-B", "-f", str(cache / "pom.xml"), "dependency:build-classpath",
             "-Dmdep.includeScope=runtime", f"-Dmdep.outputFile={tmp_out}"],
            capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise BrokerUnavailable(f"resolving {coordinates} with Maven took over "
                                f"{timeout_s:.0f}s") from exc
    if proc.returncode != 0 or not tmp_out.exists():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise BrokerUnavailable(f"Maven could not resolve {coordinates} "
                                f"(exit {proc.returncode}):\n{tail}")
    tmp_out.replace(cp_file)
    return cp_file.read_text().strip().split(os.pathsep)


def resolve_classpath(version: str = KAFKA_VERSION, *, timeout_s: float = 600.0) -> str:
    """The broker's classpath, resolving it with Maven on first use (then cached)."""
    return os.pathsep.join(maven_classpath(version, _broker_artifacts(version),
                                           timeout_s=timeout_s))


_LOG4J2_CONFIG = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.controller.name = org.apache.kafka
logger.controller.level = INFO
"""

_LOG4J1_CONFIG = """\
log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File={log}
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
"""


def _libc_prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


#: Looked up here, not in the forked child: no dynamic loading between fork and exec.
_PRCTL = _libc_prctl()
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the broker's child process (Linux): SIGKILL it when the thread that started
    it dies. A test run killed by a timeout or SIGKILL would otherwise leave the
    broker JVM running, since it has its own session."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


#: Brokers started in this process and not closed yet, for failure reports.
_STARTED: dict[int, LocalKafka] = {}


def started_brokers() -> list[LocalKafka]:
    """The :class:`LocalKafka` instances this process started and has not closed."""
    return list(_STARTED.values())


class LocalKafka:
    """One KRaft node (broker + controller) on 127.0.0.1, data and log under ``workdir``.

    Alone (the default) it is a whole cluster of one node. A
    :class:`~txsink_kafka.local_cluster.LocalKafkaCluster` runs several of them as one
    cluster: each gets its ``node_id``, the controller ports of every voter
    (``voters``) and the cluster's ``cluster_id``.

    :param properties: extra ``server.properties`` entries (e.g. a short
        ``transaction.max.timeout.ms`` for timeout tests); they override the defaults.
    :param transaction_version: the ``transaction.version`` feature level to format
        with (4.x; ``None`` keeps the release's default, 2 on 4.x).
    """

    def __init__(
        self,
        workdir: str | os.PathLike[str] | None = None,
        *,
        version: str | None = None,
        properties: Mapping[str, str] | None = None,
        transaction_version: int | None = None,
        heap: str = "512m",
        port: int | None = None,
        node_id: int = 1,
        controller_port: int | None = None,
        voters: Mapping[int, int] | None = None,
        cluster_id: str | None = None,
    ) -> None:
        self.version = version or os.environ.get(ENV_VERSION) or KAFKA_VERSION
        tv = os.environ.get(ENV_TRANSACTION_VERSION)
        self.transaction_version = (transaction_version if transaction_version is not None
                                    else int(tv) if tv else None)
        self._own_workdir = workdir is None
        self.workdir = Path(workdir if workdir is not None
                            else tempfile.mkdtemp(prefix="txsink-kafka-"))
        self.port = port or _free_port()
        self.node_id = node_id
        self.controller_port = controller_port or _free_port()
        #: Controller port of every voter of the metadata quorum, by node id.
        self.voters = dict(voters) if voters else {node_id: self.controller_port}
        self.cluster_id = cluster_id
        self.properties = dict(properties or {})
        self.heap = heap
        self.proc: subprocess.Popen[bytes] | None = None
        self._classpath: str | None = None
        self._formatted = False
        #: Stopped with SIGSTOP (see :meth:`pause`) and not resumed yet.
        self.paused = False

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        """The broker's own log (server, controller, transaction coordinator)."""
        return self.workdir / "broker.log"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        """The JVM was started and has not exited (it may be paused)."""
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` WARN/ERROR lines of the broker log (where to look first)."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        worth = [t for t in text if "] WARN " in t or "] ERROR " in t]
        return "\n".join(worth[-lines:])

    def describe(self) -> str:
        tv = f", transaction.version={self.transaction_version}" \
            if self.transaction_version is not None else ""
        node = f" node {self.node_id}" if len(self.voters) > 1 else ""
        return f"Apache Kafka {self.version}{tv} (local{node}, log: {self.log_path})"

    # -- lifecycle ----------------------------------------------------------------------

    def _server_properties(self) -> dict[str, str]:
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "listeners": (f"PLAINTEXT://127.0.0.1:{self.port},"
                          f"CONTROLLER://127.0.0.1:{self.controller_port}"),
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            # A static quorum: every node knows every voter from its configuration, so
            # one `StorageTool format` per node with the cluster's id is all it needs
            # (on 3.9 and 4.x alike).
            "controller.quorum.voters": ",".join(
                f"{n}@127.0.0.1:{p}" for n, p in sorted(self.voters.items())),
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.workdir / "data"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "3",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "3",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
        }
        props.update(self.properties)
        return props

    def _java(self, main: str, *args: str, **kw: object) -> list[str]:
        assert self._classpath is not None
        java = shutil.which("java", path=os.path.join(os.environ["JAVA_HOME"], "bin")) \
            if os.environ.get("JAVA_HOME") else shutil.which("java")
        if java is None:
            raise BrokerUnavailable("Apache Kafka needs Java 17 (`java` on PATH or JAVA_HOME)")
        return [java, f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
                f"-Dlog4j.configuration=file:{self.workdir / 'log4j.properties'}",
                "-cp", self._classpath, main, *args]

    def _format(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for name, template in (("log4j2.properties", _LOG4J2_CONFIG),
                               ("log4j.properties", _LOG4J1_CONFIG)):
            (self.workdir / name).write_text(template.format(log=self.log_path))
        props = self.workdir / "server.properties"
        props.write_text("".join(f"{k}={v}\n" for k, v in self._server_properties().items()))
        if (self.workdir / "data" / "meta.properties").exists():
            self._formatted = True
            return
        if self.cluster_id is None:
            self.cluster_id = random_cluster_id(self._java)
        cmd = self._java("kafka.tools.StorageTool", "format", "-t", self.cluster_id,
                         "-c", str(props))
        if self.transaction_version is not None:
            cmd += ["--feature", f"transaction.version={self.transaction_version}"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise BrokerUnavailable(f"formatting Kafka storage failed: "
                                    f"{(done.stdout + done.stderr).strip()[-2000:]}")
        self._formatted = True

    def start(self, timeout_s: float = 90.0) -> LocalKafka:
        """Start (or restart) the broker and wait until it serves metadata."""
        if self.running:
            return self
        self.launch()
        try:
            self.wait_ready(timeout_s)
        except BaseException:
            self.kill()
            raise
        log.info("Apache Kafka %s node %d up at %s (pid %s)", self.version, self.node_id,
                 self.bootstrap, self.pid)
        return self

    def prepare(self) -> None:
        """Resolve the jars and format the storage, if not done yet (a cluster does
        this for its nodes at once)."""
        if self._classpath is None:
            self._classpath = resolve_classpath(self.version)
        if not self._formatted:
            self._format()

    def launch(self) -> None:
        """Start the JVM without waiting for it (the nodes of a cluster start together:
        none is ready before a quorum of controllers is up)."""
        if self.running:
            return
        self.prepare()
        self.paused = False
        with open(self.workdir / "stdout.log", "ab") as out:
            self.proc = subprocess.Popen(
                self._java("kafka.Kafka", str(self.workdir / "server.properties")),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.workdir, start_new_session=True,
                # Linux ties the death signal to the starting *thread*: a broker
                # (re)started from a helper thread would die when that thread ends.
                preexec_fn=(_die_with_parent
                            if threading.current_thread() is threading.main_thread()
                            else None))
        _STARTED[id(self)] = self

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        """Block until the broker lists itself in metadata (it is then accepting work)."""
        import confluent_kafka.admin as kadmin

        deadline = time.monotonic() + timeout_s
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap, "log_level": 0,
                                "logger": _QUIET}
        admin = kadmin.AdminClient(conf)
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise BrokerUnavailable(
                    f"Apache Kafka {self.version} exited with code {self.proc.returncode}; "
                    f"see {self.log_path} and {self.workdir / 'stdout.log'}")
            with contextlib.suppress(Exception):
                md = admin.list_topics(timeout=1)
                if self.node_id in md.brokers:
                    return
            time.sleep(0.2)
        raise BrokerUnavailable(f"Apache Kafka {self.version} did not answer on "
                                f"{self.bootstrap} within {timeout_s:.0f}s; see {self.log_path}")

    def stop(self, timeout_s: float = 30.0) -> None:
        """Clean shutdown (SIGTERM), SIGKILL if it does not exit in time."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        if self.paused:  # a stopped process acts on SIGTERM only once it runs again
            proc.send_signal(signal.SIGCONT)
            self.paused = False
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("Apache Kafka pid %d ignored SIGTERM for %.0fs; killing it",
                        proc.pid, timeout_s)
            proc.kill()
            proc.wait(30)

    def kill(self) -> None:
        """SIGKILL the broker JVM, as a machine crash would stop it."""
        proc, self.proc = self.proc, None
        self.paused = False
        if proc is None or proc.poll() is not None:
            return
        proc.kill()
        proc.wait(30)

    def pause(self) -> None:
        """SIGSTOP the JVM: it keeps its sockets open and answers nothing, like a broker
        stuck in a long GC pause or on a frozen VM. :meth:`resume` lets it go on."""
        if self.proc is None or self.proc.poll() is not None:
            raise BrokerUnavailable(f"node {self.node_id} is not running: cannot pause it")
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT a paused JVM (nothing if it is not paused)."""
        if self.paused and self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def restart(self, *, hard: bool = False, timeout_s: float = 90.0) -> None:
        """Stop (SIGKILL when ``hard``) and start again on the same ports and data."""
        if hard:
            self.kill()
        else:
            self.stop()
        self.start(timeout_s)

    def close(self) -> None:
        """Stop the broker; remove the work directory if this object made it."""
        self.stop()
        _STARTED.pop(id(self), None)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalKafka:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def random_cluster_id(java: Any) -> str:
    """A new cluster id from ``StorageTool random-uuid`` (``java`` builds the command)."""
    done = subprocess.run(java("kafka.tools.StorageTool", "random-uuid"),
                          capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.strip().splitlines()[-1]


_QUIET = logging.getLogger("txsink_kafka.local_broker.librdkafka")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


def main(argv: list[str] | None = None) -> int:
    """``python -m txsink_kafka.local_broker resolve|run``: fetch jars, or run a broker."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m txsink_kafka.local_broker",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("command", choices=["resolve", "run"],
                        help="resolve: fetch the jars into the local Maven repository; "
                             "run: start a broker and keep it up until Ctrl-C")
    parser.add_argument("--version", default=os.environ.get(ENV_VERSION, KAFKA_VERSION))
    parser.add_argument("--workdir", help="data and log directory (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.command == "resolve":
        classpath = resolve_classpath(args.version)
        print(f"Apache Kafka {args.version}: {len(classpath.split(os.pathsep))} jars ready")
        return 0
    kafka = LocalKafka(args.workdir, version=args.version)
    with kafka:
        print(f"{kafka.describe()} at {kafka.bootstrap}; Ctrl-C stops it", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while kafka.proc is not None and kafka.proc.poll() is None:
                time.sleep(1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
