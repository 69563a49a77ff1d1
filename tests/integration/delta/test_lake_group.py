"""Delta and Iceberg as targets of a group with the files backend: one decision per
epoch, and still ONE log entry / snapshot per table per epoch, whichever target the
coordinator commits first, also when a crash stops the commit half way."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from txsink.coordinator import Coordinator, EpochOutcome
from txsink.faults import AFTER_FIRST_COMMIT, FaultInjector, FaultRule, InjectedFault
from txsink.group import TargetGroup, write_group
from txsink.plugins import build_plugins
from txsink.state import DirectoryStateStore
from txsink.targets import TargetSpec, target_sink_id
from txsink_delta.backend import DeltaBackend
from txsink_iceberg.backend import IcebergBackend

from tests.integration.delta.test_delta_backend import log_entries
from tests.integration.delta.test_delta_conformance import read_table_ids
from tests.integration.iceberg.test_iceberg_conformance import read_table_ids as read_iceberg

pytestmark = pytest.mark.integration

GROUP = "orders"


def specs(tmp_path: Path, order: tuple[str, ...]) -> list[TargetSpec]:
    options = {"delta": ("delta", {"path": str(tmp_path / "delta")}),
               "iceberg": ("iceberg", {"warehouse": str(tmp_path / "wh"),
                                       "table": "db.orders"}),
               "files": ("files", {"path": str(tmp_path / "files")})}
    return [TargetSpec(n, options[n][0], options[n][1]) for n in order]


def epoch_rows(epoch: int, partition: int) -> pa.RecordBatch:
    base = epoch * 1000 + partition * 100
    return pa.record_batch({"id": pa.array(range(base, base + 10), pa.int64())})


@pytest.mark.parametrize("order", [("delta", "iceberg", "files"),
                                   ("files", "iceberg", "delta")])
def test_one_entry_per_table_per_epoch_in_a_group(tmp_path: Path,
                                                  order: tuple[str, ...]) -> None:
    plugins = build_plugins()

    def coordinator(faults: FaultInjector | None = None) -> tuple[Coordinator, TargetGroup]:
        group = TargetGroup.from_specs(GROUP, specs(tmp_path, order), plugins)
        return Coordinator(group, DirectoryStateStore(tmp_path / "state"), GROUP,
                           plugins=plugins, faults=faults or FaultInjector()), group

    crash = FaultInjector([FaultRule(AFTER_FIRST_COMMIT, 1, "raise")])
    coord, group = coordinator(crash)
    coord.start()
    assert coord.commit_epoch(0, [c for p in range(4) for c in
                                  write_group(group, 0, p, 0, [epoch_rows(0, p)])]
                              ) is EpochOutcome.COMMITTED
    with pytest.raises(InjectedFault):
        coord.commit_epoch(1, [c for p in range(4) for c in
                               write_group(group, 1, p, 0, [epoch_rows(1, p)])])
    coord, group = coordinator()
    assert coord.start().recommitted_epochs == [1]

    want = sorted(e * 1000 + p * 100 + i for e in (0, 1) for p in range(4) for i in range(10))
    delta = group.member("delta").backend
    iceberg = group.member("iceberg").backend
    assert isinstance(delta, DeltaBackend) and isinstance(iceberg, IcebergBackend)
    assert sorted(read_table_ids(delta.path)) == want
    assert sorted(read_iceberg(iceberg)) == want
    delta_sink = target_sink_id(GROUP, "delta")
    assert [e["txsink.epoch"] for e in log_entries(tmp_path / "delta")
            if e.get("txsink.sink") == delta_sink] == ["0", "1"]
    snapshots = iceberg._load().snapshots()
    assert [s.summary["txsink.epoch"] for s in snapshots] == ["0", "1"]
    assert group.highest_epochs() == {"delta": 1, "iceberg": 1, "files": 1}
    assert delta.list_prepared(delta_sink) == []
    assert iceberg.list_prepared(target_sink_id(GROUP, "iceberg")) == []


@pytest.mark.promise("iceberg-schema-checked-before-decision", "backend")
@pytest.mark.promise("delta-schema-checked-before-decision", "backend")
@pytest.mark.parametrize("table", ["delta", "iceberg"])
def test_rows_that_do_not_fit_the_table_are_refused_before_the_decision(
        tmp_path: Path, table: str) -> None:
    """An epoch whose frame gained a column: the table would refuse its files at commit,
    after the decision, with the files target of the group holding the epoch already
    (half an epoch visible, the table stuck on it). Refused before the decision instead:
    no target shows any of it, no participant is left, the error names the column."""
    import glob

    from txsink.errors import ConfigError
    from txsink.state import EpochState

    plugins = build_plugins()
    group = TargetGroup.from_specs(GROUP, specs(tmp_path, ("files", table)), plugins)
    coord = Coordinator(group, DirectoryStateStore(tmp_path / "state"), GROUP, plugins=plugins)
    coord.start()
    assert coord.commit_epoch(0, write_group(group, 0, 0, 0, [epoch_rows(0, 0)])
                              ) is EpochOutcome.COMMITTED
    wider = pa.record_batch({"id": pa.array([5000], pa.int64()), "extra": pa.array(["x"])})
    with pytest.raises(ConfigError, match="nothing of the epoch is committed") as refused:
        coord.commit_epoch(1, write_group(group, 1, 0, 0, [wider]))
    assert refused.value.field == "extra"
    assert EpochState.DECIDED not in coord.store.states().values()
    visible = [p for p in glob.glob(str(tmp_path / "files" / "*.parquet"))]
    assert len(visible) == 1  # epoch 0's file only
    member = group.member(table).backend
    ids = (read_table_ids(str(tmp_path / "delta")) if table == "delta"
           else read_iceberg(member))  # type: ignore[arg-type]
    assert sorted(ids) == list(range(10))
    assert member.list_prepared(target_sink_id(GROUP, table)) == []


@pytest.mark.promise("iceberg-sink-owner", "backend")
@pytest.mark.promise("delta-sink-owner", "backend")
@pytest.mark.parametrize("table", ["delta", "iceberg"])
def test_a_new_state_for_a_sink_id_the_table_holds_is_refused(
        tmp_path: Path, table: str) -> None:
    """The checkpoint was deleted with its state, and the query started again: Spark
    reads the source from its start. Every other backend records which state owns the
    sink id and refuses the new one; a table took it, and the new query wrote every row
    a second time. The refusal names the owner file to delete once the old query is
    gone for good; until then the table keeps each row once."""
    from txsink.errors import SinkOwnedError

    plugins = build_plugins()

    def run(state: str, epochs: range) -> None:
        group = TargetGroup.from_specs(GROUP, specs(tmp_path, (table,)), plugins)
        coord = Coordinator(group, DirectoryStateStore(tmp_path / state), GROUP,
                            plugins=plugins)
        coord.start()
        for e in epochs:
            epoch = coord.reserve_epoch()
            assert coord.commit_epoch(epoch, write_group(group, epoch, 0, 0, [epoch_rows(e, 0)])
                                      ) is EpochOutcome.COMMITTED

    run("state", range(2))
    run("state", range(2, 3))  # the same state again: its own sink id
    with pytest.raises(SinkOwnedError, match=r"_owner\.json") as refused:
        run("state-new", range(3))  # the source read again from its start
    assert str(tmp_path / "state-new") not in str(refused.value.owner_state)
    member = TargetGroup.from_specs(GROUP, specs(tmp_path, (table,)), plugins).member(table)
    ids = (read_table_ids(str(tmp_path / "delta")) if table == "delta"
           else read_iceberg(member.backend))  # type: ignore[arg-type]
    assert sorted(ids) == sorted(e * 1000 + i for e in range(3) for i in range(10))


@pytest.mark.parametrize("table", ["delta", "iceberg"])
def test_a_table_of_another_query_leaves_the_files_target_unclaimed(
        tmp_path: Path, table: str) -> None:
    """The files target comes first: before the group checked every claim, it was
    claimed and kept bound to a state the refused run then deleted. The table's check
    reads its owner file and writes none."""
    from txsink.errors import SinkOwnedError

    plugins = build_plugins()
    group = TargetGroup.from_specs(GROUP, specs(tmp_path, ("files", table)), plugins)
    lake = group.member(table).backend
    sink = target_sink_id(GROUP, table)
    try:
        lake.check_claim(sink, "state-new", "/new")  # no owner file: nothing to refuse
        assert not list(tmp_path.rglob("_owner.json"))
        lake.claim_sink(sink, "state-old", "/old")  # another query's
        owner_files = list(tmp_path.rglob("_owner.json"))
        with pytest.raises(SinkOwnedError, match=r"_owner\.json") as refused:
            group.claim_sink(GROUP, "state-new", "/new")
        assert refused.value.owner_state == "/old"
        assert not (tmp_path / "files" / "_txsink" / "state.json").exists()
        assert list(tmp_path.rglob("_owner.json")) == owner_files
    finally:
        group.close()
