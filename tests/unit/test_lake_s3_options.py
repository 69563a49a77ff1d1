"""Options of Delta and Iceberg tables on S3, checked without a server: what is refused
(naming the option), what each S3 client is given, and what never reaches the state."""

from __future__ import annotations

import pickle
import re
import socket
from pathlib import Path

import pytest
from txsink.errors import ConfigError
from txsink.plugins import get_plugins
from txsink_delta.backend import DeltaBackend
from txsink_iceberg.backend import IcebergBackend

KEYS = {"endpoint_url": "http://127.0.0.1:8333", "access_key_id": "AKIDEXAMPLE",
        "secret_access_key": "wJalrXUtnFEMI-secret-42"}


def create(kind: str, options: dict[str, str]) -> object:
    return get_plugins().create_backend(kind, options)


@pytest.mark.parametrize(("options", "field"), [
    ({"path": "/tmp/t", "endpoint_url": "http://x:1"}, "endpoint_url"),
    ({"path": "s3://bucket/t", "access_key_id": "a"}, "secret_access_key"),
    ({"path": "s3://bucket/t", "secret_access_key": "s"}, "access_key_id"),
    ({"path": "s3://bucket/t", "endpoint_url": "127.0.0.1:8333"}, "endpoint_url"),
    ({"path": "s3://bucket/t", "endpoint_url": "http://u:p@host:1"}, "endpoint_url"),
    ({"path": "s3://bucket/t", "addressing_style": "diagonal"}, "addressing_style"),
    ({"path": "s3:///t"}, "path"),
    ({"path": "s3://bucket/a/../t"}, "path"),
    ({"path": "gs://bucket/t"}, "path"),
    ({"path": "s3://bucket/t", "endpoint": "http://x:1"}, None),
])
def test_delta_refuses_bad_s3_options_naming_the_field(options: dict[str, str],
                                                       field: str | None) -> None:
    with pytest.raises(ConfigError) as info:
        create("delta", options)
    if field is not None:
        assert info.value.field == field
    assert "wJalr" not in str(info.value)


@pytest.mark.promise("delta-secrets-never-stored", "backend")
def test_delta_on_s3_gives_delta_rs_conditional_put_and_keeps_secrets_out_of_state() -> None:
    options = {"path": "s3a://bucket/lake/orders/", **KEYS}
    backend = create("delta", options)
    assert isinstance(backend, DeltaBackend)
    assert backend.path == "s3://bucket/lake/orders"
    storage = backend.storage_options()
    assert storage is not None
    assert storage["conditional_put"] == "etag"
    assert storage["AWS_ENDPOINT_URL"] == KEYS["endpoint_url"]
    assert storage["AWS_ALLOW_HTTP"] == "true"
    assert storage["AWS_SECRET_ACCESS_KEY"] == KEYS["secret_access_key"]
    assert backend.secret_values() == [KEYS["secret_access_key"]]
    assert "secret_access_key" not in backend.safe_options(options)
    assert "secret_access_key" not in DeltaBackend.destination(options)
    assert KEYS["secret_access_key"] not in repr(backend.s3)
    assert backend.uri("txsink/s/e1/x.parquet") == "s3://bucket/lake/orders/txsink/s/e1/x.parquet"
    assert backend.spark_path("txsink/s") == "s3a://bucket/lake/orders/txsink/s"
    again = pickle.loads(pickle.dumps(backend))  # how executors get it
    assert isinstance(again, DeltaBackend) and again.storage_options() == storage


def test_delta_on_local_disk_has_no_storage_options(tmp_path: object) -> None:
    backend = create("delta", {"path": f"file://{tmp_path}/t"})
    assert isinstance(backend, DeltaBackend)
    assert backend.storage_options() is None and backend.s3 is None
    # Fully qualified: a path without a scheme is on Spark's fs.defaultFS (HDFS, DBFS).
    assert backend.spark_path("x") == f"file://{tmp_path}/t/x"


@pytest.mark.promise("iceberg-secrets-never-stored", "backend")
def test_iceberg_warehouse_on_s3_needs_a_catalog_uri_and_gets_pyarrow_file_io() -> None:
    with pytest.raises(ConfigError) as info:
        create("iceberg", {"warehouse": "s3://bucket/wh", "table": "db.t", **KEYS})
    assert info.value.field == "catalog_uri"
    options = {"warehouse": "s3://bucket/wh/", "table": "db.t",
               "catalog_uri": "sqlite:////var/lib/txsink/catalog.db", **KEYS}
    backend = create("iceberg", options)
    assert isinstance(backend, IcebergBackend)
    props = backend.file_io_properties()
    assert props["py-io-impl"] == "pyiceberg.io.pyarrow.PyArrowFileIO"
    assert props["s3.endpoint"] == KEYS["endpoint_url"]
    assert props["s3.secret-access-key"] == KEYS["secret_access_key"]
    assert backend.warehouse == "s3://bucket/wh"
    safe = backend.safe_options(options)
    assert "secret_access_key" not in safe and "catalog_uri" not in safe


