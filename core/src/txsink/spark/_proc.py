"""Process facts the Spark adapter needs: a fencing owner token shared by one driver.

Spark runs the sink's driver-side code in several short-lived Python worker
processes (one plans each micro-batch, another runs ``commit``/``abort``), and
creates a fresh :class:`~pyspark.sql.datasource.DataSource` in some of them. A token
generated in ``DataSource.__init__`` therefore differs between the planner and the
committer of the same query (checked with PySpark 4.3). What all of them share is
the driver JVM they descend from, so the owner token names that JVM (pid plus start
time, which pid reuse cannot repeat): stable across the processes of one query run,
different for the next run. The driver's own Python process (where ``foreachBatch``
functions and the native path's driver side run) is the JVM's parent, not its child:
there the token names the JVM of its active SparkContext, so it holds the same lease as
the workers of the same driver, whatever JVM (a CI agent, a scheduler) started it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any

from txsink import procfs
from txsink.state import new_owner_token

#: Overrides the derived owner token (tests, or engines that are not Spark).
OWNER_ENV = "TXSINK_OWNER"


def driver_jvm() -> tuple[int, int] | None:
    """``(pid, starttime)`` of the nearest ancestor JVM (this process included), if any."""
    return procfs.ancestor_jvm()


def owner_token() -> str:
    """The fencing owner for coordinators of the current driver (see module docstring)."""
    explicit = os.environ.get(OWNER_ENV)
    if explicit:
        return explicit
    # A driver process names its own SparkContext's JVM first: a JVM above it (a CI
    # agent or scheduler that started the driver) is not Spark's, and a lease taken
    # under its token outlived the run while that JVM lived.
    token = _context_jvm_token()
    if token is not None:
        return token
    jvm = driver_jvm()
    if jvm is None:
        global _process_token
        if _process_token is None:
            _process_token = new_owner_token()
        return _process_token
    return f"{socket.gethostname()}:jvm{jvm[0]}:{jvm[1]}"


#: Fallback when no JVM ancestor is found: one token per process.
_process_token: str | None = None


def _context_jvm_token() -> str | None:
    """The token of the JVM this process started for its active SparkContext (a classic
    driver process), if any; None under Spark Connect or without Spark."""
    import sys

    context_module = sys.modules.get("pyspark.core.context") or sys.modules.get(
        "pyspark.context")
    context = getattr(getattr(context_module, "SparkContext", None),
                      "_active_spark_context", None)
    proc = getattr(getattr(context, "_gateway", None), "proc", None)
    pid = getattr(proc, "pid", None)
    return jvm_owner_token(pid) if isinstance(pid, int) else None


def jvm_owner_token(pid: int) -> str | None:
    """The owner token the sink's code inside the JVM ``pid`` will use (see above)."""
    info = procfs.stat(pid)
    if info is None:
        return None
    return f"{socket.gethostname()}:jvm{pid}:{info[2]}"


#: Owner tokens that name a txsink command's own process (``host:KIND:PID:START``):
#: ``txsink run`` holds its checkpoint's lease from its ownership check before Spark
#: starts to its end (its query's coordinators take the same token from
#: :data:`OWNER_ENV`); ``txsink reset`` holds it while it deletes.
COMMAND_KINDS = ("run", "reset")


def command_owner_token(kind: str) -> str:
    """The lease owner of this ``txsink run`` or ``reset`` process: host, kind, pid and
    the pid's start time (which pid reuse cannot repeat)."""
    assert kind in COMMAND_KINDS, kind
    info = procfs.stat(os.getpid())
    started = info[2] if info is not None else 0
    return f"{socket.gethostname()}:{kind}:{os.getpid()}:{started}"


def _command(owner: str) -> tuple[str, str, int, int] | None:
    """``(host, kind, pid, start)`` of a :func:`command_owner_token`, else None."""
    parts = owner.split(":")
    if (len(parts) == 4 and parts[1] in COMMAND_KINDS and parts[2].isdigit()
            and parts[3].isdigit()):
        return parts[0], parts[1], int(parts[2]), int(parts[3])
    return None


def owner_words(owner: str) -> str:
    """Who an owner token names, for a line: the command and its pid where it is one."""
    command = _command(owner)
    if command is not None:
        host, kind, pid, _ = command
        where = "this host" if host == socket.gethostname() else f"host {host}"
        return f"`txsink {kind}` pid {pid} on {where}"
    host, sep, rest = owner.partition(":connect:")
    if sep:
        where = "this host" if host == socket.gethostname() else f"host {host}"
        return (f"the `txsink run --remote` client pid {rest.split(':')[0]} on {where}, "
                "whose query runs on its Spark Connect server")
    if ":jvm" in owner:
        return "a Spark driver"
    return "a coordinator"


def owner_alive(owner: str) -> bool | None:
    """Whether the process named by an owner token still runs on this host.

    A ``txsink run --remote`` client token (``host:connect:PID:START``) is alive while
    that client runs, unknown after (its query may go on in the server). Tokens of a
    ``txsink run`` or ``reset`` process (``host:run:PID:START``) and driver JVM
    tokens (``host:jvmPID:START``) are exact: the start time tells a reused
    pid from the original, and a zombie (killed, not yet reaped) is dead — it can never
    write again. Plain process tokens (``host:PID:RANDOM``, coordinators outside Spark)
    are dead when their pid is gone or a zombie; a live pid may be a reuse, so that
    answer is None. None too for a token of another host: nothing here can tell.
    """
    host, sep, rest = owner.partition(":connect:")
    if sep:
        # A ``txsink run --remote`` client (``host:connect:PID:START``): its run holds
        # the lease while that process lives. Once it ended, whether its query still
        # runs on the server nothing here can tell: unknown, never gone. Older tokens
        # (``host:connect:RANDOM``) name no process: unknown.
        pid_text, _, started = rest.partition(":")
        if host != socket.gethostname() or not pid_text.isdigit() or not started.isdigit():
            return None
        info = procfs.stat(int(pid_text))
        return True if (info is not None and info[2] == int(started)
                        and info[3] not in procfs.ENDED_STATES) else None
    command = _command(owner)
    if command is not None:  # a `txsink run` or `reset`: exact, as a driver JVM's
        if command[0] != socket.gethostname():
            return None
        info = procfs.stat(command[2])
        return (info is not None and info[2] == command[3]
                and info[3] not in procfs.ENDED_STATES)
    host, sep, rest = owner.partition(":jvm")
    if sep:
        pid_text, _, started = rest.partition(":")
        if host != socket.gethostname() or not pid_text.isdigit() or not started.isdigit():
            return None
        info = procfs.stat(int(pid_text))
        return (info is not None and info[2] == int(started)
                and info[3] not in procfs.ENDED_STATES)
    parts = owner.split(":")
    if len(parts) != 3 or parts[0] != os.uname().nodename or not parts[1].isdigit():
        return None
    return False if procfs.ended(int(parts[1])) else None


def lease_holder(lease: Mapping[str, Any]) -> str:
    """Who holds a state's lease, as one of ``free``, ``running``, ``gone``, ``unknown``.

    ``free``: never taken, or released by a run that ended. ``running``: a live process
    on this host. ``gone``: its process ended (a crash, a kill, a zombie). ``unknown``:
    another host's driver, or a pid that may have been reused.
    """
    if not lease.get("owner") or lease.get("released_at") is not None:
        return "free"
    alive = owner_alive(str(lease["owner"]))
    return "running" if alive else "gone" if alive is False else "unknown"
