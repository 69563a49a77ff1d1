"""A throw-away Spark Connect server on 127.0.0.1, for tests of Connect clients.

Spark Connect splits Spark in two: a thin client (``SparkSession.builder.remote(...)``,
``SPARK_REMOTE``; what managed platforms hand their users) talks gRPC to a server that
is the driver. The server here is the one that ships with PySpark: ``spark-submit
--class org.apache.spark.sql.connect.service.SparkConnectServer`` in local mode, in its
own process group, so :meth:`LocalSparkConnect.stop` leaves no JVM or Python worker
behind, and :meth:`LocalSparkConnect.kill` is what a crashed server looks like.

    with LocalSparkConnect() as server:
        spark = SparkSession.builder.remote(server.url).getOrCreate()

Everything txsink does runs in the server's Python workers (the data source, the
writers, the coordinator), so they run ``python`` (default: this interpreter), which
must have txsink and the backends installed. The PySpark packages ship the server jar
(``pyspark/jars/spark-connect_2.13-<version>.jar``, 4.0.5 and 4.3.0 checked); an install
without it (a Spark distribution trimmed of it) gets it from Maven Central by
``--packages``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from txsink.testing.spark_cluster import HOST, descendants, free_port, spark_home

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


class ConnectServerError(RuntimeError):
    """The server did not come up (the message holds the end of its log)."""


def server_jar_args() -> list[str]:
    """``--packages`` for the server jar when the Spark install lacks it."""
    jars = spark_home() / "jars"
    if any(jars.glob("spark-connect_*.jar")):
        return []
    import pyspark

    return ["--packages", f"org.apache.spark:spark-connect_2.13:{pyspark.__version__}"]


class LocalSparkConnect:
    """One Spark Connect server (local mode) on a free loopback port.

    :param master: the server's Spark master.
    :param python: interpreter of the server's Python workers.
    :param env: extra environment of the server (and so of its Python workers).
    :param conf: extra ``--conf`` settings of the server.
    :param directory: holds the server's log and working directory; a temporary one
        by default (removed by :meth:`cleanup`).
    """

    def __init__(self, *, master: str = "local[2]", python: str | None = None,
                 env: Mapping[str, str] | None = None, conf: Mapping[str, str] | None = None,
                 directory: str | os.PathLike[str] | None = None) -> None:
        self.master = master
        self.python = python or sys.executable
        self.extra_env = dict(env or {})
        self.conf = dict(conf or {})
        self._own_dir = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="txsink-spark-connect-"))
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    @property
    def url(self) -> str:
        return f"sc://{HOST}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.directory / "connect-server.log"

    @property
    def pid(self) -> int:
        assert self.process is not None, "the Connect server is not running"
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _command(self) -> list[str]:
        conf = {"spark.connect.grpc.binding.port": str(self.port),
                "spark.connect.grpc.binding.address": HOST,
                "spark.driver.host": HOST, "spark.driver.bindAddress": HOST,
                "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                "spark.pyspark.python": self.python,
                # A foreachBatch function runs in a Python process the server starts
                # (it imports the Connect client: seconds on a loaded machine) that must
                # connect back within this (Spark's default: 15 s).
                "spark.python.authenticate.socketTimeout": "180s", **self.conf}
        args = [str(spark_home() / "bin" / "spark-submit"), "--class", SERVER_CLASS,
                "--master", self.master, *server_jar_args()]
        for key, value in conf.items():
            args += ["--conf", f"{key}={value}"]
        return [*args, "spark-internal"]

    def start(self, timeout: float = 180.0) -> LocalSparkConnect:
        """Start the server; return once it accepts connections on :attr:`port`."""
        if self.running:
            raise ConnectServerError("the Connect server is already running")
        self.directory.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "SPARK_LOCAL_IP": HOST, "PYSPARK_PYTHON": self.python,
               **self.extra_env}
        env.pop("SPARK_REMOTE", None)
        env.pop("SPARK_CONNECT_MODE_ENABLED", None)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(self._command(), env=env, cwd=self.directory,
                                        stdout=self._log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running:
                raise ConnectServerError(f"the Spark Connect server exited with "
                                         f"{self.process.returncode if self.process else '?'}:"
                                         f"\n{self.log_tail()}")
            with contextlib.suppress(OSError), socket.create_connection((HOST, self.port), 1):
                return
            time.sleep(0.5)
        raise ConnectServerError(f"the Spark Connect server did not listen on {self.url} within "
                                 f"{timeout:.0f}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL the server and everything it started, as a crashed machine would."""
        if self.process is None:
            return
        members = [self.process.pid, *descendants(self.process.pid)]
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(30)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the server's process group, then SIGKILL what is left. Safe twice."""
        if self.process is not None:
            members = [self.process.pid, *descendants(self.process.pid)]
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            for pid in members:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)
            self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def restart(self, timeout: float = 180.0) -> LocalSparkConnect:
        """Stop (or reap a killed) server and start a new one on the same port."""
        self.stop()
        return self.start(timeout)

    def cleanup(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> LocalSparkConnect:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
