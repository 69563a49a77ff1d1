"""Property: any sequence of crashes and restarts yields each epoch's rows exactly once.

A small model of Spark drives the coordinator: writers prepare participants (some
task attempts fail after preparing and are retried, some have speculative twins
whose messages never arrive), the driver commits, and Spark's own commit log is
written after ``commit`` returns. Crashes are injected at every coordinator fault
point, inside the backend's commit (reply lost), and between txsink's commit and
Spark's commit log; after each crash a fresh coordinator starts from the state
directory, exactly as a restarted query does.
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from txsink.coordinator import Coordinator, RetryPolicy
from txsink.faults import POINTS, FaultInjector, InjectedFault
from txsink.model import Committable, TransactionContext
from txsink.plugins import build_plugins
from txsink.state import DirectoryStateStore
from txsink.testing import memory
from txsink.testing.memory import MemoryBackend
from txsink.writer import write_participant

from .conftest import expected_ids, rows

SPARK_LOG = "before-spark-commit-log"
BACKEND_COMMIT = "inside-backend-commit"
TASK_FAIL = "task-fails-after-prepare"
SPECULATIVE = "speculative-twin"
ALL_POINTS = [*POINTS, SPARK_LOG, BACKEND_COMMIT, TASK_FAIL, SPECULATIVE]

faults_strategy = st.lists(
    st.tuples(st.integers(0, 4), st.sampled_from(ALL_POINTS), st.integers(0, 2)),
    max_size=8,
)


class Schedule:
    """Each scheduled fault fires once, at its (epoch, point, partition)."""

    def __init__(self, faults: list[tuple[int, str, int]]) -> None:
        self.pending = list(faults)
        self.fired: list[tuple[int, str, int]] = []

    def take(self, epoch: int | None, point: str, partition: int | None = None) -> bool:
        for f in self.pending:
            if f[0] == epoch and f[1] == point and (partition is None or f[2] == partition):
                self.pending.remove(f)
                self.fired.append(f)
                return True
        return False

    def injector(self) -> FaultInjector:
        def hit(point: str, epoch: int | None) -> None:
            if self.take(epoch, point):
                raise InjectedFault(point, epoch)

        return FaultInjector(callback=hit)


def run_pipeline(state_dir: Path, epochs: int, partitions: int, retain: int,
                 schedule: Schedule) -> tuple[list[int], int]:
    name = f"prop-{uuid.uuid4().hex}"
    backend = MemoryBackend(name)
    system = memory.system(name)
    plugins = build_plugins(entry_points=[])
    sink = "prop"
    spark_log = -1  # Spark's commit log: last batch it recorded as done
    attempts: dict[tuple[int, int], int] = {}
    restarts = 0

    def lose_reply(c: Committable) -> None:
        if schedule.take(c.epoch, BACKEND_COMMIT, c.partition):
            raise InjectedFault(BACKEND_COMMIT, c.epoch)

    system.after_commit = lose_reply

    def task(epoch: int, partition: int) -> Committable:
        while True:
            attempt = attempts.get((epoch, partition), 0)
            attempts[(epoch, partition)] = attempt + 1
            ctx = TransactionContext(sink, epoch, partition, attempt)
            c = write_participant(backend, ctx, [rows(epoch, partition, 5)])
            if schedule.take(epoch, SPECULATIVE, partition):
                twin = TransactionContext(sink, epoch, partition, attempt + 100)
                write_participant(backend, twin, [rows(epoch, partition, 5)])
            if schedule.take(epoch, TASK_FAIL, partition):
                continue  # prepared, but the message is lost: Spark retries the task
            return c

    try:
        while spark_log < epochs - 1:
            restarts += 1
            assert restarts < 50, "no progress"
            coord = Coordinator(backend, DirectoryStateStore(state_dir), sink,
                                owner=f"run-{restarts}", plugins=plugins,
                                retry=RetryPolicy(attempts=2, initial_backoff_s=0,
                                                  sleep=lambda s: None),
                                retain_epochs=retain, faults=schedule.injector())
            try:
                coord.start()
                for epoch in range(spark_log + 1, epochs):
                    msgs = [task(epoch, p) for p in range(partitions)]
                    coord.commit_epoch(epoch, msgs)
                    if schedule.take(epoch, SPARK_LOG):
                        raise InjectedFault(SPARK_LOG, epoch)
                    spark_log = epoch
            except InjectedFault:
                continue
        # The query stops cleanly at the end; a last start cleans what the last run left.
        Coordinator(backend, DirectoryStateStore(state_dir), sink, plugins=plugins,
                    faults=FaultInjector()).start()
        ids = sorted(r["id"] for r in system.rows())
        return ids, len(system.prepared)
    finally:
        memory.SYSTEMS.pop(name, None)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(epochs=st.integers(1, 5), partitions=st.integers(1, 3), retain=st.integers(1, 3),
       faults=faults_strategy)
def test_any_crash_sequence_yields_exactly_once(epochs: int, partitions: int, retain: int,
                                                faults: list[tuple[int, str, int]]) -> None:
    schedule = Schedule(faults)
    with tempfile.TemporaryDirectory() as tmp:
        ids, prepared_left = run_pipeline(Path(tmp) / "state", epochs, partitions, retain,
                                          schedule)
    assert ids == expected_ids(range(epochs), partitions, 5)
    assert prepared_left == 0


def test_model_really_crashes_at_every_point() -> None:
    """Guard the property test itself: each kind of fault fires and is survived."""
    faults = [(e, point, 0) for e, point in enumerate(ALL_POINTS)]
    schedule = Schedule(faults)
    with tempfile.TemporaryDirectory() as tmp:
        ids, left = run_pipeline(Path(tmp) / "s", len(ALL_POINTS), 2, 2, schedule)
    assert sorted(schedule.fired) == sorted(faults)
    assert ids == expected_ids(range(len(ALL_POINTS)), 2, 5)
    assert left == 0
