"""Every example on docs/lakehouse.md runs in a test: the readers without the JVM here
(a Delta table and an Iceberg table txsink wrote, three epochs each), the Spark ones in
``tests/e2e/interop/test_docs_lakehouse_spark.py`` (Spark's connectors: ``tox -e
lake-spark41``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from txsink.coordinator import Coordinator, EpochOutcome
from txsink.model import TransactionContext
from txsink.plugins import build_plugins, get_plugins
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "lakehouse.md"
SPARK_TEST = "tests/e2e/interop/test_docs_lakehouse_spark.py"
COVERED = {
    "delta-rs-read": __file__, "pyiceberg-read": __file__,
    "spark-delta-read": SPARK_TEST, "spark-iceberg-session": SPARK_TEST,
    "spark-iceberg-read": SPARK_TEST, "spark-delta-maintain": SPARK_TEST,
    "spark-iceberg-maintain": SPARK_TEST,
}
_BLOCK = re.compile(r"(?:<!-- example: (?P<name>[\w-]+) -->\n)?```(?P<lang>\w+)\n"
                    r"(?P<body>.*?)```", re.S)


def examples() -> dict[str, str]:
    found: dict[str, str] = {}
    for m in _BLOCK.finditer(PAGE.read_text()):
        assert m.group("name"), f"a block without an <!-- example: NAME --> marker: " \
                                f"{m.group('body')[:60]!r}"
        found[m.group("name")] = m.group("body")
    return found


def write_epochs(backend_name: str, options: dict[str, str], state: Path) -> list[int]:
    """Three epochs of ten rows through the coordinator; the ids written."""
    backend = get_plugins().create_backend(backend_name, options)
    backend.preflight("orders")
    coord = Coordinator(backend, DirectoryStateStore(state), "orders", plugins=build_plugins())
    coord.start()
    for epoch in range(3):
        rows = pa.record_batch({"id": pa.array(range(epoch * 10, epoch * 10 + 10), pa.int64())})
        message = write_participant(backend, TransactionContext("orders", epoch, 0, 0), [rows])
        assert coord.commit_epoch(epoch, [message]) is EpochOutcome.COMMITTED
    backend.close()
    return list(range(30))


def test_every_example_on_the_page_is_named_and_run_by_a_test() -> None:
    assert sorted(examples()) == sorted(COVERED)


def test_delta_rs_read_example(tmp_path: Path) -> None:
    path = str(tmp_path / "orders")
    want = write_epochs("delta", {"path": path}, tmp_path / "state")
    ns: dict[str, Any] = {"path": path}
    exec(examples()["delta-rs-read"], ns)
    assert sorted(ns["rows"].column("id").to_pylist()) == want
    assert sorted(ns["epochs"].values()) == [0, 1, 2]
    assert sorted(ns["first"].column("id").to_pylist()) == list(range(10))


def test_pyiceberg_read_example(tmp_path: Path) -> None:
    warehouse = str(tmp_path / "wh")
    want = write_epochs("iceberg", {"warehouse": warehouse, "table": "db.orders"},
                        tmp_path / "state")
    ns: dict[str, Any] = {"warehouse": warehouse}
    exec(examples()["pyiceberg-read"], ns)
    assert sorted(ns["rows"].column("id").to_pylist()) == want
    assert sorted(ns["epochs"].values()) == [0, 1, 2]
    assert sorted(ns["first"].column("id").to_pylist()) == list(range(10))
    ns["catalog"].engine.dispose()
