"""One epoch number, one set of rows, through real Spark (issue 31, files targets).

* a backfill (``TargetSet.write``) then the stream on the same checkpoint: every
  micro-batch is written after the backfill's epochs (they were taken for replays of
  the backfill's epochs and dropped); a batch write between two runs of the stream is
  refused before anything is written (it took the number of the stream's next batch,
  which was then dropped), and the stream's next run is exact;
* a batch job ``epoch(spark, version=1)``, then the documented ``foreachBatch``
  pattern with ``version=batch_id`` on the same group: refused, loudly (its batches 0
  and 1 were skipped with a WARNING).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from txsink.state import DirectoryStateStore

from tests.e2e import identity_driver
from tests.e2e.spark_harness import DriverRun, leftover_files, read_files_output

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def targets(tmp: Path) -> list[dict[str, Any]]:
    return [
        {"name": "all", "backend": "files",
         "options": {"path": str(tmp / "all"), "format": "jsonl"}},
        {"name": "big", "backend": "files", "where": "amount >= 500",
         "select": ["id", "amount"], "epoch_column": "txsink_epoch",
         "options": {"path": str(tmp / "big"), "format": "jsonl"}},
    ]


def inputs(directory: Path, first_id: int, files: int, rows: int = 40) -> None:
    """JSON-lines files of rows with ids from ``first_id``, modification times rising."""
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        chunk = [{"id": i, "key": i % 7, "amount": (i * 37) % 1000}
                 for i in range(first_id + f * rows, first_id + (f + 1) * rows)]
        path = directory / f"input-{first_id + f * rows:06d}.json"
        path.write_text("".join(json.dumps(r) + "\n" for r in chunk))
        stamp = 1_700_000_000 + first_id + f
        os.utime(path, (stamp, stamp))


def check_exact(tmp: Path, rows: list[dict[str, int]]) -> None:
    """Every row once in every target it belongs to, nothing left prepared."""
    want_all = sorted(r["id"] for r in rows)
    want_big = sorted(r["id"] for r in rows if r["amount"] >= 500)
    got_all = sorted(r["id"] for r in read_files_output(tmp / "all"))
    got_big = sorted(r["id"] for r in read_files_output(tmp / "big"))
    assert got_all == want_all, f"all: {len(got_all)} rows, want {len(want_all)}"
    assert got_big == want_big, f"big: {len(got_big)} rows, want {len(want_big)}"
    assert leftover_files(tmp / "all") == [] and leftover_files(tmp / "big") == []


@pytest.fixture(scope="module")
def driven(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, DriverRun]:
    """Both scenarios in one Spark driver (one session start for the module)."""
    tmp = tmp_path_factory.mktemp("identity")
    back, ver = tmp / "backfill", tmp / "versions"
    inputs(back / "backfill", 0, 2)
    inputs(back / "in", 1000, 2)
    inputs(back / "later", 2000, 2)
    inputs(back / "between", 3000, 1)
    inputs(ver / "job", 0, 1)
    inputs(ver / "in", 1000, 3)
    run = identity_driver.run({"scenarios": {
        "backfill": {
            "sink_id": "backfilled", "targets": targets(back),
            "checkpoint": str(back / "chk"),
            "steps": [
                {"op": "write", "input": str(back / "backfill")},
                {"op": "stream", "input": str(back / "in")},
                {"op": "write", "input": str(back / "between")},
                {"op": "move", "from": str(back / "later"), "to": str(back / "in")},
                {"op": "stream", "input": str(back / "in")},
            ]},
        "versions": {
            "sink_id": "versions", "targets": targets(ver),
            "checkpoint": str(ver / "group-chk"),
            "steps": [
                {"op": "epoch", "input": str(ver / "job"), "version": 1},
                {"op": "foreach", "input": str(ver / "in"),
                 "checkpoint": str(ver / "stream-chk")},
            ]},
    }}).check()
    return tmp, run


@pytest.mark.promise("batch-into-stream-refused", "datasource")
def test_a_backfill_then_the_stream_and_a_batch_write_between_its_runs(
        driven: tuple[Path, DriverRun]) -> None:
    tmp, run = driven
    tmp = tmp / "backfill"
    rows = [r for d in ("backfill", "in") for r in _rows(tmp / d)]  # "later" moved to "in"
    between = {r["id"] for r in _rows(tmp / "between")}
    check_exact(tmp, rows)
    assert not between & {r["id"] for r in read_files_output(tmp / "all")}
    results = identity_driver.steps(run, "backfill")
    assert [r["ok"] for r in results] == [True, True, False, True, True], results
    refused = results[2]["error"]
    assert "a streaming query writes through this sink's state" in refused, refused
    assert "Nothing of this batch write was written" in refused
    # The stream's epochs come after the backfill's, each one set of rows.
    records = DirectoryStateStore(tmp / "chk" / "txsink").records()
    assert [records[e].origin for e in sorted(records)] == ["batch"] + ["stream"] * 4
    epochs = {r["txsink_epoch"] for r in read_files_output(tmp / "big")}
    assert epochs == set(records)


@pytest.mark.promise("app-id-one-writer", "grouped")
def test_a_batch_jobs_version_and_a_streams_batch_ids_on_one_group_are_refused(
        driven: tuple[Path, DriverRun]) -> None:
    tmp, run = driven
    tmp = tmp / "versions"
    # Nothing of the stream is written, nothing is left prepared: only the job's rows.
    check_exact(tmp, _rows(tmp / "job"))
    results = identity_driver.steps(run, "versions")
    assert [r["ok"] for r in results] == [True, False], results
    assert "written by batch jobs no stream drives" in results[1]["error"], results[1]


def _rows(directory: Path) -> list[dict[str, int]]:
    return [json.loads(line) for f in sorted(directory.iterdir())
            for line in f.read_text().splitlines()]
