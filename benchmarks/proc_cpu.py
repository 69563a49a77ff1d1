"""CPU seconds of processes from ``/proc`` (Linux), shared by the benchmark scripts.

On a small machine the sink, Spark's JVM, the Python workers and a local server
share the cores, so the benchmarks print CPU seconds beside wall-clock ratios to
tell a slower code path from a busier machine.
"""

from __future__ import annotations

import os

_TICKS = os.sysconf("SC_CLK_TCK")


def read_stat(pid: int | str) -> tuple[int, float, float] | None:
    """(parent pid, own CPU s, CPU s of waited-for children) of ``pid``; None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # fields[0] is stat(5) field 3: ppid is field 4, utime/stime 14-15, cutime/cstime 16-17.
    own = (int(fields[11]) + int(fields[12])) / _TICKS
    children = (int(fields[13]) + int(fields[14])) / _TICKS
    return int(fields[1]), own, children


def tree_cpu_seconds(root: int | None = None) -> float:
    """CPU seconds of ``root`` (default: this process) and all its descendants.

    Finished children count through their parent's cutime/cstime.
    """
    me = os.getpid() if root is None else root
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := read_stat(entry)) is not None:
            parents[int(entry)] = stat[0]
            cpu[int(entry)] = stat[1] + stat[2]

    def mine(pid: int) -> bool:
        while pid > 1:
            if pid == me:
                return True
            pid = parents.get(pid, 0)
        return False

    return sum(seconds for pid, seconds in cpu.items() if mine(pid))
