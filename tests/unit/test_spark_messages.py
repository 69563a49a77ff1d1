"""Spark's error texts become one line naming the field; resumed runs are described.

The texts are the ones PySpark 4 produced for these mistakes (recorded from real
sessions); the functions under test take strings, so no JVM is needed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from txsink.config import parse_pipeline
from txsink.coordinator import Coordinator
from txsink.files.backend import FilesBackend
from txsink.spark.checks import source_error, spark_message, transform_error
from txsink.spark.messages import first_lines
from txsink.spark.pipeline import resume_notes
from txsink.state import DirectoryStateStore, EpochRecord, EpochState

PARSE_ERROR = ("\n[PARSE_SYNTAX_ERROR] Syntax error at or near 'SELEC'. SQLSTATE: 42601 "
               "(line 1, pos 0)\n\n== SQL ==\nSELEC value FROM source\n^^^\n")
UNRESOLVED = ("[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column, variable, or function parameter "
              "with name `valu` cannot be resolved. Did you mean one of the following? "
              "[`value`, `timestamp`]. SQLSTATE: 42703; line 1 pos 7;\n'Project ['valu]\n"
              "+- ~SubqueryAlias source\n")
NOT_FOUND = ("An error occurred while calling o87.load.\n: org.apache.spark."
             "SparkClassNotFoundException: [DATA_SOURCE_NOT_FOUND] Failed to find the data "
             "source: nosuchformat. Make sure the provider name is correct. SQLSTATE: 42K02\n"
             "\tat org.apache.spark.sql.errors.QueryExecutionErrors$.dataSourceNotFoundError")


def _cfg(tmp_path: Path, source: dict[str, object]) -> object:
    return parse_pipeline({"source": source, "transform": "SELECT * FROM source",
                           "sink": {"backend": "files", "sink_id": "s",
                                    "options": {"path": str(tmp_path / "out")}},
                           "checkpoint": str(tmp_path / "chk")})


@pytest.mark.parametrize(("text", "expected"), [
    (PARSE_ERROR, "Syntax error at or near 'SELEC' (line 1, pos 0)"),
    (UNRESOLVED, "A column, variable, or function parameter with name `valu` cannot be "
                 "resolved. Did you mean one of the following? [`value`, `timestamp`] "
                 "(line 1, pos 7)"),
    (NOT_FOUND, "Failed to find the data source: nosuchformat. Make sure the provider name "
                "is correct"),
])
def test_spark_message_is_one_line_without_plan_or_frames(text: str, expected: str) -> None:
    assert spark_message(Exception(text)) == expected


def test_transform_error_names_the_field() -> None:
    error = transform_error(Exception(PARSE_ERROR))
    assert error.field == "transform"
    assert str(error).startswith("transform: Spark cannot run this SQL")
    assert "\n" not in str(error)


def test_source_errors_name_the_option_by_name_or_by_value(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, {"type": "rate", "options": {"rowsPerSecond": "twenty",
                                                      "numPartitions": "2"}})
    by_value = source_error(cfg, Exception('For input string: "twenty"'))  # type: ignore[arg-type]
    assert by_value.field == "source.options.rowsPerSecond"
    by_name = source_error(cfg, Exception(  # type: ignore[arg-type]
        "Invalid value '-1'. The option 'numPartitions' must be positive"))
    assert by_name.field == "source.options.numPartitions"
    spark_cfg = _cfg(tmp_path, {"type": "spark", "format": "nosuchformat"})
    assert source_error(spark_cfg, Exception(NOT_FOUND)).field == "source.format"  # type: ignore[arg-type]


def test_query_failure_names_the_python_error_at_the_bottom() -> None:
    text = ("[STREAM_FAILED] Query [id = 1] terminated with exception: Failed when Python "
            "streaming data source perform commit: Traceback (most recent call last):\n"
            '  File "/x/worker.py", line 1, in main\n'
            "txsink.faults.InjectedFault: injected fault at before-decide (epoch 1)\n"
            "\tat org.apache.spark.X(X.scala:1)")
    assert first_lines(text) == "InjectedFault: injected fault at before-decide (epoch 1)"
    assert first_lines("ValueError: x\ntxsink.errors.CommitError: participant p is gone") == (
        "CommitError: participant p is gone")


def test_resume_notes_say_where_a_run_continues_and_what_it_replays(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, {"type": "rate"})
    store = DirectoryStateStore(tmp_path / "chk" / "txsink")
    assert resume_notes(cfg, store) == []  # type: ignore[arg-type]  # a first run: silent
    chk = tmp_path / "chk"
    for sub, ids in (("offsets", [0, 1, 2, 3]), ("commits", [0, 1, 2])):
        (chk / sub).mkdir(parents=True)
        for i in ids:
            (chk / sub / str(i)).write_text("v1")
    options = {"path": str(tmp_path / "out")}
    coordinator = Coordinator(FilesBackend.from_options(options), store, "s",
                              backend_options=options)
    coordinator.start()
    store.put(coordinator.lease, EpochRecord(2, EpochState.COMMITTED, (), 0.0, 1.0))
    store.put(coordinator.lease, EpochRecord(3, EpochState.DECIDED, (), 0.0))
    notes = resume_notes(cfg, store)  # type: ignore[arg-type]
    assert notes[0] == (f"resuming sink 's' at epoch 3 from {chk}; replaying epoch 3 "
                        "(planned before the last stop but not finished in Spark)")
    assert "epoch(s) 3 were decided but not fully committed" in notes[1]
    assert "catch-up rows" in notes[2]
    (chk / "commits" / "3").write_text("v1")
    assert resume_notes(cfg, store)[0] == f"resuming sink 's' at epoch 4 from {chk}"  # type: ignore[arg-type]
