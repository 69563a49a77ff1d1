"""Spark's own Delta and Iceberg connectors for tests and benchmarks.

Neither is published for every Spark version: this is what Maven Central serves for
the versions txsink supports (checked 2026-11-27; none for Spark 4.3):

=====  =============================  =================================================
Spark  Delta (``delta-spark_2.13``)   Iceberg (``iceberg-spark-runtime-<spark>_2.13``)
=====  =============================  =================================================
4.0    4.0.0                          1.10.0 (1.11.0)
4.1    4.3.0                          1.12.0 (1.11.0)
4.2    4.4.0                          none
=====  =============================  =================================================

:func:`connectors` picks the row of the installed PySpark; :func:`session_conf` gives a
session both connectors (Delta as ``spark_catalog``, Iceberg catalogs by name). The
jars are resolved with Maven into ``~/.m2`` once (:mod:`txsink.testing.maven`) and put
on the driver's class path (local mode: the executors share the driver's JVM).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from txsink.testing.maven import Jar, JarsUnavailable, resolve, without_shipped

#: Iceberg's SQL catalog on SQLite (pyiceberg's default) needs the SQLite JDBC driver.
SQLITE_JDBC = Jar("org.xerial", "sqlite-jdbc", "3.51.1.0")
POSTGRES_JDBC = Jar("org.postgresql", "postgresql", "42.7.8")


@dataclass(frozen=True)
class Connectors:
    """The connector versions for one Spark minor version."""

    spark: str
    delta: str | None
    iceberg_artifact: str | None
    iceberg: str | None

    def describe(self) -> str:
        delta = f"io.delta:delta-spark_2.13:{self.delta}" if self.delta else "no Delta"
        iceberg = (f"org.apache.iceberg:{self.iceberg_artifact}:{self.iceberg}"
                   if self.iceberg else "no Iceberg runtime")
        return f"Spark {self.spark}: {delta}, {iceberg}"


CONNECTORS: dict[str, Connectors] = {
    "4.0": Connectors("4.0", "4.0.0", "iceberg-spark-runtime-4.0_2.13", "1.10.0"),
    "4.1": Connectors("4.1", "4.3.0", "iceberg-spark-runtime-4.1_2.13", "1.12.0"),
    "4.2": Connectors("4.2", "4.4.0", None, None),
}


class ConnectorsUnavailable(RuntimeError):
    """No connector is published for this Spark, or its jars cannot be had."""


def spark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def connectors(version: str | None = None) -> Connectors:
    """The connectors published for ``version`` (default: the installed PySpark)."""
    version = version or spark_version()
    minor = ".".join(version.split(".")[:2])
    found = CONNECTORS.get(minor)
    if found is None:
        raise ConnectorsUnavailable(
            f"neither delta-spark nor iceberg-spark-runtime is published for Spark {version} "
            f"(published for {', '.join(sorted(CONNECTORS))}): run these tests in "
            "tox -e lake-spark40 / lake-spark41 / lake-spark42")
    return found


def _pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def jars(found: Connectors, *, delta: bool = True, iceberg: bool = True) -> list[str]:
    """Local jar paths of the connectors (and the JDBC drivers Iceberg's SQL catalogs
    need), less what PySpark ships."""
    wanted: list[Jar] = []
    if delta and found.delta:
        wanted.append(Jar("io.delta", "delta-spark_2.13", found.delta))
    if iceberg and found.iceberg and found.iceberg_artifact:
        wanted += [Jar("org.apache.iceberg", found.iceberg_artifact, found.iceberg),
                   SQLITE_JDBC, POSTGRES_JDBC]
    if not wanted:
        raise ConnectorsUnavailable(f"{found.describe()}: nothing asked for is published")
    name = "lake-" + "-".join(j.artifact + "-" + j.version for j in wanted[:2])
    try:
        return without_shipped(resolve(name, wanted), _pyspark_jars())
    except JarsUnavailable as exc:
        raise ConnectorsUnavailable(str(exc)) from exc


def iceberg_catalog_conf(name: str, properties: Mapping[str, str]) -> dict[str, str]:
    """Spark settings of an Iceberg catalog ``name`` (``type``: ``jdbc`` or ``rest``,
    ``uri``, ``warehouse``, ...)."""
    conf = {f"spark.sql.catalog.{name}": "org.apache.iceberg.spark.SparkCatalog"}
    conf.update({f"spark.sql.catalog.{name}.{k}": v for k, v in properties.items()})
    return conf


def session_conf(found: Connectors, classpath: list[str], *,
                 iceberg_catalogs: Mapping[str, Mapping[str, str]] | None = None
                 ) -> dict[str, str]:
    """Spark settings for a session with the connectors on ``classpath``: Delta's SQL
    extension and catalog (``spark_catalog``), Iceberg's extension and ``iceberg_catalogs``."""
    extensions = []
    conf = {"spark.driver.extraClassPath": ":".join(classpath),
            "spark.executor.extraClassPath": ":".join(classpath)}
    if found.delta:
        extensions.append("io.delta.sql.DeltaSparkSessionExtension")
        conf["spark.sql.catalog.spark_catalog"] = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
    if found.iceberg:
        extensions.append("org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        for name, props in (iceberg_catalogs or {}).items():
            conf.update(iceberg_catalog_conf(name, props))
    conf["spark.sql.extensions"] = ",".join(extensions)
    return conf
