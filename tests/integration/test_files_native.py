"""The files backend's native data path: Spark's writer's files staged, recorded with
their names and sizes, published by link at commit.

The backend's steps directly (staging layout, the checks before publishing, replayed
and half-done commits, abort and the orphan scan), then the whole path
(``TargetSet.write_epoch`` with :mod:`tests.integration.files_native_driver`'s stand-in
for Spark's writer) with the driver SIGKILLed at every protocol step: the restarted run
leaves exact rows (count and checksum) and no staging leftovers.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from txsink.backend import CommitOutcome
from txsink.errors import FatalCommitError, ParticipantLostError
from txsink.files.backend import FilesBackend
from txsink.model import TransactionContext

from tests.integration.files_native_driver import ROWS, TASKS, FakeFrame, rows_of
from tests.long_runs import long_run

ROOT = Path(__file__).resolve().parents[2]
SINK = "native-files"


def stage(backend: FilesBackend, epoch: int, version: int, attempt: int = 1
          ) -> tuple[TransactionContext, str]:
    """What Spark's writer leaves in a fresh staging directory."""
    ctx = TransactionContext(SINK, epoch, 0, attempt)
    path, dirname = backend.native_staging(ctx)
    FakeFrame(rows_of(version)).write.mode("errorifexists").parquet(path)
    return ctx, dirname


def read(path: Path) -> tuple[int, str]:
    """Rows readers see (count, checksum); every value is its id times 7."""
    table = ds.dataset(str(path), format="parquet").to_table()  # skips _txsink
    ids = table.column("id").to_pylist()
    assert table.column("value").to_pylist() == [i * 7 for i in ids]
    return len(ids), hashlib.sha256(repr(sorted(ids)).encode()).hexdigest()


def expected(versions: int) -> tuple[int, str]:
    ids = list(range(versions * ROWS))
    return len(ids), hashlib.sha256(repr(ids).encode()).hexdigest()


@pytest.fixture
def backend(tmp_path: Path) -> FilesBackend:
    b = FilesBackend(str(tmp_path / "out"))
    b.preflight(SINK)
    b.claim_sink(SINK, "state-of-the-test", str(tmp_path / "state"))  # as a coordinator does
    return b


def test_prepare_records_each_staged_file_and_commit_publishes_whole_epochs(
        backend: FilesBackend) -> None:
    ctx, dirname = stage(backend, 0, 0)
    c = backend.committable_for_directory(ctx, dirname)
    assert backend.is_committed(c) is False
    files = c.payload["files"]
    # The empty file Spark writes for a task without rows is not published.
    assert len(files) == TASKS - 1 and c.rows == ROWS
    assert [f["final"] for f in files] == [f"part-0000000000-{n:05d}.parquet"
                                           for n in range(TASKS - 1)]
    assert all(f["size"] == (backend._staging / dirname / f["name"]).stat().st_size
               for f in files)
    assert not list(backend.base.glob("part-*"))  # staged: nobody reads it yet
    assert backend.commit_all([c]) == [CommitOutcome.COMMITTED]
    assert read(backend.base) == (ROWS, expected(1)[1])
    assert backend.leftovers() == [] and backend.holds_epoch(SINK, 0)
    assert backend.is_committed(c) is True
    # A replayed commit (recovery) publishes nothing twice.
    assert backend.commit_all([c]) == [CommitOutcome.ALREADY_COMMITTED]
    assert read(backend.base)[0] == ROWS


@pytest.mark.promise("native-commit-whole-never-twice", "native")
def test_a_commit_stopped_mid_renames_is_finished_by_the_next(backend: FilesBackend) -> None:
    ctx, dirname = stage(backend, 3, 0)
    c = backend.committable_for_directory(ctx, dirname)
    first = c.payload["files"][0]
    os.link(backend._staging / dirname / first["name"], backend.base / first["final"])
    # One file of three is out (a commit only runs after the decision): held, and
    # whether the participant is committed is neither yes nor no (a forced resolve then
    # says its rows' visibility is unknown, not that they were dropped).
    assert backend.holds_epoch(SINK, 3)
    assert backend.is_committed(c) is None
    assert backend.commit_all([c]) == [CommitOutcome.COMMITTED]
    assert read(backend.base)[0] == ROWS
    assert backend.leftovers() == []
    # Crash after every link and unlink (the marker came before them), before the
    # staging directory went.
    ctx2, dir2 = stage(backend, 4, 1)
    c2 = backend.committable_for_directory(ctx2, dir2)
    for f in c2.payload["files"]:
        os.link(backend._staging / dir2 / f["name"], backend.base / f["final"])
        os.unlink(backend._staging / dir2 / f["name"])
    assert backend._mark_epochs({4})
    assert backend.commit_all([c2]) == [CommitOutcome.ALREADY_COMMITTED]
    assert backend.leftovers() == [] and read(backend.base)[0] == 2 * ROWS


