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


def test_a_kept_session_is_reused_and_one_that_lost_its_partition_claims_again(
        pg_server: PgServer, table_name: str) -> None:
    """A session kept between the tasks of one query run is taken again without a claim
    while its generation is the newest; one that another process claimed meanwhile
    (another Python worker got the next task) is claimed again when the task takes it,
    before a row is written; nothing is written twice."""
    from txsink.realtime import SessionPool

    sink = f"rt-{uuid.uuid4().hex[:8]}"
    target = spec(pg_server, table_name, sink)
    claims: list[str] = []

    def counting(name: str) -> Any:
        def factory(source: SourcePartition) -> Any:
            claims.append(name)
            return target(source)
        return factory

    mine, theirs = SessionPool(), SessionPool()
    row = lambda off: {"id": off, "name": "a", "amount": 1.0}  # noqa: E731
    try:
        w = PositionWriter(counting("first"), commit_interval_s=60, run="r", pool=mine)
        for off in range(3):
            w.add(SRC, off, row(off))
        w.close()
        kept = PositionWriter(counting("kept"), commit_interval_s=60, run="r", pool=mine)
        kept.add(SRC, 3, row(3))
        kept.close()
        other = PositionWriter(counting("other"), commit_interval_s=60, run="r",
                               pool=theirs)
        other.add(SRC, 4, row(4))
        other.close()
        again = PositionWriter(counting("again"), commit_interval_s=60, run="r", pool=mine)
        for off in range(4, 7):
            again.add(SRC, off, row(off))
        again.close()
        assert ids(pg_server, table_name) == list(range(7))
        assert claims == ["first", "other", "again"]  # "kept" took the kept session
        assert again.stats.skipped == 1 and again.stats.commits == 1
        assert target.stored_positions() == {SRC: 6}
    finally:
        mine.clear()
        theirs.clear()
