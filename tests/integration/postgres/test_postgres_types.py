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
from txsink.errors import ConfigError
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


#: Every type the vectorised (CSV) COPY path takes, with the values CSV makes hard:
#: NULL vs empty text, separators, quotes, newlines, backslashes, the end-of-data
#: marker, float extremes, a non-UTC zone, nanoseconds, and bytea.
EDGE_ROWS = pa.record_batch({
    "k": pa.array([1, 2, 3, 4], pa.int32()),
    "b": pa.array([True, False, None, True]),
    "i64": pa.array([-(2**63), 2**63 - 1, None, 0], pa.int64()),
    "u64": pa.array([2**64 - 1, 0, None, 1], pa.uint64()),
    "f32": pa.array([3.4e38, -1.5, None, 1e-45], pa.float32()),
    "f64": pa.array([5e-324, 1.7976931348623157e308, -0.0, 0.1 + 0.2], pa.float64()),
    "f64s": pa.array([float("nan"), float("inf"), float("-inf"), None], pa.float64()),
    "dec": pa.array([decimal.Decimal("-99999999.99"), None, decimal.Decimal("0.01"),
                     decimal.Decimal(0)], pa.decimal128(10, 2)),
    "s": pa.array(["", None, 'a,b "q"\nline\\two', "\\.\r\n é ✓"], pa.string()),
    "bin": pa.array([b"", None, b"\x00\xff,\n\"", bytes(range(256))], pa.binary()),
    "fbin": pa.array([b"ab", b"\x00\x01", None, b"zz"], pa.binary(2)),
    "d": pa.array([dt.date(1, 1, 1), dt.date(9999, 12, 31), None, dt.date(2024, 2, 29)]),
    "ts": pa.array([dt.datetime(2024, 3, 31, 1, 30, tzinfo=UTC), None,
                    dt.datetime(1970, 1, 1, tzinfo=UTC), dt.datetime(2000, 1, 1, tzinfo=UTC)],
                   pa.timestamp("us", tz="Europe/Paris")),
    "ts_ns": pa.array([1_700_000_000_123_456_789, None, 0, -1], pa.timestamp("ns")),
    "t": pa.array([dt.time(0, 0), dt.time(23, 59, 59, 999999), None, dt.time(12, 0, 1)]),
    "cat": pa.array(["x", None, "x", "y"]).dictionary_encode(),
})


def _read_edge(pg_server: PgServer, table: str) -> list[tuple[object, ...]]:
    with pg_server.connect() as conn:
        return conn.execute(f"SELECT * FROM {table} ORDER BY k").fetchall()


def _nan_safe(rows: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    return [tuple("NaN" if isinstance(v, float) and v != v else v for v in r) for r in rows]


@pytest.mark.parametrize("copy_format", ["csv", "binary", "text"])
def test_every_copy_path_round_trips_the_same_values(
    pg_server: PgServer, new_table: str, copy_format: str
) -> None:
    """CSV (vectorised), binary and text rows must store exactly the same values."""
    reference = f"{new_table}_ref"
    ref = get_plugins().create_backend(
        "postgres", pg_server.options(reference, create_table="true", copy_format="binary"))
    assert isinstance(ref, PostgresBackend)
    try:
        write_commit(ref, EDGE_ROWS.drop_columns(["t"]), f"edge-ref-{copy_format}")
        expected = _read_edge(pg_server, reference)
    finally:
        drop_table(pg_server, reference)
    backend = get_plugins().create_backend(
        "postgres", pg_server.options(new_table, create_table="true", copy_format=copy_format))
    assert isinstance(backend, PostgresBackend)
    write_commit(backend, EDGE_ROWS.drop_columns(["t"]), f"edge-{copy_format}")
    got = _read_edge(pg_server, new_table)
    assert _nan_safe(got) == _nan_safe(expected)
    # Spot checks against the input itself, not only against another path.
    first, second, third, fourth = got
    assert first[8] == "" and second[8] is None  # empty text stays apart from NULL
    assert third[8] == 'a,b "q"\nline\\two' and fourth[8] == "\\.\r\n é ✓"
    assert first[9] == b"" and second[9] is None and fourth[9] == bytes(range(256))
    assert first[5] == 5e-324 and fourth[5] == 0.1 + 0.2
    assert first[12] == dt.datetime(2024, 3, 31, 1, 30, tzinfo=UTC)
    assert first[13] == dt.datetime(2023, 11, 14, 22, 13, 20, 123456)  # ns truncated


def test_time_column_round_trips_through_csv(pg_server: PgServer, new_table: str) -> None:
    backend = get_plugins().create_backend(
        "postgres", pg_server.options(new_table, create_table="true", copy_format="csv"))
    assert isinstance(backend, PostgresBackend)
    write_commit(backend, EDGE_ROWS.select(["k", "t"]), "edge-time")
    with pg_server.connect() as conn:
        rows = conn.execute(f"SELECT t FROM {new_table} ORDER BY k").fetchall()
    assert [r[0] for r in rows] == EDGE_ROWS.column("t").to_pylist()


@pytest.mark.promise("postgres-dates-before-year-1-refused", "backend")
def test_auto_copies_whole_batches_as_csv_and_refuses_dates_before_year_one(
    pg_server: PgServer, new_table: str
) -> None:
    """Years past 9999 round-trip (row-by-row COPY could not even hold them); a date
    before year 1 is refused with an error naming the column, before it is written."""
    backend = get_plugins().create_backend(
        "postgres", pg_server.options(new_table, create_table="true"))
    assert isinstance(backend, PostgresBackend)
    backend.preflight("edge-auto")

    def batch(first: int, day: int) -> pa.RecordBatch:
        return pa.record_batch({"k": pa.array([first, first + 1], pa.int32()),
                                "d": pa.array([day, None], pa.date32())})

    txn = backend.begin_transaction(TransactionContext("edge-auto", 0, 0))
    for b in (batch(1, 19000), batch(3, 3_000_000)):
        backend.write(txn, b)
    assert txn.copy_csv  # type: ignore[attr-defined]
    c = backend.pre_commit(txn)
    assert backend.commit(c) is CommitOutcome.COMMITTED
    with pg_server.connect() as conn:
        rows = conn.execute(f"SELECT k, d::text FROM {new_table} ORDER BY k").fetchall()
    assert rows == [(1, "2022-01-08"), (2, None), (3, "10183-09-21"), (4, None)]
    txn = backend.begin_transaction(TransactionContext("edge-auto", 1, 0))
    with pytest.raises(ConfigError, match="column 'd' holds a date or timestamp before year 1"):
        backend.write(txn, batch(5, -800_000))
    backend.discard(txn)
    backend.close()


@pytest.mark.promise("postgres-csv-refuses-inexact", "backend")
def test_copy_format_csv_refuses_columns_it_cannot_write_exactly(
    pg_server: PgServer, new_table: str
) -> None:
    backend = get_plugins().create_backend(
        "postgres", pg_server.options(new_table, create_table="true", copy_format="csv"))
    assert isinstance(backend, PostgresBackend)
    backend.preflight("edge-refuse")
    txn = backend.begin_transaction(TransactionContext("edge-refuse", 0, 0))
    with pytest.raises(ConfigError, match=r"copy_format=csv cannot write column.*dur") as info:
        backend.write(txn, ROWS)
    assert info.value.field == "copy_format"
    backend.discard(txn)
    backend.close()
