"""The PostgreSQL real-time target's positions as identities, on a real server (no
Spark: the position writer driven as a task drives it).

Each case once lost rows silently: positions deleted to start over restarted the
generation at 1, so a zombie task of the dead driver (generation 1 too) kept writing
into the new run's positions; a sink id reused for another table found the old table's
positions and skipped every record; a position of a recreated source topic was used to
skip the new topic's records.
"""

from __future__ import annotations

import json
import pickle
import uuid
from pathlib import Path
from typing import Any

import pytest
from postgres_support import PgServer
from txsink.errors import ConfigError, FencedError
from txsink.realtime import PositionWriter, SourcePartition
from txsink_postgres import PostgresBackend

pytestmark = [pytest.mark.integration]

SRC = SourcePartition("orders", 3)


def spec(server: PgServer, table: str, sink_id: str, **extra: str) -> Any:
    options = {"dsn": server.dsn, "table": table, **extra}
    if server.password:
        options["password"] = server.password
    target = PostgresBackend.realtime_target(sink_id, options)
    target.prepare()
    return target


def ids(server: PgServer, table: str) -> list[int]:
    with server.connect() as conn:
        return [r[0] for r in conn.execute(f"SELECT id FROM {table} ORDER BY id")]


def row(off: int, who: str = "a") -> dict[str, Any]:
    return {"id": off, "name": who, "amount": 1.0}


@pytest.mark.promise("realtime-deleted-position-is-no-position", "realtime")
@pytest.mark.parametrize("delete", ["sql", "delete_positions"])
def test_a_zombie_writer_stays_fenced_after_its_positions_are_deleted_to_start_over(
        pg_server: PgServer, table_name: str, delete: str) -> None:
    """The start-over runbook while a zombie task still writes: empty the table, delete
    the positions (the SQL an operator would run, or ``txsink reset``'s own), start
    again. The zombie must not add a row, nor move the new run's positions."""
    sink = f"rt-{uuid.uuid4().hex[:8]}"
    target = spec(pg_server, table_name, sink)
    zombie = PositionWriter(target, commit_interval_s=0.0)
    for off in range(100, 105):
        zombie.add(SRC, off, row(off, "zombie"))
    with pg_server.connect() as conn:
        conn.execute(f"TRUNCATE {table_name}")
        if delete == "sql":
            conn.execute("DELETE FROM public.txsink_progress WHERE sink_id = %s", [sink])
    if delete == "delete_positions":
        assert target.delete_positions() == [
            f"{SRC}: offset 104 (row deleted from public.txsink_progress)"]
    # The next run: a new driver prepares the target again (its own generation).
    fresh = PositionWriter(spec(pg_server, table_name, sink), commit_interval_s=0.0)
    for off in range(0, 3):
        fresh.add(SRC, off, row(off, "new"))
    with pytest.raises(FencedError, match="claimed by a newer writer"):
        zombie.add(SRC, 105, row(105, "zombie"))
    zombie.close(RuntimeError("task killed"))
    for off in range(3, 6):
        fresh.add(SRC, off, row(off, "new"))
    fresh.close()
    assert ids(pg_server, table_name) == list(range(6))
    assert target.stored_positions() == {SRC: 5}


@pytest.mark.promise("realtime-reset-fences-old-run", "realtime")
def test_a_task_of_the_old_run_claiming_after_a_reset_is_refused_and_writes_nothing(
        pg_server: PgServer, table_name: str) -> None:
    """docs/realtime.md's start-over while a task of the dead driver that had not claimed
    its source partition yet still runs (it holds no row a reset could delete): once it
    claimed after the reset, fencing the new run, and stored its old batch's position
    over the new run's, which then skipped its records below it. Now its run's
    generation (drawn when its driver prepared the target) is older than the reset's:
    the claim is refused, takes no generation and writes nothing."""
    sink = f"rt-{uuid.uuid4().hex[:8]}"
    old = spec(pg_server, table_name, sink)
    first = PositionWriter(old, commit_interval_s=0.0)
    for off in range(2):
        first.add(SRC, off, row(off, "old"))
    # The old run's task of the next batch, shipped to its executor, not claimed yet.
    zombie = PositionWriter(pickle.loads(pickle.dumps(old)), commit_interval_s=0.0)
    assert old.delete_positions() == [
        f"{SRC}: offset 1 (row deleted from public.txsink_progress)"]
    first.close(RuntimeError("driver killed"))
    with pg_server.connect() as conn:
        conn.execute(f"TRUNCATE {table_name}")
    new = spec(pg_server, table_name, sink)
    assert old.run is not None and new.run is not None and new.run > old.run
    fresh = PositionWriter(new, commit_interval_s=0.0)
    fresh.add(SRC, 0, row(0, "new"))
    with pytest.raises(FencedError, match=r"started before the sink's positions were "
                                          r"deleted \(txsink reset"):
        zombie.add(SRC, 2, row(2, "zombie"))
    zombie.close(RuntimeError("task failed"))
    for off in range(1, 4):  # the new run was not fenced by the refused claim
        fresh.add(SRC, off, row(off, "new"))
    fresh.close()
    assert ids(pg_server, table_name) == list(range(4))
    with pg_server.connect() as conn:
        assert {r[0] for r in conn.execute(f"SELECT name FROM {table_name}")} == {"new"}
    # The reset row is no position: status and the checks before a start skip it.
    assert new.stored_positions() == {SRC: 3}
    # Another reset (only another topic's positions) fences the run before it too.
    new.delete_positions(["audit"])
    late = PositionWriter(pickle.loads(pickle.dumps(new)), commit_interval_s=0.0)
    with pytest.raises(FencedError, match="this task belongs to a run"):
        late.add(SourcePartition("audit", 0), 0, row(9, "late"))
    late.close(RuntimeError("task failed"))
    assert ids(pg_server, table_name) == list(range(4))


