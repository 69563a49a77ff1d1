"""Process facts the Spark adapter needs: a fencing owner token shared by one driver.

Spark runs the sink's driver-side code in several short-lived Python worker
processes (one plans each micro-batch, another runs ``commit``/``abort``), and
creates a fresh :class:`~pyspark.sql.datasource.DataSource` in some of them. A token
generated in ``DataSource.__init__`` therefore differs between the planner and the
committer of the same query (checked with PySpark 4.3). What all of them share is
the driver JVM they descend from, so the owner token names that JVM (pid plus start
time, which pid reuse cannot repeat): stable across the processes of one query run,
different for the next run.
"""

from __future__ import annotations

import os
import socket

from txsink.state import new_owner_token

#: Overrides the derived owner token (tests, or engines that are not Spark).
OWNER_ENV = "TXSINK_OWNER"


def _stat(pid: int) -> tuple[str, int, int] | None:
    """``(comm, ppid, starttime)`` of ``pid`` from ``/proc``, or None off Linux."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    # comm may hold spaces and parentheses: it ends at the last ')'.
    start, end = text.find("("), text.rfind(")")
    if start < 0 or end < 0:
        return None
    comm = text[start + 1 : end]
    fields = text[end + 2 :].split()
    try:
        return comm, int(fields[1]), int(fields[19])
    except (IndexError, ValueError):
        return None


def driver_jvm() -> tuple[int, int] | None:
    """``(pid, starttime)`` of the nearest ancestor JVM (this process included), if any."""
    pid = os.getpid()
    for _ in range(32):
        info = _stat(pid)
        if info is None:
            return None
        comm, ppid, started = info
        if comm == "java":
            return pid, started
        if ppid <= 1:
            return None
        pid = ppid
    return None


def owner_token() -> str:
    """The fencing owner for coordinators of the current driver (see module docstring)."""
    explicit = os.environ.get(OWNER_ENV)
    if explicit:
        return explicit
    jvm = driver_jvm()
    if jvm is None:
        global _process_token
        if _process_token is None:
            _process_token = new_owner_token()
        return _process_token
    return f"{socket.gethostname()}:jvm{jvm[0]}:{jvm[1]}"


#: Fallback when no JVM ancestor is found: one token per process.
_process_token: str | None = None


def jvm_owner_token(pid: int) -> str | None:
    """The owner token the sink's code inside the JVM ``pid`` will use (see above)."""
    info = _stat(pid)
    if info is None:
        return None
    return f"{socket.gethostname()}:jvm{pid}:{info[2]}"


def owner_alive(owner: str) -> bool | None:
    """Whether the driver JVM named by an owner token still runs on this host.

    None when the token names another host or is not a JVM token (the answer is
    unknown); the start time in the token tells a reused pid from the original.
    """
    host, _, rest = owner.partition(":jvm")
    pid_text, _, started = rest.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit() or not started.isdigit():
        return None
    info = _stat(int(pid_text))
    return info is not None and info[2] == int(started)
