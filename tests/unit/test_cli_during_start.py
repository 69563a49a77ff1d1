"""A ``txsink run`` holds its checkpoint from its ownership check on, while Spark starts.

Before: the check gave the lease back and the query took it only once its first batch
ran, so for the whole Spark start (12-60 s on 2 cores) ``txsink status`` said no query
writes the sink, and ``txsink reset --yes`` deleted the output and the checkpoint of a
run that had already printed "resuming ... at epoch 5". Spark's start is stood in for
here by a ``build_session`` that runs the other commands and then fails: no JVM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from txsink.cli import main
from txsink.config import load_pipeline
from txsink.plugins import get_plugins
from txsink.spark import _proc, pipeline
from txsink.spark.ownership import check_ownership
from txsink.state import DirectoryStateStore

from tests.unit.test_cli_first_hour import SINK, _earlier_run, _pipeline

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")

EPOCHS = 5


def _stopped_at_epoch_5(tmp_path: Path) -> Path:
    """What five committed micro-batches leave: output, txsink state, Spark's logs."""
    _earlier_run(tmp_path, epochs=EPOCHS)
    for sub in ("offsets", "commits"):
        (tmp_path / "chk" / sub).mkdir(parents=True)
        for batch in range(EPOCHS):
            (tmp_path / "chk" / sub / str(batch)).write_text("v1\n")
    return _pipeline(tmp_path)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _output(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "out").glob("part-*"))


@pytest.mark.promise("resolve-refused-while-running", "cli")
@pytest.mark.promise("cli-refuses-while-run-starts", "cli")
def test_while_spark_starts_the_run_holds_the_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    f = _stopped_at_epoch_5(tmp_path)
    written = _output(tmp_path)
    assert len(written) == EPOCHS
    seen: dict[str, Any] = {}

    def spark_starting(cfg: Any) -> Any:
        seen["owner in the query's environment"] = os.environ.get(_proc.OWNER_ENV)
        seen["status"] = _cli(capsys, "status", str(f))
        seen["reset"] = _cli(capsys, "reset", str(f), "--yes")
        seen["resolve"] = _cli(capsys, "resolve", str(tmp_path / "chk"), "--epoch", "4",
                               "--commit")
        # Another process (without the owner this run hands its own query).
        seen["second run"] = subprocess.run(
            [sys.executable, "-m", "txsink.cli", "run", str(f)], capture_output=True,
            text=True, timeout=120, check=False,
            env={k: v for k, v in os.environ.items() if k != _proc.OWNER_ENV})
        raise RuntimeError("Spark did not start (a unit test)")

    monkeypatch.setattr(pipeline, "build_session", spark_starting)
    monkeypatch.delenv(_proc.OWNER_ENV, raising=False)
    said: list[str] = []
    with pytest.raises(RuntimeError, match="did not start"):
        pipeline.run_pipeline(load_pipeline(f), out=said.append,
                              log_path=tmp_path / "spark.log")
    assert any(line.startswith(f"resuming sink {SINK!r} at epoch {EPOCHS} ") for line in said), said
    me = f"`txsink run` pid {os.getpid()} on this host"
    token = seen["owner in the query's environment"]
    assert token == _proc.command_owner_token("run")  # the query takes the run's lease

    code, out, _ = seen["status"]
    lease = next(ln for ln in out.splitlines() if ln.startswith("lease: "))
    assert "lease: held since " in lease and (
        f"by {me}, which is starting Spark or running its query ({token}, generation"
        in lease), lease
    code, out, err = seen["reset"]
    assert code == 1 and out == "", out
    assert (f"is being written by {me} (starting Spark, or running its query) (lease owner "
            f"{token}); stop it first; nothing deleted") in err, err
    assert _output(tmp_path) == written  # nothing deleted
    assert (tmp_path / "chk" / "txsink" / "meta.json").is_file()
    assert (tmp_path / "chk" / "offsets" / "4").is_file()
    code, _, err = seen["resolve"]
    assert code == 1
    assert f"is held by {me}, starting Spark, or running its query" in err, err
    run = seen["second run"]
    assert run.returncode == 1
    assert (f"checkpoint {tmp_path / 'chk'} is in use by another run: sink {SINK!r} is being "
            f"written by {me} (starting Spark, or running its query)") in run.stderr, run.stderr
    # The run ended (Spark did not start): the lease is given back, the checkpoint kept.
    code, out, _ = _cli(capsys, "status", str(f))
    assert "lease: released at " in out, out
    assert os.environ.get(_proc.OWNER_ENV) is None  # put back as it was


