"""Ctrl-C and SIGTERM stop the test run within seconds and leave nothing behind.

The suite starts servers (PostgreSQL, SeaweedFS, Kafka, Spark standalone daemons,
Spark Connect) and Spark drivers, most of them in their own session so that a fault
can kill a whole driver group; a signal to pytest alone never reaches them, and
PySpark replaces pytest's SIGINT handler in any process that creates a SparkContext.
This plugin, loaded by ``tests/conftest.py``, makes the run's end bounded:

* every process the run starts inherits a marker in its environment
  (``TXSINK_TEST_RUN=<token>``, whatever its session or parent; with ``-n`` the
  workers too, the controller sets it before it starts them), so at the end, and
  on a signal, the run finds all of them in ``/proc`` and stops them: SIGTERM, then
  SIGKILL after :data:`GRACE_S`;
* every temporary file of the run, the servers' and Spark's included (``TMPDIR``,
  ``tempfile.tempdir`` and ``SPARK_LOCAL_DIRS`` point there), lives in one directory,
  ``txsink-run-*`` in the temporary directory the run was given, removed at the end;
* SIGTERM raises :class:`KeyboardInterrupt` like SIGINT, so pytest stops, reports and
  tears its fixtures down; SIGINT is pytest's again after every test phase (PySpark's
  handler is dropped); if the teardown is still running after :data:`TEARDOWN_S`, or a
  second signal comes, the run stops every process at once, removes its directory
  and exits (130 for SIGINT, 143 for SIGTERM).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Generator
from pathlib import Path
from types import FrameType

import pytest

#: The environment variable every process of one test run carries.
MARKER = "TXSINK_TEST_RUN"
#: Seconds the fixtures get to tear down after a signal before everything is killed.
TEARDOWN_S = 4.0
#: Seconds between SIGTERM and SIGKILL for the processes left at the end.
GRACE_S = 2.0

_token: str | None = None
_root: Path | None = None
_signalled: int | None = None
_lock = threading.Lock()


def marked_processes(token: str, root: Path | None = None, *, variable: str = MARKER
                     ) -> list[int]:
    """Pids of the live processes (zombies excluded) of one run: those whose environment
    carries ``variable=token``, or whose command line or working directory is under
    ``root`` (PostgreSQL overwrites its environment with its process title), and every
    descendant of those."""
    needle = f"{variable}={token}".encode()
    under = str(root).encode() if root is not None else None
    found: set[int] = set()
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if fields[0] in (b"Z", b"X"):
                continue
            parents[pid] = int(fields[2])
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.add(pid)
                    continue
            if under is not None:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if under in f.read():
                        found.add(pid)
                        continue
                if os.readlink(f"/proc/{entry}/cwd").encode().startswith(under):
                    found.add(pid)
        except (OSError, IndexError, ValueError):
            continue
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in found and pid not in found:
                found.add(pid)
                grew = True
    return sorted(found)


def stop_marked(token: str, root: Path | None, grace_s: float = GRACE_S) -> list[int]:
    """SIGTERM every process of the run (:func:`marked_processes`; SIGCONT too, for
    paused ones), SIGKILL what is left after ``grace_s``; return the pids killed."""
    pids = marked_processes(token, root)
    for pid in pids:
        for sig in (signal.SIGTERM, signal.SIGCONT):
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
    deadline = time.monotonic() + grace_s
    while pids and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = marked_processes(token, root)
    killed = []
    # New processes may still be forked by dying parents: sweep until none is left.
    for _ in range(20):
        pids = marked_processes(token, root)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        time.sleep(0.05)
    return killed


def _command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:200]


def _hard_stop(signum: int) -> None:
    """Everything of this run dies now; the directory goes; the process exits."""
    with _lock:
        if _token is not None:
            stop_marked(_token, _root, grace_s=1.0)
        if _root is not None:
            shutil.rmtree(_root, ignore_errors=True)
        sys.stdout.flush()
        sys.stderr.write(f"\ntxsink tests: {signal.Signals(signum).name}: stopped every "
                         f"process of the run and removed {_root}\n")
        sys.stderr.flush()
        os._exit(128 + signum)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    global _signalled
    if _signalled is not None:
        _hard_stop(signum)
    _signalled = signum
    timer = threading.Timer(TEARDOWN_S, _hard_stop, args=(signum,))
    timer.daemon = True
    timer.start()
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _install() -> None:
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(sig) is not _on_signal:
                signal.signal(sig, _on_signal)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    global _token, _root
    if _token is not None or hasattr(config, "workerinput"):
        return
    # pytest's own base temporary directory stays where it was (kept for a look after
    # a failure); everything else goes under the run's directory.
    factory = getattr(config, "_tmp_path_factory", None)
    if factory is not None:
        factory.getbasetemp()
    _token = uuid.uuid4().hex
    _root = Path(tempfile.mkdtemp(prefix="txsink-run-"))
    # Servers run as a service user when the tests run as root: they must get through.
    _root.chmod(0o711)
    os.environ[MARKER] = _token
    os.environ["TMPDIR"] = str(_root)
    os.environ["SPARK_LOCAL_DIRS"] = str(_root)
    tempfile.tempdir = str(_root)
    _install()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    try:
        return (yield)
    finally:
        _install()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    try:
        return (yield)
    finally:
        _install()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None
                            ) -> Generator[None, None, None]:
    try:
        return (yield)
    finally:
        _install()


def pytest_unconfigure(config: pytest.Config) -> None:
    global _token, _root
    if _token is None:
        return
    with _lock:
        left = {pid: _command(pid) for pid in marked_processes(_token, _root)}
        killed = stop_marked(_token, _root)
        if killed:
            sys.stderr.write(f"txsink tests: killed {len(killed)} process(es) the run had "
                             "left:\n" + "".join(f"  {pid}: {left.get(pid) or _command(pid)}\n"
                                                  for pid in killed))
        if _root is not None:
            shutil.rmtree(_root, ignore_errors=True)
        _token = _root = None
