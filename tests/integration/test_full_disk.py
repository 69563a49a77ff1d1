"""A full or read-only disk never leaves a truncated decision or an empty marker behind.

The state directory (and the files backend's directory) sit on a small tmpfs that
is filled up, so ``os.write`` really writes less than asked and then fails with
ENOSPC. The decision must fail whole with an error naming the path, nothing may be
committed, no temp file may stay, and once space is freed the sink carries on and
holds every row once. Needs permission to mount a tmpfs (root in a container);
without it the tmpfs tests are skipped and the injected short write still runs.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from txsink.coordinator import Coordinator, EpochOutcome
from txsink.errors import ConfigError, StateError
from txsink.files.backend import FilesBackend
from txsink.model import Committable, TransactionContext
from txsink.plugins import build_plugins
from txsink.state import DirectoryStateStore, EpochRecord, EpochState
from txsink.writer import write_participant

pytestmark = [pytest.mark.integration, pytest.mark.fault]

PAGE = 4096
SINK = "disk-sink"


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}); "
                    "the injected short-write test covers the same path")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(mount: Path, leave: int) -> Path:
    """Fill ``mount`` until only ``leave`` bytes (a multiple of a page) are free."""
    filler = mount / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        with contextlib.suppress(OSError):
            while os.write(fd, b"\0" * PAGE) > 0:
                pass
    finally:
        os.close(fd)
    free = os.statvfs(mount).f_bavail * os.statvfs(mount).f_frsize
    assert free == 0
    if leave:
        os.truncate(filler, filler.stat().st_size - leave)
    return filler


def prepare(backend: FilesBackend, epoch: int, partition: int) -> Committable:
    ids = range((epoch * 100 + partition) * 10, (epoch * 100 + partition) * 10 + 10)
    return write_participant(backend, TransactionContext(SINK, epoch, partition, 0),
                             [pa.record_batch({"id": pa.array(ids, pa.int64())})])


def output_ids(backend: FilesBackend) -> list[int]:
    import pyarrow.parquet as pq

    return sorted(i for f in backend.base.glob("part-*")
                  for i in pq.read_table(f).column("id").to_pylist())


@pytest.mark.promise("state-write-full-disk", "backend")
def test_decision_on_a_full_state_disk_fails_whole_and_commits_nothing(
    tmpfs: Path, tmp_path: Path
) -> None:
    backend = FilesBackend(str(tmp_path / "out"))
    backend.preflight(SINK)
    state = tmpfs / "state"
    coord = Coordinator(backend, DirectoryStateStore(state), SINK, plugins=build_plugins())
    coord.start()
    assert coord.commit_epoch(0, [prepare(backend, 0, 0)]) is EpochOutcome.COMMITTED
    # The decision of 16 participants is several pages of JSON; one page is free.
    filler = fill(tmpfs, leave=PAGE)
    messages = [prepare(backend, 1, p) for p in range(16)]
    with pytest.raises(StateError, match=str(state / "epochs")) as info:
        coord.commit_epoch(1, messages)
    assert "No space left" in str(info.value)
    assert coord.store.get(1) is None  # no truncated record in place
    assert not list(state.rglob(".*.tmp-*"))  # and no temp file eating the space
    assert output_ids(backend) == list(range(10))  # nothing of epoch 1 committed

    # Space comes back: the next run finds the epoch undecided, aborts its
    # participants as orphans, Spark replays it and it commits once.
    filler.unlink()
    again = Coordinator(backend, DirectoryStateStore(state), SINK, plugins=build_plugins())
    report = again.start()
    assert len(report.aborted_orphans) == 16
    assert again.commit_epoch(1, [prepare(backend, 1, p) for p in range(16)]) is \
        EpochOutcome.COMMITTED
    assert output_ids(backend) == sorted(
        [*range(10), *(i for p in range(16) for i in range((100 + p) * 10, (100 + p) * 10 + 10))])
    assert backend.leftovers() == []


def test_sink_markers_on_a_full_disk_are_never_left_empty(tmpfs: Path) -> None:
    filler = fill(tmpfs, leave=0)
    backend = FilesBackend(str(tmpfs / "out"))
    with pytest.raises(ConfigError, match="No space left"):
        backend.preflight(SINK)  # creates nothing: the claim is claim_sink's
    with pytest.raises(StateError, match=r"sink\.json"):
        backend.claim_sink(SINK, "state-1", "/state")
    assert not (tmpfs / "out" / "_txsink" / "sink.json").exists()
    assert not list((tmpfs / "out").rglob(".*.tmp-*"))
    filler.unlink()
    backend.preflight(SINK)  # not wedged
    backend.claim_sink(SINK, "state-1", "/state")
    assert (tmpfs / "out" / "_txsink" / "state.json").stat().st_size > 0


def test_a_short_write_never_renames_a_truncated_record_into_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = DirectoryStateStore(tmp_path / "state")
    lease = store.acquire("me")
    real_write = os.write
    calls: list[int] = []

    def short_then_full(fd: int, data: bytes | memoryview) -> int:
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[:10]))  # a short write, as on a full disk
        raise OSError(28, "No space left on device")

    c = Committable("files", SINK, 3, 0, 0, f"{SINK}-e3-p0-a0", {"final": "x"}, rows=1)
    record = EpochRecord(3, EpochState.DECIDED, (c,), 1.0)
    monkeypatch.setattr(os, "write", short_then_full)
    with pytest.raises(StateError, match="No space left"):
        store.put(lease, record)
    monkeypatch.undo()
    assert len(calls) == 2
    assert store.get(3) is None
    assert not list((tmp_path / "state").rglob(".*.tmp-*"))
    store.put(lease, record)
    assert store.get(3) == record


@pytest.mark.promise("state-write-full-disk", "backend")
def test_read_only_state_directory_is_a_clear_error(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / f"ro-{uuid.uuid4().hex[:6]}"
    real_open = os.open

    def read_only(path: object, flags: int, *args: object) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(30, "Read-only file system", str(path))
        return real_open(path, flags, *args)  # type: ignore[arg-type]

    store = DirectoryStateStore(state)
    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(StateError, match=f"{state}.*Read-only file system"):
        store.acquire("me")
