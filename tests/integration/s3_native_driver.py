"""The S3 native path without a JVM, in a process tests can kill.

``TargetSet.write_epoch`` (the real grouped-epoch code: reservation, the backend's
session check, staging, reading Spark's job document, record, decision, commit) runs
against a stand-in for a Spark DataFrame whose ``write.parquet`` leaves in S3 exactly what
txsink-s3's commit protocol (``NativeCommitProtocol``, backends/s3/jvm) leaves: one
pending multipart upload per task at the key txsink's own writer gives that task, the
uploads of failed, retried and speculative attempts beside them (pending, listed
nowhere), and the job document listing the committed tasks' uploads with their rows. So a
SIGKILL at each protocol step costs a Python process, not a Spark driver;
tests/e2e/test_s3_native_spark.py runs the same path on Spark itself.

    python -m tests.integration.s3_native_driver SPEC_JSON

SPEC: ``options`` (the S3 target's, ``writer: spark``), ``state``, ``sink_id``,
``epochs`` (versions 0..n-1), ``partitions`` (tasks with rows per version, the rows of
:func:`tests.chaos.driver.row_ids`; one more task has none), ``run`` (attempt ids are unique per
run, as Spark's are per application), ``task_faults`` (``"epoch:task"`` -> a task fault
kind, fired once: see :class:`SparkWriterStandIn`), ``faults_log`` (where fired faults
are noted), ``group`` (write the target inside a group with a second one, under another prefix).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from tests.spark_standins import StandInSession, StandInWriter

#: Spark tasks per epoch: the stand-in writes one file per task, the last one without
#: rows (Spark writes a file with only the schema for an empty first task; here the last).
TASKS = 4
#: Task faults, as a Spark executor sees them: the attempt's upload is left pending and
#: another attempt writes the task again (retry), or a second attempt races it (twin).
TASK_FAULTS = ("task-dies-before-prepare", "task-dies-after-prepare", "speculative-twin")


def table_of(ids: Any) -> pa.Table:
    ids = list(ids)
    return pa.table({"id": pa.array(ids, pa.int64()),
                     "key": pa.array([f"k{i % 13}" for i in ids]),
                     "value": pa.array([i * 7 for i in ids], pa.int64())})


def tasks_of(version: int, partitions: int = TASKS - 1) -> list[pa.Table]:
    """The rows of one version split over ``partitions`` tasks (ids of
    :func:`tests.chaos.driver.row_ids`), and a last task without rows."""
    from tests.chaos.driver import row_ids

    return [table_of(row_ids(version, p)) for p in range(partitions)] + [table_of([])]


class SparkWriterStandIn:
    """What ``df.write.options(**native_write_options).parquet(path)`` leaves in S3
    (:func:`txsink_s3.testing.spark_native_job`).

    ``task_faults``: task number -> kind, for this write: ``task-dies-before-prepare``
    (the attempt started its upload and died; a retry writes the task),
    ``task-dies-after-prepare`` (the attempt uploaded every part and died before task
    commit; a retry writes it), ``speculative-twin`` (a second attempt uploads too and
    loses the commit race). Only the winning attempts are in the job document.
    """

    KINDS = {"task-dies-before-prepare": "started", "task-dies-after-prepare": "died",
             "speculative-twin": "twin"}

    def __init__(self, options: Mapping[str, str], *, run: int = 0,
                 task_faults: Mapping[int, str] | None = None,
                 note: Any = None) -> None:
        from txsink.plugins import get_plugins

        self.backend = get_plugins().create_backend("s3", dict(options))
        self.run = run
        self.task_faults = dict(task_faults or {})
        self.note = note or (lambda kind, task: None)
        self.writes = 0

    def write(self, tasks: list[pa.Table], path: str) -> None:
        """``tasks``: each Spark task's rows, in task order."""
        from txsink_s3.testing import spark_native_job

        # Attempt ids unique per run, as Spark's are per application.
        first = self.run * 100_000 + self.writes * 100 + 1
        self.writes += 1
        spark_native_job(self.backend, path, tasks, first_attempt=first,
                         dead={t: self.KINDS[k] for t, k in self.task_faults.items()})
        for task, kind in self.task_faults.items():
            self.note(kind, task)


class _Writer(StandInWriter):
    def __init__(self, frame: FakeFrame) -> None:
        super().__init__()
        self.frame = frame

    def parquet(self, path: str) -> None:
        conf = self.frame.sparkSession.conf.values
        assert conf.get("spark.sql.sources.commitProtocolClass"), conf
        assert self.opts.get("txsink.s3.native") == "true", self.opts
        self.frame.writer.write(self.frame.tasks, path)


class FakeFrame:
    """What ``GroupEpoch.write`` uses of a DataFrame."""

    def __init__(self, tasks: list[pa.Table], writer: SparkWriterStandIn) -> None:
        from pyspark.sql.types import LongType, StringType, StructField, StructType

        self.tasks = tasks
        self.writer = writer
        self.sparkSession = StandInSession()
        self.schema = StructType([StructField("id", LongType()), StructField("key", StringType()),
                                  StructField("value", LongType())])

    @property
    def write(self) -> _Writer:
        return _Writer(self)

    def persist(self) -> FakeFrame:
        return self

    def unpersist(self) -> FakeFrame:
        return self


def without_jvm_checks() -> None:
    """The stand-in has no JVM whose class path and s3a:// the session check could
    look at: name the protocol as the check would once it passed."""
    from txsink_s3 import native
    from txsink_s3.jvm import PROTOCOL_CLASS

    def session_conf(backend: Any, spark: Any) -> dict[str, str]:
        return {"spark.sql.sources.commitProtocolClass": PROTOCOL_CLASS}

    native.session_conf = session_conf  # type: ignore[assignment]


def main(spec: dict[str, Any]) -> None:
    from txsink.spark import target, targets
    from txsink.spark.group import TargetSet
    from txsink.targets import TargetSpec

    if os.environ.get("TXSINK_FAULTS"):
        os.environ.setdefault("TXSINK_FAULTS_KILL_PID", str(os.getpid()))
    without_jvm_checks()
    log = Path(spec["faults_log"]) if spec.get("faults_log") else None
    fired = set(log.read_text().split()) if log is not None and log.exists() else set()
    if spec.get("group"):  # a second target on the native path, under another prefix
        other = {**spec["options"], "prefix": spec["options"].get("prefix", "") + "-copy"}
        group = targets(spec["sink_id"], [target("s3", "s3", **spec["options"]),
                                          target("copy", "s3", **other)],
                        state_location=spec["state"])
    else:
        group = TargetSet(spec["sink_id"], [TargetSpec(spec["sink_id"], "s3", spec["options"])],
                          state_location=spec["state"], single=True)
    for version in range(spec["epochs"]):
        faults: dict[int, str] = {}
        for where, kind in (spec.get("task_faults") or {}).items():
            epoch, task = (int(x) for x in where.split(":"))
            if epoch == version and f"{kind}@{where}" not in fired:
                faults[task] = kind

        def note(kind: str, task: int, version: int = version) -> None:
            if log is not None:
                with open(log, "a") as f:
                    f.write(f"{kind}@{version}:{task}\n")
                    f.flush()
                    os.fsync(f.fileno())

        writer = SparkWriterStandIn(spec["options"], run=spec.get("run", 0),
                                    task_faults=faults, note=note)
        frame = FakeFrame(tasks_of(version, spec.get("partitions", TASKS - 1)), writer)
        group.write_epoch(frame, version)  # type: ignore[arg-type]
    print("TXSINK-S3-NATIVE-DONE", flush=True)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main(json.loads(sys.argv[1]))
