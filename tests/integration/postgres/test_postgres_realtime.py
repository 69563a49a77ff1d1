"""The PostgreSQL real-time target: rows and progress in one transaction, fencing,
and a server restart in the middle of the stream (no Spark: the writer driven directly)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from postgres_support import PgServer, local_or_skip
from txsink.errors import ConfigError, FencedError
from txsink.realtime import PositionWriter, SourcePartition
from txsink_postgres import PostgresBackend
from txsink_postgres import testing as pgtesting

pytestmark = [pytest.mark.integration]

SRC = SourcePartition("orders", 3)


def spec(server: PgServer, table: str, sink_id: str) -> Any:
    options = {"dsn": server.dsn, "table": table}
    if server.password:
        options["password"] = server.password
    target = PostgresBackend.realtime_target(sink_id, options)
    target.prepare()
    return target


def ids(server: PgServer, table: str) -> list[int]:
    with server.connect() as conn:
        return [r[0] for r in conn.execute(f"SELECT id FROM {table} ORDER BY id")]


@pytest.mark.promise("realtime-replay-skipped", "realtime")
def test_rows_and_progress_commit_together_and_a_replay_is_skipped(
        pg_server: PgServer, table_name: str) -> None:
    sink = f"rt-{uuid.uuid4().hex[:8]}"
    target = spec(pg_server, table_name, sink)
    w = PositionWriter(target, commit_interval_s=0.0)
    for off in range(10):
        w.add(SRC, off, {"id": off, "name": "a", "amount": 1.0})
    w.close()
    assert target.stored_positions() == {SRC: 9}
    replay = PositionWriter(target, commit_interval_s=0.0)
    for off in range(5, 15):
        replay.add(SRC, off, {"id": off, "name": "a", "amount": 1.0})
    replay.close()
    assert ids(pg_server, table_name) == list(range(15))
    assert replay.stats.skipped == 5 and target.stored_positions() == {SRC: 14}


@pytest.mark.promise("realtime-two-drivers-fenced", "realtime")
def test_a_second_writer_fences_the_first_before_it_writes_a_row(
        pg_server: PgServer, table_name: str) -> None:
    sink = f"rt-{uuid.uuid4().hex[:8]}"
    target = spec(pg_server, table_name, sink)
    old = PositionWriter(target, commit_interval_s=60)
    old.add(SRC, 0, {"id": 0, "name": "old", "amount": 0.0})
    new = PositionWriter(target, commit_interval_s=60)
    new.add(SRC, 0, {"id": 0, "name": "new", "amount": 0.0})
    with pytest.raises(FencedError, match="claimed by a newer writer"):
        old.close()
    new.close()
    with pg_server.connect() as conn:
        assert conn.execute(f"SELECT name FROM {table_name}").fetchall() == [("new",)]


def test_missing_table_is_refused_before_anything_is_written(pg_server: PgServer) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        spec(pg_server, f"public.nope_{uuid.uuid4().hex[:6]}", "rt-missing")


def test_a_restart_between_commits_loses_and_duplicates_nothing() -> None:
    local_or_skip()
    with pgtesting.LocalPostgres(max_prepared_transactions=0) as server:
        pg = PgServer.local(server)
        with psycopg.connect(server.dsn, password=server.password, autocommit=True) as conn:
            conn.execute("CREATE TABLE public.ev (id bigint)")
        target = spec(pg, "public.ev", "rt-restart")
        w = PositionWriter(target, commit_interval_s=0.0)
        for off in range(50):
            w.add(SRC, off, {"id": off})
        server.restart(mode="immediate")  # a crash: the writer's connection is gone
        with pytest.raises(psycopg.OperationalError):
            w.add(SRC, 50, {"id": 50})
        w.close(RuntimeError("task failed"))
        # The engine replays from its last checkpoint: before what the target holds.
        again = PositionWriter(target, commit_interval_s=0.0)
        for off in range(20, 80):
            again.add(SRC, off, {"id": off})
        again.close()
        assert ids(pg, "public.ev") == list(range(80))
