"""Groups of targets through real Spark, on files targets (no servers needed).

Grouped writes in ``foreachBatch``: an exception in the block aborts every target and
the re-run writes the batch once; the versions are bound to the streaming query, so a
reset checkpoint is refused instead of its batches being taken for ones already
written. The driver is killed at every protocol step (with an epoch committed in some
targets only, or the Parquet target's staged files half published), and the restart
finishes it in all of them. The Parquet target ``all`` takes the native data path
(Spark's own writer, in ``foreachBatch``) in both modes; the JSON-lines ones txsink's
data source.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from txsink.cut import consistent_cut
from txsink.group import TargetGroup
from txsink.state import DirectoryStateStore, EpochState
from txsink.targets import parse_targets

from tests.e2e import multi_driver
from tests.e2e.spark_harness import leftover_files, make_input, read_files_output, summarize
from tests.long_runs import long_run

pytestmark = [pytest.mark.spark, pytest.mark.slow]

FILES = 3


def targets(tmp: Path) -> list[dict[str, Any]]:
    return [
        {"name": "all", "backend": "files", "options": {"path": str(tmp / "all")}},
        {"name": "big", "backend": "files", "where": "amount >= 500",
         "select": ["id", "key", "amount"], "epoch_column": "txsink_epoch",
         "options": {"path": str(tmp / "big"), "format": "jsonl"}},
        {"name": "keys", "backend": "files", "select": ["id", "key", "amount", "key * 2 AS k2"],
         "options": {"path": str(tmp / "keys"), "format": "jsonl"}},
    ]


def expected(tmp: Path) -> dict[str, Any]:
    rows = [json.loads(line) for f in sorted((tmp / "in").iterdir())
            for line in f.read_text().splitlines()]
    return {"all": summarize(rows), "keys": summarize(rows),
            "big": summarize(r for r in rows if r["amount"] >= 500)}


def check_exact(tmp: Path, sink: str, state: Path) -> None:
    want = expected(tmp)
    for name in ("all", "big", "keys"):
        got = read_files_output(tmp / name)
        assert summarize(got) == want[name], name
        assert len(got) == len({r["id"] for r in got}), f"{name}: a row twice"
        assert leftover_files(tmp / name) == [], name
    keys = read_files_output(tmp / "keys")
    assert all(r["k2"] == 2 * r["key"] for r in keys)
    big = read_files_output(tmp / "big")
    assert big and all(isinstance(r["txsink_epoch"], int) for r in big)
    store = DirectoryStateStore(state)
    records = store.records()
    assert records and all(r.state is EpochState.COMMITTED for r in records.values())
    for r in records.values():  # one decision record per epoch, every target in it
        assert {c.target for c in r.committables} == {"all", "big", "keys"}
    group = TargetGroup.from_specs(sink, parse_targets(targets(tmp), sink))
    try:
        cut = consistent_cut(group, store, sink)
    finally:
        group.close()
    assert cut.cut == max(records) and set(cut.targets.values()) == {max(records)}


@pytest.mark.promise("versioned-checkpoint-replaced-refused", "grouped", "native")
@pytest.mark.promise("grouped-exception-aborts", "grouped", "native")
@long_run
def test_foreach_block_that_raises_aborts_every_target_and_versions_stay_bound(
        tmp_path: Path) -> None:
    make_input(tmp_path / "in", files=FILES, rows_per_file=120)
    spec = {"mode": "foreach", "input_dir": str(tmp_path / "in"),
            "checkpoint": str(tmp_path / "chk"), "state": str(tmp_path / "group-state"),
            "sink_id": "fb-group", "targets": targets(tmp_path), "raise_at": 1}
    failed = multi_driver.run(spec)
    assert failed.returncode != 0 and "raised in the block of batch 1" in failed.output
    # Batch 0 is in every target; batch 1's first write was rolled back everywhere.
    assert all(leftover_files(tmp_path / n) == [] for n in ("all", "big", "keys"))
    assert {r["id"] for r in read_files_output(tmp_path / "all")} == set(range(120))
    multi_driver.run(spec).check()  # Spark replays batch 1, then the rest
    check_exact(tmp_path, "fb-group", tmp_path / "group-state")

    # The stream's checkpoint is reset while the group's state is kept: Spark numbers
    # batches from 0 again, which must not be taken for versions already written.
    shutil.rmtree(tmp_path / "chk")
    refused = multi_driver.run(spec)
    assert refused.returncode != 0
    assert "CheckpointChangedError" in refused.output, refused.output[-3000:]
    assert "the stream's checkpoint was deleted or replaced" in refused.output
    check_exact(tmp_path, "fb-group", tmp_path / "group-state")


@pytest.mark.promise("group-all-or-none", "grouped", "native")
@pytest.mark.promise("committed-replay-aborted", "grouped", "native")
@pytest.mark.promise("decided-epoch-recommitted", "grouped", "native")
@pytest.mark.promise("undecided-rolled-back", "grouped", "native")
@long_run
@pytest.mark.fault
@pytest.mark.parametrize("point", ["native-before-record", "before-decide", "after-decide",
                                   "after-first-commit", "native-mid-publish",
                                   "before-mark-committed", "after-mark-committed"])
@pytest.mark.parametrize("mode", ["stream", "foreach"])
def test_driver_killed_at_a_protocol_point_then_exact(tmp_path: Path, mode: str,
                                                      point: str) -> None:
    make_input(tmp_path / "in", files=FILES, rows_per_file=120)
    spec = {"mode": mode, "input_dir": str(tmp_path / "in"),
            "checkpoint": str(tmp_path / "chk"), "state": str(tmp_path / "group-state"),
            "sink_id": "kill-group", "targets": targets(tmp_path)}
    multi_driver.run(spec, faults=f"{point}@1:kill").check_killed(point)
    multi_driver.run(spec).check()
    state = tmp_path / ("chk/txsink" if mode == "stream" else "group-state")
    check_exact(tmp_path, "kill-group", state)


_VALIDATE = """
import json, sys
from pathlib import Path
from txsink.config import load_pipeline
from txsink.errors import ConfigError
from txsink.spark.pipeline import check_pipeline

