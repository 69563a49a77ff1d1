"""Orphan listing is exact per sink id, whatever LIKE would match."""

from __future__ import annotations

import pyarrow as pa
import pytest
from postgres_support import PgServer
from txsink.model import TransactionContext
from txsink.plugins import get_plugins
from txsink.writer import write_participant
from txsink_postgres import PostgresBackend

pytestmark = pytest.mark.integration


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
