"""Spark's own Delta and Iceberg connectors beside txsink.

These tests need a PySpark for which the connectors are published (4.0, 4.1, 4.2:
:mod:`txsink.testing.lake_connectors`), so they run in the tox environments
``lake-spark40``, ``lake-spark41`` and ``lake-spark42`` (``TXSINK_LAKE_SPARK=1``), not in
the default run (uv.lock's PySpark 4.3 has none). One Spark session with both
connectors serves the whole run: its JVM start is most of a test's cost.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ENV = "TXSINK_LAKE_SPARK"
_NAMES = itertools.count()


def _unavailable() -> str | None:
    if not os.environ.get(ENV):
        return (f"Spark's Delta and Iceberg connectors run in tox -e lake-spark40 / "
                f"lake-spark41 / lake-spark42 ({ENV}=1); none is published for uv.lock's "
                "PySpark 4.3")
    try:
        from txsink.testing.lake_connectors import connectors

        connectors()
    except Exception as exc:
        return str(exc)
    return None


#: PySpark 4.0-4.2 leave py4j's callback sockets (foreachBatch, streaming sources) to the
#: garbage collector; the warning they raise there says nothing about the test.
UNCLOSED_PY4J = ("ignore:Exception ignored in. <socket.socket"
                 ":pytest.PytestUnraisableExceptionWarning")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    reason = _unavailable()
    here = str(Path(__file__).parent)
    for item in items:
        if not str(item.path).startswith(here):
            continue
        item.add_marker(pytest.mark.filterwarnings(UNCLOSED_PY4J))
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


#: What each interop case did (connector | feature | read/write/maintain | result),
#: printed at the end of the run: the interop matrix.
OUTCOMES: list[str] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if OUTCOMES:
        terminalreporter.write_sep("=", "interop matrix")
        for line in OUTCOMES:
            terminalreporter.write_line(line)


@dataclass
class Lake:
    """The session with the connectors, and what the tests ask of it."""

    spark: Any
    found: Any
    outcomes: list[str] = field(default_factory=lambda: OUTCOMES)

    @property
    def has_iceberg(self) -> bool:
        return self.found.iceberg is not None

    def need_iceberg(self) -> None:
        if not self.has_iceberg:
            pytest.skip(f"{self.found.describe()}: Iceberg publishes no Spark runtime for "
                        f"Spark {self.found.spark}")

    def iceberg(self, warehouse: Path, table: str = "db.t", **extra: str
                ) -> tuple[dict[str, str], str]:
        """txsink's options for an Iceberg table in a SQL catalog on a SQLite file (the
        backend's default), and the name Spark reads it by: a Spark catalog of the same
        name on the same database (Iceberg's JDBC catalog keys tables by catalog name)."""
        from txsink_iceberg.backend import IcebergBackend

        self.need_iceberg()
        name = f"c{next(_NAMES)}"
        options = {"warehouse": str(warehouse), "table": table, "catalog_name": name, **extra}
        # txsink (pyiceberg) makes the catalog's tables; Spark must not: Iceberg's JDBC
        # catalog leaves the SQLite transaction of that step open, and every later
        # commit of another process fails with "database is locked" (docs/lakehouse.md).
        IcebergBackend.from_options(options)._catalog()
        self.catalog(name, {"type": "jdbc",
                            "uri": f"jdbc:sqlite:{warehouse}/txsink-catalog.db",
                            "jdbc.init-catalog-tables": "false",
                            # Another writer's snapshots (txsink's) are seen at once,
                            # not after the cached table expires (30 s).
                            "cache-enabled": "false",
                            "warehouse": warehouse.as_uri()})
        return options, f"{name}.{table}"

    def catalog(self, name: str, props: dict[str, str]) -> None:
        """An Iceberg catalog added to the running session (Spark loads catalogs on
        first use)."""
        from txsink.testing.lake_connectors import iceberg_catalog_conf

        for key, value in iceberg_catalog_conf(name, props).items():
            self.spark.conf.set(key, value)

    def sql(self, text: str) -> list[Any]:
        return list(self.spark.sql(text).collect())


@pytest.fixture(scope="session")
def lake() -> Iterator[Lake]:
    from txsink.testing import lake_connectors as lc

    from tests.e2e.spark_harness import local_spark

    found = lc.connectors()
    conf = lc.session_conf(found, lc.jars(found))
    conf.update({"spark.sql.session.timeZone": "UTC",
                 # VACUUM / RETAIN 0 HOURS in the maintenance tests.
                 "spark.databricks.delta.retentionDurationCheck.enabled": "false",
                 "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true"})
    session = local_spark(f"txsink-interop-{found.spark}", **conf)
    spark = next(session)
    state = Lake(spark, found)
    OUTCOMES.append(f"connectors: {found.describe()}")
    try:
        yield state
    finally:
        with __import__("contextlib").suppress(StopIteration):
            next(session)
