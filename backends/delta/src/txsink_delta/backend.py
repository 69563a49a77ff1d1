"""Delta Lake backend: one log entry per epoch, with Delta's own idempotency record.

Writers put Parquet files into the table's directory (invisible: no log entry names
them); the driver commits an epoch as ONE log entry (delta-rs
``create_write_transaction``) holding every participant's add actions, the ``txn``
action ``appId = txsink:<sink id>, version = epoch`` (what Spark's
``txnAppId``/``txnVersion`` write; :func:`txn_app_id`) and, in its commit info, which
participant directories it names. Before each commit the log is read: an epoch it
already names is not added again, so a commit whose outcome was unknown is finished,
never doubled. delta-rs 1.6 accepts a second commit with the same ``txn`` version, so
this check is txsink's own.

txsink appends whole files and reads no row: a table whose protocol asks more of a
writer (row tracking, identity columns, column mapping, ...), a partitioned table, one
with rules on rows, a directory holding other files, and a table that lost its log
are refused before any target prepares, and again before each decision (another
writer may have changed the table meanwhile), naming what and why.

A table on S3 (``s3://bucket/prefix``) is as safe: delta-rs writes each log entry with
a create-only PUT (``If-None-Match: *``, its ``conditional_put=etag``), so of two
writers of one log version exactly one wins, with no DynamoDB lock. The store must
honour that condition: the preflight proves it on a scratch log before data moves.
"""

from __future__ import annotations

import json
import logging
import pathlib
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar
from urllib.parse import quote

import pyarrow.fs as pafs
from txsink.errors import ConfigError, FatalCommitError
from txsink.lakehouse import (
    DATA_FOLDER,
    EPOCH_KEY,
    SINK_KEY,
    ConflictError,
    DataFile,
    EpochSearch,
    TableBackend,
    after_decision,
    marked_highest,
    marker,
    nullable_schema,
)
from txsink.model import Committable
from txsink.objectstore import (
    SECRET_KEYS,
    S3Access,
    S3Names,
    is_s3,
    split_uri,
    table_location,
)
from txsink.options import Options
from txsink.redact import redact

log = logging.getLogger(__name__)

