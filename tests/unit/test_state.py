from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest
from txsink.errors import ConfigError, FencedError, StateError
from txsink.model import Committable
from txsink.state import DirectoryStateStore, EpochRecord, EpochState


def record(epoch: int) -> EpochRecord:
    c = Committable("files", "s1", epoch, 0, 0, f"s1-e{epoch}-p0-a0", {"final": "x"}, rows=3)
    return EpochRecord(epoch, EpochState.DECIDED, (c,), 1.0)


def test_records_round_trip_and_leave_no_temp_files(tmp_path: Path) -> None:
    store = DirectoryStateStore(tmp_path)
    lease = store.acquire("a")
    store.put(lease, record(7))
    store.put(lease, record(7).committed(5.0))
    got = store.get(7)
    assert got is not None and got.state is EpochState.COMMITTED and got.committed_at == 5.0
    assert got.committables == record(7).committables
    assert [p.name for p in (tmp_path / "epochs").iterdir()] == ["000000000007.committed.json"]
    assert not list(tmp_path.rglob(".*.tmp-*"))


def test_lease_generation_fences_the_old_owner(tmp_path: Path) -> None:
    store = DirectoryStateStore(tmp_path)
    old = store.acquire("old")
    new = store.acquire("new")
    assert new.generation == old.generation + 1
    with pytest.raises(FencedError):
        store.put(old, record(1))
    store.put(new, record(1))
    assert store.acquire("new") == new


