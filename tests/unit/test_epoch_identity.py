"""One epoch number, one set of rows, in every target, forever (core, in-memory targets).

* a write is a replay of another only if the state recorded the same identity for
  the epoch (a stream's query and batch, a batch write's txnAppId, version and driving
  query), never by the number alone: otherwise it is refused, loudly;
* a fresh epoch is above every number ever used, also one a forced resolve gave up;
* the consistent cut never names an epoch that is still being written.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from txsink.cut import consistent_cut
from txsink.faults import AFTER_FIRST_COMMIT, FaultInjector
from txsink.state import DirectoryStateStore, EpochState

from .conftest import Env
from .test_group import GroupEnv

WAIT_S = 30.0


class _PausingStore(DirectoryStateStore):
    """A state store that runs ``pause`` once, right after its first ``states()`` read."""

    def __init__(self, path: Path, pause: Callable[[], None]) -> None:
        super().__init__(path)
        self._pause: Callable[[], None] | None = pause

    def states(self) -> dict[int, EpochState]:
        out = super().states()
        pause, self._pause = self._pause, None
        if pause is not None:
            pause()
        return out


def _wait(event: threading.Event, what: str) -> None:
    assert event.wait(WAIT_S), f"timed out waiting for {what}"


def test_the_cut_never_names_an_epoch_a_stream_is_still_committing(env: Env) -> None:
    """A reader's cut taken while epoch 1 is committed one participant after the other
    (the state read before the decision, the target after its first commit) named
    epoch 1: a reader resuming after it never saw the other participants' rows."""
    coord = env.coordinator()
    coord.start()
    coord.commit_epoch(0, env.prepare_epoch(0))
    state_read, partly, cut_done = threading.Event(), threading.Event(), threading.Event()

    def after_first_commit(point: str, epoch: int | None) -> None:
        if point == AFTER_FIRST_COMMIT and epoch == 1:
            partly.set()
            _wait(cut_done, "the cut")

    coord.faults = FaultInjector(callback=after_first_commit)
    found: list[int] = []

    def read_cut() -> None:
        def pause() -> None:
            state_read.set()
            _wait(partly, "epoch 1 to be committed in part")

        try:
            found.append(consistent_cut(env.backend, _PausingStore(env.state_dir, pause),
                                        "unit-sink").cut)
        finally:
            cut_done.set()

    reader = threading.Thread(target=read_cut)
    reader.start()
    _wait(state_read, "the cut's first read of the state")
    coord.commit_epoch(1, env.prepare_epoch(1))
    reader.join(WAIT_S)
    assert found == [0], "the cut named an epoch only part of whose participants are committed"
    assert consistent_cut(env.backend, env.store(), "unit-sink").cut == 1


def test_the_cut_never_passes_a_grouped_write_still_in_flight(tmp_path: Path) -> None:
    """Two batch writes of a group: the later one committed in every target while the
    earlier one is still preparing. The cut named the later epoch, so readers skipped
    the earlier one for good."""
    genv = GroupEnv(tmp_path)
    coord = genv.coordinator(owner="driver")
    coord.start()
    coord.commit_epoch(0, genv.prepare(0))
    state_read, both_written = threading.Event(), threading.Event()
    found: list[int] = []

    def read_cut() -> None:
        def pause() -> None:
            state_read.set()
            _wait(both_written, "the two writes")

        group = genv.group()
        try:
            found.append(consistent_cut(group, _PausingStore(genv.state_dir, pause),
                                        "orders").cut)
        finally:
            group.close()

    reader = threading.Thread(target=read_cut)
    reader.start()
    _wait(state_read, "the cut's first read of the state")
    first, second = coord.reserve_epoch(), coord.reserve_epoch()
    assert (first, second) == (1, 2)
    coord.commit_epoch(second, genv.prepare(second))  # the first is still preparing
    both_written.set()
    reader.join(WAIT_S)
    assert found == [0], "the cut passed an epoch that no target holds yet"
    coord.commit_epoch(first, genv.prepare(first))
    group = genv.group()
    try:
        assert consistent_cut(group, genv.store(), "orders").cut == 2
    finally:
        group.close()


def test_the_cut_of_a_files_sink_mid_commit_stops_below_the_epoch(tmp_path: Path) -> None:
    """The same on a real target (the files backend: its epoch markers are what the cut
    reads), epoch 1 of an ordinary stream committed one participant after the other."""
    import pyarrow as pa
    from txsink.coordinator import Coordinator
    from txsink.model import TransactionContext
    from txsink.plugins import get_plugins
    from txsink.writer import write_participant

    backend = get_plugins().create_backend("files", {"path": str(tmp_path / "out")})
    coord = Coordinator(backend, DirectoryStateStore(tmp_path / "state"), "files-cut",
                        faults=FaultInjector())
    coord.start()

    def prepare(epoch: int) -> list[Any]:
        return [write_participant(backend, TransactionContext("files-cut", epoch, p, 0), [
            pa.record_batch({"id": pa.array([epoch * 10 + p], pa.int64())})])
            for p in range(2)]

    coord.commit_epoch(0, prepare(0))
    state_read, partly, cut_done = threading.Event(), threading.Event(), threading.Event()

    def after_first_commit(point: str, epoch: int | None) -> None:
        if point == AFTER_FIRST_COMMIT and epoch == 1:
            partly.set()
            _wait(cut_done, "the cut")

    coord.faults = FaultInjector(callback=after_first_commit)
    found: list[int] = []

    def read_cut() -> None:
        def pause() -> None:
            state_read.set()
            _wait(partly, "epoch 1 to be committed in part")

        reader_backend = get_plugins().create_backend("files", {"path": str(tmp_path / "out")})
        try:
            found.append(consistent_cut(reader_backend, _PausingStore(tmp_path / "state", pause),
                                        "files-cut").cut)
        finally:
            reader_backend.close()
            cut_done.set()

    reader = threading.Thread(target=read_cut)
    reader.start()
    _wait(state_read, "the cut's first read of the state")
    coord.commit_epoch(1, prepare(1))
    reader.join(WAIT_S)
    backend.close()
    assert found == [0], "the cut named an epoch one of whose files is not published yet"
