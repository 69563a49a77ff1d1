"""The conformance suite every txsink backend passes against a live system.

Subclass :class:`BackendConformance` in a test module (its name must start with
``Test``), set :attr:`~BackendConformance.backend_name`, and provide:

* a ``backend_options`` fixture returning options for a live instance;
* :meth:`~BackendConformance.read_ids`, returning the ``id`` column of every row a
  reader can see for a sink id (committed rows only: e.g. ``read_committed``).

Override :meth:`~BackendConformance.make_batch` when the backend needs another
schema (Kafka wants ``key``/``value``) and :meth:`~BackendConformance.open_participants`
when the backend cannot list prepared participants.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from txsink.backend import Backend, Capability, CommitOutcome
from txsink.coordinator import Coordinator, EpochOutcome
from txsink.faults import AFTER_DECIDE, AFTER_FIRST_COMMIT, FaultInjector, FaultRule, InjectedFault
from txsink.model import Committable, DeliveryGuarantee, TransactionContext
from txsink.plugins import build_plugins, get_plugins
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant

_COMMIT_ELSEWHERE = r"""
import json, sys
from txsink.model import Committable
from txsink.plugins import get_plugins
spec = json.loads(sys.stdin.read())
backend = get_plugins().create_backend(spec["backend"], spec["options"])
try:
    print(backend.commit(Committable.from_bytes(spec["committable"].encode())).value)
finally:
    backend.close()
