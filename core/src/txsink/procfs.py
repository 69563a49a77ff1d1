"""Process facts from Linux ``/proc``: who a pid is, whether it has ended, the JVM above.

Several floors need them: fencing tells a dead lease holder from a live one, the
metrics server folds the files of workers that ended, fault injection kills the JVM
it runs under. Everything returns None (unknown) off Linux.
"""

from __future__ import annotations

import os

#: ``/proc/<pid>/stat`` states of a process that has ended: zombie (exited, not yet
#: reaped by its parent) and dead. A SIGKILLed driver stays a zombie until its parent
#: waits for it, which a container's PID 1 may never do.
ENDED_STATES = frozenset({"Z", "X", "x"})


def stat(pid: int) -> tuple[str, int, int, str] | None:
    """``(comm, ppid, starttime, state)`` of ``pid``, or None (gone, or not Linux)."""
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
        return comm, int(fields[1]), int(fields[19]), fields[0]
    except (IndexError, ValueError):
        return None


def ended(pid: int) -> bool:
    """True once ``pid`` has exited (gone, or a zombie nobody reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    info = stat(pid)
    return info is not None and info[3] in ENDED_STATES


def ancestor_jvm() -> tuple[int, int] | None:
    """``(pid, starttime)`` of the nearest ancestor JVM (this process included), if any."""
    pid = os.getpid()
    for _ in range(32):
        info = stat(pid)
        if info is None:
            return None
        comm, ppid, started, _ = info
        if comm == "java":
            return pid, started
        if ppid <= 1:
            return None
        pid = ppid
    return None


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children first found, then theirs)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            info = stat(int(entry))
            if info is not None and info[3] not in ENDED_STATES:
                parents[int(entry)] = info[1]
    found: list[int] = []
    frontier = {pid}
    while frontier:
        below = [p for p, parent in parents.items() if parent in frontier and p not in found]
        found.extend(below)
        frontier = set(below)
    return found
