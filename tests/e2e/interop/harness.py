"""What the interop tests share: the input, the two ways txsink streams into a table,
and the independent readers (delta-rs, pyiceberg) to compare Spark with."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tests.e2e.spark_harness import SCHEMA

#: Rows as (id, key, amount, at): the values of every column, compared whole.
Row = tuple[int, int, int, int]


def write_input(directory: Path, first_file: int, files: int, rows_per_file: int = 50
                ) -> list[Row]:
    """JSON-lines files ``first_file ..``, one micro-batch each (mtime increasing)."""
    directory.mkdir(parents=True, exist_ok=True)
    out: list[Row] = []
    for f in range(first_file, first_file + files):
        chunk = [(i, i % 7, (i * 37) % 1000, i)
                 for i in range(f * rows_per_file, (f + 1) * rows_per_file)]
        out += chunk
        path = directory / f"input-{f:04d}.json"
        path.write_text("".join(json.dumps({"id": r[0], "key": r[1], "amount": r[2]}) + "\n"
                                for r in chunk))
        os.utime(path, (1_700_000_000 + f, 1_700_000_000 + f))
    return out


def source(spark: Any, directory: Path) -> Any:
    """The input as a stream, one file per micro-batch, with a timestamp column."""
    from pyspark.sql import functions as F

    return (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
            .json(str(directory)).withColumn("at", F.timestamp_seconds(F.col("id"))))


def stream(spark: Any, path_kind: str, backend: str, options: Mapping[str, str],
           input_dir: Path, checkpoint: Path, sink_id: str) -> None:
    """Every input file into the table through txsink, to the end (``availableNow``):
    ``native`` is a group of one target (Spark's Parquet writer into the table, the
    driver commits), ``datasource`` is ``writeStream.format("txsink")``."""
    df = source(spark, input_dir)
    if path_kind == "native":
        from txsink.spark import target, targets

        group = targets(sink_id, [target("t", backend, **options)],
                        checkpoint_location=str(checkpoint))
        writer = group.write_stream(df)
    else:
        writer = (df.writeStream.format("txsink").option("backend", backend)
                  .option("sink_id", sink_id).option("checkpointLocation", str(checkpoint))
                  .options(**options))
    query = writer.trigger(availableNow=True).start()
    assert query.awaitTermination(300), "the stream did not finish"
    assert query.exception() is None, query.exception()


def as_rows(records: Iterable[Any]) -> list[Row]:
    """Sorted (id, key, amount, at seconds) of Spark Rows or dicts."""
    out = []
    for r in records:
        d = r.asDict() if hasattr(r, "asDict") else dict(r)
        at = d["at"]
        seconds = int(at.timestamp()) if hasattr(at, "timestamp") else int(at) // 1_000_000
        out.append((int(d["id"]), int(d["key"]), int(d["amount"]), seconds))
    return sorted(out)


def delta_rs_rows(path: Path | str, version: int | None = None) -> list[Row]:
    from deltalake import DeltaTable

    table = DeltaTable(str(path), version=version)
    return as_rows(table.to_pyarrow_table().to_pylist())


def delta_txsink_versions(path: Path | str, sink_id: str) -> dict[int, int]:
    """Log version -> epoch of every entry txsink committed for ``sink_id``."""
    from deltalake import DeltaTable

    out = {}
    for entry in DeltaTable(str(path)).history():
        if entry.get("txsink.sink") == sink_id:
            out[int(entry["version"])] = int(entry["txsink.epoch"])
    return out


def pyiceberg_table(options: Mapping[str, str]) -> Any:
    from txsink_iceberg.backend import IcebergBackend

    return IcebergBackend.from_options(dict(options))._load()


def pyiceberg_rows(options: Mapping[str, str], snapshot_id: int | None = None) -> list[Row]:
    table = pyiceberg_table(options)
    return as_rows(table.scan(snapshot_id=snapshot_id).to_arrow().to_pylist())


def iceberg_txsink_snapshots(options: Mapping[str, str], sink_id: str) -> dict[int, int]:
    """Snapshot id -> epoch of every snapshot txsink committed for ``sink_id``."""
    out = {}
    for snap in pyiceberg_table(options).snapshots():
        summary = snap.summary
        if summary is not None and summary.get("txsink.sink") == sink_id:
            out[int(snap.snapshot_id)] = int(summary["txsink.epoch"])
    return out
