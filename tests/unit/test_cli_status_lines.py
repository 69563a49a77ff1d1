"""What ``txsink status`` and ``resolve`` say about each epoch: every state as what it is,
and a group's rows per target.

Before: a group's epoch line summed rows over its targets (``59994 row(s)`` for 19,998
rows in each of three targets), and a RESERVED epoch (a batch write that has not
decided) read "decided <time>".
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from txsink.cli import main
from txsink.config import load_pipeline
from txsink.coordinator import Coordinator, record_prepared
from txsink.group import TargetGroup, write_group
from txsink.state import DirectoryStateStore
from txsink.targets import ROUTE_PREFIX

ROWS = 19_998


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def three_targets(tmp_path: Path) -> Path:
    f = tmp_path / "three.yaml"
    targets = "".join(f"""
    - name: {name}
      backend: files
      options: {{path: {tmp_path}/{name}, format: jsonl}}""" for name in ("a", "b", "c"))
    f.write_text(f"""
source: {{type: rate}}
checkpoint: {tmp_path}/chk
sink:
  sink_id: three
  targets:{targets}
""")
    return f


def rows_for_every_target(epoch: int, partition: int, n: int) -> pa.RecordBatch:
    ids = pa.array(range(epoch * 100_000 + partition * n, epoch * 100_000 + (partition + 1) * n),
                   pa.int64())
    return pa.record_batch({ROUTE_PREFIX + name: pa.StructArray.from_arrays([ids], ["id"])
                            for name in ("a", "b", "c")})


def _group(f: Path) -> tuple[TargetGroup, DirectoryStateStore]:
    cfg = load_pipeline(f)
    group = cfg.create_backend()
    assert isinstance(group, TargetGroup)
    return group, DirectoryStateStore(Path(cfg.checkpoint) / "txsink")


def test_a_groups_epoch_shows_rows_per_target_not_their_sum(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = three_targets(tmp_path)
    group, store = _group(f)
    coordinator = Coordinator(group, store, "three")
    coordinator.start()
    half = ROWS // 2
    coordinator.commit_epoch(0, [c for p in range(2) for c in write_group(
        group, 0, p, 0, [rows_for_every_target(0, p, half)])])
    group.close()
    store.release(coordinator.lease)
    code, out, err = _run(capsys, "status", str(f))
    assert code == 0, err
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("0  committed"))
    assert str(3 * ROWS) not in line, line
    assert "6 participant(s), decided " in line
    assert f"a 2 ({ROWS} rows), b 2 ({ROWS} rows), c 2 ({ROWS} rows)" in line, line
    # resolve says it per target too (an epoch already committed: nothing to do, so the
    # words come from a commit of a decided one below).
    code, out, _ = _run(capsys, "status", str(f), "--json")
    epoch = json.loads(out)["epochs"][0]
    assert {t: v["rows"] for t, v in epoch["targets"].items()} == {"a": ROWS, "b": ROWS,
                                                                   "c": ROWS}


def test_resolve_commit_of_a_groups_epoch_counts_rows_per_target(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from txsink.faults import AFTER_DECIDE, FaultInjector, FaultRule, InjectedFault

    f = three_targets(tmp_path)
    group, store = _group(f)
    coordinator = Coordinator(group, store, "three",
                              faults=FaultInjector([FaultRule(AFTER_DECIDE, 0, "raise")]))
    coordinator.start()
    with pytest.raises(InjectedFault):
        coordinator.commit_epoch(0, write_group(group, 0, 0, 0,
                                                [rows_for_every_target(0, 0, 7)]))
    group.close()
    code, out, _ = _run(capsys, "status", str(tmp_path / "chk"))
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("0  decided"))
    assert ", not committed yet; a 1 (7 rows)" in line, line
    code, out, err = _run(capsys, "resolve", str(tmp_path / "chk"), "--epoch", "0", "--commit")
    assert code == 0, err
    assert "committed epoch 0 of sink 'three': 3 participant(s), a 7, b 7, c 7 row(s)" in out


def test_a_reserved_epoch_names_its_writer_and_is_not_called_decided(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = three_targets(tmp_path)
    group, store = _group(f)
    # A writer that is gone: a process that ran on this host and ended.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    import os

    owner = f"{os.uname().nodename}:{dead.stdout.strip()}:abc123"
    writer = Coordinator(group, store, "three", owner=owner)
    writer.start()
    epoch = writer.reserve_epoch()
    record_prepared(store, owner, epoch,
                    write_group(group, epoch, 0, 0, [rows_for_every_target(epoch, 0, 5)]),
                    None)
    group.close()
    code, out, err = _run(capsys, "status", str(f))
    assert code == 0, err
    line = next(ln for ln in out.splitlines()
                if re.match(rf"\s+{epoch}\s+reserved\s", ln))
    assert "decided" not in line.replace("not decided", ""), line
    assert re.search(rf"3 participant\(s\) prepared so far, reserved \d{{4}}-\d\d-\d\d "
                     rf"[\d:]+ by {re.escape(owner)} \(gone: the next start aborts what it "
                     r"prepared\); not decided; a 1 \(5 rows\)", line), line
    code, out, _ = _run(capsys, "status", str(f), "--json")
    record = next(e for e in json.loads(out)["epochs"] if e["epoch"] == epoch)
    assert record["state"] == "reserved" and record["decided_at"] is None
    assert record["reserved_by"] == owner and record["reserved_at"] > 0


def test_a_reserved_epoch_of_a_live_writer_says_it_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = three_targets(tmp_path)
    group, store = _group(f)
    writer = Coordinator(group, store, "three")  # this process: alive, pid maybe reused
    writer.start()
    epoch = writer.reserve_epoch()
    group.close()
    code, out, _ = _run(capsys, "status", str(f))
    assert code == 0
    line = next(ln for ln in out.splitlines() if re.match(rf"\s+{epoch}\s+reserved\s", ln))
    assert f"by {writer.owner} (whether it still runs is unknown from here); not decided" \
        in line, line
