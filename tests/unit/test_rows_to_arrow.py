"""PySpark 4.0 hands a streaming data source Rows, not Arrow: the Arrow batches txsink
builds from them keep the frame's Spark types (found by the interop work: inferred from
the Python values, an INT column became BIGINT and a timestamp lost its time zone, so a
table txsink created got the wrong types and one Spark created was refused)."""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator

import pyarrow as pa
import pytest
from pyspark.sql import Row
from pyspark.sql.types import (
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)
from txsink.spark.datasource import _rows_to_batches, arrow_schema


@pytest.fixture
def berlin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A driver whose local time is not UTC, where Spark's naive datetimes differ."""
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_rows_become_arrow_of_the_frames_spark_types(berlin: None) -> None:
    schema = StructType([
        StructField("id", IntegerType()), StructField("name", StringType()),
        StructField("at", TimestampType()), StructField("local", TimestampNTZType()),
        StructField("inner", StructType([StructField("at", TimestampType())])),
    ])
    noon = datetime.datetime(2026, 1, 1, 12, 0)  # as Spark hands it: naive, local time
    rows = [Row(id=7, name="a", at=noon, local=noon, inner=Row(at=noon)),
            Row(id=None, name=None, at=None, local=None, inner=None)]
    batches = list(_rows_to_batches(iter(rows), arrow_schema(schema)))
    table = pa.Table.from_batches(batches)
    assert table.schema.field("id").type == pa.int32()
    assert table.schema.field("at").type == pa.timestamp("us", tz="UTC")
    assert table.schema.field("local").type == pa.timestamp("us")
    first = table.to_pylist()[0]
    utc = datetime.datetime(2026, 1, 1, 11, 0, tzinfo=datetime.timezone.utc)
    assert first["at"] == utc and first["inner"]["at"] == utc
    assert first["local"] == noon
    assert table.to_pylist()[1]["id"] is None