def _acquire_and_write(path: str, owner: str, q: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    store = DirectoryStateStore(path)
    lease = store.acquire(owner)
    try:
        for epoch in range(20):
            store.put(lease, record(epoch))
        q.put("ok")
    except FencedError:
        q.put("fenced")


def test_concurrent_coordinators_in_processes_never_both_succeed(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_acquire_and_write, args=(str(tmp_path), f"o{i}", q))
             for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    results = sorted(q.get(timeout=5) for _ in procs)
    # Whoever acquired first is fenced as soon as the second acquires, unless it
    # finished all its writes before; never do both write after the takeover.
    assert results in (["fenced", "ok"], ["ok", "ok"])
    lease = json.loads((tmp_path / "lease.json").read_text())
    assert lease["generation"] == 2


def test_corrupt_state_is_reported(tmp_path: Path) -> None:
    store = DirectoryStateStore(tmp_path)
    store.put(store.acquire("a"), record(1))
    (tmp_path / "epochs" / "000000000001.decided.json").write_text("{not json")
    with pytest.raises(StateError, match="corrupt"):
        store.records()


def test_future_format_is_refused(tmp_path: Path) -> None:
    store = DirectoryStateStore(tmp_path)
    store.put(store.acquire("a"), record(1))
    path = tmp_path / "epochs" / "000000000001.decided.json"
    data = json.loads(path.read_text())
    data["committables"][0]["v"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(StateError, match="upgrade txsink"):
        store.get(1)


def test_non_local_location_needs_a_plugin() -> None:
    with pytest.raises(ConfigError, match="state-store plugin"):
        DirectoryStateStore("hdfs://nn/checkpoints/q1")


def test_file_url_is_accepted(tmp_path: Path) -> None:
    store = DirectoryStateStore(f"file://{tmp_path}")
    assert store.location == str(tmp_path)
    assert os.path.samefile(store.root, tmp_path)


def _write_old_layout(tmp_path: Path, *records: EpochRecord) -> None:
    """Record files as releases before the state-in-the-name layout wrote them."""
    (tmp_path / "epochs").mkdir(parents=True, exist_ok=True)
    for r in records:
        (tmp_path / "epochs" / f"{r.epoch:012d}.json").write_text(json.dumps(r.to_dict()))


def test_an_old_layout_state_is_read_then_renamed_on_acquire(tmp_path: Path) -> None:
    old = [record(1).committed(2.0), record(2),
           EpochRecord(3, EpochState.RESERVED, (), 1.0, owner="run-1")]
    _write_old_layout(tmp_path, *old)
    store = DirectoryStateStore(tmp_path)
    assert store.records() == {r.epoch: r for r in old}
    assert store.states() == {1: EpochState.COMMITTED, 2: EpochState.DECIDED,
                              3: EpochState.RESERVED}
    assert store.get(2) == old[1]
    lease = store.acquire("a")
    assert sorted(p.name for p in (tmp_path / "epochs").iterdir()) == [
        "000000000001.committed.json", "000000000002.decided.json",
        "000000000003.reserved.json"]
    assert DirectoryStateStore(tmp_path).records() == {r.epoch: r for r in old}
    assert store.put_new(lease, record(3)) is False
    store.put(lease, record(2).committed(3.0))
    assert store.states()[2] is EpochState.COMMITTED


def test_an_old_layout_record_that_is_still_there_counts_when_further_advanced(
        tmp_path: Path) -> None:
    """An old name left next to a new one (a crash while renaming): readers take the
    furthest advanced state, and a new name before an old one of the same state."""
    _write_old_layout(tmp_path, record(4).committed(1.0), record(5))
    epochs = tmp_path / "epochs"
    (epochs / "000000000004.decided.json").write_text(json.dumps(record(4).to_dict()))
    newer = EpochRecord(5, EpochState.DECIDED, record(5).committables, 9.0)
    (epochs / "000000000005.decided.json").write_text(json.dumps(newer.to_dict()))
    store = DirectoryStateStore(tmp_path)
    assert store.states() == {4: EpochState.COMMITTED, 5: EpochState.DECIDED}
    assert store.get(4) == record(4).committed(1.0)
    assert store.get(5) == newer
    store.acquire("a")
    assert sorted(p.name for p in epochs.iterdir()) == [
        "000000000004.committed.json", "000000000005.decided.json"]
    assert store.records() == {4: record(4).committed(1.0), 5: newer}


def test_two_names_of_one_epoch_resolve_to_the_further_advanced_state(tmp_path: Path) -> None:
    """``put`` writes the new name, then removes the old: a crash in between (or an
    unsynced removal undone by a power loss) leaves both."""
    store = DirectoryStateStore(tmp_path)
    lease = store.acquire("a")
    store.put(lease, record(6))
    decided_name = tmp_path / "epochs" / "000000000006.decided.json"
    kept = decided_name.read_bytes()
    store.put(lease, record(6).committed(4.0))
    decided_name.write_bytes(kept)  # the removed name is back
    assert store.states() == {6: EpochState.COMMITTED}
    assert store.get(6) == record(6).committed(4.0)
    assert store.records() == {6: record(6).committed(4.0)}
    assert store.put_new(lease, record(6)) is False
    store.delete(lease, [6])
    assert list((tmp_path / "epochs").iterdir()) == []
    assert store.put_new(lease, record(6)) is True


def test_states_come_from_the_names_without_reading_the_records(tmp_path: Path) -> None:
    store = DirectoryStateStore(tmp_path)
    lease = store.acquire("a")
    store.put(lease, record(1))
    store.put(lease, record(2).committed(1.0))
    (tmp_path / "epochs" / "000000000001.decided.json").write_text("{not json")
    assert store.states() == {1: EpochState.DECIDED, 2: EpochState.COMMITTED}
    with pytest.raises(StateError, match="corrupt"):
        store.get(1)


def test_a_record_under_the_name_of_another_state_is_reported(tmp_path: Path) -> None:
    store = DirectoryStateStore(tmp_path)
    store.put(store.acquire("a"), record(1))
    epochs = tmp_path / "epochs"
    (epochs / "000000000001.decided.json").rename(epochs / "000000000001.committed.json")
    with pytest.raises(StateError, match=r"corrupt.*epoch 1 decided"):
        store.records()
