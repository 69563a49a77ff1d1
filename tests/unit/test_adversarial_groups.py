"""An adversarial pass over groups and batch writes (issue 31): sequences users run.

Each test is one way found to lose, misplace or silently misread rows through the
public entry points, on real files targets (no server) driven through the coordinator
as the Spark data source drives it. A test marked ``xfail(strict=True)`` is a finding
not fixed yet: its reason says what goes wrong.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from txsink.config import load_pipeline
from txsink.coordinator import Coordinator, EpochOutcome
from txsink.cut import pipeline_cut
from txsink.errors import ConfigError, TxsinkError
from txsink.faults import AFTER_DECIDE, FaultInjector, FaultRule, InjectedFault
from txsink.group import TargetGroup, write_group
from txsink.model import Committable, TransactionContext
from txsink.plugins import get_plugins
from txsink.state import DirectoryStateStore
from txsink.targets import ROUTE_PREFIX, parse_targets
from txsink.writer import write_participant

from .test_group_cli import batch, pipeline


def _ids(path: Path) -> list[int]:
    return sorted(json.loads(line)["id"] for p in path.glob("part-*")
                  for line in p.read_text().splitlines())


def _group_write(f: Path, *, crash: str | None = None, owner: str = "job") -> int:
    """One batch write of the group in pipeline file ``f`` (two tasks)."""
    cfg = load_pipeline(f)
    group = cfg.create_backend()
    assert isinstance(group, TargetGroup)
    faults = FaultInjector([FaultRule(crash, None, "raise")]) if crash else FaultInjector()
    coord = Coordinator(group, DirectoryStateStore(Path(cfg.checkpoint) / "txsink"),
                        cfg.sink.sink_id, owner=owner, faults=faults)
    try:
        coord.start()
        epoch = coord.reserve_epoch()
        msgs: list[Committable] = []
        for p in range(2):
            msgs += write_group(group, epoch, p, 0, [batch(epoch, p)])
        assert coord.commit_epoch(epoch, msgs) is EpochOutcome.COMMITTED
        coord.store.release(coord.lease)
        return epoch
    finally:
        group.close()


def _events(epochs: range) -> list[int]:
    """The ids ``batch`` makes for the events target (every row) of ``epochs``."""
    return sorted(e * 100 + p * 10 + i for e in epochs for p in range(2) for i in range(3))


def _refusal(action: Callable[[], object]) -> str | None:
    """The message of the TxsinkError ``action`` raised (None: it went through)."""
    try:
        action()
    except TxsinkError as exc:
        return str(exc)
    return None


# -- a target moved to another place under the same name ------------------------------------


def test_a_target_moved_to_another_path_is_refused_or_the_cut_stays_true(
        tmp_path: Path) -> None:
    """A target given another path under the same name and backend was accepted: the
    state silently recorded the new options, and the cut then named epochs the moved
    target's new place never held."""
    f = pipeline(tmp_path)
    for _ in range(2):
        _group_write(f)
    assert pipeline_cut(f).cut == 1
    f.write_text(f.read_text().replace(f"{tmp_path}/totals", f"{tmp_path}/totals2"))
    refusal = _refusal(lambda: _group_write(f))
    if refusal is not None:  # the exact outcome: refused, one line, nothing written
        assert "\n" not in refusal
        assert not (tmp_path / "totals2").exists() or _ids(tmp_path / "totals2") == []
        return
    cut = pipeline_cut(f).cut
    # Every epoch up to the cut must be in the target where readers now read it.
    held = {json.loads(line)["txsink_epoch"] for p in (tmp_path / "totals2").glob("part-*")
            for line in p.read_text().splitlines()}
    assert set(range(cut + 1)) <= held, (
        f"the cut names epochs 0..{cut}, the moved target holds only {sorted(held)}")


def test_a_target_moved_while_an_epoch_is_decided_is_named_as_moved(tmp_path: Path) -> None:
    """Recovery of a DECIDED epoch after a move looked in the new place and said the
    participants were 'aborted or deleted outside txsink'; they sit in the old place."""
    f = pipeline(tmp_path)
    _group_write(f)
    with pytest.raises(InjectedFault):
        _group_write(f, crash=AFTER_DECIDE)
    f.write_text(f.read_text().replace(f"{tmp_path}/totals", f"{tmp_path}/totals2"))
    with pytest.raises(TxsinkError) as err:
        _group_write(f, owner="job-2")
    assert "aborted or deleted outside txsink" not in str(err.value)
    assert "totals" in str(err.value) and "path" in str(err.value)