CRASHING_START = """
import sys, time
from pathlib import Path
from txsink.config import load_pipeline
from txsink.spark import pipeline

def spark_starting(cfg):
    print("starting", flush=True)
    time.sleep(600)

pipeline.build_session = spark_starting
pipeline.run_pipeline(load_pipeline(sys.argv[1]), log_path=Path(sys.argv[2]))
"""


def test_a_run_killed_while_spark_starts_leaves_a_mark_that_reads_as_ended(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SIGKILL during the start (no release): status says that run ended, and both ways
    on work without --force: the next run takes the checkpoint over, reset deletes."""
    f = _stopped_at_epoch_5(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != _proc.OWNER_ENV}
    proc = subprocess.Popen([sys.executable, "-c", CRASHING_START, str(f),
                             str(tmp_path / "spark.log")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        while proc.stdout.readline().strip() != "starting":  # Spark "starts" now
            assert proc.poll() is None, proc.communicate()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    store = DirectoryStateStore(tmp_path / "chk" / "txsink")
    lease = store.lease_info()
    assert lease["owner"].startswith(f"{os.uname().nodename}:run:{proc.pid}:")
    assert lease.get("released_at") is None
    assert _proc.owner_alive(lease["owner"]) is False
    code, out, _ = _cli(capsys, "status", str(f))
    line = next(ln for ln in out.splitlines() if ln.startswith("lease: "))
    assert (f"by `txsink run` pid {proc.pid} on this host, which ended ({lease['owner']}, "
            "generation") in line, line
    assert "the next run, reset or resolve takes it over" in line
    # The next run: its ownership check takes the checkpoint over.
    mine = _proc.command_owner_token("run")
    taken = check_ownership(load_pipeline(f), get_plugins(), store, str(f), hold_as=mine)
    assert taken is not None and store.lease_info()["owner"] == mine
    assert store.release(taken)
    # Or reset, as the docs say, without --force.
    code, out, err = _cli(capsys, "reset", str(f), "--yes")
    assert code == 0, err
    assert not _output(tmp_path) and not (tmp_path / "chk").exists()


def test_a_run_starting_while_reset_deletes_is_refused(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """Reset holds the lease while it deletes: a run starting then is refused, naming
    it, and resumes nothing of a checkpoint that is going away."""
    from txsink.errors import ConfigError

    f = _stopped_at_epoch_5(tmp_path)
    store = DirectoryStateStore(tmp_path / "chk" / "txsink")
    # What `txsink reset` holds while it deletes (a live process: this one stands in).
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        from txsink import procfs

        info = procfs.stat(sleeper.pid)
        assert info is not None
        resetting = f"{os.uname().nodename}:reset:{sleeper.pid}:{info[2]}"
        store.acquire(resetting)
        with pytest.raises(ConfigError, match=rf"in use by another run: sink {SINK!r} is being "
                           rf"written by `txsink reset` pid {sleeper.pid} on this host, which "
                           "is deleting this pipeline's output and checkpoint"):
            check_ownership(load_pipeline(f), get_plugins(), store, str(f),
                            hold_as=_proc.command_owner_token("run"))
        _code, out, _ = _cli(capsys, "status", str(f))
        assert (f"by `txsink reset` pid {sleeper.pid} on this host, which is deleting this "
                "pipeline's output and checkpoint") in out, out
    finally:
        sleeper.kill()
        sleeper.wait()


def test_reset_holds_the_checkpoint_while_it_deletes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A run whose ownership check comes while `txsink reset` deletes the output is
    refused, naming the reset: it resumes nothing of a checkpoint that is going away."""
    from txsink.errors import ConfigError
    from txsink.files.backend import FilesBackend

    f = _stopped_at_epoch_5(tmp_path)
    store = DirectoryStateStore(tmp_path / "chk" / "txsink")
    deleting = FilesBackend.reset_sink
    seen: dict[str, Any] = {}

    def reset_sink(self: FilesBackend, sink_id: str) -> list[str]:
        seen["lease"] = dict(store.lease_info())
        try:  # a `txsink run` starting right now
            check_ownership(load_pipeline(f), get_plugins(), store, str(f),
                            hold_as=f"{os.uname().nodename}:run:1:1")
        except ConfigError as exc:
            seen["run"] = str(exc)
        return deleting(self, sink_id)

    monkeypatch.setattr(FilesBackend, "reset_sink", reset_sink)
    code, _, err = _cli(capsys, "reset", str(f), "--yes")
    assert code == 0, err
    assert seen["lease"]["owner"] == _proc.command_owner_token("reset")
    assert (f"is being written by `txsink reset` pid {os.getpid()} on this host, which is "
            "deleting this pipeline's output and checkpoint") in seen["run"], seen["run"]
    assert not _output(tmp_path) and not (tmp_path / "chk").exists()


def test_reset_looks_at_the_holder_again_after_its_question(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A run started while `txsink reset` waited for its answer is refused by the reset,
    which deletes nothing (before: it was looked at once, before the question)."""
    import builtins

    f = _stopped_at_epoch_5(tmp_path)
    written = _output(tmp_path)
    store = DirectoryStateStore(tmp_path / "chk" / "txsink")
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        from txsink import procfs

        info = procfs.stat(sleeper.pid)
        assert info is not None
        run = f"{os.uname().nodename}:run:{sleeper.pid}:{info[2]}"

        def answer(prompt: str) -> str:
            store.acquire(run)  # a `txsink run` starts while the operator types
            return SINK

        monkeypatch.setattr(builtins, "input", answer)
        monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
        code, _, err = _cli(capsys, "reset", str(f))
        assert code == 1
        assert (f"is being written by `txsink run` pid {sleeper.pid} on this host (starting "
                "Spark, or running its query)") in err, err
        assert _output(tmp_path) == written
        assert (tmp_path / "chk" / "txsink" / "meta.json").is_file()
        assert store.lease_info()["owner"] == run  # the run keeps its lease
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_reset_that_stops_half_way_gives_the_lease_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A target that cannot delete its output refuses after the reset took the lease:
    the lease is released (status does not read it as a crashed holder), and the next
    run goes on."""
    from txsink.files.backend import FilesBackend

    f = _stopped_at_epoch_5(tmp_path)
    written = _output(tmp_path)

    def cannot(self: FilesBackend, sink_id: str) -> list[str]:
        raise NotImplementedError("this target keeps its output")

    monkeypatch.setattr(FilesBackend, "reset_sink", cannot)
    code, _, err = _cli(capsys, "reset", str(f), "--yes")
    assert code == 1 and "this target keeps its output; nothing deleted" in err, err
    assert _output(tmp_path) == written
    lease = DirectoryStateStore(tmp_path / "chk" / "txsink").lease_info()
    assert lease["owner"] == _proc.command_owner_token("reset")
    assert lease.get("released_at") is not None
    code, out, _ = _cli(capsys, "status", str(f))
    assert "lease: released at " in out, out
    store = DirectoryStateStore(tmp_path / "chk" / "txsink")
    taken = check_ownership(load_pipeline(f), get_plugins(), store, str(f),
                            hold_as=f"{os.uname().nodename}:run:1:1")
    assert taken is not None


def test_a_reset_that_takes_the_lease_between_a_runs_look_and_take_stops_the_run(
        tmp_path: Path) -> None:
    """The narrow race: the run looked (free), a reset took the lease, the run took it
    over from the reset. The run sees whom it took it from and stops, starting nothing."""
    from txsink import procfs
    from txsink.errors import ConfigError

    f = _stopped_at_epoch_5(tmp_path)
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        info = procfs.stat(sleeper.pid)
        assert info is not None
        resetting = f"{os.uname().nodename}:reset:{sleeper.pid}:{info[2]}"

        class Racing(DirectoryStateStore):
            looks = 0

            def lease_info(self) -> dict[str, Any]:
                seen = super().lease_info()
                Racing.looks += 1
                if Racing.looks == 1:  # right after the run's look
                    DirectoryStateStore(self.root).acquire(resetting)
                return seen

        store = Racing(tmp_path / "chk" / "txsink")
        run = f"{os.uname().nodename}:run:1:1"
        with pytest.raises(ConfigError, match=rf"`txsink reset` pid {sleeper.pid} on this "
                           "host is deleting this pipeline's output and checkpoint; nothing "
                           "was started"):
            check_ownership(load_pipeline(f), get_plugins(), store, str(f), hold_as=run)
        lease = DirectoryStateStore(tmp_path / "chk" / "txsink").lease_info()
        assert lease["owner"] == run and lease.get("released_at") is not None
    finally:
        sleeper.kill()
        sleeper.wait()
