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

Columns are found by field id and tables known by uuid: every file txsink adds carries
the table's field ids (Spark's files on the native path are written again with them),
the sink's claim is the table property ``txsink.owner.<sink id>`` (orphan-file removal
deleted the claim file of earlier releases), and the namespace property
``txsink.table.<table>.<sink id>`` binds the sink to the table's uuid, so a table
dropped and made again, or a catalog entry lost over existing metadata, is refused
before anything is written.

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
import json
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar
from urllib.parse import quote

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from txsink.backend import Transaction
from txsink.errors import ConfigError, FatalCommitError, StateError
from txsink.lakehouse import (
    EPOCH_KEY,
    SINK_KEY,
    ConflictError,
    DataFile,
    EpochSearch,
    TableBackend,
    after_decision,
    files_of,
    marked_highest,
    marker,
    nullable_schema,
    refuse_characters,
)
from txsink.model import Committable, TransactionContext
from txsink.objectstore import (
    SECRET_KEYS,
    S3Access,
    S3Names,
    is_s3,
    table_location,
)
from txsink.options import Options

log = logging.getLogger(__name__)

#: Table property prefix: ``txsink.epoch.<sink id>`` = the sink's highest committed epoch.
EPOCH_PROPERTY = "txsink.epoch."
CATALOG_FILE = "txsink-catalog.db"
#: The kinds of catalog (option ``catalog_type``).
CATALOG_TYPES = ("sql", "rest")
#: Table property ``txsink.owner.<sink id>``: which txsink state owns the sink id in this
#: table. A property, not a file: orphan-file removal deletes any file no snapshot names
#: (the ``_owner.json`` of earlier releases), and expiry never touches properties.
OWNER_PROPERTY = "txsink.owner."
#: Namespace property ``txsink.table.<table>.<sink id>`` = the uuid of the table the sink
#: writes: the catalog's own record of which table the name pointed at, kept when the
#: table is dropped and another created under its name.
TABLE_PROPERTY = "txsink.table."
#: Characters a warehouse, table name or location must not hold, and why: pyiceberg takes
#: a data file's location as a URL (``#`` starts a fragment, ``?`` a query) and read
#: another file than the one added, after the decision; Java's Iceberg takes them as
#: characters of the path, so no spelling of such a location works for both readers.
_NO_URL = ("pyiceberg reads a data file at such a location as a URL and finds another "
           "file, and Java's Iceberg does not (no spelling works for both)")
LOCATION_CHARACTERS = {"#": _NO_URL, "?": _NO_URL}
#: What keeps an epoch's marker long enough (the remedy when it is gone).
KEEP_DECIDED = ("Keep snapshots longer than the longest time a pipeline may be down with a "
                "decided epoch")
#: pyiceberg's names of the S3 settings (its FileIO properties).
S3_NAMES = S3Names("s3.region", "s3.endpoint", "s3.force-virtual-addressing",
                   "s3.access-key-id", "s3.secret-access-key", "s3.session-token")
#: Parquet's field-id key in Arrow field metadata.
FIELD_ID = b"PARQUET:field_id"


