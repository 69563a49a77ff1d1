"""Delta Lake backend: one log entry per epoch, with Delta's own idempotency record.

Writers put Parquet files into the table's directory (invisible: no log entry names
them); the driver commits an epoch as ONE log entry (delta-rs
``create_write_transaction``) holding every participant's add actions, the ``txn``
action ``appId = sink id, version = epoch`` (what Spark's ``txnAppId``/``txnVersion``
write) and, in its commit info, which participant directories it names. Before each
commit the log is read: an epoch it already names is not added again, so a commit
whose outcome was unknown is finished, never doubled. delta-rs 1.6 accepts a second
commit with the same ``txn`` version, so this check is txsink's own.
"""

from __future__ import annotations

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
from txsink.options import Options

log = logging.getLogger(__name__)

SINK_KEY = "txsink.sink"
EPOCH_KEY = "txsink.epoch"
PARTICIPANTS_KEY = "txsink.participants"
#: Log entries read per step when looking back for an epoch.
HISTORY_STEP = 32


class DeltaBackend(TableBackend):
    """A Delta table on local disk (``path``)."""

    name: ClassVar[str] = "delta"

    def __init__(self, path: str, *, create: bool = True) -> None:
        self.path = path
        self.create = create

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> DeltaBackend:
        opts = Options(options, owner="delta backend")
        path = opts.str("path", required=True)
        if path.startswith("file://"):
            path = path[len("file://"):]
        elif "://" in path:
            raise ConfigError(
                f"delta backend: option 'path' must be a local directory for now, got "
                f"{path!r}; tables on object stores are not supported yet", field="path")
        create = opts.bool("create", True)
        opts.check_unknown()
        return cls(os.path.abspath(path), create=create)

    def describe(self) -> str:
        return f"delta table {self.path}"

    def safe_options(self, options: Mapping[str, str]) -> dict[str, str]:
        kept = super().safe_options(options)
        kept["path"] = self.path  # absolute: status/resolve may run elsewhere
        return kept

    def data_root(self) -> str:
        return self.path

    # -- the table ------------------------------------------------------------------------

    def _table(self) -> Any:
        """The table at its latest version, or None when there is none yet."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.path)
        except TableNotFoundError:
            return None

    def preflight(self, sink_id: str) -> None:
        table = self._table()
        if table is None:
            if not self.create:
                raise ConfigError(f"delta backend: no Delta table at {self.path} and "
                                  "create=false; create it first, or drop create=false",
                                  field="path")
            return
        parts = table.metadata().partition_columns
        if parts:
            raise ConfigError(
                f"delta backend: table {self.path} is partitioned by {', '.join(parts)}; "
                "txsink writes unpartitioned Delta tables only (for now)", field="path")

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
                elif e < epoch:
                    return found
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
        schema = table.schema()
        self._check_schema(schema, files)
        actions = []
        for f in files:
            mtime = int(os.stat(self.absolute(f.path)).st_mtime * 1000)
            actions.append(AddAction(f.path, f.size, {}, mtime, True,
                                     f.stats or f'{{"numRecords":{f.rows}}}'))
        props = CommitProperties(
            custom_metadata={SINK_KEY: sink_id, EPOCH_KEY: str(epoch),
                             PARTICIPANTS_KEY: marker_json(participants)},
            app_transactions=[Transaction(sink_id, epoch)],
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
        import pyarrow.parquet as pq
        from deltalake import DeltaTable

        if not files:
            return None
        if not self.create:
            raise FatalCommitError(f"delta backend: the table at {self.path} is gone and "
                                   "create=false; create it again to commit")
        schema = pq.read_schema(self.absolute(files[0].path))
        try:
            DeltaTable.create(self.path, schema=schema, mode="ignore")
        except Exception as exc:
            log.info("delta table %s: create raced with another writer (%s)", self.path, exc)
        return self._table()

    def _check_schema(self, schema: Any, files: Sequence[DataFile]) -> None:
        import pyarrow.parquet as pq
        from deltalake import Schema

        if not files:
            return
        theirs = Schema.from_arrow(pq.read_schema(self.absolute(files[0].path)))
        want = {f.name: f.type for f in schema.fields}
        have = {f.name: f.type for f in theirs.fields}
        if want != have:
            raise FatalCommitError(
                f"delta backend: the epoch's files do not match the schema of {self.path} "
                f"(table: {sorted(want)}, files: {sorted(have)} or their types differ); "
                "the epoch stays DECIDED: alter the table or write a matching frame")
