"""Exactly-once on the files backend through real Spark, with the driver SIGKILLed.

One query is crashed at each coordinator point in turn, restarting from the same
checkpoint each time (every restart first recovers the previous crash, then dies
at the next point), and finally runs to the end: the output must equal the input
(count and checksums per key) with no in-progress or pending file left. A second
query runs with injected task failures (Spark retries them) and unreported
"speculative" twins, then a batch write.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from txsink.state import DirectoryStateStore, EpochState

from tests.e2e.spark_harness import (
    DriverSpec,
    leftover_files,
    make_input,
    read_files_output,
    run_driver,
    summarize,
)
from tests.long_runs import long_run

pytestmark = [pytest.mark.spark, pytest.mark.slow]

EPOCHS = 6


def _finals(out: Path, epoch: int) -> list[str]:
    return sorted(p.name for p in out.glob(f"part-{epoch:010d}-*"))


def _pending(out: Path, epoch: int) -> list[str]:
    return sorted(p.name for p in (out / "_txsink" / "pending").glob(f"*-e{epoch}-p*"))


def _state(chk: Path) -> dict[int, EpochState]:
    return {e: r.state for e, r in DirectoryStateStore(chk / "txsink").records().items()}


def _spark_committed(chk: Path, batch: int) -> bool:
    return (chk / "commits" / str(batch)).exists()


@pytest.mark.promise("committed-replay-aborted", "datasource")
@pytest.mark.promise("decided-epoch-recommitted", "datasource")
@pytest.mark.promise("undecided-rolled-back", "datasource")
@long_run
@pytest.mark.fault
def test_driver_killed_at_every_coordinator_point_then_exactly_once(tmp_path: Path) -> None:
    expected = make_input(tmp_path / "in", files=EPOCHS, rows_per_file=240)
    out, chk = tmp_path / "out", tmp_path / "chk"
    spec = DriverSpec(input_dir=tmp_path / "in", checkpoint=chk, sink_id="e2e-crash",
                      options={"path": str(out), "format": "jsonl"})

    def crash(point: str, epoch: int) -> None:
        run_driver(spec, faults=f"{point}@{epoch}:kill").check_killed(f"{point}@{epoch}")

    # (a) all participants prepared, no decision: they are orphans of a dead run.
    crash("before-decide", 1)
    assert 1 not in _state(chk)
    assert len(_pending(out, 1)) == 2
    assert not _finals(out, 1)
    assert not _spark_committed(chk, 1)

    # (b) decided, nothing committed. The restart first recovered (a): epoch 1 was
    # replayed by Spark and committed once, the dead run's participants aborted.
    crash("after-decide", 2)
    states = _state(chk)
    assert states[1] is EpochState.COMMITTED
    assert len(_finals(out, 1)) == 2
    assert states[2] is EpochState.DECIDED
    assert not _finals(out, 2)
    assert len(_pending(out, 2)) == 2

    # (c) some participants committed.
    crash("after-first-commit", 3)
    states = _state(chk)
    assert states[2] is EpochState.COMMITTED
    assert len(_finals(out, 2)) == 2
    assert states[3] is EpochState.DECIDED
    assert len(_finals(out, 3)) == 1

    # (d) COMMITTED in txsink's state, but Spark never logged the batch: it replays it.
    crash("after-mark-committed", 4)
    states = _state(chk)
    assert states[3] is EpochState.COMMITTED
    assert states[4] is EpochState.COMMITTED
    assert not _spark_committed(chk, 4)

    # Restart and run to the end.
    run_driver(spec).check()
    rows = read_files_output(out)
    assert summarize(rows) == expected
    assert len(rows) == len({r["id"] for r in rows})
    assert leftover_files(out) == []
    assert set(_state(chk).values()) == {EpochState.COMMITTED}
    assert all(len(_finals(out, e)) == 2 for e in range(EPOCHS))


@pytest.mark.promise("orphans-aborted", "datasource")
@pytest.mark.fault
def test_task_failures_and_speculative_twins_then_batch_write(tmp_path: Path) -> None:
    expected = make_input(tmp_path / "in", files=4, rows_per_file=200)
    out, chk = tmp_path / "out", tmp_path / "chk"
    batch_out = tmp_path / "batch-out"
    spec = DriverSpec(
        input_dir=tmp_path / "in", checkpoint=chk, sink_id="e2e-retry",
        options={"path": str(out)},  # parquet
        # Spark does not launch speculative copies in local mode (single host), so the
        # `duplicate` fault prepares the twin such a copy leaves behind when it loses
        # the commit race; speculation stays on to run the configuration users would.
        conf={"spark.speculation": "true", "spark.speculation.multiplier": "1.1",
              "spark.speculation.quantile": "0.1", "spark.speculation.interval": "50ms"},
        batch_write={"sink_id": "e2e-batch", "checkpoint": str(tmp_path / "batch-chk"),
                     "path": str(batch_out), "format": "jsonl"},
    )
    faults = ("task-after-pre-commit@1:raise,task-before-pre-commit@2:raise,"
              "task-after-pre-commit@3:duplicate")
    run = run_driver(spec, faults=faults).check()
    # The failures really happened and Spark retried the tasks.
    assert "injected fault at task-after-pre-commit (epoch 1)" in run.output
    assert "injected fault at task-before-pre-commit (epoch 2)" in run.output
    assert "prepared unreported twin" in run.output

    rows = read_files_output(out)
    assert summarize(rows) == expected
    assert len(rows) == len({r["id"] for r in rows})
    assert leftover_files(out) == []
    records = DirectoryStateStore(chk / "txsink").records()
    assert {r.state for r in records.values()} == {EpochState.COMMITTED}

    batch_rows = read_files_output(batch_out)
    assert summarize(batch_rows) == expected
    assert leftover_files(batch_out) == []
    batch_state = json.loads((tmp_path / "batch-chk" / "txsink" / "meta.json").read_text())
    assert batch_state["sink_id"] == "e2e-batch"
