"""A throw-away Spark standalone cluster on 127.0.0.1, for tests of Spark pipelines.

Local mode runs the driver and every task in one JVM on one disk, which hides what
a cluster changes: executors are separate JVMs with their own Python workers, they
die on their own, and Spark really runs speculative copies of slow tasks. This
starts Spark's own cluster manager from the PySpark install (``spark-class``): a
master and ``workers`` workers, each in its own process group, so that
:meth:`SparkStandaloneCluster.stop` (SIGTERM, then SIGKILL of the groups) leaves
no JVM behind, also when a test fails. A driver in client mode connects with
:attr:`~SparkStandaloneCluster.master_url` and :meth:`~SparkStandaloneCluster.driver_conf`.

    with SparkStandaloneCluster(workers=2) as cluster:
        spark = (SparkSession.builder.master(cluster.master_url)
                 .config(map=cluster.driver_conf()).getOrCreate())

The workers' executors run the Python given as ``python`` (default: this
interpreter), so everything the job imports (txsink and its backends) must be
installed there. State of the running cluster is read from the master's JSON
status page (``/json/``), which is why the master's web UI stays on (loopback only).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
#: The JVM class of a standalone executor (what :meth:`executor_pids` looks for).
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def spark_home() -> Path:
    """The Spark distribution inside the installed PySpark package."""
    env = os.environ.get("SPARK_HOME")
    if env:
        return Path(env)
    import pyspark

    return Path(pyspark.__file__).parent


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux ``/proc``)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/children").read_text()
        except OSError:
            continue
        out.extend(int(p) for p in text.split())
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        return ""


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, depth first."""
    out: list[int] = []
    stack = _children(pid)
    while stack:
        child = stack.pop()
        out.append(child)
        stack.extend(_children(child))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@dataclass
class _Daemon:
    """One master or worker JVM, the leader of its own process group."""

    name: str
    args: list[str]
    log_path: Path
    port: int = 0
    host: str = HOST
    process: subprocess.Popen[bytes] | None = None
    log_file: Any = None

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} is not running"
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class ClusterError(RuntimeError):
    """The cluster did not come up (the message holds the end of the daemon's log)."""