def test_iceberg_refuses_s3_options_for_a_local_warehouse(tmp_path: object) -> None:
    with pytest.raises(ConfigError) as info:
        create("iceberg", {"warehouse": str(tmp_path), "table": "db.t",
                           "access_key_id": "a", "secret_access_key": "wJalr-x"})
    assert info.value.field == "access_key_id"


def test_the_endpoint_and_region_come_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "https://s3.example.test")
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    backend = create("delta", {"path": "s3://bucket/t"})
    assert isinstance(backend, DeltaBackend)
    storage = backend.storage_options()
    assert storage is not None
    assert storage["AWS_ENDPOINT_URL"] == "https://s3.example.test"
    assert storage["AWS_REGION"] == "eu-west-3"
    assert "AWS_ALLOW_HTTP" not in storage and "AWS_SECRET_ACCESS_KEY" not in storage


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_the_destination_on_s3_is_the_store_and_prefix_not_the_keys(kind: str) -> None:
    """What the state records as the target's place: a rotated key or another region
    is no move, another prefix or endpoint is; the recorded (secret-free) options give
    the same place as the ones given."""
    where = "path" if kind == "delta" else "warehouse"
    base = {where: "s3a://bucket/lake/t/", "region": "eu-west-1", **KEYS}
    if kind == "iceberg":
        base.update(table="db.t", catalog_uri="sqlite:////tmp/c.db")
    cls = type(create(kind, base))
    place = cls.destination(base)
    assert place[where] == "s3://bucket/lake/t"
    assert cls.destination({**base, "access_key_id": "AKIDOTHER", "region": "us-east-2"}) == place
    assert cls.destination({**base, where: "s3://bucket/lake/t"}) == place
    assert cls.destination({**base, where: "s3://bucket/lake/u"}) != place
    assert cls.destination({**base, "endpoint_url": "http://other:9000"}) != place
    backend = create(kind, base)
    assert cls.destination(backend.safe_options(base)) == place  # type: ignore[attr-defined]
    assert not any(KEYS["secret_access_key"] in v for v in place.values())


def test_an_owner_file_that_cannot_be_read_is_not_advised_for_deletion(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table's claim (its owner file) read while the store is down said "the owner
    file ... is unreadable (... NETWORK_CONNECTION ...); delete it if its state is gone":
    an error, not a server down, advising to drop the claim that keeps a second query
    out. A store that is down is a server down now; a file that cannot be read for
    another reason is kept. A closed port, one attempt: about 1 s."""
    from txsink.errors import ServerUnavailableError, StateError
    from txsink.objectstore import S3Access

    one_try = S3Access.filesystem
    monkeypatch.setattr(S3Access, "filesystem", lambda self, max_attempts=1: one_try(self, 1))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    down = create("delta", {"path": "s3://bucket/t", **KEYS,
                            "endpoint_url": f"http://127.0.0.1:{port}"})
    assert isinstance(down, DeltaBackend)
    with pytest.raises(ServerUnavailableError) as info:
        down.check_claim("s", "state-1", "/one")
    assert info.value.field == "endpoint_url"
    assert "down or unreachable" in str(info.value) and "delete" not in str(info.value)
    assert "wJalr" not in str(info.value)

    local = create("delta", {"path": str(tmp_path / "t")})
    assert isinstance(local, DeltaBackend)
    (tmp_path / "t" / "txsink" / "s" / "_owner.json").mkdir(parents=True)  # not a file
    with pytest.raises(StateError, match="do not delete it"):
        local.check_claim("s", "state-1", "/one")


@pytest.mark.parametrize(("kind", "char"), [
    ("delta", "#"), ("delta", "?"), ("delta", "%20"), ("delta", "%"),
    ("iceberg", "#"), ("iceberg", "?")])
def test_a_table_location_the_table_libraries_read_as_a_url_is_refused(
        tmp_path: Path, kind: str, char: str) -> None:
    """A table directory named with ``#``, ``?`` or ``%``: Spark and txsink's writers put
    the epoch's files there, the decision was recorded, and then delta-rs (its history
    is empty under such a path, or ``%20`` read as a space) and pyiceberg (the files read
    under a cut path) never found them: the epoch stayed DECIDED, refused again at every
    restart (seen on both the native path and the data source). Refused before anything
    is written, naming the option. (Iceberg takes ``%``: its SQLite URL is escaped.)"""
    location = tmp_path / f"lake{char}x" / "t"
    options = ({"path": str(location)} if kind == "delta"
               else {"warehouse": str(location), "table": "db.t"})
    with pytest.raises(ConfigError, match=re.escape(f"holds {char[0]!r}")) as info:
        create(kind, options)
    assert info.value.field == ("path" if kind == "delta" else "warehouse")
    assert not location.parent.exists()
    with pytest.raises(ConfigError, match=re.escape(f"holds {char[0]!r}") + "|glob"):
        create(kind, {**options, ("path" if kind == "delta" else "warehouse"):
                      f"s3://bucket/lake{char}x", "endpoint_url": "http://127.0.0.1:1",
                      **({"catalog_uri": "sqlite:////tmp/c.db"} if kind == "iceberg" else {})})
