"""SIGINT and SIGTERM during ``txsink run``, and stop steps bounded in time.

A signal becomes :class:`Interrupted` in the main thread, so the run stops its query
and prints its summary; each stop step after it gets a few seconds, past which the
driver's JVM is killed (exactly once does not need the wait: the next run recovers
the epoch in flight as after a crash).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived; ``txsink run`` stops the query and prints its summary."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def interrupts_as_exceptions() -> Iterator[None]:
    """Turn SIGINT and SIGTERM into :class:`Interrupted` in the main thread.

    Without this, SIGTERM kills the driver without a summary, and Ctrl-C leaves it
    to whichever py4j call is running to fail noisily.
    """
    old = {sig: signal.signal(sig, _raise_interrupted) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


class DeadlineReached(KeyboardInterrupt):
    """``--timeout`` passed while a step of the run was still busy (Spark starting, a
    query starting): the run stops as it does at a signal, and says why."""


@contextlib.contextmanager
def deadline_alarm(at: float | None) -> Iterator[None]:
    """Raise :class:`DeadlineReached` in the main thread at monotonic time ``at`` (none:
    ``None``), wherever it is: a bound that holds while a step that cannot be asked to
    stop (a JVM starting, a py4j call) still runs."""
    import time

    if at is None:
        yield
        return

    def fire(signum: int, frame: object) -> None:
        raise DeadlineReached("--timeout")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(0.001, at - time.monotonic()))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def take_back_sigint() -> None:
    """PySpark's SparkContext installs its own SIGINT handler (cancel jobs over py4j,
    which fails when it interrupts another py4j call); use ours again."""
    signal.signal(signal.SIGINT, _raise_interrupted)


#: After SIGINT/SIGTERM, how long `txsink run` lets Spark stop the query and itself
#: (Spark waits for a batch in flight, e.g. an abort in a Python worker) before it kills
#: the driver's JVM and everything under it. Exactly once does not need the wait: the
#: next run recovers the epoch in flight as after a crash.
STOP_BOUND_S = 6.0


def stop_within(action: Callable[[], object], spark: SparkSession | None, what: str,
                out: Callable[[str], None] | None = None,
                bound_s: float = STOP_BOUND_S) -> bool:
    """Run a stop step after a signal, for at most ``bound_s``; past that, kill the
    driver's JVM with its Python workers (the step then ends too). Whether it ran to
    its end."""
    done = threading.Event()
    ok = [False]

    def run() -> None:
        try:
            action()
            ok[0] = True
        except BaseException:
            log.debug("%s after an interrupt failed", what, exc_info=True)
        finally:
            done.set()

    threading.Thread(target=run, name=f"txsink-{what}", daemon=True).start()
    try:
        finished = done.wait(bound_s)
    except KeyboardInterrupt:  # a second signal: no more waiting
        finished = done.is_set()
    if not finished:
        if out is not None:
            out(f"{what} took over {bound_s:.0f}s (a batch still running): stopping Spark's "
                "JVM; the next `txsink run` rolls back or finishes the epoch in flight")
        _kill_driver_jvm(spark)
        done.wait(2.0)
    return ok[0]


def _kill_driver_jvm(spark: SparkSession | None) -> None:
    from txsink.procfs import descendants

    proc = getattr(getattr(getattr(spark, "sparkContext", None), "_gateway", None), "proc",
                   None) if spark is not None else None
    if proc is None:
        return
    for pid in [proc.pid, *descendants(proc.pid)]:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def quietly(action: Callable[[], object], *, interrupted: bool) -> bool:
    """Run a cleanup step; after an interrupt, Spark may already be gone: say nothing.
    Whether the step succeeded."""
    try:
        action()
    except (Exception, KeyboardInterrupt):
        if not interrupted:
            raise
        log.debug("cleanup after interrupt failed", exc_info=True)
        return False
    return True