class SparkStandaloneCluster:
    """A standalone master and workers on loopback ports.

    :param workers: number of worker JVMs.
    :param cores: cores each worker offers (one executor per worker with the defaults).
    :param memory: memory each worker offers to executors, e.g. ``"1g"``.
    :param python: interpreter of the executors' Python workers.
    :param directory: holds logs and the workers' work dirs; a temporary one by default
        (removed by :meth:`cleanup`).
    :param daemon_memory: heap of the master and worker JVMs themselves.
    :param worker_hosts: the address each worker (and its executors) binds, by default
        127.0.0.1 for all. Spark never runs a speculative copy of a task on a host
        where an attempt of it runs, so speculation needs workers on distinct hosts:
        give distinct loopback addresses, e.g. ``("127.0.0.2", "127.0.0.3")`` (all of
        127.0.0.0/8 is loopback on Linux).
    """

    def __init__(self, workers: int = 2, *, cores: int = 1, memory: str = "1g",
                 python: str | None = None, directory: str | os.PathLike[str] | None = None,
                 daemon_memory: str = "256m", env: Mapping[str, str] | None = None,
                 worker_hosts: Sequence[str] | None = None,
                 node_local: Sequence[str | os.PathLike[str]] = ()) -> None:
        self.workers_count = workers
        self.cores = cores
        self.memory = memory
        self.python = python or sys.executable
        self._own_dir = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="txsink-spark-cluster-"))
        self.daemon_memory = daemon_memory
        self.extra_env = dict(env or {})
        self.worker_hosts = list(worker_hosts or [HOST] * workers)
        if len(self.worker_hosts) != workers or not all(
                h.startswith("127.") for h in self.worker_hosts):
            raise ValueError("worker_hosts needs one loopback address (127.x.y.z) per worker")
        #: Directories each worker sees as its own (an empty file system of its own
        #: there, as on separate machines): a node-local path on a cluster.
        self.node_local = [str(Path(d).absolute()) for d in node_local]
        self.master_port = free_port()
        self.master_ui_port = free_port()
        self.master: _Daemon | None = None
        self.workers: list[_Daemon] = []

    # -- addresses ------------------------------------------------------------------------

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.master_port}"

    def driver_conf(self, *, executor_memory: str | None = None) -> dict[str, str]:
        """Settings a client-mode driver needs to use this cluster from 127.0.0.1."""
        return {
            "spark.master": self.master_url,
            "spark.submit.deployMode": "client",
            "spark.driver.host": HOST,
            "spark.driver.bindAddress": HOST,
            "spark.pyspark.python": self.python,
            "spark.pyspark.driver.python": sys.executable,
            "spark.executorEnv.PYSPARK_PYTHON": self.python,
            "spark.executor.memory": executor_memory or self.memory,
            "spark.executor.cores": str(self.cores),
            "spark.ui.enabled": "false",
        }

    # -- processes ------------------------------------------------------------------------

    def _env(self, host: str = HOST) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "SPARK_LOCAL_IP": host,
            "SPARK_MASTER_HOST": HOST,
            "PYSPARK_PYTHON": self.python,
            "SPARK_DAEMON_MEMORY": self.daemon_memory,
            # The daemons log to their console, which goes to the log file.
            "SPARK_NO_DAEMONIZE": "1",
        })
        env.pop("SPARK_CONF_DIR", None)
        env.update(self.extra_env)
        return env

    def _spawn(self, daemon: _Daemon) -> None:
        daemon.log_file = open(daemon.log_path, "ab")  # noqa: SIM115 - closed in _reap
        spark_class = spark_home() / "bin" / "spark-class"
        command = [str(spark_class), *daemon.args]
        if self.node_local and daemon.name.startswith("worker"):
            # A mount namespace of its own with an empty tmpfs on each node-local
            # directory: what its executors write there, the driver never sees.
            mounts = " && ".join(f'mkdir -p "${i + 1}" && mount -t tmpfs txsink-node "${i + 1}"'
                                 for i in range(len(self.node_local)))
            n = len(self.node_local)
            command = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                       f'{mounts} && shift {n} && exec "$@"', "sh", *self.node_local,
                       *command]
        daemon.process = subprocess.Popen(
            command, env=self._env(daemon.host), cwd=self.directory,
            stdout=daemon.log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        log.debug("started spark %s (pid %d)", daemon.name, daemon.process.pid)

    def _worker(self, index: int) -> _Daemon:
        work = self.directory / f"worker-{index}"
        work.mkdir(parents=True, exist_ok=True)
        host = self.worker_hosts[index]
        port = free_port(host)
        return _Daemon(
            f"worker-{index}",
            ["org.apache.spark.deploy.worker.Worker", self.master_url, "--host", host,
             "--port", str(port), "--webui-port", str(free_port(host)),
             "--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(work)],
            self.directory / f"worker-{index}.log", port, host)

    def start(self, timeout: float = 120.0) -> SparkStandaloneCluster:
        """Start the master and every worker; return once all workers registered."""
        if self.master is not None:
            raise ClusterError("the cluster is already running")
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            self.master = _Daemon(
                "master",
                ["org.apache.spark.deploy.master.Master", "--host", HOST,
                 "--port", str(self.master_port), "--webui-port", str(self.master_ui_port)],
                self.directory / "master.log")
            self._spawn(self.master)
            self.workers = [self._worker(i) for i in range(self.workers_count)]
            for worker in self.workers:
                self._spawn(worker)
            self.wait_for_workers(self.workers_count, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def status(self) -> dict[str, Any]:
        """The master's JSON status (workers, applications)."""
        url = f"http://{HOST}:{self.master_ui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as response:
            data: dict[str, Any] = json.loads(response.read())
            return data

    def alive_workers(self) -> int:
        return sum(1 for w in self.status().get("workers", []) if w.get("state") == "ALIVE")

    def _registered(self) -> int:
        """Running worker daemons the master lists as ALIVE (a killed worker can stay
        ALIVE in the master's view for a while, so count ours by port)."""
        alive = {(str(w.get("host")), int(w.get("port", -1)))
                 for w in self.status().get("workers", []) if w.get("state") == "ALIVE"}
        return sum(1 for w in self.workers if w.running and (w.host, w.port) in alive)

    def wait_for_workers(self, count: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            for daemon in (self.master, *self.workers):
                if daemon is not None and daemon.process is not None and not daemon.running:
                    raise ClusterError(f"spark {daemon.name} exited with "
                                       f"{daemon.process.returncode}:\n"
                                       f"{self.log_tail(daemon.name)}")
            try:
                alive = self._registered()
                if alive >= count:
                    return
                last = f"{alive} of {count} workers registered"
            except OSError as exc:
                last = exc
            time.sleep(0.5)
        raise ClusterError(f"spark standalone cluster not ready within {timeout:.0f}s "
                           f"({last}); master log:\n{self.log_tail('master')}")

    def log_tail(self, name: str, lines: int = 40) -> str:
        try:
            text = (self.directory / f"{name}.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    # -- what tests kill -----------------------------------------------------------------

    def worker_pid(self, index: int) -> int:
        return self.workers[index].pid

    def executor_pids(self, worker: int | None = None) -> list[int]:
        """Executor JVMs running under the workers (or under worker ``worker``)."""
        chosen = self.workers if worker is None else [self.workers[worker]]
        pids: list[int] = []
        for daemon in chosen:
            if not daemon.running:
                continue
            pids.extend(p for p in descendants(daemon.pid)
                        if EXECUTOR_CLASS in _cmdline(p) and _alive(p))
        return sorted(pids)

    def wait_for_executors(self, count: int, timeout: float = 120.0) -> list[int]:
        deadline = time.monotonic() + timeout
        while True:
            pids = self.executor_pids()
            if len(pids) >= count or time.monotonic() > deadline:
                return pids
            time.sleep(0.2)

    def kill_executor(self, pid: int) -> None:
        """SIGKILL one executor JVM (its Python workers lose their JVM and exit)."""
        if pid not in self.executor_pids():
            raise ClusterError(f"pid {pid} is not an executor of this cluster")
        os.kill(pid, signal.SIGKILL)

    def kill_worker(self, index: int) -> None:
        """SIGKILL one worker JVM, as a lost machine would; its executors notice and exit."""
        daemon = self.workers[index]
        if daemon.running:
            os.kill(daemon.pid, signal.SIGKILL)
            daemon.process.wait(30)  # type: ignore[union-attr]

    def restart_worker(self, index: int, timeout: float = 120.0) -> None:
        """Replace worker ``index`` (killed or not) by a fresh one on new ports."""
        old = self.workers[index]
        self._reap(old, 5.0)
        fresh = self._worker(index)
        self.workers[index] = fresh
        self._spawn(fresh)
        self.wait_for_workers(self.workers_count, timeout)

    # -- stopping ------------------------------------------------------------------------

    @staticmethod
    def _signal_group(daemon: _Daemon, sig: int) -> None:
        if daemon.process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(daemon.process.pid, sig)

    def _reap(self, daemon: _Daemon, timeout: float) -> None:
        if daemon.process is not None:
            members = [daemon.process.pid, *descendants(daemon.process.pid)]
            self._signal_group(daemon, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.process.wait(timeout)
            # Executors and Python workers share the daemon's group; some may have
            # escaped it (setsid), so kill what was seen below the daemon too.
            self._signal_group(daemon, signal.SIGKILL)
            for pid in members:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.process.wait(10)
            _wait_gone(members, 10.0)
            daemon.process = None
        if daemon.log_file is not None:
            daemon.log_file.close()
            daemon.log_file = None

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the workers (and their executors), then the master. Safe to call twice."""
        for worker in self.workers:
            self._reap(worker, timeout)
        if self.master is not None:
            self._reap(self.master, timeout)
            self.master = None

    def cleanup(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> SparkStandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def _wait_gone(pids: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)


def main(argv: list[str] | None = None, out: TextIO = sys.stdout) -> int:
    """``python -m txsink.testing.spark_cluster``: run a cluster until interrupted."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cores", type=int, default=1)
    ap.add_argument("--memory", default="1g")
    args = ap.parse_args(argv)
    with SparkStandaloneCluster(args.workers, cores=args.cores, memory=args.memory) as cluster:
        print(f"master {cluster.master_url}; logs in {cluster.directory}; Ctrl-C stops it",
              file=out, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