def test_generations_of_an_older_progress_table_are_carried_into_the_sequence(
        pg_server: PgServer, table_name: str) -> None:
    """A progress table an older release wrote (no identity columns, generations counted
    per row) is migrated: its positions stay, and a new claim's generation is above
    every generation a row held (a zombie of the old release stays fenced)."""
    progress = f"public.p_{uuid.uuid4().hex[:8]}"
    sink = f"rt-{uuid.uuid4().hex[:8]}"
    with pg_server.connect() as conn:
        conn.execute(f"CREATE TABLE {progress} (sink_id text NOT NULL, source_topic text "
                     "NOT NULL, source_partition integer NOT NULL, source_offset bigint NOT "
                     "NULL, generation bigint NOT NULL, PRIMARY KEY (sink_id, source_topic, "
                     "source_partition))")
        conn.execute(f"INSERT INTO {progress} VALUES (%s, 'orders', 3, 4, 41)", [sink])
    target = spec(pg_server, table_name, sink, progress_table=progress)
    assert target.stored_positions() == {SRC: 4}
    w = PositionWriter(target, commit_interval_s=0.0)
    for off in range(8):
        w.add(SRC, off, row(off))
    w.close()
    assert ids(pg_server, table_name) == [5, 6, 7] and w.stats.skipped == 5
    with pg_server.connect() as conn:
        generation, topic_id, dest = conn.execute(
            f"SELECT generation, topic_id, destination FROM {progress}").fetchone()
    assert generation > 41 and topic_id is None and table_name.split(".")[-1] in dest


@pytest.mark.promise("realtime-sink-id-reused-refused", "realtime")
def test_a_sink_id_reused_for_another_table_is_refused_not_skipped(
        pg_server: PgServer, table_name: str) -> None:
    """A copy of the pipeline (a new checkpoint) or the same one with ``table``
    changed: the positions belong to the first table; taken for the second one's they
    skipped every record it should receive."""
    sink = f"rt-{uuid.uuid4().hex[:8]}"
    w = PositionWriter(spec(pg_server, table_name, sink), commit_interval_s=0.0)
    for off in range(10):
        w.add(SRC, off, row(off))
    w.close()
    other = f"public.o_{uuid.uuid4().hex[:8]}"
    with pg_server.connect() as conn:
        conn.execute(f"CREATE TABLE {other} (LIKE {table_name})")
    moved = PositionWriter(spec(pg_server, other, sink), commit_interval_s=0.0)
    with pytest.raises(ConfigError) as info:
        moved.add(SRC, 0, row(0))
    moved.close(info.value)
    text = str(info.value)
    assert info.value.field == "sink.options.table" and "\n" not in text
    assert f"sink {sink!r} moved: its stored positions recorded table {table_name!r}" in text
    assert "write the new place under another sink_id" in text
    assert ids(pg_server, other) == []
    assert ids(pg_server, table_name) == list(range(10))


@pytest.mark.promise("realtime-recreated-source-topic-refused", "realtime")
def test_a_position_of_a_recreated_source_topic_is_refused_at_the_claim(
        pg_server: PgServer, table_name: str) -> None:
    sink = f"rt-{uuid.uuid4().hex[:8]}"
    target = spec(pg_server, table_name, sink)
    w = PositionWriter(target, commit_interval_s=0.0)
    for off in range(10):
        w.add(SourcePartition("orders", 3, "id-before"), off, row(off))
    w.close()
    assert target.stored()[SRC].topic_id == "id-before"
    again = PositionWriter(target, commit_interval_s=0.0)
    with pytest.raises(ConfigError, match="source topic 'orders' is not the topic whose "
                                          "offsets sink") as info:
        again.add(SourcePartition("orders", 3, "id-after"), 0, row(0))
    again.close(info.value)
    assert "--source-topic orders" in str(info.value)
    assert ids(pg_server, table_name) == list(range(10))
    # The way out: delete that topic's positions; the new topic's records then land.
    assert len(target.delete_positions(["orders"])) == 1
    fresh = PositionWriter(spec(pg_server, table_name, sink), commit_interval_s=0.0)
    for off in range(3):
        fresh.add(SourcePartition("orders", 3, "id-after"), off, row(100 + off))
    fresh.close()
    assert ids(pg_server, table_name) == [*range(10), 100, 101, 102]
    assert target.stored()[SRC].topic_id == "id-after"


