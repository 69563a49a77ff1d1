"""The default run's coverage promise, checked: every backend, both guarantees, and one
crash at every protocol step of every backend stay in ``uv run pytest``, whatever moves
to the long-run tox environments (``tests/long_runs.py``).

The map: (backend, guarantee, protocol step) -> the default-run test that covers it.
The check collects the default run (``testpaths``) in a child pytest with no long-run
variable set and fails if a test of the map is missing or skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from txsink.faults import NATIVE_POINTS, POINTS

from tests.chaos.lake import KINDS as LAKE_KINDS
from tests.chaos.runner import TASK_KINDS, plan_every_point
from tests.chaos.targets import TARGETS

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ("files", "postgres", "s3", "kafka", "delta", "iceberg")
#: The table formats: exactly_once only; their own faults (a concurrent committer, a log
#: write failing after success) are steps of the every-step chaos test too.
TABLES = ("delta", "iceberg")
CONFORMANCE = {
    "files": "tests/unit/test_conformance_files.py::TestFilesParquetConformance",
    "postgres": "tests/integration/postgres/test_postgres_conformance.py::"
                "TestPostgresConformance",
    "s3": "tests/integration/s3/test_s3_conformance.py::TestS3Conformance",
    "kafka": "tests/integration/kafka/test_kafka_conformance.py::TestKafkaConformance",
    "delta": "tests/integration/delta/test_delta_conformance.py::TestDeltaConformance",
    "iceberg": "tests/integration/iceberg/test_iceberg_conformance.py::TestIcebergConformance",
}
SPARK = {
    "files": "tests/e2e/test_files_exactly_once.py::"
             "test_task_failures_and_speculative_twins_then_batch_write",
    "postgres": "tests/e2e/test_postgres_spark.py::"
                "test_task_failures_and_speculative_twins_then_batch_write",
    "s3": "tests/e2e/test_s3_spark.py::test_task_failures_and_speculative_twins_then_batch_write",
    "kafka": "tests/e2e/test_kafka_spark.py::"
             "test_every_record_committed_once_and_no_transaction_left_open",
    "delta": "tests/e2e/test_lake_spark.py::"
             "test_group_stream_into_delta_and_iceberg_on_spark_writer",
    "iceberg": "tests/e2e/test_lake_spark.py::"
               "test_group_stream_into_delta_and_iceberg_on_spark_writer",
}
#: Every protocol step a crash is injected at, in the default run, per backend.
STEPS = (*POINTS, *TASK_KINDS)


def coverage_map() -> dict[tuple[str, str, str], str]:
    """(backend, guarantee, step) -> node id of the default-run test covering it."""
    out: dict[tuple[str, str, str], str] = {}
    for backend in BACKENDS:
        for step in (*STEPS, *(LAKE_KINDS if backend in TABLES else ())):
            out[(backend, "exactly_once", step)] = (
                f"tests/chaos/test_chaos.py::test_a_crash_at_every_protocol_step[{backend}]")
        out[(backend, "exactly_once", "spark")] = SPARK[backend]
        out[(backend, "exactly_once", "commit")] = (
            f"{CONFORMANCE[backend]}::test_data_invisible_until_commit_then_exactly_once")
        out[(backend, "exactly_once", "recovery")] = (
            f"{CONFORMANCE[backend]}::test_recovery_after_partial_commit")
        if backend not in TABLES:
            out[(backend, "at_least_once", "commit")] = (
                f"{CONFORMANCE[backend]}::test_non_transactional_guarantees_commit_in_the_task")
    for step in NATIVE_POINTS:  # the native data path (Spark's writer, staged files)
        out[("files", "exactly_once", step)] = (
            "tests/integration/test_files_native.py::"
            "test_driver_killed_at_every_native_step_in_turn_then_exact")
    # S3 on Spark's writer (writer: spark): every coordinator step, the native path's own
    # deaths and the task faults, over the real grouped-epoch code; and Spark itself.
    for step in (*STEPS, *TARGETS["s3-native"].points):
        out[("s3-native", "exactly_once", step)] = (
            "tests/chaos/test_chaos.py::test_a_crash_at_every_protocol_step[s3-native]")
    out[("s3-native", "exactly_once", "spark")] = (
        "tests/e2e/test_s3_native_spark.py::"
        "test_batch_and_stream_on_sparks_writer_each_row_once")
    out[("s3-native", "exactly_once", "commit")] = (
        "tests/integration/s3/test_s3_native.py::"
        "test_each_upload_becomes_the_participant_txsinks_own_writer_would_make")
    out[("s3-native", "exactly_once", "recovery")] = (
        "tests/integration/s3/test_s3_native.py::"
        "test_the_orphan_scan_aborts_dead_attempts_never_the_decided_uploads")
    out[("files", "at_least_once", "spark")] = (
        "tests/e2e/test_guarantee_spark.py::"
        "test_at_least_once_under_the_faults_loses_nothing_and_says_so")
    return out


def test_the_every_step_plan_crashes_at_every_protocol_step() -> None:
    for can_restart, can_kill in ((False, False), (True, False), (True, True)):
        plan = plan_every_point(can_restart, can_kill)
        assert sorted(p for _, p, _ in plan.driver_faults) == sorted(POINTS)
        assert plan.lake == {}
        assert sorted(plan.task_faults.values()) == sorted(TASK_KINDS)
        servers = [kind for _, _, kind in plan.driver_faults if kind]
        assert servers == ([("server-kill" if can_kill else "server-restart")]
                           if can_restart else [])
    table = plan_every_point(False, False, LAKE_KINDS)
    assert sorted(table.lake.values()) == sorted(LAKE_KINDS)


def test_every_cell_of_the_map_runs_in_the_default_run() -> None:
    cells = coverage_map()
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("TXSINK_") and k.endswith(("LONG", "CHAOS")))}
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "-p", "tests.coverage_probe"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    state = {}
    for line in done.stdout.splitlines():
        if line.startswith("COVERAGE-PROBE "):
            _, verdict, nodeid = line.split(" ", 2)
            state[nodeid] = verdict
    assert state, done.stdout[-3000:] + done.stderr[-3000:]
    running = {n for n, verdict in state.items() if verdict == "runs"}
    # A cell names a test; its parametrized forms (a broker kind, say) cover it too.
    missing = {cell: n for cell, n in cells.items()
               if n not in running and not any(r.startswith(f"{n}[") for r in running)}
    assert missing == {}, "cells of the coverage map the default run does not cover"
    assert {b for b, _, _ in cells} == {*BACKENDS, "s3-native"}
    assert {g for _, g, _ in cells} == {"exactly_once", "at_least_once"}
