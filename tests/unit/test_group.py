"""A group of targets in the core: one state, one decision per epoch over every target.

The targets are in-memory systems (each like a database with prepared transactions);
each test would fail if the group lost the all-or-none of an epoch, routed a row to
the wrong target, or forgot which target a participant belongs to.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from txsink.coordinator import Coordinator, EpochOutcome, RetryPolicy
from txsink.errors import ConfigError, RetriableCommitError, StateError
from txsink.faults import POINTS, FaultInjector, FaultRule, InjectedFault
from txsink.group import Member, TargetGroup, write_group
from txsink.model import Committable, DeliveryGuarantee
from txsink.plugins import build_plugins
from txsink.state import DirectoryStateStore, EpochState
from txsink.targets import ROUTE_PREFIX, TargetSpec, parse_targets, target_sink_id
from txsink.testing import memory
from txsink.testing.memory import MemoryBackend

GROUP = "orders"
NAMES = ("events", "totals", "archive")


class GroupEnv:
    def __init__(self, tmp_path: Path, names: tuple[str, ...] = NAMES) -> None:
        self.systems = {n: f"grp-{n}-{uuid.uuid4().hex[:8]}" for n in names}
        self.state_dir = tmp_path / "state"
        self.names = names
        self.plugins = build_plugins(entry_points=[], extra_plugins=[("memory", memory)])

    def group(self, names: tuple[str, ...] | None = None,
              epoch_column: str | None = None) -> TargetGroup:
        specs = [TargetSpec(n, "memory", {"system": self.systems[n]},
                            epoch_column=epoch_column) for n in (names or self.names)]
        return TargetGroup(GROUP, [Member(s, MemoryBackend(self.systems[s.name]),
                                          target_sink_id(GROUP, s.name)) for s in specs])

    def store(self) -> DirectoryStateStore:
        return DirectoryStateStore(self.state_dir)

    def coordinator(self, faults: FaultInjector | None = None,
                    group: TargetGroup | None = None, **kw: Any) -> Coordinator:
        kw.setdefault("retry", RetryPolicy(attempts=3, initial_backoff_s=0, sleep=lambda s: None))
        return Coordinator(group or self.group(), self.store(), GROUP, plugins=self.plugins,
                           faults=faults or FaultInjector(), **kw)

    def prepare(self, epoch: int, partitions: int = 2, attempt: int = 0,
                group: TargetGroup | None = None) -> list[Committable]:
        g = group or self.group()
        out: list[Committable] = []
        for p in range(partitions):
            out += write_group(g, epoch, p, attempt, [batch(epoch, p)])
        return out

    def ids(self, name: str) -> list[int]:
        return sorted(r["id"] for r in memory.system(self.systems[name]).rows())

    def prepared(self, name: str) -> int:
        return len(memory.system(self.systems[name]).prepared)


def batch(epoch: int, partition: int, n: int = 5) -> pa.RecordBatch:
    base = epoch * 1000 + partition * 100
    return pa.record_batch({"id": pa.array(range(base, base + n), pa.int64())})


def want(epochs: range, partitions: int = 2, n: int = 5) -> list[int]:
    return sorted(e * 1000 + p * 100 + i for e in epochs for p in range(partitions)
                  for i in range(n))


@pytest.fixture
def genv(tmp_path: Path) -> Iterator[GroupEnv]:
    e = GroupEnv(tmp_path)
    yield e
    for name in e.systems.values():
        memory.SYSTEMS.pop(name, None)


def test_one_decision_record_holds_every_targets_participants(genv: GroupEnv) -> None:
    coord = genv.coordinator()
    coord.start()
    for epoch in range(2):
        assert coord.commit_epoch(epoch, genv.prepare(epoch)) is EpochOutcome.COMMITTED
    for name in NAMES:
        assert genv.ids(name) == want(range(2))
        assert genv.prepared(name) == 0
    record = genv.store().get(1)
    assert record is not None and record.state is EpochState.COMMITTED
    assert sorted({c.target for c in record.committables}) == sorted(NAMES)
    assert {c.sink_id for c in record.committables} == {f"{GROUP}--{n}" for n in NAMES}
    raw = json.loads(next((genv.state_dir / "epochs").glob("000000000001.*")).read_text())
    assert {c["v"] for c in raw["committables"]} == {2}
    meta = genv.store().read_meta()
    assert meta is not None and meta.backend == "group"
    assert {n: t["backend"] for n, t in meta.targets.items()} == dict.fromkeys(NAMES, "memory")


@pytest.mark.parametrize("point", POINTS)
def test_a_crash_at_any_point_leaves_every_target_all_or_none(genv: GroupEnv,
                                                               point: str) -> None:
    genv.coordinator().commit_epoch(0, genv.prepare(0))
    with pytest.raises(InjectedFault):
        genv.coordinator(FaultInjector([FaultRule(point, 1, "raise")])).commit_epoch(
            1, genv.prepare(1))
    seen = {n: genv.ids(n) for n in NAMES}
    if point != "after-first-commit":  # between the first commit and the rest: some show it
        assert len({tuple(v) for v in seen.values()}) == 1
    report = genv.coordinator().start()  # the next run: recovery
    decided = point != "before-decide"
    for name in NAMES:
        assert genv.ids(name) == want(range(2 if decided else 1)), name
        assert genv.prepared(name) == 0, name
    if point in ("after-decide", "after-first-commit", "before-mark-committed"):
        assert report.recommitted_epochs == [1]


def test_a_participant_that_cannot_be_committed_names_target_and_participant(
        genv: GroupEnv) -> None:
    msgs = genv.prepare(0)
    memory.system(genv.systems["totals"]).fail_next_commits = 100
    with pytest.raises(RetriableCommitError) as info:
        genv.coordinator().commit_epoch(0, msgs)
    text = str(info.value)
    assert "target totals: orders--totals-e0-p0-a0" in text
    assert "target=totals" in text
    assert genv.store().get(0).state is EpochState.DECIDED  # type: ignore[union-attr]
    memory.system(genv.systems["totals"]).fail_next_commits = 0
    assert genv.coordinator().start().recommitted_epochs == [0]
    for name in NAMES:
        assert genv.ids(name) == want(range(1))


def test_orphans_of_every_target_are_aborted(genv: GroupEnv) -> None:
    lost = genv.prepare(0, partitions=1, attempt=7)  # a task attempt Spark never reported
    genv.coordinator().commit_epoch(0, genv.prepare(0))
    assert all(genv.prepared(n) == 0 for n in NAMES)
    assert {c.target for c in lost} == set(NAMES)
    for name in NAMES:
        assert genv.ids(name) == want(range(1))


def test_a_replay_of_a_committed_epoch_is_aborted_in_every_target(genv: GroupEnv) -> None:
    genv.coordinator().commit_epoch(0, genv.prepare(0))
    again = genv.prepare(0, attempt=3)
    assert genv.coordinator().commit_epoch(0, again) is EpochOutcome.REPLAYED
    for name in NAMES:
        assert genv.ids(name) == want(range(1))
        assert genv.prepared(name) == 0


def test_an_epoch_without_a_participant_in_some_target_is_refused(genv: GroupEnv) -> None:
    msgs = [c for c in genv.prepare(0) if c.target != "archive"]
    with pytest.raises(StateError, match=r"no participant in target\(s\) archive"):
        genv.coordinator().commit_epoch(0, msgs)
    assert all(genv.ids(n) == [] for n in NAMES)
    assert all(genv.prepared(n) == 0 for n in NAMES)


def test_a_committable_of_another_target_or_untagged_is_refused(genv: GroupEnv) -> None:
    msgs = genv.prepare(0)
    import dataclasses

    bad = [dataclasses.replace(msgs[0], target=None), *msgs[1:]]
    with pytest.raises(StateError, match="does not belong"):
        genv.coordinator().commit_epoch(0, bad)
    assert all(genv.ids(n) == [] for n in NAMES)


def test_the_targets_of_a_group_cannot_change(genv: GroupEnv) -> None:
    genv.coordinator().commit_epoch(0, genv.prepare(0))
    with pytest.raises(ConfigError) as info:
        genv.coordinator(group=genv.group(("events", "totals"))).start()
    assert "its targets were archive (memory), events (memory), totals (memory)" in str(
        info.value)
    assert info.value.field == "targets"


def test_a_single_target_state_of_an_older_release_still_reads(tmp_path: Path) -> None:
    """Version 1 committables (no target) as an older txsink wrote them."""
    store = DirectoryStateStore(tmp_path)
    (tmp_path / "epochs").mkdir(parents=True)
    old = {"v": 1, "epoch": 0, "state": "committed", "decided_at": 1.0, "committed_at": 2.0,
           "committables": [{"v": 1, "backend": "files", "sink_id": "s", "epoch": 0,
                             "partition": 0, "attempt": 0, "participant": "s-e0-p0-a0",
                             "rows": 3, "payload_version": 1, "payload": {"x": 1}}]}
    (tmp_path / "epochs" / "000000000000.committed.json").write_text(json.dumps(old))
    record = store.get(0)
    assert record is not None and record.committables[0].target is None
    assert record.committables[0].to_dict()["v"] == 1


def test_shaped_rows_go_to_their_target_with_the_epoch_column(genv: GroupEnv) -> None:
    g = genv.group(epoch_column="txsink_epoch")
    ids = pa.array([1, 2, 3], pa.int64())
    shaped = pa.record_batch({
        ROUTE_PREFIX + "events": pa.StructArray.from_arrays([ids], ["id"]),
        ROUTE_PREFIX + "totals": pa.StructArray.from_arrays(
            [pa.array([10, 20, 30], pa.int64())], ["id"],
            mask=pa.array([False, True, False])),
        ROUTE_PREFIX + "archive": pa.StructArray.from_arrays(
            [ids], ["id"], mask=pa.array([True, True, True])),
    })
    msgs = write_group(g, 4, 0, 0, [shaped])
    assert {c.target: c.rows for c in msgs} == {"events": 3, "totals": 2, "archive": 0}
    genv.coordinator(group=g).commit_epoch(4, msgs)
    assert genv.ids("totals") == [10, 30]
    rows = memory.system(genv.systems["events"]).rows()
    assert rows == [{"id": 1, "txsink_epoch": 4}, {"id": 2, "txsink_epoch": 4},
                    {"id": 3, "txsink_epoch": 4}]
    assert genv.ids("archive") == []


def test_a_failed_task_leaves_nothing_prepared_in_any_target(genv: GroupEnv) -> None:
    def boom() -> None:
        raise RuntimeError("task died")

    with pytest.raises(RuntimeError):
        write_group(genv.group(), 0, 0, 0, [batch(0, 0)], before_prepare=boom)
    assert all(genv.prepared(n) == 0 for n in NAMES)


def test_a_state_older_than_the_targets_names_who_holds_the_epoch(genv: GroupEnv) -> None:
    """Restored from a backup taken while epoch 0 was half committed."""
    import shutil

    backup = genv.state_dir.parent / "backup"
    genv.coordinator().start()
    shutil.copytree(genv.state_dir, backup)
    with pytest.raises(InjectedFault):
        genv.coordinator(FaultInjector([FaultRule("after-first-commit", 0, "raise")])
                         ).commit_epoch(0, genv.prepare(0))
    shutil.rmtree(genv.state_dir)
    shutil.copytree(backup, genv.state_dir)
    coord = genv.coordinator()
    coord.start(recover=False)
    with pytest.raises(StateError) as info:
        coord.commit_epoch(0, genv.prepare(0, attempt=9))
    assert "target(s) events already hold epoch 0" in str(info.value)
    assert "target(s) totals, archive do not" in str(info.value)


def test_a_target_failed_over_brings_back_a_participant_rolled_forward(
        genv: GroupEnv) -> None:
    """A standby of one target holds a decided participant prepared again: the decision
    (even pruned into the archive, which keeps the target) rolls it forward."""
    system = memory.system(genv.systems["totals"])
    coord = genv.coordinator(retain_epochs=2)
    coord.start()
    msgs = genv.prepare(0)
    standby = None

    def snapshot_after_decide(point: str, epoch: int | None) -> None:
        nonlocal standby
        if point == "after-decide" and epoch == 0:
            standby = system.snapshot()

    coord.faults = FaultInjector(callback=snapshot_after_decide)
    coord.commit_epoch(0, msgs)
    coord.faults = FaultInjector()
    for epoch in range(1, 6):
        coord.commit_epoch(epoch, genv.prepare(epoch))
    archived = json.loads((genv.state_dir / "archive" / "00000000.json").read_text())
    assert [0, 0, "totals"] in archived["epochs"]["0"]["names"]
    assert standby is not None
    system.restore(standby)  # failed over: epoch 0 prepared again, later epochs gone
    genv.coordinator().start()
    assert genv.ids("totals") == want(range(1))
    assert genv.prepared("totals") == 0


def test_parse_targets_errors_name_the_target(genv: GroupEnv) -> None:
    def parse(items: Any, **kw: Any) -> Any:
        return parse_targets(items, GROUP, plugins=genv.plugins, **kw)

    cases: list[tuple[Any, str]] = [
        ([], "targets: must be a non-empty list"),
        ([{"name": "Events", "backend": "memory"}], "targets[0].name: 'Events' is not a valid"),
        ([{"name": "a", "backend": "memory", "optoins": {}}],
         "targets[a].optoins: unknown field (did you mean 'options'?)"),
        ([{"name": "a", "backend": "nope"}], "targets[a].backend:"),
        ([{"name": "a", "backend": "memory", "options": {"sytem": "x"}}],
         "targets[a].options.sytem: memory backend: unknown option(s) 'sytem'"),
        ([{"name": "a", "backend": "memory"}, {"name": "a", "backend": "memory"}],
         "targets[a].name: two targets are named 'a'"),
        ([{"name": "a", "backend": "memory", "epoch_column": "x y"}],
         "targets[a].epoch_column: must be a column name"),
        ([{"name": "a" * 32, "backend": "memory"}], "would be longer than 64"),
    ]
    for items, message in cases:
        with pytest.raises(ConfigError) as info:
            parse(items) if "longer" not in message else parse_targets(
                items, "g" * 40, plugins=genv.plugins)
        assert message in str(info.value), (items, str(info.value))
        assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="needs exactly_once"):
        parse([{"name": "a", "backend": "memory"}], guarantee=DeliveryGuarantee.AT_LEAST_ONCE)
    specs = parse([{"name": "a", "backend": "memory", "options": {"System": "x"},
                    "select": "id, id * 2 AS twice", "where": " id > 0 "}])
    assert specs[0].options == {"system": "x"}
    assert specs[0].select == ("id, id * 2 AS twice",) and specs[0].where == "id > 0"


class _SecretMemory(MemoryBackend):
    """A memory target with a password, and a committable that may carry a string."""

    def __init__(self, system_name: str, secret: str, payload_note: str = "") -> None:
        super().__init__(system_name)
        self.secret = secret
        self.note = payload_note

    def secret_values(self) -> list[str]:
        return [self.secret]

    def pre_commit(self, txn: Any) -> Committable:
        import dataclasses

        c = super().pre_commit(txn)
        return dataclasses.replace(c, payload={**c.payload, "note": self.note})


@pytest.mark.promise("secret-in-committable-refused", "backend")
def test_each_target_is_checked_for_its_own_secrets(genv: GroupEnv) -> None:
    """A bucket may be named like another target's password; a target's own secret in
    its committable is refused, naming the target."""
    def group(note: str) -> TargetGroup:
        a = TargetSpec("events", "memory", {"system": genv.systems["events"]})
        b = TargetSpec("totals", "memory", {"system": genv.systems["totals"]})
        return TargetGroup(GROUP, [
            Member(a, _SecretMemory(genv.systems["events"], "shared-name", note),
                   target_sink_id(GROUP, "events")),
            Member(b, _SecretMemory(genv.systems["totals"], "totals-pw", "shared-name"),
                   target_sink_id(GROUP, "totals"))])

    g = group("")
    genv.coordinator(group=g).commit_epoch(0, write_group(g, 0, 0, 0, [batch(0, 0)]))
    assert genv.ids("totals") == [0, 1, 2, 3, 4]
    g = group("totals-pw")  # events now carries totals' password: not events' own secret
    genv.coordinator(group=g).commit_epoch(1, write_group(g, 1, 0, 0, [batch(1, 0)]))
    g = group("shared-name")  # events carries its own secret: refused
    from txsink.errors import PluginError

    with pytest.raises(PluginError) as info:
        genv.coordinator(group=g).commit_epoch(2, write_group(g, 2, 0, 0, [batch(2, 0)]))
    assert "backend 'memory' (target events) put a secret into the committable" in str(
        info.value)
    assert genv.ids("events") == want(range(2), partitions=1)


@pytest.mark.promise("reset-all-or-none", "cli")
def test_a_group_resets_every_target_or_none(genv: GroupEnv, tmp_path: Path) -> None:
    """A target whose backend cannot delete what it wrote is named before anything goes."""
    from txsink.files.backend import FilesBackend

    files = TargetSpec("files", "files", {"path": str(tmp_path / "out")})
    mem = TargetSpec("events", "memory", {"system": genv.systems["events"]})
    fb = FilesBackend(str(tmp_path / "out"))
    g = TargetGroup(GROUP, [Member(files, fb, target_sink_id(GROUP, "files")),
                            Member(mem, MemoryBackend(genv.systems["events"]),
                                   target_sink_id(GROUP, "events"))])
    genv.coordinator(group=g).commit_epoch(0, write_group(g, 0, 0, 0, [batch(0, 0)]))
    assert list((tmp_path / "out").glob("part-*"))
    with pytest.raises(NotImplementedError, match="target 'events': the memory backend "
                       "cannot delete what a sink wrote, so no target of the group is reset"):
        g.reset_sink(GROUP)
    assert list((tmp_path / "out").glob("part-*"))  # nothing deleted


def test_a_target_that_aborted_a_decided_participant_salvages_it_under_its_own_sink_id(
        genv: GroupEnv) -> None:
    """The driver of a group was down too long: one target aborted its prepared
    participants on its own. The group hands each to its own target, which writes it
    again under the target's sink id; every target then holds the epoch once."""
    from txsink.faults import AFTER_DECIDE
    from txsink.model import parse_participant

    msgs = genv.prepare(0)
    with pytest.raises(InjectedFault):
        genv.coordinator(FaultInjector([FaultRule(AFTER_DECIDE, 0, "raise")])
                         ).commit_epoch(0, msgs)
    lost = [c for c in msgs if c.target == "totals"]
    for c in lost:
        memory.system(genv.systems["totals"]).expire(c.participant)
    assert genv.coordinator().start().recommitted_epochs == [0]
    for name in NAMES:
        assert genv.ids(name) == want(range(1)), name
        assert genv.prepared(name) == 0, name
    record = genv.store().get(0)
    assert record is not None and record.state is EpochState.COMMITTED
    assert sorted(o for _, o in record.salvaged) == sorted(c.participant for c in lost)
    for replacement, _ in record.salvaged:
        ctx = parse_participant(replacement)
        assert ctx is not None and ctx.sink_id == f"{GROUP}--totals"
        c = next(c for c in record.committables if c.participant == replacement)
        assert c.target == "totals"
