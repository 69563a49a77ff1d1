"""Who holds a sink's lease, told from real processes: a crashed driver that was not
reaped (a zombie) is gone, a driver on another host is unknown, and neither `txsink
run` nor `txsink reset` may be wrong about it (operations issue, holes 7 and 8)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from txsink.config import load_pipeline
from txsink.errors import ConfigError
from txsink.plugins import get_plugins
from txsink.spark import _proc
from txsink.state import DirectoryStateStore

from tests.unit.test_cli_first_hour import _earlier_run, _pipeline, txsink

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


def _state(pid: int) -> str:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rfind(")") + 2:].split()[0]


@pytest.fixture
def zombie() -> Iterator[int]:
    """A child killed and not waited for: what a SIGKILLed driver is until reaped."""
    proc = subprocess.Popen(["sleep", "300"])
    os.kill(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _state(proc.pid) != "Z":
        assert time.monotonic() < deadline, "the killed child never became a zombie"
        time.sleep(0.01)
    yield proc.pid
    proc.wait()


@pytest.fixture
def running() -> Iterator[int]:
    proc = subprocess.Popen(["sleep", "300"])
    yield proc.pid
    proc.kill()
    proc.wait()


def test_a_zombie_driver_is_gone(zombie: int) -> None:
    token = _proc.jvm_owner_token(zombie)
    assert token is not None
    assert _proc.owner_alive(token) is False
    assert _proc.lease_holder({"owner": token, "generation": 3}) == "gone"


def test_a_running_process_is_running_and_a_reused_pid_is_not(running: int) -> None:
    token = _proc.jvm_owner_token(running)
    assert token is not None
    assert _proc.owner_alive(token) is True
    host, _, rest = token.partition(":jvm")
    pid, _, started = rest.partition(":")
    assert _proc.owner_alive(f"{host}:jvm{pid}:{int(started) + 1}") is False
    # A plain process token with a live pid may name a reused pid: unknown, not alive.
    assert _proc.owner_alive(f"{os.uname().nodename}:{running}:abc123") is None
    assert _proc.lease_holder({"owner": f"other-host-{socket.gethostname()}:jvm1:2"}) == (
        "unknown")
    assert _proc.lease_holder({"owner": token, "released_at": 1.0}) == "free"


@pytest.mark.promise("zombie-driver-taken-over", "cli")
def test_run_takes_over_from_a_zombie_driver(tmp_path: Path, zombie: int) -> None:
    """SIGKILL a `txsink run` and start it again before PID 1 reaps it: the restart
    must not be refused (it was in 8 of 17 crash-loop runs)."""
    from txsink.spark.pipeline import check_ownership

    _earlier_run(tmp_path)
    store = DirectoryStateStore(tmp_path / "chk" / "txsink")
    token = _proc.jvm_owner_token(zombie)
    assert token is not None
    store.acquire(token)
    cfg = load_pipeline(str(_pipeline(tmp_path)))
    check_ownership(cfg, get_plugins(), store, "p.yaml")  # no ConfigError
    assert store.lease_info()["owner"] != token


def test_run_refuses_a_driver_running_on_this_host(tmp_path: Path, running: int) -> None:
    from txsink.spark.pipeline import check_ownership

    _earlier_run(tmp_path)
    store = DirectoryStateStore(tmp_path / "chk" / "txsink")
    token = _proc.jvm_owner_token(running)
    assert token is not None
    store.acquire(token)
    cfg = load_pipeline(str(_pipeline(tmp_path)))
    with pytest.raises(ConfigError, match="is being written by a running query"):
        check_ownership(cfg, get_plugins(), store, "p.yaml")


@pytest.mark.promise("reset-refused-while-running", "cli")
def test_reset_never_deletes_under_a_driver_on_another_host(tmp_path: Path) -> None:
    _earlier_run(tmp_path)
    pipeline = _pipeline(tmp_path)
    DirectoryStateStore(tmp_path / "chk" / "txsink").acquire("elsewhere-7:jvm4242:99")
    proc = txsink("reset", str(pipeline), "--yes")
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "held by elsewhere-7:jvm4242:99" in lines[0]
    assert "cannot be told from this host" in lines[0]
    assert f"txsink reset {pipeline} --force" in lines[0]
    assert len(list((tmp_path / "out").glob("part-*"))) == 2  # nothing deleted
    assert (tmp_path / "chk" / "txsink" / "meta.json").is_file()
    # The documented way on, once the operator knows that query is stopped.
    proc = txsink("reset", str(pipeline), "--yes", "--force")
    assert proc.returncode == 0, proc.stderr
    assert "may still run" in proc.stderr  # said loudly
    assert not list((tmp_path / "out").glob("part-*"))
    assert not (tmp_path / "chk").exists()


@pytest.mark.promise("reset-refused-while-running", "cli")
def test_reset_refuses_a_running_driver_even_with_force(tmp_path: Path, running: int) -> None:
    _earlier_run(tmp_path)
    token = _proc.jvm_owner_token(running)
    assert token is not None
    DirectoryStateStore(tmp_path / "chk" / "txsink").acquire(token)
    proc = txsink("reset", str(_pipeline(tmp_path)), "--yes", "--force")
    assert proc.returncode == 1
    assert "is being written by a running query" in proc.stderr
    assert len(list((tmp_path / "out").glob("part-*"))) == 2


@pytest.mark.promise("zombie-driver-taken-over", "cli")
def test_reset_after_a_zombie_driver(tmp_path: Path, zombie: int) -> None:
    _earlier_run(tmp_path)
    token = _proc.jvm_owner_token(zombie)
    assert token is not None
    DirectoryStateStore(tmp_path / "chk" / "txsink").acquire(token)
    proc = txsink("reset", str(_pipeline(tmp_path)), "--yes")
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "chk").exists()



@pytest.mark.promise("remote-second-run-refused", "cli")
def test_a_remote_client_token_is_running_while_the_client_lives_and_unknown_after(
        zombie: int) -> None:
    """``txsink run --remote`` names its client process in the lease: a second run on
    this host sees it running (and is refused, naming it) instead of fencing a healthy
    query; once the client ended its query may still run on the server: unknown (never
    gone, which would let `txsink reset` delete output under it)."""
    from txsink import procfs
    from txsink.spark.pipeline import remote_owner_token

    token = remote_owner_token()
    host = socket.gethostname()
    assert token.startswith(f"{host}:connect:{os.getpid()}:")
    assert _proc.owner_alive(token) is True
    assert _proc.lease_holder({"owner": token}) == "running"
    info = procfs.stat(zombie)
    assert info is not None
    assert _proc.owner_alive(f"{host}:connect:{zombie}:{info[2]}") is None
    started = procfs.stat(os.getpid())
    assert started is not None
    assert _proc.owner_alive(f"{host}:connect:{os.getpid()}:{started[2] + 1}") is None
    assert _proc.owner_alive(f"{host}:connect:6325feb3960e") is None  # an older token
    assert _proc.owner_alive(f"elsewhere:connect:{os.getpid()}:{started[2]}") is None