def test_a_state_without_recorded_destinations_keeps_working_and_refuses_a_move(
        tmp_path: Path) -> None:
    """A state written before destinations were recorded runs on, records them, and is
    still refused a move (compared by the options it recorded)."""
    f = pipeline(tmp_path)
    _group_write(f)
    meta_file = tmp_path / "chk" / "txsink" / "meta.json"
    meta = json.loads(meta_file.read_text())
    for target in meta["targets"].values():
        del target["destination"]
    meta_file.write_text(json.dumps(meta))
    _group_write(f)
    recorded = json.loads(meta_file.read_text())["targets"]["totals"]["destination"]
    assert recorded == {"path": str(tmp_path / "totals")}
    meta_file.write_text(json.dumps(meta))  # without destinations again
    f.write_text(f.read_text().replace(f"{tmp_path}/totals", f"{tmp_path}/totals2"))
    refusal = _refusal(lambda: _group_write(f, owner="job-2"))
    assert refusal is not None and refusal.startswith("sink.targets[totals].path: ")
    assert "put path back" in refusal.lower() and "\n" not in refusal


@pytest.mark.promise("group-target-moved-refused", "cli")
def test_the_cut_of_a_moved_target_is_refused(tmp_path: Path) -> None:
    """The cut read the new place and named epochs it never held."""
    f = pipeline(tmp_path)
    _group_write(f)
    f.write_text(f.read_text().replace(f"{tmp_path}/totals", f"{tmp_path}/totals2"))
    with pytest.raises(ConfigError, match=r"^sink\.targets\[totals\]\.path: ") as err:
        pipeline_cut(f)
    assert err.value.field == "sink.targets[totals].path" and "\n" not in str(err.value)


def test_destinations_name_the_place_never_a_secret_or_a_tuning_option() -> None:
    """What each built-in backend counts as a move, on options as given and as recorded."""
    plugins = get_plugins()
    files = plugins.backend_class("files")
    assert files.destination({"path": "out", "format": "jsonl"}) == \
        files.destination({"path": str(Path("out").absolute()), "format": "parquet"})
    pg = plugins.backend_class("postgres")
    given = pg.destination({"dsn": "postgresql://u:hunter2@db:5433/shop", "table": "orders",
                            "password": "hunter2", "connect_timeout": "5"})
    assert given == {"dbname": "shop", "table": "public.orders"}
    # A failover promotes a standby at another address: the same place.
    assert pg.destination({"dsn": "postgresql://u@standby:5434/shop", "table": "orders"}) \
        == given
    assert pg.destination({"dsn": "host=db port=5433 dbname=shop",
                           "table": "public.orders2"})["table"] == "public.orders2"
    kafka = plugins.backend_class("kafka")
    assert kafka.destination({"kafka.bootstrap.servers": "a:9092", "topic": "t"}) == \
        kafka.destination({"kafka.bootstrap.servers": "b:9092,c:9092", "topic": "t"})
    assert kafka.destination({"topic": "t"}) != kafka.destination({"topic": "u"})
    s3 = plugins.backend_class("s3")
    assert s3.destination({"bucket": "b", "prefix": "p", "secret_access_key": "k"}) != \
        s3.destination({"bucket": "b", "prefix": "q"})


def test_a_single_sink_moved_under_its_kept_state_is_refused(tmp_path: Path) -> None:
    """A single files sink given another path under a kept checkpoint was accepted: the
    state's epochs sit in the old directory, recovery looked in the new one."""
    def run(path: Path) -> None:
        options = {"path": str(path), "format": "jsonl"}
        backend = get_plugins().create_backend("files", options)
        coord = Coordinator(backend, DirectoryStateStore(tmp_path / "chk"), "one",
                            backend_options=options)
        try:
            coord.start()
            epoch = coord.reserve_epoch()
            msgs = [write_participant(backend, TransactionContext("one", epoch, 0, 0), [
                pa.record_batch({"id": pa.array([epoch], pa.int64())})])]
            assert coord.commit_epoch(epoch, msgs) is EpochOutcome.COMMITTED
            coord.store.release(coord.lease)
        finally:
            backend.close()

    run(tmp_path / "a")
    with pytest.raises(ConfigError, match=r"^sink\.options\.path: sink 'one' moved") as err:
        run(tmp_path / "b")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "b").exists() or _ids(tmp_path / "b") == []


