"""A group of targets from a pipeline file, without Spark: validate, status, resolve, cut.

The targets are files directories; the epochs are driven through the coordinator as a
Spark query would drive them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from txsink.cli import main
from txsink.config import load_pipeline
from txsink.coordinator import Coordinator
from txsink.cut import pipeline_cut
from txsink.faults import AFTER_FIRST_COMMIT, FaultInjector, FaultRule, InjectedFault
from txsink.group import TargetGroup, write_group
from txsink.model import Committable
from txsink.state import DirectoryStateStore, EpochState
from txsink.targets import ROUTE_PREFIX


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def pipeline(tmp_path: Path, extra: str = "") -> Path:
    f = tmp_path / "group.yaml"
    f.write_text(f"""
source: {{type: rate}}
checkpoint: {tmp_path}/chk
sink:
  sink_id: shop
  targets:
    - name: events
      backend: files
      options: {{path: {tmp_path}/events, format: jsonl}}
    - name: totals
      backend: files
      select: [id, "id * 2 AS twice"]
      where: id % 2 = 0
      epoch_column: txsink_epoch
      options: {{path: {tmp_path}/totals, format: jsonl}}
{extra}""")
    return f


def batch(epoch: int, partition: int) -> pa.RecordBatch:
    """One task's rows shaped for the group, as Spark hands them to the data source:
    events gets every id, totals (``where: id % 2 = 0``) the even ones with ``twice``."""
    base = epoch * 100 + partition * 10
    ids = pa.array(range(base, base + 3), pa.int64())
    return pa.record_batch({
        ROUTE_PREFIX + "events": pa.StructArray.from_arrays([ids], ["id"]),
        ROUTE_PREFIX + "totals": pa.StructArray.from_arrays(
            [ids, pa.array([2 * i for i in ids.to_pylist()], pa.int64())], ["id", "twice"],
            mask=pa.array([i % 2 != 0 for i in ids.to_pylist()]))})


def evens(epochs: range) -> list[int]:
    return sorted(i for e in epochs for p in range(2)
                  for i in range(e * 100 + p * 10, e * 100 + p * 10 + 3) if i % 2 == 0)


def run_epochs(f: Path, epochs: range, *, crash: str | None = None) -> None:
    cfg = load_pipeline(f)
    group = cfg.create_backend()
    assert isinstance(group, TargetGroup)
    store = DirectoryStateStore(Path(cfg.checkpoint) / "txsink")
    faults = FaultInjector([FaultRule(crash, None, "raise")]) if crash else FaultInjector()
    coordinator = Coordinator(group, store, cfg.sink.sink_id, faults=faults)
    coordinator.start()
    try:
        for epoch in epochs:
            msgs: list[Committable] = []
            for p in range(2):
                msgs += write_group(group, epoch, p, epoch * 10 + p, [batch(epoch, p)])
            coordinator.commit_epoch(epoch, msgs)
        store.release(coordinator.lease)  # the run ended (as `txsink run` releases it)
    finally:
        group.close()


def test_validate_summarises_the_group(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "validate", "--no-spark", str(pipeline(tmp_path)))
    assert code == 0
    assert ("sink: group sink_id=shop, one decision per epoch over 2 targets [events: files"
            in out)
    assert "totals: files (shaped)" in out


@pytest.mark.parametrize(("target", "field"), [
    ("{name: events, backend: files, options: {path: /tmp/x, format: xml}}",
     "sink.targets[events].options.format"),
    ("{name: events, backend: files, options: {path: /tmp/x, colour: red}}",
     "sink.targets[events].options.colour"),
    ("{name: events, backend: nosuch}", "sink.targets[events].backend"),
    ("{name: events, backend: files, selct: [a]}", "sink.targets[events].selct"),
    ("{name: Events, backend: files}", "sink.targets[0].name"),
])
def test_bad_target_options_are_one_line_naming_the_target(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str, field: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(f"source: {{type: rate}}\ncheckpoint: {tmp_path}/chk\n"
                 f"sink: {{sink_id: s, targets: [{target}]}}\n")
    for command in ("validate", "run"):
        code, _, err = _run(capsys, command, str(f))
        assert code == 1
        assert err.startswith(f"txsink: config error: {field}:"), err
        assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "chk").exists()


@pytest.mark.promise("group-at-least-once-refused", "cli")
def test_a_group_refuses_a_non_transactional_guarantee(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    f = pipeline(tmp_path, "  guarantee: at_least_once\n")
    code, _, err = _run(capsys, "validate", "--no-spark", str(f))
    assert code == 1
    assert err.startswith("txsink: config error: sink.guarantee: a group of targets commits "
                          "every target of an epoch or none"), err


def test_status_resolve_and_cut_of_a_group(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    f = pipeline(tmp_path)
    run_epochs(f, range(2))
    with pytest.raises(InjectedFault):
        run_epochs(f, range(2, 3), crash=AFTER_FIRST_COMMIT)
    chk = str(tmp_path / "chk")

    code, out, _ = _run(capsys, "status", chk)
    assert code == 0
    assert "sink 'shop': a group of 2 targets, one decision per epoch:" in out
    assert "target events: backend files, sink id shop--events" in out
    assert "epoch 2: target totals: shop--totals-e2-p0-a20" in out
    code, out, _ = _run(capsys, "status", chk, "--json")
    status = json.loads(out)
    assert status["in_doubt"] == [2]
    assert status["epochs"][2]["targets"]["events"]["rows"] == 6

    cut = pipeline_cut(f)
    assert cut.targets == {"events": 2, "totals": 1}  # the crash came after events' commit
    assert cut.unfinished == (2, "decided") and cut.cut == 1
    code, out, _ = _run(capsys, "cut", str(f))
    assert code == 0
    assert "events (files jsonl at" in out and "highest epoch committed 2" in out
    assert "state: epoch 2 is decided, not finished in every target yet" in out
    assert out.rstrip().endswith("cut: 1 (every target holds every epoch up to 1)")

    code, out, _ = _run(capsys, "resolve", chk, "--epoch", "2", "--commit")
    assert code == 0, out
    assert "committed epoch 2 of sink 'shop': 4 participant(s)" in out
    code, out, _ = _run(capsys, "cut", str(f), "--json")
    assert json.loads(out) == {"sink_id": "shop", "targets": {"events": 2, "totals": 2},
                               "cut": 2, "unfinished": None}
    rows = [json.loads(line) for p in sorted((tmp_path / "totals").glob("part-*"))
            for line in p.read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == evens(range(3))
    assert all(r["twice"] == 2 * r["id"] for r in rows)
    assert {r["txsink_epoch"] for r in rows if r["id"] >= 200} == {2}


@pytest.mark.promise("resolve-abort-undecided", "cli")
def test_resolve_abort_rolls_back_every_target(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    f = pipeline(tmp_path)
    run_epochs(f, range(1))
    cfg = load_pipeline(f)
    group = cfg.create_backend()
    assert isinstance(group, TargetGroup)
    write_group(group, 1, 0, 5, [batch(1, 0)])  # prepared, never decided
    group.close()
    chk = str(tmp_path / "chk")
    code, out, _ = _run(capsys, "status", chk)
    assert "epoch 1: target events: shop--events-e1-p0-a5" in out
    assert "epoch 1: target totals: shop--totals-e1-p0-a5" in out
    code, out, _ = _run(capsys, "resolve", chk, "--epoch", "1", "--abort")
    assert code == 0
    assert "2 prepared participant(s) rolled back" in out
    assert not list((tmp_path / "events" / "_txsink" / "pending").iterdir())
    assert not list((tmp_path / "totals" / "_txsink" / "pending").iterdir())
    store = DirectoryStateStore(tmp_path / "chk" / "txsink")
    assert store.states() == {0: EpochState.COMMITTED}


def test_a_group_option_without_a_target_is_refused(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    f = pipeline(tmp_path)
    run_epochs(f, range(1))
    code, _, err = _run(capsys, "resolve", str(tmp_path / "chk"), "--epoch", "0", "--commit",
                        "--option", "password=x")
    assert code == 1
    assert "--option password: the options of a group go to one target: TARGET.KEY=VALUE" in err


@pytest.mark.promise("reset-all-or-none", "cli")
def test_reset_deletes_every_target(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = pipeline(tmp_path)
    run_epochs(f, range(2))
    code, out, err = _run(capsys, "reset", str(f), "--yes")
    assert code == 0, err
    assert "deleted target events: 4 file(s)" in out
    assert "deleted target totals:" in out
    assert not list(tmp_path.glob("events/part-*")) and not list(tmp_path.glob("totals/part-*"))
    assert not (tmp_path / "chk").exists()


@pytest.mark.promise("forced-resolve-keeps-committed", "cli")
def test_resolve_force_abort_keeps_what_a_target_committed_and_the_replay_adds_the_rest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = pipeline(tmp_path)
    run_epochs(f, range(2))
    with pytest.raises(InjectedFault):  # epoch 2: one participant of events committed
        run_epochs(f, range(2, 3), crash=AFTER_FIRST_COMMIT)
    code, out, _ = _run(capsys, "resolve", str(tmp_path / "chk"), "--epoch", "2", "--abort",
                        "--force")
    assert code == 0, out
    assert "1 participant(s) (events 3 row(s)) were committed already and stay visible" in out
    assert "their partitions (events 0) are not written again" in out
    # Per target: the sum (7) counted events' rows and totals' rows as if they were others.
    assert "3 participant(s), events 3, totals 4 row(s) dropped" in out
    run_epochs(f, range(2, 3))  # Spark replays epoch 2: only the others are written
    for name in ("events", "totals"):
        ids = sorted(json.loads(line)["id"] for p in (tmp_path / name).glob("part-*")
                     for line in p.read_text().splitlines())
        assert ids == (evens(range(3)) if name == "totals" else sorted(
            i for e in range(3) for p in range(2)
            for i in range(e * 100 + p * 10, e * 100 + p * 10 + 3))), name
        assert not list((tmp_path / name / "_txsink" / "pending").iterdir())


@pytest.mark.promise("group-targets-changed-refused", "cli")
def test_reset_after_a_target_was_renamed_refuses_before_deleting_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: events was reset, the renamed totals not ("nothing deleted"), and the
    checkpoint was gone; put back, the file's cut named an epoch totals lacked."""
    f = pipeline(tmp_path)
    run_epochs(f, range(2))
    original = f.read_text()
    f.write_text(original.replace("name: totals", "name: sums"))
    code, out, err = _run(capsys, "reset", str(f), "--yes")
    assert code == 1
    assert ("config error: sink.targets: sink 'shop': its targets were events (files), "
            "totals (files), this file has events (files), sums (files) (missing here: "
            "totals; new here: sums)") in err
    assert ("reset deletes what the recorded targets wrote: put the targets back in "
            f"{f} as the state recorded them, run `txsink reset {f}` again, then change "
            "them; nothing was deleted") in err
    assert "deleted" not in out
    assert len(list(tmp_path.glob("events/part-*"))) == 4
    assert len(list(tmp_path.glob("totals/part-*"))) == 4
    assert (tmp_path / "chk" / "txsink" / "meta.json").is_file()
    f.write_text(original)  # the way out the refusal names
    assert pipeline_cut(str(f)).cut == 1
    code, out, err = _run(capsys, "reset", str(f), "--yes")
    assert code == 0, err
    assert not list(tmp_path.glob("events/part-*")) and not list(tmp_path.glob("totals/part-*"))
    assert not (tmp_path / "chk").exists()


