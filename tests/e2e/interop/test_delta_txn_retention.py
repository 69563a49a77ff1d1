"""Delta's ``delta.setTransactionRetentionDuration`` set by the team that owns the
table (Delta's own advice for tables many idempotent writers touch): Spark's next
checkpoint drops every ``txn`` action older than it, txsink's too when the pipeline
was stopped longer. The oracle: the next round goes on, every row once. (Before the
fix the next start refused the intact table as "replaced", no txn action of the sink
being left, and the remedy it named, moving txsink's folder away, would have had a
decided epoch committed again: every epoch looked uncommitted without a txn.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.e2e.interop.conftest import Lake
from tests.e2e.interop.harness import delta_rs_rows, stream, write_input

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.mark.promise("delta-txn-expired-read-from-log", "backend")
@pytest.mark.parametrize("path_kind", ["datasource", "native"])
def test_delta_txn_expired_by_spark_s_checkpoint(lake: Lake, tmp_path: Path,
                                                 path_kind: str) -> None:
    table = tmp_path / "t"
    name = f"delta.`{table}`"
    want = write_input(tmp_path / "in", 0, 2)
    stream(lake.spark, path_kind, "delta", {"path": str(table)}, tmp_path / "in",
           tmp_path / "chk", "s")
    lake.sql(f"ALTER TABLE {name} SET TBLPROPERTIES ("
             "'delta.setTransactionRetentionDuration' = 'interval 1 seconds', "
             "'delta.checkpointInterval' = '1')")
    time.sleep(2)  # longer than the retention: the pipeline stopped meanwhile
    lake.sql(f"INSERT INTO {name} VALUES (-1, 0, 0, timestamp_seconds(0))")  # checkpoint
    want += [(-1, 0, 0, 0)]
    want += write_input(tmp_path / "in", 2, 1)
    stream(lake.spark, path_kind, "delta", {"path": str(table)}, tmp_path / "in",
           tmp_path / "chk", "s")
    assert delta_rs_rows(table) == sorted(want)
