"""Apache Iceberg's own REST catalog server on 127.0.0.1, for tests and benchmarks.

The server is ``org.apache.iceberg.rest.RESTCatalogServer`` from the test fixtures of
``org.apache.iceberg:iceberg-open-api`` (what the ``apache/iceberg-rest-fixture``
image runs): a REST front of Iceberg's JDBC catalog, here on a SQLite file (or any
JDBC URL, e.g. PostgreSQL), with a local warehouse. Its POM declares no dependencies
(they live in Iceberg's Gradle build), so the class path is listed here; the jars are
resolved with Maven into ``~/.m2`` once. The fixture binds every interface and has no
setting for the host, so a small launcher (``java/LoopbackRESTCatalogServer.java``,
compiled with ``javac`` on first use) starts the same catalog, adapter and servlet on
127.0.0.1. The server takes any OAuth2 client credentials and any bearer token.

    with LocalRestCatalog(workdir) as rest:
        rest.uri            # http://127.0.0.1:<port>
        rest.restart()      # same port, same database
        rest.lose_catalog() # a new, empty database (the catalog lost)
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from types import TracebackType

from txsink.testing.maven import Jar, cache_dir, resolve

#: 1.12.0's test fixtures are not on Maven Central (checked 2026-11-27); 1.11.0's are.
ICEBERG_VERSION = "1.11.0"
JETTY_VERSION = "12.1.5"
LAUNCHER = "org.apache.iceberg.rest.LoopbackRESTCatalogServer"
_SOURCE = Path(__file__).parent / "java" / "LoopbackRESTCatalogServer.java"


class RestCatalogUnavailable(RuntimeError):
    """The server could not be resolved, compiled or started here; the message says why."""


def server_jars(version: str = ICEBERG_VERSION) -> list[Jar]:
    """What ``RESTCatalogServer`` needs at run time (Iceberg's build lists it for its
    test fixtures: core and its test jar with the adapter and servlet, the cloud
    modules whose property classes the adapter names, Hadoop's configuration and file
    system for the warehouse, Jetty 12, JDBC drivers, a logger)."""
    ice = "org.apache.iceberg"
    return [
        Jar(ice, "iceberg-open-api", version, "test-fixtures", alone=True),
        Jar(ice, "iceberg-core", version),
        Jar(ice, "iceberg-core", version, "tests", alone=True),
        Jar(ice, "iceberg-aws", version, alone=True),
        Jar(ice, "iceberg-gcp", version, alone=True),
        Jar(ice, "iceberg-azure", version, alone=True),
        Jar("org.apache.hadoop", "hadoop-client-api", "3.4.1"),
        Jar("org.apache.hadoop", "hadoop-client-runtime", "3.4.1"),
        Jar("org.eclipse.jetty.ee10", "jetty-ee10-servlet", JETTY_VERSION),
        Jar("org.eclipse.jetty.compression", "jetty-compression-server", JETTY_VERSION),
        Jar("org.eclipse.jetty.compression", "jetty-compression-gzip", JETTY_VERSION),
        Jar("org.xerial", "sqlite-jdbc", "3.51.1.0"),
        Jar("org.postgresql", "postgresql", "42.7.8"),
        Jar("org.slf4j", "slf4j-simple", "2.0.17"),
    ]


def classpath(version: str = ICEBERG_VERSION) -> str:
    """The server's class path with the launcher (compiled into the cache once)."""
    try:
        jars = resolve(f"iceberg-rest-{version}", server_jars(version))
    except Exception as exc:
        raise RestCatalogUnavailable(str(exc)) from exc
    source = _SOURCE.read_bytes()
    digest = hashlib.sha256(source + version.encode()).hexdigest()[:12]
    classes = cache_dir() / f"iceberg-rest-launcher-{digest}"
    if not (classes / "org" / "apache" / "iceberg" / "rest").exists():
        javac = shutil.which("javac")
        if javac is None:
            raise RestCatalogUnavailable("javac (a JDK 17) is needed once, to compile the "
                                         "REST catalog server's loopback launcher")
        tmp = classes.with_name(classes.name + f".{os.getpid()}")
        done = subprocess.run([javac, "-cp", os.pathsep.join(jars), "-d", str(tmp),
                               str(_SOURCE)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RestCatalogUnavailable(f"javac failed: {done.stderr[-800:]}")
        with contextlib.suppress(OSError):
            tmp.replace(classes)
        shutil.rmtree(tmp, ignore_errors=True)
    return os.pathsep.join([str(classes), *jars])


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _close(proc: subprocess.Popen[bytes]) -> None:
    if proc.stdout is not None:
        with contextlib.suppress(OSError):
            proc.stdout.close()


class LocalRestCatalog:
    """One REST catalog server: its JDBC database and warehouse under ``workdir``."""

    def __init__(self, workdir: Path | str, *, jdbc_uri: str | None = None,
                 jdbc_user: str | None = None, jdbc_password: str | None = None,
                 port: int | None = None, version: str = ICEBERG_VERSION) -> None:
        self.workdir = Path(workdir)
        self.warehouse = self.workdir / "warehouse"
        self.database = self.workdir / "rest-catalog.db"
        self.jdbc_uri = jdbc_uri or f"jdbc:sqlite:{self.database}"
        self.jdbc_user = jdbc_user
        self.jdbc_password = jdbc_password
        self.port = port or _free_port()
        self.version = version
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.workdir / "rest-catalog.log"

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LocalRestCatalog:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self, timeout_s: float = 120.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        cp = classpath(self.version)
        self.warehouse.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CATALOG_")}
        env.update({"CATALOG_URI": self.jdbc_uri,
                    "CATALOG_WAREHOUSE": self.warehouse.as_uri(),
                    "CATALOG_JDBC_SCHEMA__VERSION": "V1"})
        if self.jdbc_user is not None:
            env["CATALOG_JDBC_USER"] = self.jdbc_user
        if self.jdbc_password is not None:
            env["CATALOG_JDBC_PASSWORD"] = self.jdbc_password
        java = shutil.which("java") or "java"
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [java, "-Xmx512m", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", cp,
             LAUNCHER, str(self.port)], stdout=subprocess.PIPE, stderr=log,
            stdin=subprocess.DEVNULL, env=env, cwd=self.workdir, start_new_session=True)
        log.close()
        ready = threading.Event()
        lines: list[str] = []

        def watch() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for raw in self.proc.stdout:
                line = raw.decode(errors="replace").strip()
                lines.append(line)
                if line.startswith("READY"):
                    ready.set()
        threading.Thread(target=watch, daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while not ready.wait(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace")[-1500:]
                self.stop()
                raise RestCatalogUnavailable(
                    f"Iceberg's REST catalog server did not start on port {self.port}: "
                    f"{' / '.join(lines[-3:])}\n{tail}")

    def stop(self, timeout_s: float = 15.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is not None:
            _close(proc)
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)
        _close(proc)

    def kill(self) -> None:
        """SIGKILL the server (its database stays)."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(15)
        if proc is not None:
            _close(proc)

    def restart(self) -> None:
        self.stop()
        self.start()

    def lose_catalog(self) -> None:
        """Stop, delete the catalog's SQLite database, start on an empty one (the
        warehouse's files stay: what a lost or replaced catalog leaves)."""
        self.stop()
        with contextlib.suppress(FileNotFoundError):
            self.database.unlink()
        self.start()
