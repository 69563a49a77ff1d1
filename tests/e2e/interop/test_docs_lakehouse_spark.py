"""The Spark examples of docs/lakehouse.md, run as written on a session with Spark's
own connectors, against tables txsink wrote (three epochs each)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.interop.conftest import Lake
from tests.integration.test_docs_lakehouse import examples, write_epochs

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_spark_delta_examples(lake: Lake, tmp_path: Path) -> None:
    path = str(tmp_path / "orders")
    lake.sql(f"CREATE TABLE delta.`{path}` (id BIGINT) USING delta "
             "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    want = write_epochs("delta", {"path": path}, tmp_path / "state")
    ns: dict[str, Any] = {"spark": lake.spark, "path": path}
    exec(examples()["spark-delta-read"], ns)
    assert sorted(r["id"] for r in ns["rows"].collect()) == want
    assert sorted(r["id"] for r in ns["first"].collect()) == list(range(10))
    assert sorted(r["id"] for r in ns["changes"].collect()) == want
    assert ns["upstream"].isStreaming
    exec(examples()["spark-delta-maintain"], ns)
    assert sorted(r["id"] for r in lake.spark.read.format("delta").load(path).collect()) == want


def test_spark_iceberg_examples(lake: Lake, tmp_path: Path) -> None:
    lake.need_iceberg()
    warehouse = str(tmp_path / "wh")
    want = write_epochs("iceberg", {"warehouse": warehouse, "table": "db.orders",
                                    "catalog_name": "lake"}, tmp_path / "state")
    ns: dict[str, Any] = {"spark": lake.spark, "warehouse": warehouse}
    exec(examples()["spark-iceberg-session"], ns)
    for key, value in ns["conf"].items():
        lake.spark.conf.set(key, value)
    exec(examples()["spark-iceberg-read"], ns)
    assert sorted(r["id"] for r in ns["rows"].collect()) == want
    assert sorted(int(r["epoch"]) for r in ns["snapshots"].collect()) == [0, 1, 2]
    assert len(ns["first"].collect()) in (10, 20, 30)
    assert ns["upstream"].isStreaming
    exec(examples()["spark-iceberg-maintain"], ns)
    assert sorted(r["id"] for r in lake.spark.table("lake.db.orders").collect()) == want