#: Log entries read per step when looking back for an epoch.
HISTORY_STEP = 32
#: (endpoint, bucket) pairs whose conditional writes this process has seen work.
_CONDITIONAL_PUT_PROVEN: set[tuple[str | None, str]] = set()
#: Characters a table location must not hold, and why (delta-rs 1.6, measured): its log
#: listing takes ``#`` and ``?`` for a URL's fragment and query and reads no history (txsink
#: could not tell which epochs the table holds, and added them again), and it decodes
#: percent-escapes in the location twice (``a%20b`` became ``a b``, another directory).
LOCATION_CHARACTERS = {
    "#": "delta-rs reads no history of a table at such a location, so txsink could not "
         "tell which epochs it holds",
    "?": "delta-rs reads no history of a table at such a location, so txsink could not "
         "tell which epochs it holds",
    "%": "delta-rs decodes percent-escapes in a table's location twice and finds "
         "another directory",
}
#: delta-rs's names of the S3 settings (its ``storage_options``).
S3_NAMES = S3Names("AWS_REGION", "AWS_ENDPOINT_URL", "AWS_VIRTUAL_HOSTED_STYLE_REQUEST",
                   "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
#: Writer features txsink's commits honour (Delta protocol, "Table Features"): appends
#: of whole files with statistics are all these ask of a writer, and delta-rs 1.6
#: writes (and checkpoints) tables that list them. ``invariants``, ``checkConstraints``
#: and ``generatedColumns`` are listed but refused where a table uses them (rows are
#: not checked); ``columnMapping`` where its mode is not ``none``.
WRITER_FEATURES = frozenset({
    "appendOnly", "invariants", "checkConstraints", "changeDataFeed", "generatedColumns",
    "columnMapping", "deletionVectors", "timestampNtz", "v2Checkpoint", "variantType"})
READER_FEATURES = frozenset({
    "columnMapping", "deletionVectors", "timestampNtz", "v2Checkpoint", "variantType"})
#: What a feature txsink refuses asks of every writer (for the refusal).
FEATURE_NEEDS = {
    "rowTracking": "row ids (baseRowId) on every added file",
    "domainMetadata": "domain metadata kept by every commit",
    "identityColumns": "identity values generated for each row",
    "icebergCompatV1": "Iceberg metadata written with every commit (UniForm)",
    "icebergCompatV2": "Iceberg metadata written with every commit (UniForm)",
    "clustering": "clustering domain metadata",
    "inCommitTimestamp": "an in-commit timestamp in every commit",
    "typeWidening": "type-widening metadata",
    "vacuumProtocolCheck": "a protocol check by every VACUUM",
    "allowColumnDefaults": "column defaults applied to each row",
}

#: What txsink's ``txn`` app id starts with (:func:`txn_app_id`).
TXN_APP_PREFIX = "txsink:"


def txn_app_id(sink_id: str) -> str:
    """The app id of txsink's ``txn`` action for ``sink_id``: ``txsink:<sink id>``.

    Delta keys a ``txn`` by app id alone, and a Spark job's ``txnAppId`` is a name its
    team picks, often the pipeline's, so the sink id itself is a likely one: under it
    the job's versions and txsink's epochs would hide each other (Delta skipping the
    job's writes, silently). Releases before this one used the bare sink id; tables
    they wrote are read on by :meth:`DeltaBackend._txn_version`."""
    return TXN_APP_PREFIX + sink_id


class DeltaBackend(TableBackend):
    """A Delta table on local disk or on S3 (``path``)."""

    name: ClassVar[str] = "delta"
    secret_options: ClassVar[frozenset[str]] = SECRET_KEYS

    def __init__(self, path: str, *, create: bool = True, s3: S3Access | None = None) -> None:
        self._locate(path, s3, LOCATION_CHARACTERS)
        self.path = path
        self.create = create

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> DeltaBackend:
        opts = Options(options, owner="delta backend", secret_keys=SECRET_KEYS)
        path, s3 = table_location(opts, options, "delta backend", "path")
        create = opts.bool("create", True)
        opts.check_unknown()
        return cls(path, create=create, s3=s3)

    def describe(self) -> str:
        return f"delta table {self.path}"

    def data_root(self) -> str:
        return self.path

    def table_uri(self, path: str | None = None) -> str:
        """The table's location (or ``path``, another one on the same store) as delta-rs
        takes it: a URL, percent-encoded (spaces, non-ASCII names)."""
        path = self.path if path is None else path
        if is_s3(path):
            bucket, key = split_uri(path, owner="delta backend", field="path")
            return f"s3://{bucket}/{quote(key, safe='/')}"
        return pathlib.Path(path).as_uri()

    def storage_options(self) -> dict[str, str] | None:
        """delta-rs's storage options for a table on S3 (None on local disk).

        ``conditional_put=etag``: every log entry is a create-only PUT, so a commit that
        lost the race for a version fails instead of overwriting the winner (delta-rs 1.x
        does this by default on S3; stated so a changed default cannot undo it)."""
        if self.s3 is None:
            return None
        out = {"conditional_put": "etag", **self.s3.properties(S3_NAMES)}
        if out.get(S3_NAMES.endpoint, "").startswith("http://"):
            out["AWS_ALLOW_HTTP"] = "true"
        return out

    # -- the table ------------------------------------------------------------------------

    def load_table(self) -> Any:
        """The table at its latest version, or None when there is none yet."""
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError, TableNotFoundError

        try:
            return DeltaTable(self.table_uri(), storage_options=self.storage_options())
        except TableNotFoundError:
            return None
        except DeltaError as exc:
            # A protocol above what delta-rs reads (minReaderVersion 4, say) fails the
            # open itself, before the protocol check could name it.
            text = redact(str(exc), self.secret_values())
            if "Unsupported" not in text:
                raise
            raise ConfigError(
                f"delta backend: table {self.path} uses a protocol delta-rs cannot read "
                f"({text}). Nothing of the epoch is written. Write this table with a writer "
                "that implements it (Spark with Delta), or give a table without it",
                field="path") from None

    def preflight(self, sink_id: str) -> None:
        if self.s3 is not None:
            self.check_location()
            self._check_conditional_put()
        table = self.load_table()
        if table is None:
            if not self.create:
                raise self.not_created(f"Delta table at {self.path}", field="path")
            self._refuse_foreign_directory()
        else:
            self._refuse_unsupported(table)
            self.refuse_restored(table, sink_id)
        self._refuse_replaced(sink_id, table)

    def _refuse_foreign_txn(self, sink_id: str, table: Any) -> None:
        """Refuse a table whose ``txn`` action of txsink's app id for ``sink_id`` no
        txsink commit wrote: another writer's idempotent writes use that app id (Spark's
        ``txnAppId``). Delta keeps one version per app id, so txsink would take the other
        writer's versions for epochs of its own, and Delta would skip that writer's later
        writes whose version is at or below txsink's epoch, silently. Read only when
        txsink's folder holds no committed epoch of the sink (its first start on this
        table), and only a log read back to version 0 decides."""
        app_id = txn_app_id(sink_id)
        version = table.transaction_version(app_id)
        if version is None or self.committed_above(sink_id, -1):
            return
        versions = []
        for entry in _history(table):
            if entry.get(SINK_KEY) == sink_id:
                return
            versions.append(int(entry.get("version", 0)))
        if min(versions, default=0) != 0:
            return  # the log was cleaned up: txsink's entries may have been there
        raise ConfigError(
            f"delta backend: table {self.path} holds a txn action of app id {app_id!r} "
            f"(version {version}) that no txsink commit wrote: another writer's idempotent "
            "writes use it (Spark's txnAppId), and it is txsink's own app id for sink "
            f"{sink_id!r}. Delta keeps one version per app id, so txsink's epochs and that "
            "writer's versions would hide each other, and Delta would skip that writer's "
            "writes silently. Nothing is written. Give that writer another txnAppId (one "
            f"not starting with {TXN_APP_PREFIX!r}), or this sink another sink_id",
            field="sink_id", sink_id=sink_id)

    def _txn_version(self, table: Any, sink_id: str) -> int | None:
        """The sink's highest epoch in the table: its ``txn`` action's version under
        :func:`txn_app_id`; else the newest entry of the log that marks the sink (the
        action dropped by a checkpoint: ``delta.setTransactionRetentionDuration``
        shorter than the pipeline was stopped; or a table an earlier release wrote,
        whose ``txn`` has the bare sink id as app id); else that bare ``txn`` when
        txsink's folder says the table held epochs of the sink and the log no longer
        reaches version 0 (an earlier release's table whose log was cleaned up). A bare
        ``txn`` that neither backs is another writer's (a Spark job whose ``txnAppId``
        is the sink id) and says nothing of the sink: so is one beside a whole log that
        marks no epoch of the sink, where the folder's epochs were held by a table
        since replaced (or the folder came from another table). Without any of these,
        None. The log is read
        only when a bare ``txn`` is there or the folder says the table held epochs of
        the sink (a sink new to the table has neither): after the first commit of this
        release the ``txn`` under txsink's app id answers alone."""
        version = table.transaction_version(txn_app_id(sink_id))
        if version is not None:
            return int(version)
        bare = table.transaction_version(sink_id)
        held = bool(self.committed_above(sink_id, -1))
        if bare is None and not held:
            return None
        earliest: int | None = None  # the oldest entry the log still has
        for entry in _history(table):
            highest = marked_highest(entry, sink_id)
            if highest is not None:
                return highest
            earliest = int(entry.get("version", 0))
        if bare is not None and held and earliest != 0:
            return int(bare)
        return None

    def _refuse_replaced(self, sink_id: str, table: Any) -> None:
        """Refuse a table that does not hold the sink at all while txsink's folder says a
        table here held epochs of it: the table's log was deleted (txsink would create a
        new, empty table over it) or the table replaced by another. Its rows are not in
        what readers see, and going on would hide that."""
        if table is not None and self._txn_version(table, sink_id) is not None:
            self._refuse_foreign_txn(sink_id, table)
            self._refuse_behind(sink_id, table)
            return
        held = self.committed_epochs_on_disk(sink_id)
        if not held:
            return
        what = ("there is no Delta table there any more (its _delta_log is gone)"
                if table is None else "the Delta table there does not know the sink (no "
                "txn action of it: the table was replaced)")
        raise ConfigError(
            f"delta backend: {self.uri(self._sink_folder(sink_id))} holds {len(held)} epoch(s) "
            f"of sink {sink_id!r} that a table at {self.path} held (epochs {held[0]} to "
            f"{held[-1]}), but {what}. Their rows are not in the table. Restore the table's "
            "log; or, to start the sink over in this table without them, move that folder "
            "away", field="path", sink_id=sink_id)

    def _refuse_behind(self, sink_id: str, table: Any) -> None:
        """Stop when the log lacks epochs it held: ``_committed.json`` (written only after a
        log entry named the epoch) is there for epochs above the sink's ``txn`` version,
        and no entry of the log marks them. The log was put back to an older copy (a
        backup restored, its newest entries deleted): those epochs' rows are gone from
        what readers see, and going on would leave that hole for good. (RESTORE keeps the
        ``txn`` version: :meth:`refuse_restored`.)"""
        found = self._txn_version(table, sink_id)
        version = -1 if found is None else found
        lost = set(self.committed_above(sink_id, version))
        if not lost:
            return
        for entry in _history(table):  # an earlier release may have lowered the txn
            if entry.get(SINK_KEY) == sink_id and str(entry.get(EPOCH_KEY)) in {
                    str(e) for e in lost}:
                lost.discard(int(entry[EPOCH_KEY]))
        if not lost:
            return
        first, last = min(lost), max(lost)
        raise self.taken_back(
            f"the log of table {self.path} (now at version {table.version()}) records epochs "
            f"of sink {sink_id!r} up to {version} only, but epochs {first} to {last} were "
            f"committed to it ({self.uri(self._sink_folder(sink_id))} records them): the "
            "log was put back to an older copy (a backup restored, its newest entries "
            "deleted), and their rows are gone from what readers see",
            "Put the log's newer entries back (_delta_log/<version>.json)", "older log")

    def check_claim(self, sink_id: str, state_id: str, state_location: str) -> None:
        # The owner file first: a store that is down is named there at once.
        super().check_claim(sink_id, state_id, state_location)
        self._refuse_replaced(sink_id, self.load_table())

    def claim_sink(self, sink_id: str, state_id: str, state_location: str) -> None:
        self.check_claim(sink_id, state_id, state_location)  # refused: nothing recorded
        super().claim_sink(sink_id, state_id, state_location)

    def _refuse_unsupported(self, table: Any, *, since: str = "") -> None:
        """Refuse what txsink's commits cannot write correctly into ``table``: protocol
        features neither txsink nor delta-rs implements (a commit would fail after the
        decision, every try), column mapping (readers would see NULL in every column
        of txsink's files), partitions (its files would carry no partition values) and
        rules on rows. ``since``: said when the table changed after the start."""
        problems = self._unsupported(table)
        if problems:
            raise ConfigError(
                f"delta backend: table {self.path} {since}uses "
                f"{'; '.join(problems)}. txsink adds whole Parquet files to the log and "
                "writes none of that: nothing of the epoch is written. Write this table "
                "with a writer that implements it (Spark with Delta), or give a table "
                "without it", field="path")
        self._refuse_constraints(table)

    def _unsupported(self, table: Any) -> list[str]:
        """One line per thing :meth:`_refuse_unsupported` refuses, naming it."""
        out: list[str] = []
        protocol = table.protocol()
        config = table.metadata().configuration
        reader, writer = protocol.min_reader_version, protocol.min_writer_version
        if reader > 3:
            out.append(f"reader version {reader} (minReaderVersion; delta-rs knows up to 3)")
        if writer > 7:
            out.append(f"writer version {writer} (minWriterVersion; delta-rs knows up to 7)")
        if writer == 6:
            out.append("identity columns (minWriterVersion 6: identity values generated "
                       "for each row)")
        unknown = sorted(set(protocol.writer_features or ()) - WRITER_FEATURES) + sorted(
            set(protocol.reader_features or ()) - READER_FEATURES
            - set(protocol.writer_features or ()))
        for feature in unknown:
            needs = FEATURE_NEEDS.get(feature, "a feature txsink does not know")
            out.append(f"table feature {feature!r} ({needs})")
        mode = config.get("delta.columnMapping.mode", "none")
        if mode != "none":
            out.append(f"column mapping (delta.columnMapping.mode={mode}: files must name "
                       "columns by their physical names"
                       + (" and field ids" if mode == "id" else "")
                       + "; txsink's and Spark's files name them as the frame does, so "
                       "readers would see NULL in every column)")
        formats = config.get("delta.universalFormat.enabledFormats")
        if formats and not any(f.startswith("icebergCompat") for f in unknown):
            out.append(f"UniForm (delta.universalFormat.enabledFormats={formats}: Iceberg "
                       "metadata written with every commit)")
        identity = sorted(f.name for f in table.schema().fields
                          if any(k.startswith("delta.identity.") for k in f.metadata))
        if identity and writer != 6 and "identityColumns" not in unknown:
            out.append(f"identity columns ({', '.join(identity)})")
        parts = table.metadata().partition_columns
        if parts:
            out.append(f"partition columns ({', '.join(parts)}; txsink writes "
                       "unpartitioned tables only: its files would carry no partition "
                       "values)")
        return out

    def _refuse_foreign_directory(self) -> None:
        """Refuse a location that holds files but no Delta table: txsink would create
        the table in it, and a later VACUUM of that table deletes every file its log
        does not name, the owner's too. Only txsink's own folder (a first epoch not
        committed yet) and an empty ``_delta_log`` may be there."""
        fs, root = self._fs()
        try:
            entries = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
        except OSError as exc:
            raise ConfigError(f"delta backend: cannot list {self.path}: {exc}",
                              field="path") from None
        foreign = sorted(e.base_name for e in entries if e.base_name != DATA_FOLDER and not (
            e.base_name == "_delta_log" and e.type == pafs.FileType.Directory
            and not fs.get_file_info(pafs.FileSelector(e.path, allow_not_found=True))))
        if foreign:
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more"
                                             if len(foreign) > 5 else "")
            raise ConfigError(
                f"delta backend: {self.path} is not a Delta table (no readable _delta_log) "
                f"and is not empty ({shown}): txsink would make it a Delta table, and a "
                "later VACUUM of that table deletes every file its log does not name, "
                "these too. Give a new or empty directory, or a Delta table's",
                field="path")

    def _refuse_constraints(self, table: Any) -> None:
        """Refuse a table with rules its writers must check on every row (CHECK
        constraints, column invariants, generated columns): txsink adds Spark's or its
        own Parquet files as they are, and a row breaking the rule would go in (delta-rs's
        own writer refuses it)."""
        kinds = {"delta.invariants": "column invariant on",
                 "delta.generationExpression": "generated column"}
        rules = sorted("CHECK constraint " + k.removeprefix("delta.constraints.")
                       for k in table.metadata().configuration
                       if k.startswith("delta.constraints."))
        rules += sorted(f"{kinds[key]} {f.name}" for f in table.schema().fields
                        for key in f.metadata if key in kinds)
        if rules:
            raise ConfigError(
                f"delta backend: table {self.path} has rules every written row must pass "
                f"({', '.join(rules)}); txsink commits files without checking rows against "
                "them, so a row breaking one would go in. Drop them, or write this table "
                "with a writer that enforces them", field="path")

    def refuse_restored(self, table: Any, sink_id: str) -> None:
        """Stop when a RESTORE since the sink's last entry took its epochs out.

        RESTORE TABLE ... TO VERSION AS OF v removes what later entries added, but keeps
        their ``txn`` action and their commit info in the log: read as they are, the
        sink's epochs after ``v`` would still look committed (a replay skipped, a group's
        cut passing rows the table no longer holds). Exactly-once cannot hold then; the
        pipeline stops before anything more is decided, naming the RESTORE."""
        restore: tuple[int, int | None, Any] | None = None
        for entry in _history(table):
            version = int(entry.get("version", -1))
            if entry.get(SINK_KEY) == sink_id:
                if restore is None:
                    return  # the sink committed after any RESTORE
                at, target, when = restore
                if target is not None and version <= target:
                    return  # restored to a version that holds the sink's epochs
                if target is None and isinstance(when, int | float) and \
                        int(entry.get("timestamp", 0)) <= when:
                    return
                to = f"version {target}" if target is not None else f"timestamp {when}"
                raise self.taken_back(
                    f"table {self.path} was restored (RESTORE, log version {at}) to {to}, "
                    f"before epoch {entry.get(EPOCH_KEY)} of sink {sink_id!r} (log version "
                    f"{version}): the epochs committed after it are no longer in the "
                    "table, though its log still names them",
                    f"RESTORE the table to version {version} or later", "RESTORE")
            if restore is None and entry.get("operation") == "RESTORE":
                params = entry.get("operationParameters") or {}
                target = params.get("version")
                restore = (version, int(target) if target is not None else None,
                           _millis(params.get("timestamp")))

    def _check_conditional_put(self) -> None:
        """Two writers of one log version on a scratch table under the data folder: the
        second must be refused. A store that ignores ``If-None-Match`` lets it overwrite
        the first entry, and a lost race would then drop a committed epoch silently."""
        from deltalake import CommitProperties, DeltaTable
        from deltalake.exceptions import CommitFailedError

        assert self.s3 is not None
        bucket, _ = split_uri(self.path, owner="delta backend", field="path")
        proven = (self.s3.endpoint(), bucket)
        if proven in _CONDITIONAL_PUT_PROVEN:
            return
        import pyarrow as pa

        scratch = f"{DATA_FOLDER}/_probe-{uuid.uuid4().hex[:12]}"
        uri = self.table_uri(self.uri(scratch))
        options = self.storage_options()
        schema = pa.schema([("id", pa.int64())])
        once = CommitProperties(max_commit_retries=0)
        try:
            DeltaTable.create(uri, schema=schema, storage_options=options)
            first = DeltaTable(uri, storage_options=options)
            second = DeltaTable(uri, storage_options=options)
            first.create_write_transaction([], "append", first.schema(),
                                           commit_properties=once)
            try:
                second.create_write_transaction([], "append", second.schema(),
                                                commit_properties=once)
            except CommitFailedError:
                _CONDITIONAL_PUT_PROVEN.add(proven)
                return
            raise ConfigError(
                f"delta backend: {self.s3.where(bucket)} does not honour conditional writes "
                "(If-None-Match: *): a second writer of a Delta log version overwrote the "
                "first on a scratch table. Two committers of one table could then lose a "
                "commit silently; use a store that honours them (AWS S3, SeaweedFS 4.x, "
                "recent MinIO)", field="endpoint_url")
        finally:
            self._delete_dir(scratch)

    def table_epoch(self, sink_id: str, epoch: int, table: Any = None
                    ) -> dict[str, str] | None:
        table = table if table is not None else self.load_table()
        if table is None:
            return None
        version = self._txn_version(table, sink_id)
        if version is None or version < epoch:
            return None  # Delta's own record: nothing of this epoch yet
        search = EpochSearch(sink_id, epoch)
        versions = []
        for entry in _history(table):
            if search.read(entry):
                return search.found  # no older entry can be of this epoch
            versions.append(int(entry.get("version", 0)))
        if search.found is not None:
            return search.found
        earliest = min(versions, default=0)
        if earliest == 0:
            return None  # the whole log read: this epoch number was never committed
        raise self.untold(
            sink_id, epoch, f"{self.describe()} records epoch {version} of this sink, but its "
            f"log no longer reaches back to epoch {epoch} (cleaned up before version "
            f"{earliest})", "Raise delta.logRetentionDuration above the longest time a "
            "pipeline may be down")

    def highest_in(self, table: Any, sink_id: str) -> int:
        version = self._txn_version(table, sink_id)
        return -1 if version is None else int(version)

    def append_to(self, table: Any, sink_id: str, epoch: int,
                  participants: Mapping[str, Sequence[DataFile]],
                  files: Sequence[DataFile]) -> None:
        from deltalake import CommitProperties, Transaction
        from deltalake.exceptions import CommitFailedError
        from deltalake.transaction import AddAction

        self.refuse_if_named(table, sink_id, epoch, participants)
        self.refuse_restored(table, sink_id)
        with after_decision():
            self._refuse_unsupported(table, since="was changed since the epoch was decided: "
                                     "it now ")
        schema = table.schema()
        self._check_schema(schema, files)
        # The txn version stays the sink's highest epoch when a lower one commits after
        # it: Delta keeps the latest txn action, and a lowered one would hide the higher
        # epoch from table_epoch (whose retry then added its rows again).
        recorded = self._txn_version(table, sink_id)
        highest = epoch if recorded is None else max(epoch, int(recorded))
        actions = []
        for f in files:
            mtime = self.modified_ns(f.path) // 1_000_000
            actions.append(AddAction(f.path, f.size, {}, mtime, True,
                                     f.stats or f'{{"numRecords":{f.rows}}}'))
        props = CommitProperties(
            custom_metadata=marker(sink_id, epoch, participants, highest),
            app_transactions=[Transaction(txn_app_id(sink_id), highest)],
            # delta-rs would retry a lost race itself, on the new log version, without
            # looking at the winner's txn: two committers of one epoch then both add it
            # (seen: both answered committed). Lost races come back here instead, and
            # the caller reads the markers again first.
            max_commit_retries=0)
        try:
            table.create_write_transaction(actions, "append", schema, commit_properties=props)
        except CommitFailedError as exc:
            if "Unsupported table features" in str(exc):
                # Not a race: every try would fail the same way (seen before the check
                # at the start existed: "kept changing under 20 commit attempts").
                raise FatalCommitError(
                    f"delta backend: table {self.path} refuses txsink's commit: {exc}; the "
                    "epoch stays DECIDED") from exc
            raise ConflictError(str(exc)) from exc

    def create_table(self, sink_id: str, files: Sequence[DataFile]) -> Any:
        """Create the table from the first file's schema (a racing creator may win)."""
        from deltalake import DeltaTable

        if not files:
            return None
        if not self.create:
            raise self.gone(f"the table at {self.path}")
        # Every column nullable: a frame's NOT NULL columns (Spark's range, a literal)
        # would otherwise refuse every later frame that may hold a null.
        schema = nullable_schema(self.read_schema(files[0].path))
        try:
            DeltaTable.create(self.table_uri(), schema=schema, mode="ignore",
                              storage_options=self.storage_options())
        except Exception as exc:
            log.info("delta table %s: create raced with another writer (%s)", self.path, exc)
        return self.load_table()

    def _schema_mismatch(self, schema: Any, files: Sequence[DataFile]) -> tuple[str, str] | None:
        """(first offending column, what differs) when the files do not fit ``schema``."""
        from deltalake import Schema

        if not files:
            return None
        theirs = Schema.from_arrow(self.read_schema(files[0].path))
        want = {f["name"]: f["type"] for f in json.loads(schema.to_json())["fields"]}
        have = {f["name"]: f["type"] for f in json.loads(theirs.to_json())["fields"]}
        extra = sorted(set(have) - set(want))
        # A nullable column the files lack reads as null (how every reader takes a
        # column added by ALTER TABLE to older files); a NOT NULL one cannot.
        nullable = {f["name"] for f in json.loads(schema.to_json())["fields"] if f["nullable"]}
        missing = sorted(set(want) - set(have) - nullable)
        changed = sorted(n for n in set(want) & set(have)
                         if _loose(want[n]) != _loose(have[n]))
        if extra or missing or changed:
            parts = ([f"not in the table: {', '.join(extra)}"] if extra else []) + (
                [f"missing, NOT NULL in the table: {', '.join(missing)}"]
                if missing else []) + (
                [f"of another type: {', '.join(changed)}"] if changed else [])
            return (extra or missing or changed)[0], "; ".join(parts)
        # Same types; nullability: a NOT NULL top-level column takes a nullable frame's
        # files whose statistics count no null; a nested NOT NULL cannot be checked.
        nested = sorted(n for n in want if n in have and _stricter_inside(want[n], have[n]))
        if nested:
            return nested[0], (f"with a NOT NULL field or element inside in the table, "
                               f"which the epoch's files may hold nulls in (txsink cannot "
                               f"count nested nulls): {', '.join(nested)}")
        nulls = _nulls_in_required(schema, theirs, files)
        return None if not nulls else (
            nulls[0], f"NOT NULL in the table, with nulls (or maybe nulls) in the "
            f"epoch's files: {', '.join(nulls)}")

    def check_prepared(self, committables: Sequence[Committable]) -> None:
        table = self.load_table()
        if table is not None:  # restored since the start, by another writer
            for sink_id in sorted({c.sink_id for c in committables}):
                self.refuse_restored(table, sink_id)
        super().check_prepared(committables)

    def check_files_schema(self, files: Sequence[DataFile]) -> None:
        table = self.load_table()
        if table is not None:
            # Changed since the start by another writer (a feature turned on, columns
            # mapped, partitions): refused before the decision, never after it.
            self._refuse_unsupported(table, since="was changed since the start: it now ")
        else:
            self._refuse_foreign_directory()
        mismatch = self._schema_mismatch(table.schema(), files) if table is not None else None
        if mismatch is not None:
            raise self.misfit(f"{self.path} (columns {mismatch[1]})", field=mismatch[0])

    def _check_schema(self, schema: Any, files: Sequence[DataFile]) -> None:
        # Again at commit: the table may have been altered since the epoch was decided.
        mismatch = self._schema_mismatch(schema, files)
        if mismatch is not None:
            raise FatalCommitError(
                f"delta backend: the epoch's files do not match the schema of {self.path} "
                f"(columns {mismatch[1]}); the epoch stays DECIDED: alter the table or "
                "write a matching frame")


