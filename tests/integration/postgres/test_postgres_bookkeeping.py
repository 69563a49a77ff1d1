"""Bookkeeping: orphan listing is exact per sink id; old commit markers are pruned."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from postgres_support import PgServer
from txsink.coordinator import Coordinator
from txsink.model import TransactionContext
from txsink.plugins import build_plugins, get_plugins
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant
from txsink_postgres import PostgresBackend

pytestmark = pytest.mark.integration


@pytest.mark.promise("postgres-orphans-exact-sink", "backend")
def test_list_prepared_is_exact_per_sink_id(pg_server: PgServer, table_name: str) -> None:
    backend = get_plugins().create_backend("postgres", pg_server.options(table_name))
    assert isinstance(backend, PostgresBackend)
    backend.preflight("iso_a")
    one = pa.record_batch({"id": pa.array([1], pa.int64())})
    # "iso_a" as a LIKE pattern also matches "isoXa"; "iso_a-e1" starts with "iso_a-e".
    sinks = ["iso_a", "isoXa", "iso_a-e1", "iso_a-e1-p0"]
    made = {s: write_participant(backend, TransactionContext(s, 1, 0), [one]) for s in sinks}
    try:
        for s in sinks:
            found = list(backend.list_prepared(s))
            assert [c.participant for c in found] == [made[s].participant], s
            assert found[0].payload["xid"] == made[s].payload["xid"]
        aborted = backend.abort_orphans("iso_a", protected=set())
        assert [c.participant for c in aborted] == [made["iso_a"].participant]
        assert set(pg_server.prepared_gids("isoXa")) == {made["isoXa"].payload["gid"]}
    finally:
        for c in made.values():
            backend.abort(c)
        backend.close()
    assert all(pg_server.prepared_gids(s) == [] for s in sinks)


def test_old_commit_markers_are_pruned(pg_server: PgServer, table_name: str,
                                       tmp_path: Path) -> None:
    options = pg_server.options(table_name, marker_retention_epochs="2")
    backend = get_plugins().create_backend("postgres", options)
    assert isinstance(backend, PostgresBackend)
    sink = "prune-markers"
    backend.preflight(sink)
    coord = Coordinator(backend, DirectoryStateStore(tmp_path / "s"), sink,
                        plugins=build_plugins())
    coord.start()
    one = pa.record_batch({"id": pa.array([1], pa.int64())})
    for epoch in range(5):
        c = write_participant(backend, TransactionContext(sink, epoch, 0), [one])
        coord.commit_epoch(epoch, [c])
    backend.close()
    with pg_server.connect() as conn:
        epochs = [r[0] for r in conn.execute(
            "SELECT epoch FROM txsink.txsink_commits WHERE sink_id = %s ORDER BY epoch",
            (sink,))]
    assert epochs == [2, 3, 4]
    assert len(pg_server.ids(table_name)) == 5
