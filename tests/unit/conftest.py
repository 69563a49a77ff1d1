from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from txsink.coordinator import Coordinator, RetryPolicy
from txsink.faults import FaultInjector
from txsink.hookspecs import hookimpl
from txsink.model import Committable, TransactionContext
from txsink.plugins import Plugins, build_plugins
from txsink.state import DirectoryStateStore
from txsink.testing import memory
from txsink.testing.memory import MemoryBackend, MemorySystem
from txsink.writer import write_participant

SINK = "unit-sink"


class Recorder:
    """An observer plugin that records every lifecycle hook call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    @hookimpl
    def txsink_coordinator_started(self, backend: str,
                                   participant_timeout_s: float | None) -> None:
        self.calls.append(("started", (backend, participant_timeout_s)))

    @hookimpl
    def txsink_epoch_prepared(self, epoch: int) -> None:
        self.calls.append(("prepared", epoch))

    @hookimpl
    def txsink_epoch_decided(self, epoch: int) -> None:
        self.calls.append(("decided", epoch))

    @hookimpl
    def txsink_epoch_committed(self, epoch: int, committables: Any, duration_s: float) -> None:
        assert duration_s >= 0
        self.calls.append(("committed", epoch))

    @hookimpl
    def txsink_epoch_aborted(self, epoch: int, committables: Any, reason: str) -> None:
        self.calls.append((f"aborted:{reason}", epoch))

    @hookimpl
    def txsink_participant_salvaged(self, epoch: int, original: Any, replacement: Any) -> None:
        self.calls.append(("salvaged", (epoch, original.participant, replacement.participant)))

    @hookimpl
    def txsink_recovered(self, report: Any) -> None:
        self.calls.append(("recovered", tuple(report.recommitted_epochs)))


class Env:
    """A sink wired to the in-memory backend, a directory store and a recorder."""

    def __init__(self, tmp_path: Path) -> None:
        self.system_name = f"sys-{uuid.uuid4().hex}"
        self.backend = MemoryBackend(self.system_name)
        self.state_dir = tmp_path / "state"
        self.recorder = Recorder()
        self.plugins: Plugins = build_plugins(entry_points=[],
                                              extra_plugins=[("recorder", self.recorder)])

    @property
    def system(self) -> MemorySystem:
        return memory.system(self.system_name)

    def store(self) -> DirectoryStateStore:
        return DirectoryStateStore(self.state_dir)

    def coordinator(self, faults: FaultInjector | None = None, **kw: Any) -> Coordinator:
        kw.setdefault("retry", RetryPolicy(attempts=3, initial_backoff_s=0, sleep=lambda s: None))
        return Coordinator(self.backend, self.store(), SINK, plugins=self.plugins,
                           faults=faults or FaultInjector(), **kw)

    def prepare(self, epoch: int, partition: int, n: int = 10, attempt: int = 0) -> Committable:
        ctx = TransactionContext(SINK, epoch, partition, attempt)
        return write_participant(self.backend, ctx, [rows(epoch, partition, n)])

    def prepare_epoch(self, epoch: int, partitions: int = 3, n: int = 10) -> list[Committable]:
        return [self.prepare(epoch, p, n) for p in range(partitions)]

    def ids(self) -> list[int]:
        return sorted(r["id"] for r in self.system.rows())


def rows(epoch: int, partition: int, n: int) -> pa.RecordBatch:
    base = epoch * 1_000_000 + partition * 10_000
    return pa.record_batch({"id": pa.array(range(base, base + n), pa.int64())})


def expected_ids(epochs: range, partitions: int, n: int = 10) -> list[int]:
    return sorted(e * 1_000_000 + p * 10_000 + i
                  for e in epochs for p in range(partitions) for i in range(n))


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
    yield e
    memory.SYSTEMS.pop(e.system_name, None)


@pytest.fixture
def world() -> Iterator[Any]:
    """The entry-points model (:mod:`tests.operations_entry_points`) for one test, strict:
    a known failure of issue 31 fails the test instead of being discarded."""
    from tests.operations_entry_points import EntryPointsModel

    model = EntryPointsModel()
    model.strict = True
    yield model
    model.teardown()
