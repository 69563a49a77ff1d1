"""The native data path of the files backend without a JVM, in a process tests can kill.

``TargetSet.write_epoch`` (the real grouped-epoch code: reservation, staging, record,
decision, commit) runs against a stand-in for a Spark DataFrame whose ``write.parquet``
does what Spark's writer leaves in a directory: several ``part-*.snappy.parquet`` files
(one empty, as Spark writes for an empty task), ``_SUCCESS`` and ``.crc`` files. So a
SIGKILL at each protocol step (``TXSINK_FAULTS``) costs a Python process, not a Spark
driver; tests/e2e/test_files_native_spark.py runs the same path on Spark itself.

    python -m tests.integration.files_native_driver SPEC_JSON

SPEC: ``path``, ``state``, ``sink_id``, ``epochs`` (versions 0..n-1, ``ROWS`` rows
each), ``group`` (write the files target inside a group with a second files target).
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tests.spark_standins import StandInSession, StandInWriter

ROWS = 300
#: Spark tasks per epoch: the stand-in writes one file per task (the last one empty).
TASKS = 4


def rows_of(version: int) -> pa.Table:
    ids = list(range(version * ROWS, (version + 1) * ROWS))
    return pa.table({"id": pa.array(ids, pa.int64()),
                     "value": pa.array([i * 7 for i in ids], pa.int64())})


class _Writer(StandInWriter):
    def __init__(self, table: pa.Table) -> None:
        super().__init__()
        self.table = table

    def parquet(self, path: str) -> None:
        out = Path(path.removeprefix("file://"))
        out.mkdir(parents=True)  # errorifexists (Spark makes the parents)
        job = uuid.uuid4()
        step = -(-self.table.num_rows // (TASKS - 1))
        for task in range(TASKS):
            part = self.table.slice(task * step, step)  # the last task gets no rows
            name = f"part-{task:05d}-{job}-c000.snappy.parquet"
            pq.write_table(part, out / name, compression=self.opts.get("compression",
                                                                         "snappy"))
            (out / f".{name}.crc").write_bytes(b"crc")
        (out / "_SUCCESS").write_bytes(b"")


class FakeFrame:
    """What ``GroupEpoch.write`` uses of a DataFrame. ``query_id``: the frame is a
    micro-batch of that streaming query (``foreachBatch`` runs on the stream's thread,
    where Spark sets the query id as a local property)."""

    def __init__(self, table: pa.Table, *, query_id: str | None = None) -> None:
        from pyspark.sql.types import LongType, StructField, StructType

        self.table = table
        self.sparkSession = StandInSession(
            {"sql.streaming.queryId": query_id} if query_id is not None else None)
        self.schema = StructType([StructField(n, LongType()) for n in table.column_names])

    def where(self, condition: str) -> FakeFrame:
        """Only the conditions the tests use: ``id < N``."""
        import pyarrow.compute as pc

        column, op, value = condition.split()
        assert op == "<", condition
        frame = FakeFrame(self.table.filter(pc.less(self.table[column], int(value))))
        frame.sparkSession = self.sparkSession
        return frame

    @property
    def write(self) -> _Writer:
        return _Writer(self.table)

    def persist(self) -> FakeFrame:
        return self

    def unpersist(self) -> FakeFrame:
        return self


def main(spec: dict[str, Any]) -> None:
    from txsink.spark import target, targets

    items = [target("files", "files", path=spec["path"])]
    if spec.get("group"):
        items.append(target("copy", "files", path=spec["path"] + "-copy"))
        group = targets(spec["sink_id"], items, state_location=spec["state"])
    else:
        from txsink.spark.group import TargetSet
        from txsink.targets import TargetSpec

        group = TargetSet(spec["sink_id"], [TargetSpec(spec["sink_id"], "files",
                                                       {"path": spec["path"]})],
                          state_location=spec["state"], single=True)
    for version in range(spec["epochs"]):
        group.write_epoch(FakeFrame(rows_of(version)), version)  # type: ignore[arg-type]
    print("TXSINK-NATIVE-DONE", flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
