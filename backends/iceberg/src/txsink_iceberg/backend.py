"""Apache Iceberg backend: one snapshot per epoch, marked in its summary.

Writers put Parquet files under the table's data folder (invisible: no snapshot names
them); the driver commits an epoch as ONE append snapshot (pyiceberg ``add_files``)
whose summary carries ``txsink.sink``, ``txsink.epoch`` and the participant
directories it names. Before each commit the current snapshot's ancestry is read (as
Spark's own Iceberg streaming sink does): an epoch it already holds is not added
again, so a commit whose outcome was unknown is finished, never doubled.

The same commit sets the table property ``txsink.epoch.<sink id>`` to the sink's
highest epoch: snapshot expiry drops summaries (the marker of an epoch another
writer's snapshots have since buried), never table properties. An epoch the property
covers but no snapshot marks anymore cannot be told apart from one never written, so
the backend stops and says so instead of adding it again (Delta's ``txn`` action
plays this part there).

The catalog is pyiceberg's SQL catalog: by default on a SQLite file in the warehouse
(one machine); ``catalog_uri`` names a PostgreSQL database for shared use. With
``catalog_type: rest`` it is an Iceberg REST catalog (Polaris, Gravitino, Lakekeeper,
Nessie, Unity, Glue's endpoint, Iceberg's own server) at ``catalog_uri``, reached with
``catalog_credential`` (OAuth2 client credentials) or ``catalog_token``; all three
are secrets. A warehouse
on S3 (``s3://bucket/prefix``) keeps data and metadata files there, written through
pyiceberg's pyarrow FileIO with the S3 backend's options; its catalog is always given
by ``catalog_uri`` (a SQLite file cannot live on S3). A commit is the catalog's
compare-and-swap of the table's metadata location, so no conditional PUT is needed.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from txsink.errors import ConfigError, FatalCommitError, StateError
from txsink.lakehouse import (
    ConflictError,
    DataFile,
    TableBackend,
    marker_dirs,
    marker_json,
)
from txsink.model import Committable
from txsink.objectstore import SECRET_KEYS, S3Access, is_s3, split_uri, table_location
from txsink.options import Options

log = logging.getLogger(__name__)

SINK_KEY = "txsink.sink"
EPOCH_KEY = "txsink.epoch"
PARTICIPANTS_KEY = "txsink.participants"
#: The sink's highest epoch in the table once the snapshot is in: an epoch may commit
#: after a higher one (two batch writes reserve 5 and 6, 6 commits first), so the
#: epochs along the ancestry are not in order, but these are.
HIGHEST_KEY = "txsink.highest"
#: Table property prefix: ``txsink.epoch.<sink id>`` = the sink's highest committed epoch.
EPOCH_PROPERTY = "txsink.epoch."
CATALOG_FILE = "txsink-catalog.db"
#: The kinds of catalog (option ``catalog_type``).
CATALOG_TYPES = ("sql", "rest")


class IcebergBackend(TableBackend):
    """An Iceberg table ``namespace.name`` in a SQL catalog, data on local disk or S3."""

    name: ClassVar[str] = "iceberg"
    secret_options: ClassVar[frozenset[str]] = frozenset(
        {"catalog_uri", "catalog_credential", "catalog_token", *SECRET_KEYS})
    location_option: ClassVar[str] = "warehouse"

    def __init__(self, table: str, warehouse: str, catalog_uri: str | None = None, *,
                 catalog_name: str = "txsink", create: bool = True,
                 s3: S3Access | None = None, catalog_type: str = "sql",
                 catalog_credential: str | None = None, catalog_token: str | None = None,
                 catalog_warehouse: str | None = None,
                 catalog_oauth2_uri: str | None = None) -> None:
        self.table = table
        self.warehouse = warehouse
        self.catalog_uri = catalog_uri
        self.catalog_name = catalog_name
        self.catalog_type = catalog_type
        self.catalog_credential = catalog_credential
        self.catalog_token = catalog_token
        self.catalog_warehouse = catalog_warehouse
        self.catalog_oauth2_uri = catalog_oauth2_uri
        self.create = create
        self.s3 = s3 if s3 is not None or not is_s3(warehouse) else S3Access()
        if catalog_type == "rest" and not catalog_uri:
            raise ConfigError("iceberg backend: catalog_type 'rest' needs option "
                              "'catalog_uri', the REST catalog's URL (e.g. "
                              "https://catalog.example.com/api/catalog)", field="catalog_uri")
        if self.s3 is not None and catalog_uri is None:
            raise ConfigError("iceberg backend: a warehouse on S3 needs option "
                              "'catalog_uri' (the default SQLite catalog lives in the "
                              "warehouse directory, which S3 cannot hold): e.g. "
                              "sqlite:////var/lib/txsink/catalog.db on one machine, or a "
                              "PostgreSQL URL", field="catalog_uri")
        self._catalog_cache: Any = None
        self._root: str | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> IcebergBackend:
        opts = Options(options, owner="iceberg backend", secret_keys=cls.secret_options)
        table = opts.str("table", required=True)
        if len(table.split(".")) != 2 or not all(table.split(".")):
            raise ConfigError(f"iceberg backend: option 'table' must be 'namespace.name', "
                              f"got {table!r}", field="table")
        warehouse, s3 = table_location(opts, options, "iceberg backend", "warehouse")
        secret = opts.secret("catalog_uri")
        name = opts.str("catalog_name", "txsink")
        create = opts.bool("create", True)
        kind = opts.choice("catalog_type", CATALOG_TYPES, "sql")
        credential = opts.secret("catalog_credential")
        token = opts.secret("catalog_token")
        rest_warehouse = opts.optional("catalog_warehouse")
        oauth2 = opts.optional("catalog_oauth2_uri")
        if kind != "rest":
            for key, given in (("catalog_credential", credential), ("catalog_token", token),
                               ("catalog_warehouse", rest_warehouse),
                               ("catalog_oauth2_uri", oauth2)):
                if given is not None:
                    raise ConfigError(f"iceberg backend: option {key!r} is for a REST "
                                      "catalog; add catalog_type: rest, or drop it",
                                      field=key)
        opts.check_unknown()
        return cls(table, warehouse, secret.reveal() if secret is not None else None,
                   catalog_name=name, create=create, s3=s3, catalog_type=kind,
                   catalog_credential=credential.reveal() if credential else None,
                   catalog_token=token.reveal() if token else None,
                   catalog_warehouse=rest_warehouse, catalog_oauth2_uri=oauth2)

    @classmethod
    def destination(cls, options: Mapping[str, str]) -> dict[str, str]:
        # As Delta's: on S3 the store, the warehouse prefix and the table (in its
        # catalog); region and keys are no part of the place.
        warehouse = str(options.get("warehouse") or "")
        if not is_s3(warehouse):
            return super().destination(options)
        return {"warehouse": "s3://" + warehouse.split("://", 1)[1].strip("/"),
                "table": str(options.get("table") or ""),
                "catalog_name": str(options.get("catalog_name") or "txsink"),
                "endpoint_url": str(options.get("endpoint_url") or "").rstrip("/")}

    def describe(self) -> str:
        return f"iceberg table {self.table} (warehouse {self.warehouse})"

    def secret_values(self) -> list[str]:
        rest = [v for v in (self.catalog_credential, self.catalog_token) if v]
        if self.catalog_credential and ":" in self.catalog_credential:
            rest.append(self.catalog_credential.split(":", 1)[1])  # the secret alone
        return ([self.catalog_uri] if self.catalog_uri else []) + rest + (
            self.s3.secrets() if self.s3 is not None else [])

    def s3_access(self) -> S3Access:
        return self.s3 if self.s3 is not None else S3Access()

    def on_s3(self) -> bool:
        return self.s3 is not None

    def file_io_properties(self) -> dict[str, str]:
        """pyiceberg's FileIO properties for a warehouse on S3 (pyarrow's S3 client)."""
        if self.s3 is None:
            return {}
        s3 = self.s3
        out = {"py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO",
               "s3.region": s3.region_name()}
        endpoint = s3.endpoint()
        if endpoint:
            out["s3.endpoint"] = endpoint
        if s3.addressing_style != "auto":
            out["s3.force-virtual-addressing"] = str(s3.addressing_style == "virtual").lower()
        if s3.access_key_id is not None and s3.secret_access_key is not None:
            out["s3.access-key-id"] = s3.access_key_id
            out["s3.secret-access-key"] = s3.secret_access_key.reveal()
            if s3.session_token is not None:
                out["s3.session-token"] = s3.session_token.reveal()
        return out

    def _warehouse_uri(self) -> str:
        return self.warehouse if self.s3 is not None else f"file://{self.warehouse}"

    def safe_options(self, options: Mapping[str, str]) -> dict[str, str]:
        kept = super().safe_options(options)
        kept["warehouse"] = self.warehouse
        return kept

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_catalog_cache"] = None
        return state

    # -- the catalog ----------------------------------------------------------------------

    def _catalog(self) -> Any:
        if self._catalog_cache is None and self.catalog_type == "rest":
            self._catalog_cache = self._rest_catalog()
        if self._catalog_cache is None:
            from pyiceberg.catalog.sql import SqlCatalog

            uri = self.catalog_uri or f"sqlite:///{self.warehouse}/{CATALOG_FILE}"
            if not self.catalog_uri:
                os.makedirs(self.warehouse, exist_ok=True)
            self._catalog_cache = SqlCatalog(self.catalog_name, uri=uri,
                                             warehouse=self._warehouse_uri(),
                                             **self.file_io_properties())
        return self._catalog_cache

    def _rest_catalog(self) -> Any:
        """pyiceberg's REST client; the credentials go only to it (never to a log)."""
        from pyiceberg.catalog.rest import RestCatalog

        props = {"uri": str(self.catalog_uri), **self.file_io_properties()}
        if self.catalog_credential:
            props["credential"] = self.catalog_credential
            # Where the client credentials are exchanged for a token: the catalog's own
            # endpoint unless an identity provider is named (pyiceberg's guess of it is
            # deprecated, and drops the slash).
            props["oauth2-server-uri"] = (self.catalog_oauth2_uri or
                                          f"{str(self.catalog_uri).rstrip('/')}/v1/oauth/tokens")
        if self.catalog_token:
            props["token"] = self.catalog_token
        if self.catalog_warehouse:
            props["warehouse"] = self.catalog_warehouse
        return RestCatalog(self.catalog_name, **props)

    def _file_uri(self, relative: str) -> str:
        return self.uri(relative) if self.s3 is not None else f"file://{self.absolute(relative)}"

    def _load(self) -> Any:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self._catalog().load_table(self.table)
        except NoSuchTableError:
            return None

    def _location(self) -> str:
        namespace, name = self.table.split(".")
        return f"{self.warehouse}/{namespace}/{name}"

    def data_root(self) -> str:
        """The table's data folder (read from the catalog once; a table not created yet
        gets the catalog's default location, which :meth:`append_epoch` creates it at)."""
        if self._root is None:
            table = self._load()
            location = (table.location() if table is not None else self._location())
            location = location.removeprefix("file://")
            if is_s3(location) and self.s3 is not None:
                location = "s3://" + location.split("://", 1)[1]
            elif "://" in location or self.s3 is not None:
                raise ConfigError(f"iceberg backend: table {self.table} lives at "
                                  f"{location}, outside the kind of warehouse given "
                                  f"({self.warehouse}); give the warehouse it lives in",
                                  field="warehouse")
            self._root = f"{location.rstrip('/')}/data"
        return self._root

    def preflight(self, sink_id: str) -> None:
        if self.s3 is not None:
            bucket, key = split_uri(self.warehouse, owner="iceberg backend", field="warehouse")
            self.s3.check(bucket, key, owner="iceberg backend", field="warehouse")
        table = self._load()
        if table is None and not self.create:
            raise ConfigError(f"iceberg backend: no table {self.table} in the catalog and "
                              "create=false; create it first, or drop create=false",
                              field="table")
        if table is not None and table.spec().fields:
            raise ConfigError(f"iceberg backend: table {self.table} is partitioned; txsink "
                              "writes unpartitioned Iceberg tables only (for now)",
                              field="table")
        if table is not None:
            self.refuse_format(table)
            self.refuse_rolled_back(table, sink_id)
        self.data_root()

    def refuse_format(self, table: Any) -> None:
        """Refuse a table format version pyiceberg cannot commit to (format 3: "Cannot
        write manifest for table version: 3", seen at the commit, after the decision)."""
        version = int(table.metadata.format_version)
        if version > 2:
            raise ConfigError(
                f"iceberg backend: table {self.table} is Iceberg format version {version}; "
                "txsink commits through pyiceberg, which writes format 1 and 2 manifests "
                "only. Create the table with 'format-version' = '2', or write it with "
                "Iceberg's own Spark writer", field="table")

    def refuse_rolled_back(self, table: Any, sink_id: str) -> None:
        """Stop when the table's current snapshot was rolled back past epochs the sink
        committed (``rollback_to_snapshot``, ``rollback_to_timestamp``,
        ``set_current_snapshot``): their snapshots are off the branch, their rows gone
        from what readers see, and a pipeline going on would leave that hole for good.
        Told apart from snapshot expiry: the epoch's snapshot is still in the metadata."""
        recorded = _recorded_epoch(table, sink_id)
        if recorded < 0:
            return
        on_branch = _highest(table, sink_id)
        if on_branch >= recorded or not _marked_anywhere(table, sink_id, recorded):
            return
        current = table.current_snapshot()
        raise FatalCommitError(
            f"iceberg backend: table {self.table} was rolled back past epochs of sink "
            f"{sink_id!r}: it records epoch {recorded} (property {EPOCH_PROPERTY}{sink_id}) "
            f"but its current snapshot "
            f"{current.snapshot_id if current is not None else None} holds epochs up to "
            f"{on_branch} only; the later epochs' snapshots are off the branch, their rows "
            "gone from the table, so txsink cannot keep them exactly once. Set the current "
            "snapshot back to the sink's newest (CALL system.set_current_snapshot) to go "
            "on, or write with a new sink_id (and checkpoint) and replay what the rollback "
            "took out")

    # -- markers --------------------------------------------------------------------------

    def table_epoch(self, sink_id: str, epoch: int, table: Any = None
                    ) -> dict[str, str] | None:
        table = table if table is not None else self._load()
        if table is None:
            return None
        found = self._walk(table, sink_id, epoch)
        recorded = _recorded_epoch(table, sink_id)
        if found is None and epoch == recorded and not _marked_anywhere(table, sink_id, epoch):
            # The sink's newest epoch was committed (the property is set by the epoch's
            # own commit), and its snapshot expired since. (A rolled-back epoch keeps its
            # snapshot, off the branch: that one is not in the table, and is written
            # again.)
            raise StateError(
                f"sink={sink_id} epoch={epoch}: table {self.table} records epoch {recorded} "
                f"of this sink (property {EPOCH_PROPERTY}{sink_id}), but no snapshot marks "
                "it any more (expired): txsink cannot tell whether that epoch is in the "
                "table, and does not add it a second time. Keep snapshots longer than the "
                "longest time a pipeline may be down with a decided epoch",
                sink_id=sink_id, epoch=epoch)
        return found

    def _walk(self, table: Any, sink_id: str, epoch: int) -> dict[str, str] | None:
        """The participant directories the current snapshot's ancestry marks for
        ``epoch``, read back to the sink's next older epoch."""
        found: dict[str, str] | None = None
        later = False
        snapshot = table.current_snapshot()
        while snapshot is not None:
            summary = snapshot.summary
            if summary is not None and summary.get(SINK_KEY) == sink_id:
                e = int(summary[EPOCH_KEY])
                if e == epoch:
                    found = {**(found or {}), **marker_dirs(summary[PARTICIPANTS_KEY])}
                elif int(summary.get(HIGHEST_KEY, e)) < epoch:
                    return found  # no older snapshot can be of this epoch
                else:
                    later = True
            parent = snapshot.parent_snapshot_id
            older = table.snapshot_by_id(parent) if parent is not None else None
            if older is None and (found is not None or not later
                                  or _first_of_table(snapshot)):
                return found
            snapshot = older
            if snapshot is None:
                # Expired: the parent is gone, or (pyiceberg's expiry) no longer named.
                raise StateError(
                    f"sink={sink_id} epoch={epoch}: table {self.table} holds later epochs of "
                    f"this sink, but its snapshots no longer reach back to epoch {epoch} "
                    "(expired): txsink cannot tell whether that epoch is in the table. Keep "
                    "snapshots longer than the longest time a pipeline may be down",
                    sink_id=sink_id, epoch=epoch)
        return found

    def highest_epoch(self, sink_id: str) -> int | None:
        table = self._load()
        return -1 if table is None else _highest(table, sink_id)

    # -- commit ---------------------------------------------------------------------------

    def append_epoch(self, sink_id: str, epoch: int,
                     participants: Mapping[str, Sequence[DataFile]]) -> None:
        from pyiceberg.exceptions import CommitFailedException

        files = [f for fs in participants.values() for f in fs]
        table = self._load()
        if table is None:
            table = self._create(files)
        if table is None:
            return  # an empty epoch into a table that does not exist yet
        self.refuse_if_named(table, sink_id, epoch, participants)
        recorded = _recorded_epoch(table, sink_id)
        # The branch's own highest (a rollback takes epochs out of it; the property
        # keeps them).
        props = {SINK_KEY: sink_id, EPOCH_KEY: str(epoch),
                 PARTICIPANTS_KEY: marker_json(participants),
                 HIGHEST_KEY: str(max(epoch, _highest(table, sink_id)))}
        paths = [self._file_uri(f.path) for f in files]
        table = _without_retries(table)
        try:
            with table.transaction() as tx:
                if epoch > recorded:  # in the same commit as the snapshot
                    tx.set_properties({EPOCH_PROPERTY + sink_id: str(epoch)})
                if paths:
                    # No check_duplicate_files: it scans every manifest of the table on
                    # each commit (growing with the table); the marker read before and
                    # the race coming back (retries off) are what keep a file single.
                    tx.add_files(paths, snapshot_properties=props,
                                 check_duplicate_files=False)
                else:
                    tx.append(table.schema().as_arrow().empty_table(),
                              snapshot_properties=props)
        except CommitFailedException as exc:
            raise ConflictError(str(exc)) from exc
        except ValueError as exc:
            if "already referenced" in str(exc):
                raise ConflictError(str(exc)) from exc
            raise FatalCommitError(f"iceberg backend: table {self.table} refused the "
                                   f"epoch's files: {exc}") from exc
        except Exception:
            self._drop_catalog()
            raise

    def close(self) -> None:
        self._drop_catalog()

    def _drop_catalog(self) -> None:
        """Forget the catalog's connections after a catalog write failed in an unknown
        state. SQLite keeps a transaction whose COMMIT failed ("database is locked": a
        reader on the file) open on its connection, and the pool hands it out again: a
        retry reading through it saw its own uncommitted snapshot and took the epoch for
        committed. Fresh connections read what the database holds."""
        catalog, self._catalog_cache = self._catalog_cache, None
        engine = getattr(catalog, "engine", None)
        if engine is not None:
            with contextlib.suppress(Exception):
                engine.dispose()

    def check_prepared(self, committables: Sequence[Committable]) -> None:
        table = self._load()
        if table is not None:  # rolled back or upgraded since the start, by another writer
            self.refuse_format(table)
            for sink_id in sorted({c.sink_id for c in committables}):
                self.refuse_rolled_back(table, sink_id)
        super().check_prepared(committables)

    def check_files_schema(self, files: Sequence[DataFile]) -> None:
        # The check pyiceberg's add_files makes at commit, made before the decision.
        from pyiceberg.io.pyarrow import _check_pyarrow_schema_compatible

        table = self._load()
        if table is None:
            return
        if table.spec().fields:  # partitioned since the start, by another writer
            raise ConfigError(
                f"iceberg backend: table {self.table} is partitioned now (by "
                f"{', '.join(f.name for f in table.spec().fields)}); txsink writes "
                "unpartitioned Iceberg tables only: nothing of the epoch is committed in "
                "any target", field="table")
        theirs = self.read_schema(files[0].path)
        try:
            _check_pyarrow_schema_compatible(table.schema(), theirs,
                                             format_version=table.metadata.format_version)
        except ValueError as exc:
            known = {f.name for f in table.schema().fields}
            extra = [n for n in theirs.names if n not in known]
            raise ConfigError(
                f"iceberg backend: the epoch's rows do not fit the schema of table "
                f"{self.table}: {exc}; nothing of the epoch is committed in any target: "
                "alter the table or write a matching frame",
                field=(extra or list(theirs.names) or ["?"])[0]) from None

    def _create(self, files: Sequence[DataFile]) -> Any:
        from pyiceberg.exceptions import TableAlreadyExistsError

        if not files:
            return None
        if not self.create:
            raise FatalCommitError(f"iceberg backend: table {self.table} is gone and "
                                   "create=false; create it again to commit")
        schema = self.read_schema(files[0].path)
        catalog = self._catalog()
        catalog.create_namespace_if_not_exists(self.table.split(".")[0])
        location = self.data_root().removesuffix("/data")
        try:
            return catalog.create_table(self.table, schema=schema,
                                        location=location if self.s3 is not None
                                        else f"file://{location}")
        except TableAlreadyExistsError:
            return self._load()