@pytest.mark.promise("native-commit-whole-never-twice", "native")
@pytest.mark.promise("vanished-participant-stops", "native")
def test_a_changed_or_missing_staged_file_publishes_nothing(backend: FilesBackend) -> None:
    ctx, dirname = stage(backend, 0, 0)
    c = backend.committable_for_directory(ctx, dirname)
    last = backend._staging / dirname / c.payload["files"][-1]["name"]
    with open(last, "ab") as f:
        f.write(b"torn")
    result = backend.commit_all([c])[0]
    assert isinstance(result, ParticipantLostError) and "was changed" in str(result)
    assert not list(backend.base.glob("part-*"))  # checked before the first link
    last.unlink()
    result = backend.commit_all([c])[0]
    assert isinstance(result, ParticipantLostError) and "is gone" in str(result)
    assert not list(backend.base.glob("part-*"))


@pytest.mark.promise("native-commit-whole-never-twice", "native")
def test_a_final_name_holding_other_content_is_never_overwritten(
        backend: FilesBackend) -> None:
    ctx, dirname = stage(backend, 0, 0)
    c = backend.committable_for_directory(ctx, dirname)
    (backend.base / c.payload["files"][1]["final"]).write_bytes(b"someone else's")
    result = backend.commit_all([c])[0]
    assert isinstance(result, FatalCommitError)
    assert sorted(p.name for p in backend.base.glob("part-*")) == [
        c.payload["files"][1]["final"]]


@pytest.mark.promise("orphans-aborted", "native")
def test_abort_and_orphan_scan_delete_staging_and_leave_other_epochs(
        backend: FilesBackend) -> None:
    ctx0, dir0 = stage(backend, 0, 0)
    c0 = backend.committable_for_directory(ctx0, dir0)
    _, dir1 = stage(backend, 1, 1)  # never recorded: a driver died before prepare
    ctx2, dir2 = stage(backend, 2, 2)
    c2 = backend.committable_for_directory(ctx2, dir2)
    # The second epoch's commit touches its own staging directory only.
    assert backend.commit_all([c2]) == [CommitOutcome.COMMITTED]
    assert sorted(p.name for p in backend._staging.iterdir()) == [dir0, dir1]
    listed = {c.participant: c for c in backend.list_prepared(SINK)}
    assert set(listed) == {ctx0.participant, f"{SINK}-e1-p0-a1"}
    assert listed[ctx0.participant].payload["files"] == c0.payload["files"]
    aborted = backend.abort_orphans(SINK, {ctx0.participant}, up_to_epoch=None)
    assert [c.participant for c in aborted] == [f"{SINK}-e1-p0-a1"]
    backend.abort(c0)
    assert backend.leftovers() == [] and read(backend.base)[0] == ROWS
    assert not backend.holds_epoch(SINK, 0) and backend.holds_epoch(SINK, 2)


def test_format_jsonl_keeps_txsinks_writer() -> None:
    assert FilesBackend.native_parquet_for({"path": "/x"})
    assert not FilesBackend.native_parquet_for({"path": "/x", "format": "jsonl"})


# -- the whole path, the driver killed at every step ----------------------------------------

EPOCHS = 3


