"""Option parsing, names and pickling of the postgres backend (no server needed)."""

from __future__ import annotations

import pickle

import pytest
from txsink.errors import ConfigError
from txsink.model import TransactionContext
from txsink.plugins import build_plugins
from txsink_postgres import PostgresBackend
from txsink_postgres.names import GID_MAX_BYTES, TableName, like_prefix, make_gid, parse_gid

PASSWORD = "s3cr3t-Pa55"


def test_registered_through_the_entry_point_group() -> None:
    plugins = build_plugins()
    registration = plugins.backend_registration("postgres")
    assert registration.value is PostgresBackend
    assert registration.origin.distribution == "txsink-postgres"


def test_gid_is_deterministic_and_parsed_back() -> None:
    ctx = TransactionContext("orders_v2", 12, 3, 1)
    gid = make_gid(ctx)
    assert gid == "txsink:orders_v2-e12-p3-a1"
    assert parse_gid(gid) == ctx
    assert parse_gid("someone-elses-gid") is None


def test_gid_length_is_bounded() -> None:
    ctx = TransactionContext("s" * 64, 2**62, 2**30, 2**30)
    assert len(make_gid(ctx).encode()) <= GID_MAX_BYTES


def test_like_prefix_escapes_wildcards() -> None:
    assert like_prefix("a_b") == r"txsink:a\_b-e%"
    assert like_prefix("x%") == r"txsink:x\%-e%"


@pytest.mark.parametrize(("text", "expected"), [
    ("orders", TableName("public", "orders")),
    ("sales.orders", TableName("sales", "orders")),
    ('"My.Schema"."Odd ""t"""', TableName("My.Schema", 'Odd "t"')),
])
def test_table_names(text: str, expected: TableName) -> None:
    assert TableName.parse(text) == expected


def test_bad_table_name_names_the_option() -> None:
    with pytest.raises(ConfigError) as err:
        TableName.parse("a.b.c")
    assert err.value.field == "table"


@pytest.mark.promise("postgres-secrets-never-stored", "backend")
def test_password_in_dsn_is_moved_out_and_never_shown() -> None:
    backend = PostgresBackend.from_options({
        "dsn": f"postgresql://u:{PASSWORD}@127.0.0.1:5/db", "table": "t"})
    assert PASSWORD not in backend.conninfo
    assert PASSWORD not in backend.describe()
    assert backend.secret_values() == [PASSWORD]
    safe = backend.safe_options({"dsn": f"postgresql://u:{PASSWORD}@127.0.0.1:5/db",
                                 "password": PASSWORD, "table": "t"})
    assert PASSWORD not in repr(safe)
    assert PASSWORD not in repr(backend.__dict__)
    clone = pickle.loads(pickle.dumps(backend))
    assert clone.secret_values() == [PASSWORD]


def test_unknown_and_bad_options_are_reported_by_name() -> None:
    with pytest.raises(ConfigError) as err:
        PostgresBackend.from_options({"dsn": "host=h", "table": "t", "tabel": "x"})
    assert "tabel" in str(err.value)
    with pytest.raises(ConfigError) as err:
        PostgresBackend.from_options({"table": "t"})
    assert err.value.field == "dsn"
    with pytest.raises(ConfigError) as err:
        PostgresBackend.from_options({"dsn": "host=h", "table": "t", "password": PASSWORD,
                                      "password_env": "PGPW"})
    assert err.value.field == "password_env"
    assert PASSWORD not in str(err.value)
    with pytest.raises(ConfigError) as err:
        PostgresBackend.from_options({"dsn": f"nonsense {PASSWORD}", "table": "t"})
    assert err.value.field == "dsn"
    assert PASSWORD not in str(err.value)


def test_password_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = PostgresBackend.from_options({"dsn": "host=127.0.0.1", "table": "t",
                                            "password_env": "TXSINK_TEST_PGPW"})
    monkeypatch.delenv("TXSINK_TEST_PGPW", raising=False)
    with pytest.raises(ConfigError) as err:
        backend._password()
    assert err.value.field == "password_env"
    monkeypatch.setenv("TXSINK_TEST_PGPW", PASSWORD)
    assert backend._password() == PASSWORD
    assert backend.secret_values() == [PASSWORD]
    assert PASSWORD not in repr(pickle.dumps(backend))


def test_connect_options_are_libpq_parameters() -> None:
    backend = PostgresBackend.from_options({"dsn": "host=127.0.0.1 dbname=d", "table": "t",
                                            "connect.sslmode": "disable"})
    assert "sslmode=disable" in backend.conninfo
    assert "application_name=txsink" in backend.conninfo
    with pytest.raises(ConfigError, match="nonsense") as err:
        PostgresBackend.from_options({"dsn": "host=h", "table": "t", "connect.nonsense": "1"})
    assert err.value.field == "dsn"
    with pytest.raises(ConfigError) as err:
        PostgresBackend.from_options({"dsn": "host=h", "table": "t",
                                      "connect.password": PASSWORD})
    assert err.value.field == "connect.password"
    assert PASSWORD not in str(err.value)