def test_a_run_with_changed_targets_is_refused_before_claiming_the_new_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: preflight had claimed the new target's directory for the refused group, so
    the refusal's way out (the new targets under a new sink_id) then failed there."""
    from txsink.plugins import get_plugins
    from txsink.spark.pipeline import preflight

    f = pipeline(tmp_path)
    run_epochs(f, range(1))
    archive = (f"    - name: archive\n      backend: files\n"
               f"      options: {{path: {tmp_path}/archive, format: jsonl}}\n")
    f.write_text(f.read_text() + archive)
    code, _, err = _run(capsys, "run", str(f))
    assert code == 1
    assert ("config error: sink.targets: sink 'shop': its targets were events (files), totals "
            "(files), this run has events (files), totals (files), archive (files) (new here: "
            "archive)") in err
    assert "nothing was written or claimed" in err
    assert not (tmp_path / "archive").exists()
    # The way out: the new set of targets under a new sink_id with a new checkpoint.
    f.write_text(f.read_text().replace("sink_id: shop", "sink_id: shop2")
                 .replace(f"{tmp_path}/chk", f"{tmp_path}/chk2")
                 .replace(f"{tmp_path}/events", f"{tmp_path}/events2")
                 .replace(f"{tmp_path}/totals", f"{tmp_path}/totals2"))
    preflight(load_pipeline(f), get_plugins(), 1)


