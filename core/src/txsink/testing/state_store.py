"""The suite every pending-transaction state store passes (directory, S3, plugins).

The coordinator's guarantees rest on three properties of its store: a decision is
written whole or not at all, no update is lost when several writers share a lease,
and a coordinator that was taken over can no longer write (fencing). Subclass
:class:`StateStoreContract` in a test module (name starting with ``Test``) and
provide a ``location`` fixture: a fresh, empty state location for each test. Stores
are opened through the plugin registry (:meth:`StateStoreContract.open`), the way
the coordinator opens them, so the scheme registration is tested too. Processes
spawned by the tests open the same location with the same environment.

A method added to :class:`~txsink.state.StateStore` gets its test here, so that
every store is held to it.
"""

from __future__ import annotations

import multiprocessing
import queue
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from txsink.coordinator import Coordinator, EpochOutcome
from txsink.errors import FencedError
from txsink.model import Committable, TransactionContext
from txsink.plugins import build_plugins, get_plugins
from txsink.state import EpochRecord, EpochState, SinkMeta, StateStore, WriteId
from txsink.testing.memory import MemoryBackend


def committable(epoch: int, partition: int = 0, *, owner: str = "a",
                size: int = 0) -> Committable:
    """A committable of a made-up backend; ``size`` pads the payload."""
    return Committable("files", "s1", epoch, partition, 0,
                       f"s1-e{epoch}-p{partition}-{owner}",
                       {"final": f"/out/{owner}/{epoch}/{partition}", "pad": "x" * size},
                       rows=partition + 1)


def decided(epoch: int, partitions: int = 1, *, owner: str = "a") -> EpochRecord:
    return EpochRecord(epoch, EpochState.DECIDED,
                       tuple(committable(epoch, p, owner=owner) for p in range(partitions)),
                       1_700_000_000.0 + epoch)


def _open(location: str) -> StateStore:
    return get_plugins().state_store(location)


def _race(location: str, owner: str, epochs: int, q: Any) -> None:
    """A driver in its own process: take the lease and decide ``epochs`` epochs."""
    store = _open(location)
    lease = store.acquire(owner)
    written: list[int] = []
    try:
        for epoch in range(epochs):
            store.put(lease, decided(epoch, owner=owner))
            written.append(epoch)
        q.put((owner, "ok", written))
    except FencedError:
        q.put((owner, "fenced", written))