def test_deleting_positions_of_one_topic_keeps_the_others(
        pg_server: PgServer, table_name: str) -> None:
    sink = f"rt-{uuid.uuid4().hex[:8]}"
    target = spec(pg_server, table_name, sink)
    w = PositionWriter(target, commit_interval_s=0.0)
    w.add(SourcePartition("a", 0), 4, row(1))
    w.add(SourcePartition("b", 0), 7, row(2))
    w.close()
    assert target.delete_positions(["a"]) == [
        "a-0: offset 4 (row deleted from public.txsink_progress)"]
    assert target.stored_positions() == {SourcePartition("b", 0): 7}


@pytest.mark.promise("realtime-reset-fences-and-deletes-positions", "cli")
def test_the_start_over_runbook_with_txsink_reset_lands_every_row_once(
        pg_server: PgServer, table_name: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/realtime.md, "To start over", on a PostgreSQL target, with a source topic
    given to ``--source-topic`` too: only that topic's positions go."""
    from txsink.cli import main

    sink = f"rt-{uuid.uuid4().hex[:8]}"
    target = spec(pg_server, table_name, sink)
    w = PositionWriter(target, commit_interval_s=0.0)
    for off in range(10):
        w.add(SRC, off, row(off))
    w.add(SourcePartition("audit", 0), 3, row(99))
    w.close()
    checkpoint = tmp_path / "chk"
    (checkpoint / "offsets").mkdir(parents=True)
    monkeypatch.setenv("TXSINK_TEST_PG_PASSWORD", pg_server.password or "")
    file = tmp_path / "rt.json"
    file.write_text(json.dumps({
        "source": {"type": "spark", "format": "kafka", "options": {
            "kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "orders,audit"}},
        "sink": {"backend": "postgres", "sink_id": sink, "options": {
            "dsn": pg_server.dsn, "table": table_name,
            **({"password_env": "TXSINK_TEST_PG_PASSWORD"} if pg_server.password else {})}},
        "checkpoint": str(checkpoint), "trigger": {"real_time": "5 seconds"}}))
    assert main(["reset", str(file), "--yes", "--source-topic", "orders"]) == 0
    out = capsys.readouterr().out
    assert (f"target (postgres database {target.database} table {table_name}): the stored "
            f"positions of source topic(s) orders of sink id {sink}: {SRC} offset 9") in out
    assert f"deleted {SRC}: offset 9 (row deleted from public.txsink_progress)" in out
    assert not checkpoint.exists()
    with pg_server.connect() as conn:  # then empty the target (here: that topic's rows)
        conn.execute(f"DELETE FROM {table_name} WHERE id < 99")
    assert target.stored_positions() == {SourcePartition("audit", 0): 3}
    again = PositionWriter(spec(pg_server, table_name, sink), commit_interval_s=0.0)
    for off in range(10):
        again.add(SRC, off, row(off))
    again.add(SourcePartition("audit", 0), 3, row(99))  # held: skipped
    again.close()
    assert ids(pg_server, table_name) == [*range(10), 99]
    assert again.stats.skipped == 1


def test_delete_positions_from_python_for_a_group_and_one_source_topic(
        pg_server: PgServer, table_name: str) -> None:
    """``txsink.spark.realtime.delete_positions`` (docs/realtime.md, for Python users):
    every target of a group, only the source topic named."""
    import txsink.spark as ts
    from txsink.realtime import GroupWriter
    from txsink.spark.realtime import delete_positions

    other = f"public.o_{uuid.uuid4().hex[:8]}"
    with pg_server.connect() as conn:
        conn.execute(f"CREATE TABLE {other} (LIKE {table_name})")
    secret = {"password": pg_server.password} if pg_server.password else {}
    group = ts.targets(f"rtg-{uuid.uuid4().hex[:6]}", [
        ts.target("a", "postgres", dsn=pg_server.dsn, table=table_name, **secret),
        ts.target("b", "postgres", dsn=pg_server.dsn, table=other, **secret)],
        realtime=True)
    specs = {n: spec(pg_server, t, f"{group.sink_id}--{n}")
             for n, t in (("a", table_name), ("b", other))}
    w = GroupWriter(dict(specs), commit_interval_s=0.0)
    w.add(SourcePartition("orders", 0), 5, {"a": row(1), "b": row(1)})
    w.add(SourcePartition("audit", 0), 2, {"a": row(2), "b": row(2)})
    w.close()
    lines = delete_positions(targets=group, source_topics=["orders"])
    assert sorted(lines) == [
        "target a: orders-0: offset 5 (row deleted from public.txsink_progress)",
        "target b: orders-0: offset 5 (row deleted from public.txsink_progress)"]
    for target in specs.values():
        assert target.stored_positions() == {SourcePartition("audit", 0): 2}
