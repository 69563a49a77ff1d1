"""Timeouts that follow the machine's load, so that a verdict does not depend on it.

A Spark driver's fixed 240-second bound was measured on an idle 2-core machine. With
six other test runs on the same cores (load average 25-30) one driver took 95 s just to
start its query and the bound failed four e2e tests that pass alone. A bound here is
the idle figure times how much busier the machine is than its cores: the 1-minute load
average per core, at least 1, measured when the wait starts and again while it runs.
"""

from __future__ import annotations

import os

#: Never scale by more than this: a hang must still end the test.
MAX_FACTOR = 8.0


def load_factor() -> float:
    """How many times busier the machine is than its cores (1.0 when idle or unknown)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return 1.0
    return max(1.0, min(MAX_FACTOR, load / (os.cpu_count() or 1)))


def scaled(seconds: float) -> float:
    """``seconds`` (measured on an idle machine) stretched by :func:`load_factor`."""
    return seconds * load_factor()
