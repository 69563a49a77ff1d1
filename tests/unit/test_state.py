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
    assert [p.name for p in (tmp_path / "epochs").iterdir()] == ["000000000007.json"]
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
    (tmp_path / "epochs" / "000000000001.json").write_text("{not json")
    with pytest.raises(StateError, match="corrupt"):
        store.records()


def test_future_format_is_refused(tmp_path: Path) -> None:
    store = DirectoryStateStore(tmp_path)
    store.put(store.acquire("a"), record(1))
    path = tmp_path / "epochs" / "000000000001.json"
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
