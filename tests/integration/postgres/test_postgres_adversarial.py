"""The adversarial pass of issue 31 on a real PostgreSQL: sequences users run.

A test marked ``xfail(strict=True)`` is a finding not fixed yet: its reason says what
goes wrong.
"""

from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from postgres_support import PgServer
from txsink.coordinator import Coordinator, EpochOutcome
from txsink.errors import TxsinkError
from txsink.model import TransactionContext
from txsink.plugins import get_plugins
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant

pytestmark = [pytest.mark.integration]


def _stream_run(pg: PgServer, table: str, state: Path, sink: str, query: str,
                base: int) -> list[EpochOutcome]:
    """Two micro-batches of a streaming query (one row per task, two tasks)."""
    backend = get_plugins().create_backend("postgres", pg.options(table))
    coord = Coordinator(backend, DirectoryStateStore(state), sink, owner=query)
    out: list[EpochOutcome] = []
    try:
        coord.start(query_id=query, stream=True)
        for batch_id in range(2):
            epoch = coord.stream_epoch(batch_id)
            msgs = [write_participant(backend, TransactionContext(sink, epoch, p, 0), [
                pa.record_batch({"id": pa.array([base + batch_id * 10 + p], pa.int64()),
                                 "name": pa.array(["n"]), "amount": pa.array([1.0])})])
                for p in range(2)]
            out.append(coord.commit_epoch(epoch, msgs))
        coord.store.release(coord.lease)
    finally:
        backend.close()
    return out


def test_a_new_query_after_the_documented_release_loses_no_batch(
        pg_server: PgServer, table_name: str, tmp_path: Path) -> None:
    sink = f"adv{uuid.uuid4().hex[:8]}"
    state = tmp_path / "chk" / "txsink"
    assert _stream_run(pg_server, table_name, state, sink, "q-old", 1000) == [
        EpochOutcome.COMMITTED] * 2
    shutil.rmtree(tmp_path / "chk")  # the checkpoint, and the state under it, deleted
    with pytest.raises(TxsinkError, match="gone for good, DELETE FROM") as err:
        _stream_run(pg_server, table_name, state, sink, "q-new", 2000)
    remedy = re.search(r"DELETE FROM \S+ WHERE sink_id = '[^']+'", str(err.value))
    assert remedy is not None
    with pg_server.connect() as conn:
        conn.execute(remedy.group(0))  # the remedy the error names
    old = [1000, 1001, 1010, 1011]
    try:
        _stream_run(pg_server, table_name, state, sink, "q-new", 2000)
    except TxsinkError:
        assert sorted(pg_server.ids(table_name)) == old  # refused loudly: acceptable
        return
    assert sorted(pg_server.ids(table_name)) == [*old, 2000, 2001, 2010, 2011]