def _history(table: Any) -> Iterator[dict[str, Any]]:
    """The table's log entries, newest first, read :data:`HISTORY_STEP` at first and four
    times more each time the caller reads on (a longer read starts again at the newest:
    what the callers take from an entry is the same when they see it twice)."""
    limit = HISTORY_STEP
    while True:
        entries = table.history(limit)
        yield from entries
        if len(entries) < limit:
            return
        limit *= 4


def _millis(value: Any) -> float | None:
    """A RESTORE's timestamp parameter as milliseconds since the epoch (None: unknown)."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    from datetime import datetime, timezone

    try:
        parsed = datetime.fromisoformat(str(value).replace(" ", "T"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp() * 1000


def _nulls_in_required(schema: Any, theirs: Any, files: Sequence[DataFile]) -> list[str]:
    """The table's NOT NULL columns that some file may hold a null in: its statistics
    count one, or say nothing and the file's own schema allows them. (Delta writers
    refuse such rows; a table holding one breaks the readers that trust the schema.)"""
    import json

    required = [f.name for f in schema.fields if not f.nullable]
    if not required:
        return []
    allowed = {f.name for f in theirs.fields if f.nullable}
    counts = []
    for f in files:
        try:
            counts.append(json.loads(f.stats).get("nullCount", {}) if f.stats else {})
        except ValueError:
            counts.append({})
    return [name for name in required
            if any(c.get(name, 1 if name in allowed else 0) for c in counts)]


_NULLABLE_KEYS = ("nullable", "containsNull", "valueContainsNull")


def _loose(kind: Any) -> Any:
    """A Delta type (as JSON) with every nullability flag set: what types compare by."""
    if isinstance(kind, dict):
        return {k: True if k in _NULLABLE_KEYS else _loose(v) for k, v in kind.items()
                if k != "metadata"}
    if isinstance(kind, list):
        return [_loose(v) for v in kind]
    return kind


def _stricter_inside(table: Any, files: Any) -> bool:
    """Whether the table's type says NOT NULL somewhere inside where the files' may
    hold a null (the same type otherwise)."""
    if isinstance(table, dict) and isinstance(files, dict):
        for k, v in table.items():
            if k in _NULLABLE_KEYS and v is False and files.get(k) is True:
                return True
            if k != "metadata" and _stricter_inside(v, files.get(k)):
                return True
    elif isinstance(table, list) and isinstance(files, list):
        return any(_stricter_inside(a, b) for a, b in zip(table, files, strict=False))
    return False