def test_a_single_sink_pipeline_moved_is_refused_before_its_preflight(tmp_path: Path) -> None:
    """``txsink run`` of a single sink whose path changed under its kept checkpoint is
    refused before the backend's preflight touches the new place."""
    from txsink.spark.pipeline import preflight

    f = tmp_path / "one.yaml"
    text = (f"source: {{type: rate}}\ncheckpoint: {tmp_path}/chk\nsink:\n  sink_id: one\n"
            f"  backend: files\n  options: {{path: {tmp_path}/a, format: jsonl}}\n")
    f.write_text(text)
    cfg = load_pipeline(f)
    backend = cfg.create_backend()
    coord = Coordinator(backend, DirectoryStateStore(tmp_path / "chk" / "txsink"), "one",
                        backend_options=cfg.sink.options)
    try:
        coord.start()
        coord.store.release(coord.lease)
    finally:
        backend.close()
    f.write_text(text.replace(f"{tmp_path}/a", f"{tmp_path}/b"))
    with pytest.raises(ConfigError, match=r"^sink\.options\.path: sink 'one' moved"):
        preflight(load_pipeline(f), get_plugins(), 1.0)
    assert not (tmp_path / "b").exists()


# -- a stream on a new state after the old one's claim was released -------------------------


def _stream_run(tmp_path: Path, query: str, owner: str, base: int) -> list[EpochOutcome]:
    """Two micro-batches of a streaming query into a files sink (one row per task)."""
    backend = get_plugins().create_backend(
        "files", {"path": str(tmp_path / "out"), "format": "jsonl"})
    coord = Coordinator(backend, DirectoryStateStore(tmp_path / "chk" / "txsink"), "s",
                        owner=owner)
    out: list[EpochOutcome] = []
    try:
        coord.start(query_id=query, stream=True)
        for batch_id in range(2):
            epoch = coord.stream_epoch(batch_id)
            msgs = [write_participant(backend, TransactionContext("s", epoch, p, 0), [
                pa.record_batch({"id": pa.array([base + batch_id * 10 + p], pa.int64())})])
                for p in range(2)]
            out.append(coord.commit_epoch(epoch, msgs))
        coord.store.release(coord.lease)
    finally:
        backend.close()
    return out


def test_a_new_query_after_the_documented_release_loses_no_batch(tmp_path: Path) -> None:
    assert _stream_run(tmp_path, "q-old", "old", 1000) == [EpochOutcome.COMMITTED] * 2
    shutil.rmtree(tmp_path / "chk")  # the checkpoint, and the state under it, deleted
    with pytest.raises(TxsinkError, match=r"state\.json") as err:
        _stream_run(tmp_path, "q-new", "new", 2000)
    assert "gone for good, delete" in str(err.value)
    os.remove(tmp_path / "out" / "_txsink" / "state.json")  # the remedy the error names
    refusal = _refusal(lambda: _stream_run(tmp_path, "q-new", "new", 2000))
    if refusal is not None:
        assert "\n" not in refusal  # refused loudly: acceptable
        assert _ids(tmp_path / "out") == [1000, 1001, 1010, 1011]
        return
    assert _ids(tmp_path / "out") == [1000, 1001, 1010, 1011, 2000, 2001, 2010, 2011]


# -- a column named twice --------------------------------------------------------------------