def _first_of_table(snapshot: Any) -> bool:
    """Whether ``snapshot`` is the table's first: the ancestry read to it is whole.
    (Expiry leaves the oldest kept snapshot without a parent too; its sequence number
    tells it apart. Format 1 tables number nothing: never known to be the first.)"""
    return snapshot.parent_snapshot_id is None and snapshot.sequence_number == 1


def _highest(table: Any, sink_id: str) -> int:
    """The sink's highest epoch on the table's current branch: the newest marked
    snapshot's ``txsink.highest`` (its epoch, before that key); -1 when the sink's
    epochs were all rolled back; the table property when their snapshots expired."""
    snapshot = table.current_snapshot()
    while snapshot is not None:
        summary = snapshot.summary
        if summary is not None and summary.get(SINK_KEY) == sink_id:
            return int(summary.get(HIGHEST_KEY, summary[EPOCH_KEY]))
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    if any(_is_marker(s, sink_id) for s in table.metadata.snapshots):
        return -1
    return _recorded_epoch(table, sink_id)


def _recorded_epoch(table: Any, sink_id: str) -> int:
    """The sink's highest epoch as the table's property records it (-1: none)."""
    value = table.properties.get(EPOCH_PROPERTY + sink_id)
    try:
        return int(value) if value is not None else -1
    except ValueError as exc:
        raise StateError(f"table property {EPOCH_PROPERTY}{sink_id} is {value!r}, not an "
                         "epoch number", sink_id=sink_id) from exc


def _is_marker(snapshot: Any, sink_id: str, epoch: int | None = None) -> bool:
    summary = snapshot.summary
    return summary is not None and summary.get(SINK_KEY) == sink_id and (
        epoch is None or summary.get(EPOCH_KEY) == str(epoch))


def _marked_anywhere(table: Any, sink_id: str, epoch: int) -> bool:
    """Whether any snapshot the metadata keeps (on any branch) marks ``epoch``."""
    return any(_is_marker(s, sink_id, epoch) for s in table.metadata.snapshots)


def _without_retries(table: Any) -> Any:
    """``table`` as this process sees it, with pyiceberg's own commit retries off.

    pyiceberg retries a commit that lost a race by rebuilding it on the new metadata,
    without looking at the winner: two committers of one epoch then both added it
    (seen: both answered committed). A lost race comes back to the caller, which reads
    the markers again first. Only the in-memory copy changes: the catalog applies the
    commit to the table's stored metadata, whose properties stay as they are.
    """
    from pyiceberg.table import Table

    meta = table.metadata
    props = {**meta.properties, "commit.retry.num-retries": "0"}
    return Table(table.name(), meta.model_copy(update={"properties": props}),
                 table.metadata_location, table.io, table.catalog)