"""


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class BackendConformance:
    """Reusable suite: idempotent commit, abort, recovery, orphans, streaming."""

    #: The registered backend name.
    backend_name: str = ""
    #: Size of the partition streamed by :meth:`test_large_partition_is_streamed`.
    large_partition_bytes: int = 192 * 1024 * 1024
    #: Peak memory growth allowed while streaming it.
    memory_bound_bytes: int = 96 * 1024 * 1024
    #: Rows per batch in generated partitions.
    batch_rows: int = 10_000
    #: Whether a repeated commit always answers ``ALREADY_COMMITTED``. A system that
    #: cannot tell a repeat right after the first commit (Kafka writes its commit
    #: markers after answering, and accepts the same EndTxn twice) sets this False:
    #: a repeat may then answer ``COMMITTED``; it must still succeed and write nothing.
    exact_repeat_outcome: bool = True

    # -- what a subclass provides -------------------------------------------------------

    @pytest.fixture
    def backend_options(self) -> Mapping[str, str]:
        raise NotImplementedError("provide a backend_options fixture for a live instance")

    def read_ids(self, backend: Backend, sink_id: str) -> list[int]:
        """The ``id`` of every row readers can see for ``sink_id``, with repeats."""
        raise NotImplementedError

    def make_batch(self, ids: Sequence[int]) -> pa.RecordBatch:
        return pa.record_batch(
            {
                "id": pa.array(ids, pa.int64()),
                "name": pa.array([f"row-{i}" for i in ids], pa.string()),
                "amount": pa.array([i * 0.5 for i in ids], pa.float64()),
            }
        )

    def open_participants(self, backend: Backend, sink_id: str) -> set[str]:
        """Participants of ``sink_id`` still prepared or open in the system."""
        return {c.participant for c in backend.list_prepared(sink_id)}

    def make_backend(self, options: Mapping[str, str]) -> Backend:
        return get_plugins().create_backend(self.backend_name, options)

    # -- fixtures -----------------------------------------------------------------------

    @pytest.fixture
    def sink_id(self) -> str:
        return f"conf-{uuid.uuid4().hex[:10]}"

    @pytest.fixture
    def backend(self, backend_options: Mapping[str, str], sink_id: str) -> Iterator[Backend]:
        backend = self.make_backend(backend_options)
        backend.preflight(sink_id)
        try:
            yield backend
        finally:
            backend.close()

    @pytest.fixture
    def state_dir(self, tmp_path: Path) -> Path:
        return tmp_path / "state"

    # -- helpers ------------------------------------------------------------------------

    def prepare(self, backend: Backend, sink_id: str, epoch: int, partition: int,
                ids: Sequence[int], attempt: int = 0) -> Committable:
        ctx = TransactionContext(sink_id, epoch, partition, attempt)
        step = self.batch_rows
        batches = (self.make_batch(ids[i:i + step]) for i in range(0, len(ids), step))
        return write_participant(backend, ctx, batches)

    def coordinator(self, backend: Backend, state_dir: Path, sink_id: str,
                    faults: FaultInjector | None = None) -> Coordinator:
        return Coordinator(backend, DirectoryStateStore(state_dir), sink_id,
                           plugins=build_plugins(), faults=faults or FaultInjector())

    # -- the suite ----------------------------------------------------------------------

    def test_committable_round_trip(self, backend: Backend, sink_id: str) -> None:
        c = self.prepare(backend, sink_id, 0, 0, range(10))
        try:
            again = Committable.from_bytes(c.to_bytes())
            assert again == c
            assert backend.decode_payload(again.payload_version, again.payload) == c.payload
            assert (c.sink_id, c.epoch, c.partition, c.backend) == (sink_id, 0, 0,
                                                                   backend.name)
            text = c.to_bytes().decode()
            for secret in backend.secret_values():
                assert secret not in text, "a secret leaked into the committable"
        finally:
            backend.abort(c)

    def test_data_invisible_until_commit_then_exactly_once(
        self, backend: Backend, sink_id: str
    ) -> None:
        c0 = self.prepare(backend, sink_id, 0, 0, range(0, 500))
        c1 = self.prepare(backend, sink_id, 0, 1, range(500, 1000))
        assert self.read_ids(backend, sink_id) == []
        assert {c0.participant, c1.participant} <= self.open_participants(backend, sink_id)
        for c in (c0, c1):
            assert backend.commit(c) is CommitOutcome.COMMITTED
        assert sorted(self.read_ids(backend, sink_id)) == list(range(1000))
        assert self.open_participants(backend, sink_id) == set()

    def test_commit_is_idempotent(self, backend: Backend, sink_id: str) -> None:
        c = self.prepare(backend, sink_id, 0, 0, range(100))
        assert backend.commit(c) is CommitOutcome.COMMITTED
        repeats = {CommitOutcome.ALREADY_COMMITTED}
        if not self.exact_repeat_outcome:
            repeats.add(CommitOutcome.COMMITTED)
        assert backend.commit(c) in repeats
        assert backend.commit(Committable.from_bytes(c.to_bytes())) in repeats
        assert sorted(self.read_ids(backend, sink_id)) == list(range(100))

    def test_abort_after_pre_commit(self, backend: Backend, sink_id: str) -> None:
        c = self.prepare(backend, sink_id, 0, 0, range(100))
        backend.abort(c)
        backend.abort(c)  # aborting twice is harmless
        assert self.read_ids(backend, sink_id) == []
        assert self.open_participants(backend, sink_id) == set()

    def test_discard_before_pre_commit(self, backend: Backend, sink_id: str) -> None:
        txn = backend.begin_transaction(TransactionContext(sink_id, 0, 0))
        backend.write(txn, self.make_batch(range(50)))
        backend.discard(txn)
        assert self.read_ids(backend, sink_id) == []
        assert self.open_participants(backend, sink_id) == set()

    def test_empty_partition(self, backend: Backend, sink_id: str) -> None:
        c = self.prepare(backend, sink_id, 0, 0, [])
        assert c.rows == 0
        assert backend.commit(c) in (CommitOutcome.COMMITTED, CommitOutcome.ALREADY_COMMITTED)
        assert self.read_ids(backend, sink_id) == []
        assert self.open_participants(backend, sink_id) == set()

    def test_non_transactional_guarantees_commit_in_the_task(
        self, backend: Backend, sink_id: str
    ) -> None:
        """at_least_once and none: rows are visible when the task ends, with no driver
        round; a retried attempt writes them again (duplicates, never a loss)."""
        offered = [g for g in (DeliveryGuarantee.AT_LEAST_ONCE, DeliveryGuarantee.NONE)
                   if g in type(backend).guarantees]
        if not offered:
            pytest.skip(f"backend {backend.name!r} offers only exactly_once")
        for epoch, guarantee in enumerate(offered):
            base = epoch * 1000
            ids = list(range(base, base + 100))
            for attempt in (0, 1):  # the task, then its retry
                ctx = TransactionContext(sink_id, epoch, 0, attempt)
                c = write_participant(backend, ctx, [self.make_batch(ids)], guarantee)
                assert c.rows == 100
                seen = [i for i in self.read_ids(backend, sink_id) if base <= i < base + 1000]
                assert sorted(seen) == sorted(ids * (attempt + 1)), guarantee
            assert self.open_participants(backend, sink_id) == set()

    def test_commit_from_another_process(
        self, backend: Backend, backend_options: Mapping[str, str], sink_id: str
    ) -> None:
        if Capability.COMMIT_FROM_ANY_PROCESS not in backend.capabilities:
            pytest.skip(f"backend {backend.name!r} does not declare commit-from-any-process")
        c = self.prepare(backend, sink_id, 0, 0, range(200))
        spec = {"backend": self.backend_name, "options": dict(backend_options),
                "committable": c.to_bytes().decode()}
        # Options travel on stdin, never argv: they may hold secrets.
        done = subprocess.run([sys.executable, "-c", _COMMIT_ELSEWHERE], input=json.dumps(spec),
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip() == CommitOutcome.COMMITTED.value
        assert sorted(self.read_ids(backend, sink_id)) == list(range(200))
        assert backend.commit(c) is CommitOutcome.ALREADY_COMMITTED

    def test_recovery_commits_a_decided_epoch(
        self, backend: Backend, sink_id: str, state_dir: Path
    ) -> None:
        crash = FaultInjector([FaultRule(AFTER_DECIDE, 3, "raise")])
        first = self.coordinator(backend, state_dir, sink_id, crash)
        first.start()
        msgs = [self.prepare(backend, sink_id, 3, p, range(p * 100, p * 100 + 100))
                for p in range(3)]
        with pytest.raises(InjectedFault):
            first.commit_epoch(3, msgs)
        assert self.read_ids(backend, sink_id) == []
        second = self.coordinator(backend, state_dir, sink_id)
        report = second.start()
        assert report.recommitted_epochs == [3]
        assert sorted(self.read_ids(backend, sink_id)) == list(range(300))
        assert self.open_participants(backend, sink_id) == set()

    def test_recovery_after_partial_commit(
        self, backend: Backend, sink_id: str, state_dir: Path
    ) -> None:
        crash = FaultInjector([FaultRule(AFTER_FIRST_COMMIT, 1, "raise")])
        first = self.coordinator(backend, state_dir, sink_id, crash)
        msgs = [self.prepare(backend, sink_id, 1, p, range(p * 10, p * 10 + 10))
                for p in range(3)]
        with pytest.raises(InjectedFault):
            first.commit_epoch(1, msgs)
        second = self.coordinator(backend, state_dir, sink_id)
        assert second.start().recommitted_epochs == [1]
        assert sorted(self.read_ids(backend, sink_id)) == list(range(30))

    def test_replayed_committed_epoch_is_not_written_twice(
        self, backend: Backend, sink_id: str, state_dir: Path
    ) -> None:
        coord = self.coordinator(backend, state_dir, sink_id)
        coord.start()
        first = [self.prepare(backend, sink_id, 0, p, range(p * 50, p * 50 + 50))
                 for p in range(2)]
        assert coord.commit_epoch(0, first) is EpochOutcome.COMMITTED
        replay = [self.prepare(backend, sink_id, 0, p, range(p * 50, p * 50 + 50))
                  for p in range(2)]
        assert coord.commit_epoch(0, replay) is EpochOutcome.REPLAYED
        assert sorted(self.read_ids(backend, sink_id)) == list(range(100))
        assert self.open_participants(backend, sink_id) == set()

    def test_holds_epoch_counts_committed_epochs_only(
        self, backend: Backend, sink_id: str, state_dir: Path
    ) -> None:
        """For backends that implement ``holds_epoch``: a restored state relies on it."""
        if type(backend).holds_epoch is Backend.holds_epoch:
            pytest.skip(f"backend {backend.name!r} does not implement holds_epoch")
        coord = self.coordinator(backend, state_dir, sink_id)
        coord.start()
        prepared = self.prepare(backend, sink_id, 4, 0, range(20))
        assert not backend.holds_epoch(sink_id, 4)  # prepared is not committed
        assert coord.commit_epoch(4, [prepared]) is EpochOutcome.COMMITTED
        assert backend.holds_epoch(sink_id, 4)
        assert not backend.holds_epoch(sink_id, 5)
        assert not backend.holds_epoch(f"{sink_id}x", 4)

    def test_orphans_are_aborted(self, backend: Backend, sink_id: str, state_dir: Path) -> None:
        coord = self.coordinator(backend, state_dir, sink_id)
        coord.start()
        # A failed first attempt and a speculative duplicate of partition 0 prepared too.
        self.prepare(backend, sink_id, 0, 0, range(100), attempt=0)
        self.prepare(backend, sink_id, 0, 0, range(100), attempt=2)
        winner = self.prepare(backend, sink_id, 0, 0, range(100), attempt=1)
        # An epoch whose driver died before deciding: found at the next start.
        self.prepare(backend, sink_id, 1, 0, range(1000, 1010))
        assert coord.commit_epoch(0, [winner]) is EpochOutcome.COMMITTED
        assert sorted(self.read_ids(backend, sink_id)) == list(range(100))
        restarted = self.coordinator(backend, state_dir, sink_id)
        restarted.start()
        assert self.open_participants(backend, sink_id) == set()
        assert sorted(self.read_ids(backend, sink_id)) == list(range(100))

    def test_large_partition_is_streamed(self, backend: Backend, sink_id: str) -> None:
        rows_per_batch = self.batch_rows
        sample = self.make_batch(range(rows_per_batch))
        batches = max(2, self.large_partition_bytes // max(1, sample.nbytes))
        total_rows = batches * rows_per_batch
        peak = [0]
        stop = threading.Event()

        def sample_rss() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], _rss_bytes())
                time.sleep(0.005)

        def generate() -> Any:
            for b in range(batches):
                yield self.make_batch(range(b * rows_per_batch, (b + 1) * rows_per_batch))

        baseline = _rss_bytes()
        watcher = threading.Thread(target=sample_rss, daemon=True)
        watcher.start()
        try:
            c = write_participant(backend, TransactionContext(sink_id, 0, 0), generate())
        finally:
            stop.set()
            watcher.join()
        growth = peak[0] - baseline
        assert c.rows == total_rows
        assert growth < self.memory_bound_bytes, (
            f"writing {batches * sample.nbytes / 2**20:.0f} MiB grew memory by "
            f"{growth / 2**20:.0f} MiB (bound {self.memory_bound_bytes / 2**20:.0f} MiB)")
        backend.commit(c)
        ids = self.read_ids(backend, sink_id)
        assert len(ids) == total_rows
        assert sum(ids) == total_rows * (total_rows - 1) // 2