def _written(path: Path) -> list[Path]:
    return sorted(path.glob("part-*")) + sorted((path / "_txsink" / "pending").glob("*"))


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_a_target_select_naming_a_column_twice_is_refused_before_writing(
        tmp_path: Path, fmt: str) -> None:
    """``select: ["*", "upper(customer) AS customer"]`` (overriding a column, a common
    SQL habit) gave the target's rows the column twice: the Parquet file was unreadable
    ("Multiple matches for FieldRef"), JSON lines silently kept only the second value."""
    specs = parse_targets([{"name": "totals", "backend": "files",
                            "select": ["*", "upper(customer) AS customer"],
                            "options": {"path": str(tmp_path / "totals"), "format": fmt}}],
                          "shop")
    group = TargetGroup.from_specs("shop", specs)
    shaped = pa.record_batch({ROUTE_PREFIX + "totals": pa.StructArray.from_arrays(
        [pa.array([1], pa.int64()), pa.array(["ann"]), pa.array(["ANN"])],
        ["id", "customer", "customer"])})
    try:
        with pytest.raises(ConfigError) as info:
            write_group(group, 0, 0, 0, [shaped])
    finally:
        group.close()
    assert str(info.value).startswith("targets[totals].select: the rows of target 'totals' "
                                      "have the column 'customer' twice")
    assert "nothing was written" in str(info.value) and "\n" not in str(info.value)
    assert _written(tmp_path / "totals") == []


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_rows_with_a_column_twice_are_refused_by_a_group_and_a_single_sink(
        tmp_path: Path, fmt: str) -> None:
    """A frame with two columns of one name (Spark allows it: ``selectExpr("id",
    "amount AS id")``) went whole to every target of an unshaped group, or to a single
    sink: JSON lines kept the second value as the row's id, Parquet was unreadable."""
    rows = pa.RecordBatch.from_arrays([pa.array([1, 2], pa.int64()),
                                       pa.array([10, 20], pa.int64())], names=["id", "ID"])
    specs = parse_targets([{"name": "all", "backend": "files", "options": {
        "path": str(tmp_path / "all"), "format": fmt}}], "shop")
    group = TargetGroup.from_specs("shop", specs)
    try:
        with pytest.raises(ConfigError, match="the rows have the column 'ID' twice"):
            write_group(group, 0, 0, 0, [rows])
    finally:
        group.close()
    assert _written(tmp_path / "all") == []
    single = get_plugins().create_backend("files", {"path": str(tmp_path / "one"),
                                                    "format": fmt})
    try:
        with pytest.raises(ConfigError, match="the rows have the column 'ID' twice") as info:
            write_participant(single, TransactionContext("one", 0, 0, 0), [rows])
    finally:
        single.close()
    assert "nothing was written" in str(info.value) and "\n" not in str(info.value)
    assert _written(tmp_path / "one") == []


@pytest.mark.promise("group-target-moved-refused", "cli")
def test_reset_after_a_target_moved_refuses_or_deletes_what_the_state_wrote(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Reset after a move deleted the new (empty) place and the checkpoint, and left the
    old place's epochs claimed by a state that no longer existed."""
    from txsink.cli import main

    f = pipeline(tmp_path)
    _group_write(f)
    f.write_text(f.read_text().replace(f"{tmp_path}/totals", f"{tmp_path}/totals2"))
    code = main(["reset", str(f), "--yes"])
    capsys.readouterr()
    if code != 0:
        return  # refused: nothing deleted, the file can be put back first
    assert _ids(tmp_path / "events") == []
    assert _ids(tmp_path / "totals") == [], "reset left the epochs the state wrote"


@pytest.mark.promise("resolve-unknown-epoch-error", "cli")
def test_resolve_of_a_negative_epoch_is_refused_not_called_committed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`txsink resolve CHK --epoch -1 --abort` answered "epoch -1 of sink 'shop' is
    committed; nothing to do" with exit status 0."""
    from txsink.cli import main

    f = pipeline(tmp_path)
    _group_write(f)
    with pytest.raises(SystemExit) as exit_:
        main(["resolve", str(tmp_path / "chk"), "--epoch", "-1", "--abort"])
    out, err = capsys.readouterr()
    assert exit_.value.code == 2
    assert "is committed" not in out + err
    assert "'-1' is not an epoch: give a whole number >= 0" in err


def test_an_epoch_whose_reservation_resolve_dropped_is_never_allocated_again(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`txsink resolve --epoch N --abort` of a grouped write still preparing dropped its
    reservation without remembering N: the next batch write got N again, while the
    fenced writer's participants of N (prepared after the abort) could still be about."""
    from txsink.cli import main
    from txsink.coordinator import record_prepared

    f = pipeline(tmp_path)
    _group_write(f)
    cfg = load_pipeline(f)
    group = cfg.create_backend()
    assert isinstance(group, TargetGroup)
    coord = Coordinator(group, DirectoryStateStore(Path(cfg.checkpoint) / "txsink"),
                        cfg.sink.sink_id, owner="slow-job")
    try:
        coord.start()
        epoch = coord.reserve_epoch()
        msgs: list[Committable] = []
        for p in range(2):
            msgs += write_group(group, epoch, p, 0, [batch(epoch, p)])
        record_prepared(coord.store, "slow-job", epoch, msgs, None)
        assert main(["resolve", str(tmp_path / "chk"), "--epoch", str(epoch), "--abort"]) == 0
        assert "the reservation of the write that did not finish is dropped" in (
            capsys.readouterr().out)
        with pytest.raises(TxsinkError, match="took over this sink"):
            coord.commit_epoch(epoch, msgs)
    finally:
        group.close()
    assert _group_write(f, owner="next-job") == epoch + 1
    assert _ids(tmp_path / "events") == sorted(
        [*_events(range(1)), *(i + 100 for i in _events(range(1, 2)))])