def run(spec: dict[str, object], faults: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXSINK_FAULTS")}
    if faults:
        env["TXSINK_FAULTS"] = faults
    return subprocess.run([sys.executable, "-m", "tests.integration.files_native_driver",
                           json.dumps(spec)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def staging_leftovers(out: Path) -> list[str]:
    return [p.name for d in ("staging", "pending", "inprogress")
            if (out / "_txsink" / d).is_dir() for p in (out / "_txsink" / d).iterdir()]


NATIVE_STEPS = ["native-before-record", "before-decide", "after-decide",
                "native-mid-publish", "after-mark-committed"]


@pytest.mark.promise("decided-epoch-recommitted", "native")
@pytest.mark.promise("undecided-rolled-back", "native")
@pytest.mark.fault
def test_driver_killed_at_every_native_step_in_turn_then_exact(tmp_path: Path) -> None:
    """One run per step, each killed at its step in the next epoch, so each recovery
    also starts from the previous crash (the default run's cover of every step: six
    Python processes); then a clean run. Staged files of dead runs never show."""
    out = tmp_path / "out"
    spec = {"path": str(out), "state": str(tmp_path / "state"), "sink_id": SINK,
            "epochs": len(NATIVE_STEPS) + 1}
    for epoch, point in enumerate(NATIVE_STEPS):
        killed = run(spec, f"{point}@{epoch}:kill")
        assert killed.returncode == -9, (point, killed.stdout + killed.stderr)
        # Readers see whole epochs (but a commit killed mid-publish: part of its epoch).
        if point != "native-mid-publish" and any(out.glob("part-*")):
            assert read(out)[0] % ROWS == 0
    done = run(spec)
    assert done.returncode == 0 and "TXSINK-NATIVE-DONE" in done.stdout, done.stderr
    assert read(out) == expected(len(NATIVE_STEPS) + 1)
    assert staging_leftovers(out) == []


@long_run
@pytest.mark.fault
@pytest.mark.parametrize("group", [False, True], ids=["single", "group"])
@pytest.mark.parametrize("point", NATIVE_STEPS)
def test_driver_killed_at_each_native_step_then_exact(tmp_path: Path, point: str,
                                                      group: bool) -> None:
    out = tmp_path / "out"
    spec = {"path": str(out), "state": str(tmp_path / "state"), "sink_id": SINK,
            "epochs": EPOCHS, "group": group}
    killed = run(spec, f"{point}@1:kill")
    assert killed.returncode == -9, killed.stdout + killed.stderr
    done = run(spec)
    assert done.returncode == 0 and "TXSINK-NATIVE-DONE" in done.stdout, done.stderr
    assert read(out) == expected(EPOCHS)
    assert staging_leftovers(out) == []
    if group:
        assert read(Path(str(out) + "-copy")) == expected(EPOCHS)
        assert staging_leftovers(Path(str(out) + "-copy")) == []


# -- attacks ---------------------------------------------------------------------------------


def start(spec: dict[str, object], env_extra: dict[str, str]) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXSINK_FAULTS")}
    env.update(env_extra)
    return subprocess.Popen([sys.executable, "-m", "tests.integration.files_native_driver",
                             json.dumps(spec)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_a_reader_during_a_commit_takes_whole_epochs_up_to_the_cut(tmp_path: Path) -> None:
    """The commit of epoch 1 stopped after its first link: a listing sees part of the
    epoch (the documented reader contract), and the cut, read meanwhile, stops below it,
    so a reader that takes epochs up to the cut gets whole epochs only."""
    from txsink.cut import consistent_cut
    from txsink.state import DirectoryStateStore

    out, pause = tmp_path / "out", tmp_path / "pause"
    pause.mkdir()
    spec = {"path": str(out), "state": str(tmp_path / "state"), "sink_id": SINK,
            "epochs": EPOCHS}
    proc = start(spec, {"TXSINK_FAULTS": "native-mid-publish@1:pause",
                        "TXSINK_FAULTS_PAUSE_DIR": str(pause)})
    try:
        import time

        deadline = time.monotonic() + 120
        while not (pause / "paused").exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the driver never reached the pause"
            time.sleep(0.05)
        epoch_of = {p.name: int(p.name[5:15]) for p in out.glob("part-*.parquet")}
        assert sorted(set(epoch_of.values())) == [0, 1]
        assert sum(1 for e in epoch_of.values() if e == 1) == 1  # one of three linked
        cut = consistent_cut(FilesBackend(str(out)), DirectoryStateStore(tmp_path / "state"),
                             SINK)
        assert cut.cut == 0 and cut.unfinished == (1, "decided")
        whole = ds.dataset([str(out / n) for n, e in epoch_of.items() if e <= cut.cut],
                           format="parquet").to_table()
        assert sorted(whole.column("id").to_pylist()) == list(range(ROWS))
    finally:
        (pause / "release").write_text("")
        stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "TXSINK-NATIVE-DONE" in stdout, stderr
    assert read(out) == expected(EPOCHS) and staging_leftovers(out) == []


@pytest.mark.promise("fenced-run-stops", "native")
@long_run  # 16 s under load
def test_two_drivers_of_one_sink_at_once_then_exact(tmp_path: Path) -> None:
    """Two drivers run the same writes (versions 0..n-1) on one state and target at
    once. Each start takes the lease over from the other, whose next step is refused
    (FencedError), and cleans up the other's unrecorded staged files, whose prepare then
    stops naming that; or a driver finds a version already committed and skips it. Every
    driver that stops says why; a third run finishes the rest, each version once."""
    out = tmp_path / "out"
    spec = {"path": str(out), "state": str(tmp_path / "state"), "sink_id": SINK,
            "epochs": 6}
    procs = [start(spec, {}) for _ in range(2)]
    results = [p.communicate(timeout=240) for p in procs]
    for p, (_, stderr) in zip(procs, results, strict=True):
        if p.returncode != 0:  # loud, and naming why
            assert ("FencedError" in stderr or "another run of this sink took over" in stderr
                    ), stderr[-3000:]
    done = run(spec)
    assert done.returncode == 0, done.stderr
    assert read(out) == expected(6) and staging_leftovers(out) == []