out = {}
for name in sys.argv[1:]:
    try:
        out[name] = check_pipeline(load_pipeline(name), Path(name + ".spark.log"))
    except ConfigError as exc:
        out[name] = f"{exc.field} | {exc}"
print(json.dumps(out))
"""


@long_run
def test_validate_analyses_each_targets_select_and_where(tmp_path: Path) -> None:
    """``txsink validate`` has Spark analyse each target's select and where: a mistake is
    one line naming the target's field, and a good group prints each target's columns."""
    import subprocess
    import sys

    def pipeline(name: str, where: str) -> str:
        f = tmp_path / f"{name}.yaml"
        f.write_text(f"""
source: {{type: rate}}
transform: SELECT value AS id, value % 7 AS key FROM source
checkpoint: {tmp_path}/chk-{name}
sink:
  sink_id: v
  targets:
    - {{name: all, backend: files, options: {{path: {tmp_path}/all-{name}}}}}
    - name: big
      backend: files
      where: "{where}"
      select: [id, "key * 2 AS k2"]
      epoch_column: txsink_epoch
      options: {{path: {tmp_path}/big-{name}}}
""")
        return str(f)

    good, bad = pipeline("good", "id > 3"), pipeline("bad", "idd > 3")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.run([sys.executable, "-c", _VALIDATE, good, bad], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    answers = json.loads(proc.stdout.strip().splitlines()[-1])
    assert answers[good] == ["all (id bigint, key bigint)",
                             "big (id bigint, k2 bigint, txsink_epoch bigint)"]
    field, _, message = answers[bad].partition(" | ")
    assert field == "sink.targets[big].where"
    assert message.startswith("sink.targets[big].where: Spark cannot apply it to the rows the "
                              "sink receives: "), message
    assert "`idd` cannot be resolved" in message and "\n" not in message
