"""create_table and the Arrow -> PostgreSQL type mapping, checked on a real server."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pytest
from postgres_support import PgServer, drop_table
from txsink.backend import CommitOutcome
from txsink.model import TransactionContext
from txsink.plugins import get_plugins
from txsink.writer import write_participant
from txsink_postgres import PostgresBackend

pytestmark = pytest.mark.integration

UTC = dt.timezone.utc

ROWS = pa.record_batch({
    "b": pa.array([True, None], pa.bool_()),
    "i8": pa.array([-5, 7], pa.int8()),
    "i16": pa.array([300, None], pa.int16()),
    "i32": pa.array([70000, -1], pa.int32()),
    "i64": pa.array([2**40, 0], pa.int64()),
    "u64": pa.array([2**64 - 1, 1], pa.uint64()),
    "f32": pa.array([1.5, None], pa.float32()),
    "f64": pa.array([2.25, -0.0], pa.float64()),
    "dec": pa.array([decimal.Decimal("12.34"), None], pa.decimal128(10, 2)),
    "s": pa.array(["héllo", "tab\there"], pa.string()),
    "bin": pa.array([b"\x00\x01", b""], pa.binary()),
    "d": pa.array([dt.date(2024, 2, 29), None], pa.date32()),
    "ts": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=UTC), None],
                   pa.timestamp("us", tz="UTC")),
    "ts_ntz": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5), None], pa.timestamp("ns")),
    "dur": pa.array([dt.timedelta(seconds=90), None], pa.duration("us")),
    "cat": pa.array(["x", "y"]).dictionary_encode(),
})

EXPECTED_TYPES = {
    "b": "boolean", "i8": "smallint", "i16": "smallint", "i32": "integer", "i64": "bigint",
    "u64": "numeric(20,0)", "f32": "real", "f64": "double precision", "dec": "numeric(10,2)",
    "s": "text", "bin": "bytea", "d": "date", "ts": "timestamp with time zone",
    "ts_ntz": "timestamp without time zone", "dur": "interval", "cat": "text",
}


@pytest.fixture
def new_table(pg_server: PgServer) -> Iterator[str]:
    name = f"public.created_{uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:
        drop_table(pg_server, name)


def write_commit(backend: PostgresBackend, batch: pa.RecordBatch, sink: str) -> None:
    backend.preflight(sink)
    c = write_participant(backend, TransactionContext(sink, 0, 0), [batch])
    assert backend.commit(c) is CommitOutcome.COMMITTED
    backend.close()


@pytest.mark.parametrize("copy_format", ["auto", "text"])
def test_create_table_maps_types_and_round_trips(
    pg_server: PgServer, new_table: str, copy_format: str
) -> None:
    backend = get_plugins().create_backend(
        "postgres", pg_server.options(new_table, create_table="true", copy_format=copy_format))
    assert isinstance(backend, PostgresBackend)
    write_commit(backend, ROWS, f"types-{copy_format}")
    with pg_server.connect() as conn:
        types = dict(conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attnum > 0", (new_table,)).fetchall())
        rows = conn.execute(f"SELECT * FROM {new_table} ORDER BY i32 DESC").fetchall()
    assert types == EXPECTED_TYPES
    first, second = rows
    assert first == (True, -5, 300, 70000, 2**40, decimal.Decimal(2**64 - 1), 1.5, 2.25,
                     decimal.Decimal("12.34"), "héllo", b"\x00\x01", dt.date(2024, 2, 29),
                     dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
                     dt.datetime(2024, 1, 2, 3, 4, 5), dt.timedelta(seconds=90), "x")
    assert second[0] is None and second[9] == "tab\there" and second[10] == b""


def test_nested_values_go_to_jsonb(pg_server: PgServer, new_table: str) -> None:
    batch = pa.record_batch({
        "id": pa.array([1, 2], pa.int64()),
        "tags": pa.array([["a", "b"], None], pa.list_(pa.string())),
        "point": pa.array([{"x": 1, "y": 2.5}, {"x": 3, "y": None}],
                          pa.struct([("x", pa.int32()), ("y", pa.float64())])),
    })
    backend = get_plugins().create_backend(
        "postgres", pg_server.options(new_table, create_table="true"))
    assert isinstance(backend, PostgresBackend)
    write_commit(backend, batch, "types-json")
    with pg_server.connect() as conn:
        rows = conn.execute(f"SELECT id, tags, point FROM {new_table} ORDER BY id").fetchall()
    assert rows == [(1, ["a", "b"], {"x": 1, "y": 2.5}), (2, None, {"x": 3, "y": None})]


def test_existing_wider_columns_accept_narrower_data(pg_server: PgServer,
                                                     new_table: str) -> None:
    with pg_server.connect() as conn:
        conn.execute(f"CREATE TABLE {new_table} (id numeric, n bigint, s varchar(10), "
                     "f double precision, extra text DEFAULT 'dflt')")
    batch = pa.record_batch({"id": pa.array([1], pa.int64()), "n": pa.array([5], pa.int32()),
                             "s": pa.array(["v"]), "f": pa.array([0.5], pa.float64())})
    backend = get_plugins().create_backend("postgres", pg_server.options(new_table))
    assert isinstance(backend, PostgresBackend)
    write_commit(backend, batch, "types-wide")
    with pg_server.connect() as conn:
        row = conn.execute(f"SELECT id, n, s, f, extra FROM {new_table}").fetchone()
    assert row == (decimal.Decimal(1), 5, "v", 0.5, "dflt")