class StateStoreContract:
    """Reusable tests of :class:`~txsink.state.StateStore` semantics."""

    @pytest.fixture
    def location(self) -> str:
        raise NotImplementedError("provide a fresh state location per test")

    def open(self, location: str) -> StateStore:
        """A new store object on ``location``, as another process would open it."""
        return _open(location)

    # -- basics --------------------------------------------------------------------------

    def test_a_new_location_is_empty(self, location: str) -> None:
        store = self.open(location)
        assert store.read_meta() is None
        assert store.records() == {}
        assert store.get(0) is None

    def test_records_round_trip(self, location: str) -> None:
        store = self.open(location)
        lease = store.acquire("a")
        big = EpochRecord(3, EpochState.DECIDED,
                          tuple(committable(3, p, size=200) for p in range(64)), 5.0)
        store.put(lease, decided(1))
        store.put(lease, big)
        other = self.open(location)  # another process reads what this one wrote
        assert other.get(3) == big
        assert other.records() == {1: decided(1), 3: big}
        store.put(lease, big.committed(9.0))
        got = self.open(location).get(3)
        assert got is not None
        assert (got.state, got.committed_at, got.committables) == (
            EpochState.COMMITTED, 9.0, big.committables)
        assert sorted(self.open(location).records()) == [1, 3]

    def test_a_salvaged_participant_is_remembered(self, location: str) -> None:
        # A salvage replaces a decided participant in place (still DECIDED) and the
        # record keeps which one it replaced, through the COMMITTED mark.
        store = self.open(location)
        lease = store.acquire("a")
        store.put(lease, decided(4, partitions=2))
        lost = committable(4, 1)
        again = Committable("files", "s1", 4, 1, 7, "s1-e4-p1-again", {"final": "/x"}, rows=2)
        salvaged = decided(4, partitions=2).with_replacements({lost.participant: again})
        store.put(lease, salvaged)
        got = self.open(location).get(4)
        assert got == salvaged and got.state is EpochState.DECIDED
        assert got.committables[1] == again
        assert got.salvaged == (("s1-e4-p1-again", lost.participant),)
        store.put(lease, salvaged.committed(3.0))
        got = self.open(location).get(4)
        assert got is not None and got.salvaged == salvaged.salvaged

    def test_a_record_is_replaced_whole(self, location: str) -> None:
        store = self.open(location)
        lease = store.acquire("a")
        store.put(lease, decided(2, partitions=3, owner="first"))
        store.put(lease, decided(2, partitions=1, owner="second"))
        assert self.open(location).get(2) == decided(2, partitions=1, owner="second")

    def test_meta_round_trip(self, location: str) -> None:
        store = self.open(location)
        lease = store.acquire("a")
        meta = SinkMeta("s1", "files", {"path": "/out"}, committed_watermark=4)
        store.write_meta(lease, meta)
        assert self.open(location).read_meta() == meta

    def test_delete_removes_only_the_named_epochs(self, location: str) -> None:
        store = self.open(location)
        lease = store.acquire("a")
        for epoch in range(5):
            store.put(lease, decided(epoch))
        store.delete(lease, [0, 2, 7])
        assert sorted(self.open(location).records()) == [1, 3, 4]
        store.put(lease, decided(0, owner="again"))  # a deleted epoch can be written again
        assert self.open(location).get(0) == decided(0, owner="again")

    def test_put_new_reserves_an_epoch_once(self, location: str) -> None:
        """Batch writes running at once reserve distinct epochs through ``put_new``:
        of many reservations of one epoch exactly one wins, and what it wrote (the
        write identity, the reserving owner) reads back."""
        store = self.open(location)
        lease = store.acquire("a")
        reserved = EpochRecord(7, EpochState.RESERVED, (), 1.0, write=WriteId("daily", 3),
                               owner="run-1")
        assert store.put_new(lease, reserved) is True
        assert store.put_new(lease, decided(7)) is False
        assert self.open(location).get(7) == reserved
        wins: list[bool] = []
        errors: list[BaseException] = []

        def reserve(n: int) -> None:
            try:
                wins.append(self.open(location).put_new(
                    lease, EpochRecord(8, EpochState.RESERVED, (), 1.0, owner=f"run-{n}")))
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=reserve, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert errors == []
        assert sorted(wins) == [False, False, False, True]
        got = self.open(location).get(8)
        assert got is not None and got.state is EpochState.RESERVED and got.owner

    def test_states_match_the_records(self, location: str) -> None:
        """``states()`` is what the coordinator checks on every commit: each retained
        epoch's state, as ``records()`` would give it, from any store object."""
        store = self.open(location)
        assert store.states() == {}
        lease = store.acquire("a")
        assert store.put_new(lease, EpochRecord(5, EpochState.RESERVED, (), 1.0, owner="a"))
        store.put(lease, decided(3, partitions=2))
        store.put(lease, decided(4))
        store.put(lease, decided(4).committed(2.0))
        expected = {3: EpochState.DECIDED, 4: EpochState.COMMITTED, 5: EpochState.RESERVED}
        other = self.open(location)
        assert other.states() == expected
        assert {e: r.state for e, r in other.records().items()} == expected
        store.put(lease, decided(5))
        store.delete(lease, [3])
        assert self.open(location).states() == {4: EpochState.COMMITTED,
                                                5: EpochState.DECIDED}

    # -- fencing -------------------------------------------------------------------------

    def test_the_archive_keeps_every_merged_name_and_fences(self, location: str) -> None:
        """The names of pruned decisions (see :mod:`txsink.decisions`): merges add up,
        two merges of one chunk lose nothing, and a fenced owner changes nothing."""
        store = self.open(location)
        if not store.supports_archive:
            pytest.skip(f"{type(store).__name__} keeps no archive of decided names")
        lease = store.acquire("a")
        assert store.archive_chunks() == []
        store.merge_archive(lease, 3, {"3000": {"at": 1.0, "names": [[0, 0]]}})
        self.open(location).merge_archive(lease, 3, {"3001": {"at": 2.0, "names": [[1, 5]]}})
        store.merge_archive(lease, 5, {"5000": {"at": 3.0, "names": []}})
        reader = self.open(location)
        assert reader.archive_chunks() == [3, 5]
        chunk = reader.read_archive(3)
        assert chunk is not None
        assert chunk["epochs"] == {"3000": {"at": 1.0, "names": [[0, 0]]},
                                   "3001": {"at": 2.0, "names": [[1, 5]]}}
        assert reader.read_archive(4) is None
        self.open(location).acquire("b")
        with pytest.raises(FencedError):
            store.merge_archive(lease, 3, {"3002": {"at": 4.0, "names": [[2, 2]]}})
        with pytest.raises(FencedError):
            store.delete_archive(lease, [3])
        chunk = self.open(location).read_archive(3)
        assert chunk is not None and "3002" not in chunk["epochs"]
        new = self.open(location).acquire("b")
        self.open(location).delete_archive(new, [3])
        assert self.open(location).archive_chunks() == [5]

    def test_same_owner_gets_its_lease_back(self, location: str) -> None:
        first = self.open(location).acquire("a")
        again = self.open(location).acquire("a")
        assert again == first
        store = self.open(location)
        store.check(first)
        store.put(first, decided(1))

    def test_a_new_owner_fences_every_write_of_the_old_one(self, location: str) -> None:
        old_store, new_store = self.open(location), self.open(location)
        old = old_store.acquire("old")
        old_store.put(old, decided(1, owner="old"))
        new = new_store.acquire("new")
        assert new.generation == old.generation + 1
        meta = SinkMeta("s1", "files")
        with pytest.raises(FencedError):
            old_store.check(old)
        with pytest.raises(FencedError):
            old_store.put(old, decided(2, owner="old"))
        with pytest.raises(FencedError):
            old_store.put(old, decided(1, owner="old").committed(3.0))
        with pytest.raises(FencedError):
            old_store.delete(old, [1])
        with pytest.raises(FencedError):
            old_store.write_meta(old, meta)
        # Nothing of the fenced writes is visible.
        reader = self.open(location)
        assert reader.records() == {1: decided(1, owner="old")}
        assert reader.read_meta() is None
        new_store.put(new, decided(2, owner="new"))
        assert self.open(location).acquire("new") == new
        # An owner that was fenced stays fenced: an older run never takes the sink back.
        with pytest.raises(FencedError):
            self.open(location).acquire("old")
        assert self.open(location).acquire("third").generation == new.generation + 1

    def test_concurrent_writers_lose_no_update(self, location: str) -> None:
        lease = self.open(location).acquire("a")
        errors: list[BaseException] = []

        def writer(first: int) -> None:
            store = self.open(location)
            try:
                for epoch in range(first, first + 6):
                    store.put(lease, decided(epoch))
                    if epoch % 2:
                        store.put(lease, decided(epoch).committed(1.0))
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(i * 100,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert errors == []
        records = self.open(location).records()
        assert sorted(records) == sorted(i * 100 + k for i in range(4) for k in range(6))
        assert all((r.state is EpochState.COMMITTED) == bool(e % 2) for e, r in records.items())

    def test_two_driver_processes_never_both_write_after_a_takeover(
            self, location: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        q = ctx.Queue()
        procs = [ctx.Process(target=_race, args=(location, f"driver{i}", 15, q))
                 for i in range(2)]
        for p in procs:
            p.start()
        try:
            results = {}
            for _ in procs:
                try:
                    owner, outcome, written = q.get(timeout=600)
                except queue.Empty:
                    raise AssertionError("a driver process did not report") from None
                results[owner] = (outcome, written)
        finally:
            for p in procs:
                p.join(60)
                if p.is_alive():
                    p.kill()
        outcomes = sorted(o for o, _ in results.values())
        # The first to acquire is fenced from the moment the second acquires, unless it
        # finished before; the second is never fenced.
        assert outcomes in (["fenced", "ok"], ["ok", "ok"])
        records = self.open(location).records()
        assert sorted(records) == list(range(15))
        # Every record is the second driver's: the first one's writes all came before
        # the takeover (else they were fenced), and the second rewrote each epoch after.
        writers = {c.participant.rsplit("-", 1)[1] for r in records.values()
                   for c in r.committables}
        assert len(writers) == 1
        if outcomes == ["fenced", "ok"]:
            assert writers == {o for o, (outcome, _) in results.items() if outcome == "ok"}
        lease = self.open(location).acquire("observer")
        assert lease.generation == 3

    def test_a_second_driver_fences_the_first_coordinator(self, location: str) -> None:
        """Two coordinators (drivers) on one state: after the second starts, every
        decision of the first fails with FencedError and nothing of it is recorded."""
        plugins = build_plugins(entry_points=[], extra_plugins=[("memory", _NoHooks())])
        system = f"fence-{uuid.uuid4().hex[:8]}"

        def driver(owner: str) -> Coordinator:
            return Coordinator(MemoryBackend(system), self.open(location), "s1",
                               owner=owner, plugins=plugins)

        def prepared(epoch: int, attempt: int) -> Sequence[Committable]:
            backend = MemoryBackend(system)
            out = []
            for p in range(2):
                txn = backend.begin_transaction(TransactionContext("s1", epoch, p, attempt))
                out.append(backend.pre_commit(txn))
            return out

        first = driver("driver-1")
        first.start()
        assert first.commit_epoch(0, prepared(0, 0)) is EpochOutcome.COMMITTED
        second = driver("driver-2")
        second.start()
        with pytest.raises(FencedError):
            first.commit_epoch(1, prepared(1, 1))
        assert self.open(location).get(1) is None
        mine = prepared(1, 2)
        assert second.commit_epoch(1, mine) is EpochOutcome.COMMITTED
        record = self.open(location).get(1)
        assert record is not None and record.committables == tuple(mine)
        assert record.state is EpochState.COMMITTED


class _NoHooks:
    """A plugin with no hooks: the fencing test needs no observers."""