@pytest.mark.promise("resolve-abort-drops-reservation", "cli")
def test_resolve_abort_of_a_crashed_grouped_write_drops_its_reservation_and_lease(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: the reserved epoch stayed listed, and resolve's own lease read as "held by
    a driver that is gone"."""
    from txsink.coordinator import record_prepared

    f = pipeline(tmp_path)
    run_epochs(f, range(1))
    cfg = load_pipeline(f)
    group = cfg.create_backend()
    assert isinstance(group, TargetGroup)
    store = DirectoryStateStore(tmp_path / "chk" / "txsink")
    crashed = Coordinator(group, store, "shop", owner="crashed-grouped-write")
    crashed.start()
    epoch = crashed.reserve_epoch()
    record_prepared(store, "crashed-grouped-write", epoch,
                    write_group(group, epoch, 0, 7, [batch(epoch, 0)]), None)
    group.close()  # the driver dies here: no decision, no release
    chk = str(tmp_path / "chk")
    code, out, _ = _run(capsys, "status", chk)
    assert f"{epoch:>6}  reserved" in out
    code, out, err = _run(capsys, "resolve", chk, "--epoch", str(epoch), "--abort")
    assert code == 0, err
    assert f"aborted epoch {epoch} of sink 'shop': 2 prepared participant(s) rolled back" in out
    assert "the reservation of the write that did not finish is dropped" in out
    assert store.get(epoch) is None
    assert store.lease_info().get("released_at") is not None
    code, out, _ = _run(capsys, "status", chk)
    assert "reserved" not in out and "lease: released at" in out, out
    assert not list((tmp_path / "events" / "_txsink" / "pending").iterdir())
    assert not list((tmp_path / "totals" / "_txsink" / "pending").iterdir())
    run_epochs(f, range(epoch + 1, epoch + 2))  # the next run goes on
    assert pipeline_cut(str(f)).cut == epoch + 1