class IcebergBackend(TableBackend):
    """An Iceberg table ``namespace.name`` in a SQL catalog, data on local disk or S3."""

    name: ClassVar[str] = "iceberg"
    secret_options: ClassVar[frozenset[str]] = frozenset(
        {"catalog_uri", "catalog_credential", "catalog_token", *SECRET_KEYS})
    location_option: ClassVar[str] = "warehouse"
    place_options: ClassVar[Mapping[str, str]] = {"table": "", "catalog_name": "txsink"}

    def __init__(self, table: str, warehouse: str, catalog_uri: str | None = None, *,
                 catalog_name: str = "txsink", create: bool = True,
                 s3: S3Access | None = None, catalog_type: str = "sql",
                 catalog_credential: str | None = None, catalog_token: str | None = None,
                 catalog_warehouse: str | None = None,
                 catalog_oauth2_uri: str | None = None) -> None:
        self._locate(warehouse, s3, LOCATION_CHARACTERS)
        refuse_characters(table, {**LOCATION_CHARACTERS, "/": "a table name is no path"},
                          owner="iceberg backend", field="table")
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
        #: The claims this instance made (:meth:`claim_sink`): a table it creates
        #: carries them.
        self._claims: dict[str, dict[str, Any]] = {}
        #: Table uuids the catalog bound sink ids to, as read by this process.
        self._bound: dict[str, str] = {}
        #: The field ids and NOT NULL columns files are written with (:meth:`file_schema`).
        self._file_target: pa.Schema | None = None

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

    def describe(self) -> str:
        return f"iceberg table {self.table} (warehouse {self.warehouse})"

    def secret_values(self) -> list[str]:
        rest = [v for v in (self.catalog_credential, self.catalog_token) if v]
        if self.catalog_credential and ":" in self.catalog_credential:
            rest.append(self.catalog_credential.split(":", 1)[1])  # the secret alone
        return ([self.catalog_uri] if self.catalog_uri else []) + rest + (
            super().secret_values())

    def file_io_properties(self) -> dict[str, str]:
        """pyiceberg's FileIO properties for a warehouse on S3 (pyarrow's S3 client)."""
        if self.s3 is None:
            return {}
        return {"py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO",
                **self.s3.properties(S3_NAMES)}

    def _uri(self, location: str) -> str:
        """A location (an absolute path on local disk) as the catalog and pyiceberg take
        it: ``s3://...``, or a ``file://`` URI."""
        return location if self.s3 is not None else f"file://{location}"

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

            # Percent-encoded: SQLAlchemy decodes the file's path, so a warehouse named
            # "a%20b" opened the catalog of "a b" (another warehouse's).
            uri = self.catalog_uri or f"sqlite:///{quote(self.catalog_file())}"
            if not self.catalog_uri:
                os.makedirs(self.warehouse, exist_ok=True)
            self._catalog_cache = SqlCatalog(self.catalog_name, uri=uri,
                                             warehouse=self._uri(self.warehouse),
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

    def catalog_file(self) -> str:
        """The default catalog's SQLite file (in the warehouse)."""
        return f"{self.warehouse}/{CATALOG_FILE}"

    def catalog_description(self) -> str:
        """The catalog, for messages (never its URI: it may hold a password)."""
        where = "the SQL catalog given by catalog_uri" if self.catalog_uri else (
            f"the SQLite catalog {self.catalog_file()}")
        return f"catalog {self.catalog_name!r} ({where})"

    def load_table(self) -> Any:
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
            table = self.load_table()
            location = _local_path(table.location() if table is not None else self._location())
            refuse_characters(location, LOCATION_CHARACTERS, owner="iceberg backend",
                              field="table")  # the catalog's location for the table
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
            self.check_location(self.warehouse)  # before the catalog: known without I/O
        table = self.load_table()
        if table is None and not self.create:
            raise self.not_created(f"table {self.table} in the catalog", field="table")
        if table is not None:
            self._refuse_unsupported(table)
            self.refuse_rolled_back(table, sink_id)
        self.data_root()
        self.check_identity(sink_id, table)

    # -- which table: identity and claims -------------------------------------------------

    def _binding(self, sink_id: str) -> tuple[str, str]:
        """(namespace, key) of the namespace property naming the sink's table uuid."""
        namespace, name = self.table.split(".")
        return namespace, f"{TABLE_PROPERTY}{name}.{sink_id}"

    def bound_uuid(self, sink_id: str) -> str | None:
        """The uuid of the table ``sink_id`` writes, as the catalog's namespace records it
        (None before the sink's first claim of an existing table)."""
        from pyiceberg.exceptions import NoSuchNamespaceError

        namespace, key = self._binding(sink_id)
        try:
            found = self._catalog().load_namespace_properties(namespace).get(key)
        except NoSuchNamespaceError:
            return None
        return None if found is None else str(found)

    def _bind(self, sink_id: str, table: Any) -> None:
        namespace, key = self._binding(sink_id)
        uuid = str(table.metadata.table_uuid)
        if self.bound_uuid(sink_id) != uuid:
            self._catalog().update_namespace_properties(namespace, updates={key: uuid})

    def check_identity(self, sink_id: str, table: Any) -> None:
        """Refuse, before anything is written, a table that is not the one ``sink_id``
        wrote: the name now points at another table (dropped and created again, its
        catalog entry lost and made again), or the catalog lost the table while its
        metadata is still at its location (txsink would create an empty table there, and
        the committed rows would vanish for readers). Tables are told apart by uuid."""
        bound = self.bound_uuid(sink_id)
        namespace, key = self._binding(sink_id)
        if table is None:
            metadata = self._metadata_files(self._location())
            if metadata:
                newest = metadata[-1]
                raise ConfigError(
                    f"iceberg backend: {self.catalog_description()} has no table "
                    f"{self.table}, but {self._location()} holds an Iceberg table's "
                    f"metadata ({len(metadata)} metadata file(s), the newest {newest}): its "
                    "catalog entry was lost (a catalog file deleted or replaced) or dropped "
                    "without purging. txsink creates no table over it (readers would lose "
                    "every committed row). Register it again: catalog.register_table("
                    f"{self.table!r}, {self._metadata_uri(newest)!r}) (pyiceberg), or "
                    "CALL system.register_table (Spark); or, if that table is gone for good, "
                    f"move {self._location()} away", field="table")
            if bound is not None:
                raise ConfigError(
                    f"iceberg backend: sink {sink_id!r} writes table {self.table} (uuid "
                    f"{bound}, as namespace property {key} of {self.catalog_description()} "
                    "records), which is not in the catalog any more (dropped, or renamed). "
                    "Register it again, or give its new name as option 'table'; if it is "
                    "gone for good and a new table is to take the sink's output from now "
                    f"on, remove that property: catalog.update_namespace_properties("
                    f"{namespace!r}, removals={{{key!r}}}), and move "
                    f"{self.uri(self._sink_folder(sink_id))} away if it is still there",
                    field="table")
            held = self.committed_epochs_on_disk(sink_id)
            if held:
                raise ConfigError(
                    f"iceberg backend: {self.catalog_description()} has no table "
                    f"{self.table}, and no metadata is left at {self._location()}, but "
                    f"{self.uri(self._sink_folder(sink_id))} holds {len(held)} epoch(s) of "
                    f"sink {sink_id!r} (epochs {held[0]} to {held[-1]}) that a table there "
                    "held: txsink creates no empty table over them. Restore the table (its "
                    "metadata, then register it); or, to start the sink over without "
                    "those rows, move that folder away", field="table")
            return
        uuid = str(table.metadata.table_uuid)
        if bound is not None and bound != uuid:
            raise ConfigError(
                f"iceberg backend: table {self.table} in {self.catalog_description()} is "
                f"not the table sink {sink_id!r} wrote: its uuid is {uuid}, the sink's table "
                f"was {bound} (namespace property {key}). The name points at another table "
                "(dropped and created again, or its catalog entry lost and made again): the "
                "epochs committed so far are not in it. Register the sink's table again "
                "under this name; or, if the new table is to take the sink's output from "
                "now on (without the earlier rows), remove that property: "
                f"catalog.update_namespace_properties({namespace!r}, removals={{{key!r}}})",
                field="table")
        strangers = self._other_tables_at(table)
        if strangers:
            raise ConfigError(
                f"iceberg backend: table {self.table} (uuid {uuid}) shares its location "
                f"{table.location()} with the metadata of another table ({strangers[0]}): "
                "it was created over a table whose catalog entry was lost, whose rows it "
                "does not show. Drop this table and register that one again "
                f"(catalog.register_table({self.table!r}, <its newest metadata file>)), or "
                "move the other table's files away", field="table")
        if bound is None and not _knows_sink(table, sink_id):
            # The catalog's record is gone with its namespace (dropped when the table
            # was, then made again), and the table has nothing of the sink: a new table,
            # where txsink's folder says a table of this name held epochs of it.
            held = self.committed_epochs_on_disk(sink_id)
            if held:
                raise ConfigError(
                    f"iceberg backend: table {self.table} (uuid {uuid}) in "
                    f"{self.catalog_description()} holds nothing of sink {sink_id!r} (no "
                    f"snapshot, no property {EPOCH_PROPERTY}{sink_id}), but "
                    f"{self.uri(self._sink_folder(sink_id))} holds {len(held)} epoch(s) of "
                    f"it that a table there held (epochs {held[0]} to {held[-1]}): the "
                    "table was dropped with its files and another made under its name, "
                    "and the catalog's record of the sink's table (namespace property "
                    f"{TABLE_PROPERTY}...) went too: the namespace dropped, or the catalog "
                    "lost. Those rows are not in it. Restore the sink's table; or, if "
                    "this table is to take the sink's output from now on without them, "
                    "move that folder away", field="table")
        self.refuse_behind(table, sink_id)

    def _metadata_files(self, location: str) -> list[str]:
        """The ``*.metadata.json`` files under ``location``/metadata, oldest first."""
        fs, _ = self._fs()
        folder = self._fs_path(f"{location.rstrip('/')}/metadata")
        found = fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
        return sorted(i.base_name for i in found if i.type == pafs.FileType.File
                      and i.base_name.endswith((".metadata.json", ".metadata.json.gz")))

    def _fs_path(self, location: str) -> str:
        """A location (URI or path) as this backend's filesystem names it."""
        return location.split("://", 1)[1] if is_s3(location) else _local_path(location)

    def _metadata_uri(self, name: str) -> str:
        return self._uri(f"{self._location()}/metadata/{name}")

    def _other_tables_at(self, table: Any) -> list[str]:
        """First metadata files (version 0: one per table ever created there) under
        ``table``'s location that belong to another table."""
        location = table.location()
        own = str(table.metadata.table_uuid)
        out = []
        for name in self._metadata_files(location):
            if not name.startswith("00000-") or not name.endswith(".json"):
                continue
            fs, _ = self._fs()
            path = self._fs_path(f"{location.rstrip('/')}/metadata/{name}")
            try:
                with fs.open_input_stream(path) as f:
                    other = str(json.loads(f.read()).get("table-uuid"))
            except (OSError, ValueError):
                continue
            if other != own:
                out.append(f"{name}, table uuid {other}")
        return out

    def _owner_claim(self, sink_id: str, table: Any) -> dict[str, Any] | None:
        """The sink's claim: the table property, else (a table not created yet, or a
        sink claimed by an earlier release) the owner file."""
        if table is not None:
            text = table.properties.get(OWNER_PROPERTY + sink_id)
            if text is not None:
                try:
                    found = json.loads(text)
                except ValueError as exc:
                    raise StateError(f"iceberg backend: table property {OWNER_PROPERTY}"
                                     f"{sink_id} of {self.table} is not JSON ({exc})") from exc
                if isinstance(found, dict):
                    return found
        return self._read_owner(self.absolute(self.owner_file(sink_id)))

    def _owner_remedy(self, sink_id: str) -> str:
        return (f"remove table property {OWNER_PROPERTY}{sink_id} of {self.table} (pyiceberg: "
                f"with table.transaction() as tx: tx.remove_properties("
                f"'{OWNER_PROPERTY}{sink_id}'); Spark: ALTER TABLE ... UNSET TBLPROPERTIES) "
                f"and delete {self.uri(self.owner_file(sink_id))} if "
                "it is there")

    def check_claim(self, sink_id: str, state_id: str, state_location: str) -> None:
        table = self.load_table()
        self.check_identity(sink_id, table)
        owner = self._owner_claim(sink_id, table)
        if owner is not None:
            self._refuse_owner(owner, sink_id, state_id, state_location,
                               self._owner_remedy(sink_id))

    def claim_sink(self, sink_id: str, state_id: str, state_location: str) -> None:
        """Bind ``sink_id`` to one txsink state in the table's properties, where neither
        snapshot expiry nor orphan-file removal reaches (the ``_owner.json`` file of
        earlier releases is read and carried over; it stays the claim until the table
        exists), and the table's uuid in its namespace's properties."""
        from pyiceberg.exceptions import CommitFailedException

        claim = {"sink_id": sink_id, "state_id": state_id, "state_location": state_location}
        for _ in range(5):
            table = self.load_table()
            self.check_claim(sink_id, state_id, state_location)
            self._claims[sink_id] = claim
            if table is None:
                super().claim_sink(sink_id, state_id, state_location)
                return
            if table.properties.get(OWNER_PROPERTY + sink_id) is None:
                try:
                    with _without_retries(table).transaction() as tx:
                        tx.set_properties({OWNER_PROPERTY + sink_id: json.dumps(claim)})
                except CommitFailedException:
                    continue  # another commit (maybe another claim) won: read again
                table = self.load_table()
            self._bind(sink_id, table)
            self.check_claim(sink_id, state_id, state_location)
            return
        raise StateError(f"iceberg backend: table {self.table} kept changing while sink "
                         f"{sink_id!r} was being claimed; start again")

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
        raise self.taken_back(
            f"table {self.table} was rolled back past epochs of sink {sink_id!r}: it records "
            f"epoch {recorded} (property {EPOCH_PROPERTY}{sink_id}) but its current snapshot "
            f"{current.snapshot_id if current is not None else None} holds epochs up to "
            f"{on_branch} only; the later epochs' snapshots are off the branch, their rows "
            "gone from the table", "Set the current snapshot back to the sink's newest "
            "(CALL system.set_current_snapshot)", "rollback")

    def refuse_behind(self, table: Any, sink_id: str) -> None:
        """Stop when the catalog's table lacks epochs it held: ``_committed.json`` (written
        only after a snapshot named the epoch) is there for epochs above the table's
        record of the sink, and no snapshot of the table marks them. The catalog's entry
        points at an older metadata file of the same table (the catalog restored from an
        older copy, or the table registered again from an old file): the newer epochs'
        rows are gone from what readers see, and going on would leave that hole for
        good. (A rollback keeps the record and the snapshots: :meth:`refuse_rolled_back`.)"""
        recorded = _recorded_epoch(table, sink_id)
        lost = [e for e in self.committed_above(sink_id, recorded)
                if not _marked_anywhere(table, sink_id, e)]
        if not lost:
            return
        newest = self._metadata_files(table.location())
        raise self.taken_back(
            f"{self.catalog_description()} points table {self.table} at "
            f"{table.metadata_location}, which holds epochs of sink {sink_id!r} up to "
            f"{recorded} only, but epochs {lost[0]} to {lost[-1]} were committed to it "
            f"({self.uri(self._sink_folder(sink_id))} records them): the catalog's entry "
            "is older than the table (the catalog restored from an older copy, or the "
            "table registered again from an older metadata file), and their rows are gone "
            "from what readers see",
            "Point the catalog at the table's newest metadata file ("
            + (f"{newest[-1]} in {table.location()}/metadata" if newest else
               "under the table's metadata folder")
            + "): drop the entry without purging, then catalog.register_table("
            f"{self.table!r}, <that file>) (pyiceberg) or CALL system.register_table "
            "(Spark)", "an older catalog entry")

    # -- markers --------------------------------------------------------------------------

    def table_epoch(self, sink_id: str, epoch: int, table: Any = None
                    ) -> dict[str, str] | None:
        table = table if table is not None else self.load_table()
        if table is None:
            return None
        found = self._walk(table, sink_id, epoch)
        recorded = _recorded_epoch(table, sink_id)
        if found is None and epoch == recorded and not _marked_anywhere(table, sink_id, epoch):
            # The sink's newest epoch was committed (the property is set by the epoch's
            # own commit), and its snapshot expired since. (A rolled-back epoch keeps its
            # snapshot, off the branch: that one is not in the table, and is written
            # again.)
            raise self.untold(
                sink_id, epoch, f"table {self.table} records epoch {recorded} of this sink "
                f"(property {EPOCH_PROPERTY}{sink_id}), but no snapshot marks it any more "
                "(expired)", KEEP_DECIDED, not_again=True)
        return found

    def _walk(self, table: Any, sink_id: str, epoch: int) -> dict[str, str] | None:
        """The participant directories the current snapshot's ancestry marks for
        ``epoch``, read back to the sink's next older epoch."""
        search = EpochSearch(sink_id, epoch)
        snapshot = table.current_snapshot()
        while snapshot is not None:
            if search.read(snapshot.summary):
                return search.found  # no older snapshot can be of this epoch
            parent = snapshot.parent_snapshot_id
            older = table.snapshot_by_id(parent) if parent is not None else None
            if older is None and (search.found is not None or _first_of_table(snapshot)):
                return search.found  # found, or the whole ancestry read
            if older is None and not search.later:
                # Cut short by expiry with no marker of the sink on the branch (another
                # writer's snapshots since, a compaction): that tells "never written"
                # only when the sink never recorded an epoch this high (the property
                # every commit sets), or the epoch's snapshot is off the branch (rolled
                # back). Seen: after a compaction and an expiry the epoch was taken for
                # never written, and the orphan scan offered its committed directories
                # to be committed again.
                recorded = _recorded_epoch(table, sink_id)
                if recorded < epoch or _marked_anywhere(table, sink_id, epoch):
                    return search.found
                raise self.untold(
                    sink_id, epoch, f"table {self.table} records epochs of this sink up to "
                    f"{recorded} (property {EPOCH_PROPERTY}{sink_id}), but no snapshot marks "
                    "it any more (expired)", KEEP_DECIDED, not_again=True)
            snapshot = older
            if snapshot is None:
                # Expired: the parent is gone, or (pyiceberg's expiry) no longer named.
                raise self.untold(
                    sink_id, epoch, f"table {self.table} holds later epochs of this sink, "
                    f"but its snapshots no longer reach back to epoch {epoch} (expired)",
                    "Keep snapshots longer than the longest time a pipeline may be down")
        return search.found

    def highest_in(self, table: Any, sink_id: str) -> int:
        return _highest(table, sink_id)

    # -- commit ---------------------------------------------------------------------------

    def append_to(self, table: Any, sink_id: str, epoch: int,
                  participants: Mapping[str, Sequence[DataFile]],
                  files: Sequence[DataFile]) -> None:
        # (A table is made before the decision: check_prepared.)
        from pyiceberg.exceptions import CommitFailedException

        with after_decision():
            self._check_uuid(sink_id, table)
            self._refuse_unsupported(table, since=True)
        self.refuse_if_named(table, sink_id, epoch, participants)
        recorded = _recorded_epoch(table, sink_id)
        # The branch's own highest (a rollback takes epochs out of it; the property
        # keeps them).
        props = marker(sink_id, epoch, participants, max(epoch, _highest(table, sink_id)))
        paths = [self._uri(self.uri(f.path)) for f in files]
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

    def _check_uuid(self, sink_id: str, table: Any) -> None:
        """The table is still the one the sink's claim bound (recreated meanwhile: its
        uuid changed). The binding is read once per process (it changes only by a
        claim, or by hand to let another table in); the table's uuid each time."""
        bound = self._bound.get(sink_id)
        if bound is None:
            bound = self.bound_uuid(sink_id)
            if bound is not None:
                self._bound[sink_id] = bound
        if bound is not None and bound != str(table.metadata.table_uuid):
            self._bound.pop(sink_id, None)
            self.check_identity(sink_id, table)

    def check_prepared(self, committables: Sequence[Committable]) -> None:
        """Before the decision: the table exists (made now from the first file's schema
        if it does not: an empty table made for an epoch that then fails is harmless, and
        so a table is never made after a decision, where a refusal would come too late),
        is still the sink's, unpartitioned, and takes the files' columns by field id."""
        files = files_of(committables)
        if not files:
            return
        sink_id = committables[0].sink_id
        table = self.load_table()
        if table is None:
            table = self.create_table(sink_id, files, decided=False)
        self._check_uuid(sink_id, table)
        self.refuse_rolled_back(table, sink_id)  # since the start, by another writer
        self._check_files(table, files)

    def check_files_schema(self, files: Sequence[DataFile]) -> None:
        table = self.load_table()
        if table is not None:
            self._check_files(table, files)

    def _refuse_unsupported(self, table: Any, *, since: bool = False) -> None:
        """Refuse what txsink's commit cannot write into ``table``: partitions (its files
        would carry no partition values) and format versions pyiceberg does not write
        (seen: a version 3 table was accepted, and every commit failed after the
        decision). ``since``: the table changed after the start (another writer)."""
        now = " now" if since else ""
        if table.spec().fields:
            raise ConfigError(
                f"iceberg backend: table {self.table} is partitioned{now} (by "
                f"{', '.join(f.name for f in table.spec().fields)}); txsink writes "
                "unpartitioned Iceberg tables only: nothing of the epoch is committed in "
                "any target", field="table")
        version = int(table.metadata.format_version)
        if version > 2:
            raise ConfigError(
                f"iceberg backend: table {self.table} is{now} of format version {version}; "
                "pyiceberg, which txsink commits with, writes versions 1 and 2 only "
                "(row lineage and the other version 3 duties are not written): nothing "
                "of the epoch is committed in any target. Give a table of format "
                "version 2", field="table")

    def _check_files(self, table: Any, files: Sequence[DataFile]) -> None:
        # The check pyiceberg's add_files makes at commit, made before the decision.
        from pyiceberg.io.pyarrow import _check_pyarrow_schema_compatible

        self._refuse_unsupported(table, since=True)  # changed since the start
        theirs = self.read_schema(files[0].path)
        ids = {f.name: f.field_id for f in table.schema().fields}
        for f in theirs:
            found = (f.metadata or {}).get(FIELD_ID)
            if found is not None and f.name in ids and int(found) != ids[f.name]:
                raise ConfigError(
                    f"iceberg backend: column {f.name!r} of the epoch's files has field id "
                    f"{int(found)}, and table {self.table}'s column of that name has "
                    f"{ids[f.name]}: the column was dropped and added again while the "
                    "epoch was written. Nothing of the epoch is committed in any target; "
                    "its next attempt is written with the table's ids", field=f.name)
        try:
            _check_pyarrow_schema_compatible(table.schema(), theirs,
                                             format_version=table.metadata.format_version)
        except ValueError as exc:
            known = {f.name for f in table.schema().fields}
            extra = [n for n in theirs.names if n not in known]
            raise self.misfit(f"table {self.table}: {exc}",
                              field=(extra or list(theirs.names) or ["?"])[0]) from None

    def create_table(self, sink_id: str, files: Sequence[DataFile], *,
                     decided: bool = True) -> Any:
        """Create the table from the first file's schema, every column nullable (a
        frame's NOT NULL columns would refuse every later frame that may hold a null),
        carrying the sink's claim; never where a table's metadata is (a lost catalog
        entry: :meth:`check_identity`)."""
        from pyiceberg.exceptions import TableAlreadyExistsError

        if not files:
            return None
        if not self.create:
            raise self.gone(f"table {self.table}", decided=decided)
        with after_decision() if decided else contextlib.nullcontext():
            self.check_identity(sink_id, None)
        schema = nullable_schema(self.read_schema(files[0].path))
        claim = self._claims.get(sink_id) or self._read_owner(
            self.absolute(self.owner_file(sink_id)))
        properties = {OWNER_PROPERTY + sink_id: json.dumps(claim)} if claim else {}
        catalog = self._catalog()
        catalog.create_namespace_if_not_exists(self.table.split(".")[0])
        location = self.table_dir()
        try:
            table = catalog.create_table(self.table, schema=schema,
                                         location=self._uri(location), properties=properties)
        except TableAlreadyExistsError:
            table = self.load_table()
            self.check_identity(sink_id, table)
            return table
        self._bind(sink_id, table)
        return table

    def durable_top(self) -> str:
        # The namespace's directory is as new as the table's: up to the warehouse.
        top = super().durable_top()
        return self.warehouse if top.startswith(f"{self.warehouse}/") else top

    def table_dir(self) -> str:
        return self.data_root().removesuffix("/data") if self.s3 is not None else (
            self._fs()[1].removesuffix("/data"))

    # -- field ids --------------------------------------------------------------------------

    def begin_transaction(self, ctx: TransactionContext) -> Transaction:
        self._file_target = None  # each participant takes the table's ids as they are now
        return super().begin_transaction(ctx)

    def file_schema(self, schema: pa.Schema) -> pa.Schema:
        """``schema`` with the table's field ids (and its NOT NULL columns): readers find
        a column by id, and a file without ids is read by name, so after a column is
        dropped and another of the same name added, the old files' values showed under
        the new column. A table not created yet gets the ids it will be created with
        (:meth:`create_table` makes it from this schema: the same ids, which the check
        before the decision compares)."""
        target = self._file_target
        if target is None:
            table = self.load_table()
            target = (_ids_of_table(table.schema()) if table is not None
                      else _fresh_ids(nullable_schema(schema)))
            self._file_target = target
        return _with_ids(schema, target)

    def _write_with_ids(self, path: str) -> None:
        """Write the Parquet file at ``path`` again with the table's field ids (and NOT
        NULL columns), one row group at a time, as ``<name>.ids.parquet``, and delete it.
        A crash in between leaves both in a participant nobody recorded: an orphan."""
        fs, _ = self._fs()
        schema = pq.read_schema(path, filesystem=fs)
        want = self.file_schema(schema)
        if not _needs_rewrite(schema, want):
            return  # Spark wrote the ids (native_frame), and no NOT NULL to enforce
        with fs.open_input_file(path) as source:
            parquet = pq.ParquetFile(source)
            target = f"{path.removesuffix('.parquet')}.ids.parquet"
            with fs.open_output_stream(target) as sink, pq.ParquetWriter(
                    sink, want, compression="snappy", coerce_timestamps="us",
                    allow_truncated_timestamps=False) as writer:
                for i in range(parquet.num_row_groups):
                    group = parquet.read_row_group(i)
                    writer.write_table(pa.Table.from_batches(
                        [self.fit_batch(b, want) for b in group.to_batches()], want),
                        row_group_size=max(group.num_rows, 1))
        fs.delete_file(path)

    def native_frame(self, df: Any) -> Any:
        """``df`` with each top-level column carrying the table's field id as Spark's
        ``parquet.field.id`` metadata, which Spark's Parquet writer writes into its files
        (``spark.sql.parquet.fieldId.write.enabled``, on by default): files written from
        it need no second write (:meth:`committable_for_directory` checks, and writes
        again what still lacks an id: fields inside structs, lists and maps)."""
        from pyspark.sql import functions as F

        self._file_target = None
        names = df.schema.fieldNames()
        arrow = pa.schema([pa.field(n, pa.null()) for n in names])
        target = {f.name: f for f in self.file_schema(arrow)}
        columns = []
        for name in names:
            found = (target[name].metadata or {}).get(FIELD_ID)
            column = F.col(f"`{name}`")
            if found is not None:
                metadata = {**df.schema[name].metadata, "parquet.field.id": int(found)}
                column = column.alias(name, metadata=metadata)
            columns.append(column)
        return df.select(*columns)

    def committable_for_directory(self, ctx: TransactionContext, dirname: str) -> Committable:
        """Spark's Parquet writer writes no Iceberg field ids: each of its files is written
        again here with the table's (a pass over the epoch's data on the driver), before
        the participant is recorded; see :meth:`file_schema` for why."""
        self._file_target = None  # the table's ids now (a column may have been re-added)
        rel = f"{self.epoch_folder(ctx.sink_id, ctx.epoch)}/{dirname}"
        paths = [self.absolute(f.path) for f in self._list_files(rel)
                 if not any(part.startswith(("_", ".")) for part in
                            f.path[len(rel) + 1:].split("/"))]
        if paths:
            # One file per Spark partition: pyarrow reads and writes outside the GIL.
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(min(len(paths), os.cpu_count() or 2, 8)) as pool:
                list(pool.map(self._write_with_ids, paths))
        return super().committable_for_directory(ctx, dirname)


def _local_path(location: str) -> str:
    """``file:///x`` (or Java's ``file:/x``) as the path ``/x``; any other as it is."""
    if location.startswith("file:"):
        return "/" + location.removeprefix("file:").lstrip("/")
    return location


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
        highest = marked_highest(snapshot.summary, sink_id)
        if highest is not None:
            return highest
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


def _knows_sink(table: Any, sink_id: str) -> bool:
    """Whether ``table`` holds any record of ``sink_id``: its claim, its highest epoch,
    or a snapshot of it (kept by expiry, rollbacks and REPLACE TABLE alike)."""
    props = table.properties
    return (OWNER_PROPERTY + sink_id in props or EPOCH_PROPERTY + sink_id in props
            or any(_is_marker(s, sink_id) for s in table.metadata.snapshots))


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


def _ids_of_table(schema: Any) -> pa.Schema:
    """A pyiceberg schema's field ids and required-ness as an Arrow schema of the same
    shape (what :func:`_with_ids` reads; the leaves' types are placeholders). Walked
    here, not through pyiceberg's Arrow conversion, whose module costs a writer task
    about 56 MiB."""
    from pyiceberg.types import ListType, MapType, StructType

    def field(name: str, field_id: int, kind: Any, required: bool) -> pa.Field[Any]:
        return pa.field(name, arrow(kind), nullable=not required,
                        metadata={FIELD_ID: str(field_id).encode()})

    def arrow(kind: Any) -> pa.DataType:
        if isinstance(kind, StructType):
            return pa.struct([field(f.name, f.field_id, f.field_type, f.required)
                              for f in kind.fields])
        if isinstance(kind, ListType):
            return pa.list_(field("element", kind.element_id, kind.element_type,
                                  kind.element_required))
        if isinstance(kind, MapType):
            return pa.map_(field("key", kind.key_id, kind.key_type, True),  # type: ignore[call-overload,no-any-return]
                           field("value", kind.value_id, kind.value_type,
                                 kind.value_required))
        return pa.int8()

    return pa.schema([field(f.name, f.field_id, f.field_type, f.required)
                      for f in schema.fields])


def _fresh_ids(schema: pa.Schema) -> pa.Schema:
    """The field ids pyiceberg's ``create_table`` gives a table made from ``schema``:
    its fresh numbering from 1, every field of a struct before what is inside them, a
    list's element and a map's key and value before their insides (pyiceberg's
    ``assign_fresh_schema_ids``). The check before the decision compares them with the
    table's, so a numbering that differed would refuse, never mislabel."""
    counter = iter(range(1, 1 << 31))

    def numbered(fields: list[pa.Field[Any]]) -> list[pa.Field[Any]]:
        ids = [next(counter) for _ in fields]
        return [pa.field(f.name, inside(f.type), nullable=f.nullable,
                         metadata={**(f.metadata or {}), FIELD_ID: str(i).encode()})
                for f, i in zip(fields, ids, strict=True)]

    def inside(kind: pa.DataType) -> pa.DataType:
        if pa.types.is_struct(kind):
            return pa.struct(numbered([kind.field(i) for i in range(kind.num_fields)]))
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            (element,) = numbered([kind.value_field])
            return pa.list_(element)
        if pa.types.is_map(kind):
            key, value = numbered([kind.key_field, kind.item_field])
            return pa.map_(key, value)  # type: ignore[call-overload,no-any-return]
        return kind

    return pa.schema(numbered(list(schema)))


def _with_ids(schema: pa.Schema, target: pa.Schema) -> pa.Schema:
    """``schema``'s fields (their types) with ``target``'s field ids and nullability,
    matched by name (list elements and map keys/values by position). A field the target
    lacks keeps none: the check before the decision names it."""
    by_name = {f.name: f for f in target}
    return pa.schema([_field_with_id(f, by_name.get(f.name)) for f in schema],
                     metadata=schema.metadata)  # type: ignore[arg-type]


def _field_with_id(field: pa.Field[Any], target: pa.Field[Any] | None) -> pa.Field[Any]:
    if target is None:
        return field
    kind, want = field.type, target.type
    if pa.types.is_struct(kind) and pa.types.is_struct(want):
        names = {want.field(i).name: want.field(i) for i in range(want.num_fields)}
        kind = pa.struct([_field_with_id(kind.field(i), names.get(kind.field(i).name))
                          for i in range(kind.num_fields)])
    elif pa.types.is_large_list(kind) and (pa.types.is_list(want) or pa.types.is_large_list(want)):
        kind = pa.large_list(_field_with_id(kind.value_field, want.value_field))
    elif pa.types.is_list(kind) and (pa.types.is_list(want) or pa.types.is_large_list(want)):
        kind = pa.list_(_field_with_id(kind.value_field, want.value_field))
    elif pa.types.is_map(kind) and pa.types.is_map(want):
        kind = pa.map_(_field_with_id(kind.key_field, want.key_field),
                       _field_with_id(kind.item_field, want.item_field))
    metadata = dict(field.metadata or {})
    if target.metadata and FIELD_ID in target.metadata:
        metadata[FIELD_ID] = target.metadata[FIELD_ID]
    return pa.field(field.name, kind, nullable=target.nullable, metadata=metadata)


def _needs_rewrite(schema: pa.Schema, want: pa.Schema) -> bool:
    """Whether a file of ``schema`` must be written again as ``want``: a field id missing
    or another anywhere, or a column the table declares NOT NULL that the file allows
    nulls in (the rewrite refuses a real null). A file stricter than the table is fine."""
    def differs(have: pa.Field[Any], need: pa.Field[Any]) -> bool:
        if (have.metadata or {}).get(FIELD_ID) != (need.metadata or {}).get(FIELD_ID):
            return True
        if have.nullable and not need.nullable:
            return True
        kind, other = have.type, need.type
        if pa.types.is_struct(kind) and pa.types.is_struct(other):
            return any(differs(kind.field(i), other.field(i)) for i in range(kind.num_fields))
        if (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and (
                pa.types.is_list(other) or pa.types.is_large_list(other)):
            return differs(kind.value_field, other.value_field)
        if pa.types.is_map(kind) and pa.types.is_map(other):
            return differs(kind.key_field, other.key_field) or differs(
                kind.item_field, other.item_field)
        return False

    return any(differs(h, n) for h, n in zip(schema, want, strict=True))
