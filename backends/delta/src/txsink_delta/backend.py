"""Delta Lake backend: one log entry per epoch, with Delta's own idempotency record.

Writers put Parquet files into the table's directory (invisible: no log entry names
them); the driver commits an epoch as ONE log entry (delta-rs
``create_write_transaction``) holding every participant's add actions, the ``txn``
action ``appId = sink id, version = epoch`` (what Spark's ``txnAppId``/``txnVersion``
write) and, in its commit info, which participant directories it names. Before each
commit the log is read: an epoch it already names is not added again, so a commit
whose outcome was unknown is finished, never doubled. delta-rs 1.6 accepts a second
commit with the same ``txn`` version, so this check is txsink's own.

A table on S3 (``s3://bucket/prefix``) is as safe: delta-rs writes each log entry with
a create-only PUT (``If-None-Match: *``, its ``conditional_put=etag``), so of two
writers of one log version exactly one wins, with no DynamoDB lock. The store must
honour that condition: the preflight proves it on a scratch log before data moves.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from txsink.errors import ConfigError, FatalCommitError, StateError
from txsink.lakehouse import (
    DATA_FOLDER,
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
#: The sink's highest epoch in the table once the entry is in (its ``txn`` version): an
#: epoch may commit after a higher one (two batch writes reserve 5 and 6, 6 commits
#: first), so the epochs of the log's entries are not in order, but these are.
HIGHEST_KEY = "txsink.highest"
#: Log entries read per step when looking back for an epoch.
HISTORY_STEP = 32
#: (endpoint, bucket) pairs whose conditional writes this process has seen work.
_CONDITIONAL_PUT_PROVEN: set[tuple[str | None, str]] = set()


class DeltaBackend(TableBackend):
    """A Delta table on local disk or on S3 (``path``)."""

    name: ClassVar[str] = "delta"
    secret_options: ClassVar[frozenset[str]] = SECRET_KEYS

    def __init__(self, path: str, *, create: bool = True, s3: S3Access | None = None) -> None:
        self.path = path
        self.create = create
        self.s3 = s3 if s3 is not None or not is_s3(path) else S3Access()

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> DeltaBackend:
        opts = Options(options, owner="delta backend", secret_keys=SECRET_KEYS)
        path, s3 = table_location(opts, options, "delta backend", "path")
        create = opts.bool("create", True)
        opts.check_unknown()
        return cls(path, create=create, s3=s3)

    @classmethod
    def destination(cls, options: Mapping[str, str]) -> dict[str, str]:
        # On S3 the place is the store and the table's key prefix (s3:// and s3a://
        # name the same objects); region and keys only say how to get there, and a
        # rotated key is no move. Local tables keep the default.
        path = str(options.get("path") or "")
        if not is_s3(path):
            return super().destination(options)
        return {"path": "s3://" + path.split("://", 1)[1].strip("/"),
                "endpoint_url": str(options.get("endpoint_url") or "").rstrip("/")}

    def describe(self) -> str:
        return f"delta table {self.path}"

    def safe_options(self, options: Mapping[str, str]) -> dict[str, str]:
        kept = super().safe_options(options)
        kept["path"] = self.path  # absolute: status/resolve may run elsewhere
        return kept

    def secret_values(self) -> list[str]:
        return self.s3.secrets() if self.s3 is not None else []

    def data_root(self) -> str:
        return self.path

    def s3_access(self) -> S3Access:
        return self.s3 if self.s3 is not None else S3Access()

    def on_s3(self) -> bool:
        return self.s3 is not None

    def storage_options(self) -> dict[str, str] | None:
        """delta-rs's storage options for a table on S3 (None on local disk).

        ``conditional_put=etag``: every log entry is a create-only PUT, so a commit that
        lost the race for a version fails instead of overwriting the winner (delta-rs 1.x
        does this by default on S3; stated so a changed default cannot undo it)."""
        if self.s3 is None:
            return None
        s3 = self.s3
        out = {"conditional_put": "etag", "AWS_REGION": s3.region_name()}
        endpoint = s3.endpoint()
        if endpoint:
            out["AWS_ENDPOINT_URL"] = endpoint
            if endpoint.startswith("http://"):
                out["AWS_ALLOW_HTTP"] = "true"
        if s3.addressing_style != "auto":
            out["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = str(
                s3.addressing_style == "virtual").lower()
        if s3.access_key_id is not None and s3.secret_access_key is not None:
            out["AWS_ACCESS_KEY_ID"] = s3.access_key_id
            out["AWS_SECRET_ACCESS_KEY"] = s3.secret_access_key.reveal()
            if s3.session_token is not None:
                out["AWS_SESSION_TOKEN"] = s3.session_token.reveal()
        return out

    # -- the table ------------------------------------------------------------------------

    def _table(self) -> Any:
        """The table at its latest version, or None when there is none yet."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.path, storage_options=self.storage_options())
        except TableNotFoundError:
            return None

    def preflight(self, sink_id: str) -> None:
        if self.s3 is not None:
            self.check_location()
            self._check_conditional_put()
        table = self._table()
        if table is None:
            if not self.create:
                raise ConfigError(f"delta backend: no Delta table at {self.path} and "
                                  "create=false; create it first, or drop create=false",
                                  field="path")
            return
        self._refuse_constraints(table)
        self.refuse_restored(table, sink_id)
        parts = table.metadata().partition_columns
        if parts:
            raise ConfigError(
                f"delta backend: table {self.path} is partitioned by {', '.join(parts)}; "
                "txsink writes unpartitioned Delta tables only (for now)", field="path")

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
        limit = HISTORY_STEP
        while True:
            entries = table.history(limit)
            for entry in entries:
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
                    raise FatalCommitError(
                        f"delta backend: table {self.path} was restored (RESTORE, log "
                        f"version {at}) to {to}, "
                        f"before epoch {entry.get(EPOCH_KEY)} of sink {sink_id!r} (log version "
                        f"{version}): the epochs committed after it are no longer in the "
                        "table, though its log still names them, so txsink cannot keep "
                        "them exactly once. RESTORE the table to version "
                        f"{version} or later to go on, or write with a new sink_id (and "
                        "checkpoint) and replay what the RESTORE took out")
                if restore is None and entry.get("operation") == "RESTORE":
                    params = entry.get("operationParameters") or {}
                    target = params.get("version")
                    restore = (version, int(target) if target is not None else None,
                               _millis(params.get("timestamp")))
            if len(entries) < limit:
                return
            limit *= 4

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
        uri = self.uri(scratch)
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
        table = table if table is not None else self._table()
        if table is None:
            return None
        version = table.transaction_version(sink_id)
        if version is None or version < epoch:
            return None  # Delta's own record: nothing of this epoch yet
        found: dict[str, str] | None = None
        limit = HISTORY_STEP
        while True:
            entries = table.history(limit)
            for entry in entries:
                if entry.get(SINK_KEY) != sink_id:
                    continue
                e = int(entry[EPOCH_KEY])
                if e == epoch:
                    found = {**(found or {}), **marker_dirs(str(entry[PARTICIPANTS_KEY]))}
                elif int(entry.get(HIGHEST_KEY, e)) < epoch:
                    return found  # no older entry can be of this epoch
            if len(entries) < limit:
                break
            limit *= 4
        if found is not None:
            return found
        earliest = min((int(e.get("version", 0)) for e in entries), default=0)
        if earliest == 0:
            return None  # the whole log read: this epoch number was never committed
        raise StateError(
            f"sink={sink_id} epoch={epoch}: {self.describe()} records epoch {version} of "
            "this sink, but its log no longer reaches back to epoch "
            f"{epoch} (cleaned up before version {earliest}): txsink cannot tell whether "
            "that epoch is in the table. Raise delta.logRetentionDuration above the longest "
            "time a pipeline may be down", sink_id=sink_id, epoch=epoch)

    def highest_epoch(self, sink_id: str) -> int | None:
        table = self._table()
        if table is None:
            return -1
        version = table.transaction_version(sink_id)
        return -1 if version is None else int(version)

    def append_epoch(self, sink_id: str, epoch: int,
                     participants: Mapping[str, Sequence[DataFile]]) -> None:
        from deltalake import CommitProperties, Transaction
        from deltalake.exceptions import CommitFailedError
        from deltalake.transaction import AddAction

        files = [f for fs in participants.values() for f in fs]
        table = self._table()
        if table is None:
            table = self._create(files)
        if table is None:
            return  # an empty epoch into a table that does not exist yet: nothing to name
        self.refuse_if_named(table, sink_id, epoch, participants)
        self.refuse_restored(table, sink_id)
        schema = table.schema()
        self._check_schema(schema, files)
        # The txn version stays the sink's highest epoch when a lower one commits after
        # it: Delta keeps the latest txn action, and a lowered one would hide the higher
        # epoch from table_epoch (whose retry then added its rows again).
        recorded = table.transaction_version(sink_id)
        highest = epoch if recorded is None else max(epoch, int(recorded))
        actions = []
        for f in files:
            mtime = self.modified_ns(f.path) // 1_000_000
            actions.append(AddAction(f.path, f.size, {}, mtime, True,
                                     f.stats or f'{{"numRecords":{f.rows}}}'))
        props = CommitProperties(
            custom_metadata={SINK_KEY: sink_id, EPOCH_KEY: str(epoch),
                             PARTICIPANTS_KEY: marker_json(participants),
                             HIGHEST_KEY: str(highest)},
            app_transactions=[Transaction(sink_id, highest)],
            # delta-rs would retry a lost race itself, on the new log version, without
            # looking at the winner's txn: two committers of one epoch then both add it
            # (seen: both answered committed). Lost races come back here instead, and
            # the caller reads the markers again first.
            max_commit_retries=0)
        try:
            table.create_write_transaction(actions, "append", schema, commit_properties=props)
        except CommitFailedError as exc:
            raise ConflictError(str(exc)) from exc

    def _create(self, files: Sequence[DataFile]) -> Any:
        """Create the table from the first file's schema (a racing creator may win)."""
        from deltalake import DeltaTable

        if not files:
            return None
        if not self.create:
            raise FatalCommitError(f"delta backend: the table at {self.path} is gone and "
                                   "create=false; create it again to commit")
        schema = self.read_schema(files[0].path)
        try:
            DeltaTable.create(self.path, schema=schema, mode="ignore",
                              storage_options=self.storage_options())
        except Exception as exc:
            log.info("delta table %s: create raced with another writer (%s)", self.path, exc)
        return self._table()

    def _schema_mismatch(self, schema: Any, files: Sequence[DataFile]) -> tuple[str, str] | None:
        """(first offending column, what differs) when the files do not fit ``schema``."""
        from deltalake import Schema

        if not files:
            return None
        theirs = Schema.from_arrow(self.read_schema(files[0].path))
        want = {f.name: f.type for f in schema.fields}
        have = {f.name: f.type for f in theirs.fields}
        if want == have:
            nulls = _nulls_in_required(schema, theirs, files)
            return None if not nulls else (
                nulls[0], f"NOT NULL in the table, with nulls (or maybe nulls) in the "
                f"epoch's files: {', '.join(nulls)}")
        extra = sorted(set(have) - set(want))
        missing = sorted(set(want) - set(have))
        changed = sorted(n for n in set(want) & set(have) if want[n] != have[n])
        parts = ([f"not in the table: {', '.join(extra)}"] if extra else []) + (
            [f"missing: {', '.join(missing)}"] if missing else []) + (
            [f"of another type: {', '.join(changed)}"] if changed else [])
        return (extra or missing or changed)[0], "; ".join(parts)

    def check_prepared(self, committables: Sequence[Committable]) -> None:
        table = self._table()
        if table is not None:  # restored since the start, by another writer
            for sink_id in sorted({c.sink_id for c in committables}):
                self.refuse_restored(table, sink_id)
        super().check_prepared(committables)

    def check_files_schema(self, files: Sequence[DataFile]) -> None:
        table = self._table()
        if table is not None:
            self._refuse_constraints(table)  # added since the start, by another writer
        mismatch = self._schema_mismatch(table.schema(), files) if table is not None else None
        if mismatch is not None:
            raise ConfigError(
                f"delta backend: the epoch's rows do not fit the schema of {self.path} "
                f"(columns {mismatch[1]}); nothing of the epoch is committed in any target: "
                "alter the table or write a matching frame", field=mismatch[0])

    def _check_schema(self, schema: Any, files: Sequence[DataFile]) -> None:
        # Again at commit: the table may have been altered since the epoch was decided.
        mismatch = self._schema_mismatch(schema, files)
        if mismatch is not None:
            raise FatalCommitError(
                f"delta backend: the epoch's files do not match the schema of {self.path} "
                f"(columns {mismatch[1]}); the epoch stays DECIDED: alter the table or "
                "write a matching frame")


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
