"""What table-format backends (Delta Lake, Apache Iceberg) share: data files written
into the table's own directory, invisible until one log entry / snapshot names them.

A table format makes staging free: a Parquet file in the table's directory is seen by
no reader until the table's log (Delta) or a snapshot (Iceberg) names it. So a
participant is a directory of Parquet files under the table, prepared once its files
are durable; committing an epoch appends one entry to the table naming every
participant's files and carrying the epoch marker; aborting deletes the directory.
The files may come from txsink's own writer (:meth:`TableBackend.write`) or from
Spark's Parquet writer (:meth:`TableBackend.committable_for_directory`, the native
data path): the committable is the same.

Layout under the table's data root (:meth:`TableBackend.data_root`)::

    txsink/<sink id>/e<epoch>/<participant>.<nonce>/part-*.parquet
    txsink/<sink id>/e<epoch>/_committed.json      which directories the table names

The nonce makes every attempt's directory unique, even when a restarted Spark reuses
task attempt numbers. The table's own marker (Delta's ``txn`` action and commit info,
Iceberg's snapshot summary) names the epoch and its participants' directories: it
is what a commit reads first, so a commit whose outcome was unknown (a timeout after
success) is recognised and never adds the files twice. ``_committed.json`` caches
that answer for the orphan scan (names starting with ``_`` are skipped by VACUUM and
by readers).
"""

from __future__ import annotations

import abc
import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from txsink.backend import Backend, Capability, CommitOutcome, Transaction
from txsink.errors import (
    ConfigError,
    FatalCommitError,
    ParticipantLostError,
    ServerUnavailableError,
    SinkOwnedError,
    StateError,
)
from txsink.model import (
    SOURCE_DIGEST_LENGTH,
    Committable,
    TransactionContext,
    parse_participant,
)
from txsink.objectstore import S3Access, is_s3, split_uri, unreachable

log = logging.getLogger(__name__)

#: The folder under a table's data root that holds every file txsink writes there.
DATA_FOLDER = "txsink"
COMMITTED_MARKER = "_committed.json"
#: In an epoch's folder: the digest of the source offsets of the micro-batch it holds.
SOURCE_NOTE = "_source"
#: Which txsink state owns a sink id in this table (``txsink/<sink id>/_owner.json``).
OWNER_FILE = "_owner.json"
#: Row groups are buffered up to this many bytes (Spark's own writer buffers 128 MiB;
#: a smaller group keeps a task's memory near it and the group costs low).
ROW_GROUP_BYTES = 16 << 20
ROW_GROUP_ROWS = 1 << 20
#: At most this many fsyncs of one participant at once (:meth:`TableBackend._make_durable`).
MAX_SYNCS = 16
#: How often a commit that lost a race with another writer is tried again.
CONFLICT_RETRIES = 20


def epoch_folder(epoch: int) -> str:
    return f"e{epoch:010d}"


def new_participant_dir(participant: str) -> str:
    """A fresh directory name for one attempt of ``participant``."""
    return f"{participant}.{uuid.uuid4().hex[:12]}"


def participant_of(dirname: str) -> str:
    """The participant name a directory made by :func:`new_participant_dir` belongs to."""
    return dirname.rsplit(".", 1)[0]


def refuse_characters(location: str, why: Mapping[str, str], *, owner: str,
                      field: str) -> None:
    """Refuse (before anything is written) a table location holding one of the
    characters ``why`` names, saying why that character cannot work: each format names
    its own (Iceberg takes ``%``, Delta does not)."""
    for ch, reason in why.items():
        if ch in location:
            raise ConfigError(f"{owner}: option '{field}' {location!r} holds {ch!r}: "
                              f"{reason}. Give a location without it", field=field)


def nullable_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every field nullable, inside structs, lists and map values too:
    a table created from it takes later frames whether or not they declare NOT NULL
    (a map's keys stay NOT NULL, as every format requires)."""
    return pa.schema([_nullable_field(f) for f in schema],
                     metadata=schema.metadata)  # type: ignore[arg-type]


def _nullable_field(field: pa.Field[Any]) -> pa.Field[Any]:
    kind = field.type
    if pa.types.is_struct(kind):
        kind = pa.struct([_nullable_field(kind.field(i)) for i in range(kind.num_fields)])
    elif pa.types.is_large_list(kind):
        kind = pa.large_list(_nullable_field(kind.value_field))
    elif pa.types.is_list(kind):
        kind = pa.list_(_nullable_field(kind.value_field))
    elif pa.types.is_map(kind):
        kind = pa.map_(kind.key_field, _nullable_field(kind.item_field))
    return pa.field(field.name, kind, nullable=True, metadata=field.metadata)


@contextlib.contextmanager
def after_decision() -> Iterator[None]:
    """Around a check made again at commit, after the epoch was decided: what refused the
    epoch before its decision (a :class:`~txsink.errors.ConfigError`) stops the commit
    now, and the epoch stays DECIDED for the next start."""
    try:
        yield
    except ConfigError as exc:
        raise FatalCommitError(f"{exc}; the epoch stays DECIDED") from None


def fsync_path(path: str, *, directory: bool = False) -> None:
    """Make ``path`` (a file, or a directory's entries) durable on local disk."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class DataFile:
    """One Parquet file of a participant, as the table's commit needs it."""

    #: Path relative to the data root.
    path: str
    size: int
    rows: int
    #: Delta's per-file statistics (JSON), when known.
    stats: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "size": self.size, "rows": self.rows}
        if self.stats is not None:
            out["stats"] = self.stats
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DataFile:
        stats = data.get("stats")
        return cls(str(data["path"]), int(data["size"]), int(data["rows"]),
                   None if stats is None else str(stats))


def files_of(committables: Iterable[Committable]) -> list[DataFile]:
    """Every data file the participants of ``committables`` wrote."""
    return [DataFile.from_json(f) for c in committables for f in c.payload.get("files", ())]


def file_stats(meta: pq.FileMetaData) -> str:
    """Delta's ``stats`` for a Parquet file: row count, null counts and, for files whose
    every column is of a simple type, min/max (what data skipping reads).

    A bound must hold for every row of the file: Parquet writers leave min/max out of a
    row group when a value is too long (a string over 4 KiB) or the column is NaN there,
    and bounds taken over the other row groups were too narrow, so filtered reads
    skipped rows the file holds. And bounds are given for every column or for none:
    delta-rs's pyarrow reader (``to_pyarrow_table(filters=...)``, 1.6) takes a column
    missing from ``minValues`` beside others that are there as all null, and skipped
    the file for any filter on it (a timestamp beside an integer). A row group whose
    values are all null has no min/max and needs none. A null count is given per
    column, when every row group has it."""
    schema = meta.schema.to_arrow_schema()
    simple = {f.name for f in schema if pa.types.is_integer(f.type)
              or pa.types.is_floating(f.type) or pa.types.is_string(f.type)
              or pa.types.is_large_string(f.type) or pa.types.is_boolean(f.type)}
    null_count: dict[str, int] = {}
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    no_nulls: set[str] = set()  # a row group without a null count for it
    no_bounds: set[str] = set()  # a row group with values but no usable min/max
    for rg in range(meta.num_row_groups):
        group = meta.row_group(rg)
        for ci in range(group.num_columns):
            col = group.column(ci)
            name = col.path_in_schema
            if name not in simple:
                continue
            st = col.statistics
            if st is None:
                no_nulls.add(name)
                no_bounds.add(name)
                continue
            # (pyarrow's stubs lack has_null_count; null_count is 0 without it)
            nulls = st.null_count if getattr(st, "has_null_count", True) else None
            if nulls is not None:
                null_count[name] = null_count.get(name, 0) + nulls
            else:
                no_nulls.add(name)
            if not st.has_min_max:
                if not (nulls is not None and st.num_values == 0):  # not all null
                    no_bounds.add(name)
                continue
            lo, hi = st.min, st.max
            if isinstance(lo, float) and (lo != lo or hi != hi):  # NaN: no usable bound
                no_bounds.add(name)
                continue
            mins[name] = lo if name not in mins else min(mins[name], lo)
            maxs[name] = hi if name not in maxs else max(maxs[name], hi)
    out: dict[str, Any] = {"numRecords": meta.num_rows}
    counts = {k: v for k, v in null_count.items() if k not in no_nulls}
    if counts:
        out["nullCount"] = counts
    whole = (not no_bounds and {f.name for f in schema} == simple
             and set(mins) == set(maxs) == {c for c in simple if counts.get(c, 0) < meta.num_rows})
    if whole and mins:
        out.update(minValues=mins, maxValues=maxs)
    return json.dumps(out, separators=(",", ":"), default=str)


class _TableTransaction(Transaction):
    """One participant: a Parquet file written in row groups into its own directory."""

    def __init__(self, ctx: TransactionContext, dirname: str) -> None:
        super().__init__(ctx)
        self.dirname = dirname
        self.writer: pq.ParquetWriter | None = None
        self.sink: Any = None
        self.group: list[pa.RecordBatch] = []
        self.group_bytes = 0
        self.group_rows = 0
        self.path: str | None = None
        #: What the file is written with (:meth:`TableBackend.file_schema`).
        self.schema: pa.Schema | None = None

    def flush(self) -> None:
        if self.group and self.writer is not None:
            self.writer.write_table(pa.Table.from_batches(self.group))
        self.group, self.group_bytes, self.group_rows = [], 0, 0

    def close(self) -> None:
        try:
            self.flush()
        finally:
            if self.writer is not None:
                self.writer.close()
                self.writer = None
            if self.sink is not None:
                self.sink.close()
                self.sink = None


class TableBackend(Backend):
    """Base of the table-format backends: the four operations over data files in the
    table's directory; subclasses read and append the table's log.

    An epoch's participants are committed together in one :meth:`commit_all` call
    (:meth:`first_commit_size`), which appends one entry to the table.
    """

    #: Spark's own Parquet writer may write this target's files (the native data path:
    #: ``TargetSet.write_stream`` / ``write`` and grouped epochs).
    native_parquet: ClassVar[bool] = True
    #: The option naming the table's location (for errors about it); the backend keeps
    #: its value in the attribute of the same name (:attr:`location`).
    location_option: ClassVar[str] = "path"
    #: Options besides the location and the endpoint that name the place of a table on
    #: S3 (:meth:`destination`), with their defaults.
    place_options: ClassVar[Mapping[str, str]] = {}
    #: How the table's store is reached: None for a table on local disk.
    s3: S3Access | None = None
    capabilities: ClassVar[frozenset[Capability]] = frozenset({
        Capability.COMMIT_FROM_ANY_PROCESS, Capability.LIST_PREPARED,
        Capability.COMMIT_MARKER, Capability.SURVIVES_RESTART})

    # -- what a format provides -----------------------------------------------------------

    @abc.abstractmethod
    def data_root(self) -> str:
        """Where data files go (a URI or absolute path): the table's directory (Delta) or
        its data folder (Iceberg). Known without I/O."""

    @abc.abstractmethod
    def table_epoch(self, sink_id: str, epoch: int, table: Any = None
                    ) -> dict[str, str] | None:
        """The participant directories the table's own markers name for ``epoch`` of
        ``sink_id`` (participant -> directory), or None when the table holds no entry of
        that epoch. Raise :class:`~txsink.errors.StateError` when the table's history no
        longer reaches back far enough to tell. ``table``: read that loaded version of
        the table (the one a commit is about to be based on) instead of the latest."""

    @abc.abstractmethod
    def load_table(self) -> Any:
        """The table at its latest version as the format's library loads it (delta-rs's
        ``DeltaTable``, pyiceberg's ``Table``), or None when there is no table yet."""

    @abc.abstractmethod
    def create_table(self, sink_id: str, files: Sequence[DataFile]) -> Any:
        """Create the table from the schema of the first of ``files`` (every column
        nullable) and load it; a racing creator may win. None when there is no file to
        take a schema from."""

    @abc.abstractmethod
    def highest_in(self, table: Any, sink_id: str) -> int:
        """The sink's highest epoch as the loaded ``table`` records it (-1: none)."""

    @abc.abstractmethod
    def append_to(self, table: Any, sink_id: str, epoch: int,
                  participants: Mapping[str, Sequence[DataFile]],
                  files: Sequence[DataFile]) -> None:
        """:meth:`append_epoch` into ``table``, loaded (or created) just before."""

    def append_epoch(self, sink_id: str, epoch: int,
                     participants: Mapping[str, Sequence[DataFile]]) -> None:
        """Append ONE entry to the table adding ``participants``' files and carrying the
        epoch marker (naming the participant directories). Raise
        :class:`ConflictError` when another writer won the race: the caller reads the
        markers again and retries. The markers are read again on the very version the
        entry is based on (:meth:`refuse_if_named`): a racing committer of the same epoch
        may have committed between the caller's read and this load, and the format's
        optimistic concurrency only catches a commit made after it.

        A table not there yet is created from the files first; an epoch without files
        into a table that does not exist yet appends nothing (its empty
        ``_committed.json`` records it: :meth:`epoch_committed`)."""
        files = [f for fs in participants.values() for f in fs]
        table = self.load_table()
        if table is None:
            table = self.create_table(sink_id, files)
        if table is None:
            return
        self.append_to(table, sink_id, epoch, participants, files)

    def highest_epoch(self, sink_id: str) -> int | None:
        table = self.load_table()
        if table is None:
            # No table yet: the epochs committed without rows before it was made.
            return max(self.empty_epochs(sink_id), default=-1)
        return self.highest_in(table, sink_id)

    def check_files_schema(self, files: Sequence[DataFile]) -> None:
        """Raise :class:`~txsink.errors.ConfigError` (naming a column as ``field``) when
        the table exists and ``files`` (one epoch's, all of one frame: read the first
        one's schema only) do not fit its schema. Nothing to check by default."""

    def check_prepared(self, committables: Sequence[Committable]) -> None:
        # Every participant's rows come from one frame: the first file's schema stands
        # for all (one footer read); the others' statistics are in the committables.
        files = files_of(committables)
        if files:
            self.check_files_schema(files)

    def refuse_if_named(self, table: Any, sink_id: str, epoch: int,
                        participants: Mapping[str, Sequence[DataFile]]) -> None:
        """Raise :class:`ConflictError` when ``table`` (as loaded for the commit) already
        names one of ``participants``."""
        held = self.table_epoch(sink_id, epoch, table) or {}
        if any(participant_of(d) in held for d in participants):
            raise ConflictError(f"sink={sink_id} epoch={epoch}: {self.describe()} was "
                                "given this epoch meanwhile by another committer")

    # -- refusals: one shape each, the format giving its facts and its remedy ------------

    def not_created(self, what: str, field: str) -> ConfigError:
        """The start's refusal when there is no table (``what``) and option ``create`` is
        false."""
        return ConfigError(f"{self.name} backend: no {what} and create=false; create it "
                           "first, or drop create=false", field=field)

    def gone(self, what: str, *, decided: bool = True) -> Exception:
        """The table (``what``) went away after the start, with option ``create`` false:
        fatal once the epoch is ``decided``, a refusal of the epoch before."""
        error = FatalCommitError if decided else ConfigError
        return error(f"{self.name} backend: {what} is gone and create=false; create it "
                     "again to commit")

    def misfit(self, what: str, field: str) -> ConfigError:
        """The refusal, before the decision, of an epoch whose rows do not fit the schema
        of ``what`` (the table, and how they differ); ``field``: the first column."""
        return ConfigError(f"{self.name} backend: the epoch's rows do not fit the schema of "
                           f"{what}; nothing of the epoch is committed in any target: alter "
                           "the table or write a matching frame", field=field)

    def taken_back(self, what: str, undo: str, by: str) -> FatalCommitError:
        """The stop when the table's history was set back past epochs of a sink (``what``:
        how, and which epochs), so that they are no longer in it though they were
        committed; ``undo``: how to put the table back; ``by``: the operation's name."""
        return FatalCommitError(
            f"{self.name} backend: {what}, so txsink cannot keep them exactly once. {undo} "
            "to go on, or write with a new sink_id (and checkpoint) and replay what the "
            f"{by} took out")

    @staticmethod
    def untold(sink_id: str, epoch: int, why: str, remedy: str, *,
               not_again: bool = False) -> StateError:
        """The table's history no longer says whether ``epoch`` is in it (``why``: what it
        records and what is gone); ``not_again``: say that the epoch is not added a
        second time either; ``remedy``: what keeps the history long enough."""
        again = ", and does not add it a second time" if not_again else ""
        return StateError(f"sink={sink_id} epoch={epoch}: {why}: txsink cannot tell whether "
                          f"that epoch is in the table{again}. The table is asked only for "
                          "epochs the txsink state does not know: if the state, or the "
                          "checkpoint holding it, was restored from an older copy, restore "
                          "the checkpoint's newest copy (or the newest state), which knows "
                          f"it. {remedy}", sink_id=sink_id, epoch=epoch)

    # -- the location -------------------------------------------------------------------

    def _locate(self, location: str, s3: S3Access | None, refused: Mapping[str, str]) -> None:
        """For the constructor: refuse a location holding a character ``refused`` names
        (the format's libraries cannot take it), and keep how its store is reached: ``s3``
        as given; for an ``s3://`` location without one, the AWS environment's."""
        refuse_characters(location, refused, owner=f"{self.name} backend",
                          field=self.location_option)
        self.s3 = s3 if s3 is not None or not is_s3(location) else S3Access()

    @property
    def location(self) -> str:
        """The location option's value as this backend keeps it (absolute, ``s3://``)."""
        return str(getattr(self, self.location_option))

    @classmethod
    def destination(cls, options: Mapping[str, str]) -> dict[str, str]:
        # On S3 the place is the store and the table's key prefix (s3:// and s3a:// name
        # the same objects); region and keys only say how to get there, and a rotated key
        # is no move. Local tables keep the default.
        location = str(options.get(cls.location_option) or "")
        if not is_s3(location):
            return super().destination(options)
        return {cls.location_option: "s3://" + location.split("://", 1)[1].strip("/"),
                **{k: str(options.get(k) or default) for k, default in cls.place_options.items()},
                "endpoint_url": str(options.get("endpoint_url") or "").rstrip("/")}

    def safe_options(self, options: Mapping[str, str]) -> dict[str, str]:
        kept = super().safe_options(options)
        kept[self.location_option] = self.location  # absolute: status/resolve may run elsewhere
        return kept

    def secret_values(self) -> list[str]:
        return self.s3.secrets() if self.s3 is not None else []

    # -- files ----------------------------------------------------------------------------

    def on_s3(self) -> bool:
        """Whether the table lives on S3 (known from its options, without I/O)."""
        return self.s3 is not None

    def s3_access(self) -> S3Access:
        """How this table's S3 location is reached (the AWS environment of the process
        when the options say nothing)."""
        return self.s3 if self.s3 is not None else S3Access()

    def _fs(self) -> tuple[pafs.FileSystem, str]:
        cached = getattr(self, "_fs_cache", None)
        if cached is None:
            root = self.data_root()
            fs: pafs.FileSystem
            if is_s3(root):
                bucket, key = split_uri(root, owner=f"{self.name} backend",
                                        field=self.location_option)
                fs, path = self.s3_access().filesystem(), f"{bucket}/{key}"
            elif "://" in root and not root.startswith("file://"):
                fs, path = pafs.FileSystem.from_uri(root)
            else:
                fs, path = pafs.LocalFileSystem(), root.removeprefix("file://")
            cached = (fs, path.rstrip("/"))
            self._fs_cache = cached
        return cached

    def _local(self) -> bool:
        return self._fs()[0].type_name == "local"

    def _sink_folder(self, sink_id: str) -> str:
        return f"{DATA_FOLDER}/{sink_id}"

    def epoch_folder(self, sink_id: str, epoch: int) -> str:
        """The epoch's folder, relative to the data root."""
        return f"{self._sink_folder(sink_id)}/{epoch_folder(epoch)}"

    def absolute(self, relative: str) -> str:
        """A path relative to the data root as the filesystem names it (for S3:
        ``bucket/key``, without a scheme)."""
        return f"{self._fs()[1]}/{relative}"

    def uri(self, relative: str) -> str:
        """A path relative to the data root as the table format names it: an absolute
        local path, or ``s3://bucket/key``."""
        root = self.data_root().rstrip("/")
        if is_s3(root):
            return f"s3://{root.split('://', 1)[1]}/{relative}"
        return f"{self._fs()[1]}/{relative}"

    def spark_path(self, relative: str) -> str:
        """A path relative to the data root as Spark's Hadoop filesystems name it, fully
        qualified: ``file:///...`` on local disk (a path without a scheme is on the
        cluster's default filesystem, ``fs.defaultFS``: HDFS or DBFS, where Spark would
        write files the driver never finds), ``s3a://bucket/key`` on S3. Hadoop takes
        the characters of a path as they are (no percent-encoding)."""
        uri = self.uri(relative)
        return f"s3a://{uri.split('://', 1)[1]}" if is_s3(uri) else f"file://{uri}"

    def read_schema(self, relative: str) -> pa.Schema:
        """The Arrow schema of one of the table's data files (through the filesystem)."""
        fs, _ = self._fs()
        return pq.read_schema(self.absolute(relative), filesystem=fs)

    def check_location(self, where: str | None = None) -> None:
        """Before any data moves: for a table on S3, the bucket exists, the endpoint
        answers, the credentials are accepted and an object can be written and deleted
        under the table's data folder, or under ``where`` (a location known without I/O,
        when the data root is not) (a :class:`~txsink.errors.ConfigError` naming the
        option otherwise). Nothing to check on local disk."""
        root = where if where is not None else f"{self.data_root().rstrip('/')}/{DATA_FOLDER}"
        if not is_s3(root):
            return
        owner = f"{self.name} backend"
        bucket, key = split_uri(root, owner=owner, field=self.location_option)
        self.s3_access().check(bucket, key, owner=owner, field=self.location_option)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_fs_cache", None)
        state.pop("_mtimes", None)
        if "_file_target" in state:
            state["_file_target"] = None
        return state

    # -- executor side --------------------------------------------------------------------

    def begin_transaction(self, ctx: TransactionContext) -> Transaction:
        return _TableTransaction(ctx, new_participant_dir(ctx.participant))

    def write(self, txn: Transaction, batch: pa.RecordBatch) -> None:
        assert isinstance(txn, _TableTransaction)
        if txn.writer is None:
            fs, _ = self._fs()
            folder = self.absolute(f"{self.epoch_folder(txn.ctx.sink_id, txn.ctx.epoch)}/"
                                   f"{txn.dirname}")
            if self._local():  # object stores have no directories to make
                fs.create_dir(folder, recursive=True)
            txn.schema = self.file_schema(batch.schema)
            txn.path = f"{folder}/part-00000.parquet"
            txn.sink = fs.open_output_stream(txn.path)
            # Iceberg reads timestamps as microseconds; Spark's INT96 is refused there.
            txn.writer = pq.ParquetWriter(txn.sink, txn.schema, compression="snappy",
                                          coerce_timestamps="us",
                                          allow_truncated_timestamps=False)
        if txn.schema is not None and txn.schema is not batch.schema:
            batch = self.fit_batch(batch, txn.schema)
        txn.group.append(batch)
        txn.group_bytes += batch.nbytes
        txn.group_rows += batch.num_rows
        txn.rows += batch.num_rows
        if txn.group_bytes >= ROW_GROUP_BYTES or txn.group_rows >= ROW_GROUP_ROWS:
            txn.flush()

    def file_schema(self, schema: pa.Schema) -> pa.Schema:
        """The schema a data file of rows of ``schema`` is written with: the rows' own by
        default (Iceberg adds the table's field ids and NOT NULL columns)."""
        return schema

    def fit_batch(self, batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
        """``batch`` as :meth:`file_schema` says (the same types, other field metadata
        and nullability); a null in a column the table declares NOT NULL fails the task,
        naming the column (nothing of the epoch is decided then)."""
        if batch.schema.equals(schema, check_metadata=True):
            return batch
        try:
            return batch.cast(schema)
        except (ValueError, pa.ArrowInvalid) as exc:
            column = next((f.name for f in schema if not f.nullable
                           and batch.column(f.name).null_count), None)
            if column is None:
                raise
            raise ConfigError(f"{self.name} backend: column {column!r} is NOT NULL in "
                              f"{self.describe()}, and a row of this epoch holds a null "
                              "in it: nothing of the epoch is committed in any target. "
                              "Drop those rows, or make the column nullable",
                              field=column) from exc

    def pre_commit(self, txn: Transaction) -> Committable:
        assert isinstance(txn, _TableTransaction)
        txn.close()
        files: list[DataFile] = []
        if txn.path is not None:
            rel = f"{self.epoch_folder(txn.ctx.sink_id, txn.ctx.epoch)}/{txn.dirname}"
            files = self._describe_files(rel)
            self._make_durable(rel, files)
        return self._committable(txn.ctx, txn.dirname, files)

    def discard(self, txn: Transaction) -> None:
        assert isinstance(txn, _TableTransaction)
        with contextlib.suppress(Exception):
            txn.close()
        self._delete_dir(f"{self.epoch_folder(txn.ctx.sink_id, txn.ctx.epoch)}/{txn.dirname}")

    def _committable(self, ctx: TransactionContext, dirname: str,
                     files: Sequence[DataFile]) -> Committable:
        return Committable.for_context(
            self.name, ctx, {"dir": dirname, "files": [f.to_json() for f in files]},
            rows=sum(f.rows for f in files), payload_version=self.payload_version)

    def _describe_files(self, rel_dir: str) -> list[DataFile]:
        """Every Parquet file under ``rel_dir`` with its size, rows and statistics."""
        fs, _ = self._fs()
        infos = fs.get_file_info(pafs.FileSelector(self.absolute(rel_dir), recursive=True,
                                                   allow_not_found=True))
        root = self._fs()[1]
        out: list[DataFile] = []
        for info in sorted(infos, key=lambda i: i.path):
            if info.type != pafs.FileType.File or not info.base_name.endswith(".parquet"):
                continue
            if any(part.startswith(("_", ".")) for part in
                   info.path[len(root) + 1:].split("/")[len(rel_dir.split("/")):]):
                continue  # Spark's _temporary, _SUCCESS, .crc files
            with fs.open_input_file(info.path) as f:
                meta = pq.ParquetFile(f).metadata
            out.append(DataFile(info.path[len(root) + 1:], int(info.size), meta.num_rows,
                                file_stats(meta)))
        return out

    def native_staging(self, ctx: TransactionContext) -> tuple[str, str]:
        # The table's own directory (as Spark names it: s3a:// on S3): no reader sees a
        # file the log does not name.
        dirname = new_participant_dir(ctx.participant)
        return self.spark_path(f"{self.epoch_folder(ctx.sink_id, ctx.epoch)}/{dirname}"), dirname

    def discard_staging(self, ctx: TransactionContext, dirname: str, *,
                        still_ours: Callable[[], bool] | None = None) -> None:
        # Only this write's own directory (its job's name): nothing another run staged.
        self._delete_dir(f"{self.epoch_folder(ctx.sink_id, ctx.epoch)}/{dirname}")

    def committable_for_directory(self, ctx: TransactionContext, dirname: str) -> Committable:
        """The committable of a participant whose Parquet files another writer (Spark's
        own, in the native data path) put into ``epoch_folder(...)/dirname``."""
        rel = f"{self.epoch_folder(ctx.sink_id, ctx.epoch)}/{dirname}"
        files = self._describe_files(rel)
        self._make_durable(rel, files)
        return self._committable(ctx, dirname, files)

    def table_dir(self) -> str:
        """The table's own directory, relative paths of :meth:`absolute` lead into it
        (Delta: the data root; Iceberg: the table location, the data root's parent).
        Its parent is the last directory a new table's files may have made."""
        return self._fs()[1]

    def durable_top(self) -> str:
        """The highest directory :meth:`_make_durable` syncs: the table directory's parent
        (its entry there is what a new table adds)."""
        return os.path.dirname(self.table_dir().rstrip("/")) or "/"

    def _make_durable(self, rel_dir: str, files: Sequence[DataFile]) -> None:
        """Before a participant is prepared (recorded, then decided): its files and every
        directory entry leading to them are on disk, as the files backend's are. Spark's
        writer and txsink's own make the participant's, the epoch's and the sink's
        folders (and, for a new table, the table's): a power loss must not take back a
        file the decision names. On an object store an upload is durable once it
        returns: nothing to do."""
        if not self._local():
            return
        deeper = {os.path.dirname(self.absolute(f.path)) for f in files}
        top = self.durable_top()
        chain, here = [], self.absolute(rel_dir).rstrip("/")
        while len(here) > len(top) and here.startswith(top):
            chain.append(here)
            here = os.path.dirname(here)
        chain.append(top)
        syncs = [(self.absolute(f.path), False) for f in files] + [
            (d, True) for d in sorted(deeper - set(chain), key=len, reverse=True) + chain
            if os.path.isdir(d)]
        # All at once, not one after another: each fsync waits for a journal commit, and
        # concurrent ones share it (a participant's ~10 syncs took ~2.5x longer in a
        # row). Every one has finished (or raised) before this returns, so the
        # participant is recorded only once all of it is on disk.
        if len(syncs) == 1:
            fsync_path(syncs[0][0], directory=syncs[0][1])
            return
        with ThreadPoolExecutor(min(len(syncs), MAX_SYNCS)) as pool:
            for future in [pool.submit(fsync_path, path, directory=is_dir)
                           for path, is_dir in syncs]:
                future.result()

    def _delete_dir(self, rel: str) -> None:
        fs, _ = self._fs()
        with contextlib.suppress(FileNotFoundError):
            fs.delete_dir(self.absolute(rel))

    # -- driver side ----------------------------------------------------------------------

    def first_commit_size(self, committables: Sequence[Committable]) -> int:
        # One entry per epoch: the whole epoch in the first commit_all call.
        return len(committables)

    def commit(self, committable: Committable) -> CommitOutcome:
        result = self.commit_all([committable])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def commit_all(
        self, committables: Sequence[Committable]
    ) -> list[CommitOutcome | Exception]:
        by_key: dict[tuple[str, int], list[int]] = {}
        for i, c in enumerate(committables):
            by_key.setdefault((c.sink_id, c.epoch), []).append(i)
        results: list[CommitOutcome | Exception] = [
            RuntimeError("not committed")] * len(committables)
        for (sink_id, epoch), idx in sorted(by_key.items(), key=lambda kv: kv[0][1]):
            group = [committables[i] for i in idx]
            try:
                answers: list[CommitOutcome | Exception] = list(
                    self._commit_epoch(sink_id, epoch, group))
            except Exception as exc:
                answers = [exc] * len(group)
            for i, a in zip(idx, answers, strict=True):
                results[i] = a
        return results

    def _commit_epoch(self, sink_id: str, epoch: int,
                      committables: Sequence[Committable]) -> list[CommitOutcome]:
        """Add the participants the table does not name yet, in one entry; retry after
        losing a race with another writer (their entry may be ours: read again)."""
        for attempt in range(CONFLICT_RETRIES):
            held = self.table_epoch(sink_id, epoch) or {}
            todo = [c for c in committables if c.participant not in held]
            if not todo:
                return [CommitOutcome.ALREADY_COMMITTED] * len(committables)
            participants: dict[str, list[DataFile]] = {}
            for c in todo:
                files = [DataFile.from_json(f) for f in c.payload["files"]]
                self._check_present(c, files)
                participants[str(c.payload["dir"])] = files
            try:
                self.append_epoch(sink_id, epoch, participants)
            except ConflictError as exc:
                log.warning("sink=%s epoch=%d: another writer committed to %s first (%s); "
                            "reading the table again (try %d/%d)", sink_id, epoch,
                            self.describe(), exc, attempt + 1, CONFLICT_RETRIES)
                time.sleep(min(0.05 * 2 ** attempt, 1.0))
                continue
            log.info("sink=%s epoch=%d: %s names %d participant(s), %d file(s)", sink_id, epoch,
                     self.describe(), len(participants),
                     sum(len(f) for f in participants.values()))
            return [CommitOutcome.ALREADY_COMMITTED if c.participant in held
                    else CommitOutcome.COMMITTED for c in committables]
        raise ConflictError(f"sink={sink_id} epoch={epoch}: {self.describe()} kept changing "
                            f"under {CONFLICT_RETRIES} commit attempts; the epoch stays "
                            "DECIDED and the next start commits it")

    def _check_present(self, c: Committable, files: Sequence[DataFile]) -> None:
        """Every file still there with its size (one listing of the participant's
        directory: on S3 one request instead of one per file). Their modification times
        are kept for the commit (:meth:`modified_ns`)."""
        fs, _ = self._fs()
        found = {i.path: i for i in fs.get_file_info(pafs.FileSelector(
            self.absolute(f"{self.epoch_folder(c.sink_id, c.epoch)}/{c.payload['dir']}"),
            recursive=True, allow_not_found=True))}
        self._mtimes = getattr(self, "_mtimes", {})
        for f in files:
            info = found.get(self.absolute(f.path)) or fs.get_file_info(self.absolute(f.path))
            self._mtimes[f.path] = info.mtime_ns
            if info.type != pafs.FileType.File or info.size != f.size:
                raise ParticipantLostError(
                    f"{c.describe()}: data file {f.path} under {self.describe()} is "
                    f"{'gone' if info.type == pafs.FileType.NotFound else 'changed'} and the "
                    "table does not name this participant: its rows cannot be committed "
                    "(was it deleted by VACUUM / orphan-file removal while the epoch was "
                    "prepared?)", sink_id=c.sink_id, epoch=c.epoch, participant=c.participant)

    def modified_ns(self, relative: str) -> int:
        """When a data file was written (nanoseconds; from :meth:`_check_present`'s
        listing when it saw the file, else asked for)."""
        known = getattr(self, "_mtimes", {}).pop(relative, None)
        if known is None:
            known = self._fs()[0].get_file_info(self.absolute(relative)).mtime_ns
        return int(known) if known is not None else time.time_ns()

    def abort(self, committable: Committable) -> None:
        dirname = str(committable.payload.get("dir", ""))
        if not dirname or participant_of(dirname) != committable.participant:
            raise StateError(f"{committable.describe()}: malformed {self.name} committable "
                             f"(directory {dirname!r})")
        self._delete_dir(f"{self.epoch_folder(committable.sink_id, committable.epoch)}/"
                         f"{dirname}")

    def epoch_committed(self, sink_id: str, epoch: int,
                        committables: Sequence[Committable]) -> None:
        """Cache which directories the table names for ``epoch`` (for the orphan scan)."""
        held = self.table_epoch(sink_id, epoch)
        if held is None:
            if any(c.payload.get("files") for c in committables):
                raise StateError(f"sink={sink_id} epoch={epoch}: {self.describe()} does not "
                                 "name this committed epoch; the next start commits it again")
            # An epoch without rows into a table not created yet (no schema to create it
            # from): this empty marker is what records it (holds_epoch, highest_epoch),
            # so the epoch is as normal as any and the cut of a group passes it.
            held = {}
        fs, _ = self._fs()
        folder = self.absolute(self.epoch_folder(sink_id, epoch))
        if self._local():
            fs.create_dir(folder, recursive=True)
        with fs.open_output_stream(f"{folder}/{COMMITTED_MARKER}") as out:
            out.write(json.dumps(held, sort_keys=True).encode())

    def note_epoch_source(self, sink_id: str, epoch: int, source: str) -> None:
        fs, _ = self._fs()
        folder = self.absolute(self.epoch_folder(sink_id, epoch))
        if self._local():
            fs.create_dir(folder, recursive=True)
        with fs.open_output_stream(f"{folder}/{SOURCE_NOTE}") as out:
            out.write(source.encode())

    def epoch_source(self, sink_id: str, epoch: int) -> str | None:
        """The note, or None: absent (an orphan-file removal may delete it), or torn
        by a crash while it was written (a digest has one length)."""
        fs, _ = self._fs()
        try:
            with fs.open_input_stream(
                    f"{self.absolute(self.epoch_folder(sink_id, epoch))}/{SOURCE_NOTE}") as f:
                note = f.read().decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            return None
        return note if len(note) == SOURCE_DIGEST_LENGTH else None

    def is_committed(self, committable: Committable) -> bool | None:
        held = self.table_epoch(committable.sink_id, committable.epoch) or {}
        return committable.participant in held

    def holds_epoch(self, sink_id: str, epoch: int) -> bool:
        return (self.table_epoch(sink_id, epoch) is not None
                or epoch in self.empty_epochs(sink_id, only=epoch))

    def committed_epochs_on_disk(self, sink_id: str) -> list[int]:
        """Epochs of ``sink_id`` whose ``_committed.json`` names directories: a table held
        them once (the cache is written after the table named them). Beside a table
        that does not hold the sink at all, they tell that the table was replaced."""
        return [epoch for epoch, _, marker in self._epochs(sink_id) if marker]

    def committed_above(self, sink_id: str, above: int) -> list[int]:
        """Epochs above ``above`` whose ``_committed.json`` names directories: a table held
        them once. One listing of the sink's folder; only the markers above are read (a
        table whose record of the sink is below them lost epochs it held)."""
        fs, _ = self._fs()
        top = fs.get_file_info(pafs.FileSelector(self.absolute(self._sink_folder(sink_id)),
                                                 allow_not_found=True))
        out = []
        for info in top:
            name = info.base_name
            if (info.type != pafs.FileType.Directory or not name.startswith("e")
                    or not name[1:].isdigit() or int(name[1:]) <= above):
                continue
            try:
                with fs.open_input_stream(f"{info.path}/{COMMITTED_MARKER}") as f:
                    if json.loads(f.read()):
                        out.append(int(name[1:]))
            except (FileNotFoundError, ValueError):
                continue
        return sorted(out)

    def empty_epochs(self, sink_id: str, only: int | None = None) -> list[int]:
        """Epochs of ``sink_id`` committed without rows before the table existed (an
        empty ``_committed.json``: :meth:`epoch_committed`); ``only``: look at that one.
        Only these markers count on their own: a marker naming directories is a cache
        of what the table said, and a rollback may have taken that back since."""
        fs, _ = self._fs()
        if only is not None:
            folders = [self.absolute(self.epoch_folder(sink_id, only))]
        else:
            folders = [self.absolute(self.epoch_folder(sink_id, e)) for e, _, marker
                       in self._epochs(sink_id) if marker == {}]
        out = []
        for folder in folders:
            try:
                with fs.open_input_stream(f"{folder}/{COMMITTED_MARKER}") as f:
                    if json.loads(f.read()) == {}:
                        out.append(int(folder.rsplit("/e", 1)[1]))
            except (FileNotFoundError, ValueError):
                continue
        return out

    # -- orphans --------------------------------------------------------------------------

    def _epochs(self, sink_id: str) -> Iterator[tuple[int, list[str], dict[str, str] | None]]:
        """Each epoch folder of ``sink_id``: its participant directories and the cached
        committed marker (None when absent)."""
        fs, _ = self._fs()
        top = fs.get_file_info(pafs.FileSelector(self.absolute(self._sink_folder(sink_id)),
                                                 allow_not_found=True))
        for info in sorted(top, key=lambda i: i.path):
            name = info.base_name
            if info.type != pafs.FileType.Directory or not (name.startswith("e")
                                                            and name[1:].isdigit()):
                continue
            epoch = int(name[1:])
            entries = fs.get_file_info(pafs.FileSelector(info.path, allow_not_found=True))
            dirs = sorted(e.base_name for e in entries if e.type == pafs.FileType.Directory)
            marker: dict[str, str] | None = None
            if any(e.base_name == COMMITTED_MARKER for e in entries):
                try:
                    with fs.open_input_stream(f"{info.path}/{COMMITTED_MARKER}") as f:
                        marker = {str(k): str(v) for k, v in json.loads(f.read()).items()}
                except (OSError, ValueError):
                    marker = None  # rewritten by the next commit; ask the table
            yield epoch, dirs, marker

    def _prepared(self, sink_id: str, up_to_epoch: int | None
                  ) -> Iterator[tuple[Committable, bool]]:
        """Participant directories the table does not name: (committable, superseded).

        ``superseded``: another directory of the same participant is the one committed
        (a restarted Spark reused the attempt number); it is garbage, never a candidate
        to commit.
        """
        for epoch, dirs, marker in self._epochs(sink_id):
            if up_to_epoch is not None and epoch > up_to_epoch:
                continue
            if not dirs:
                # An aborted epoch's empty folder: nothing to ask the table about (an
                # old one's log entries may be cleaned up, and asking stopped the scan).
                continue
            if marker is not None:
                held = marker
            else:
                try:
                    held = self.table_epoch(sink_id, epoch) or {}
                except StateError as exc:
                    # The marker is gone (an Iceberg orphan-file removal deletes it) and
                    # the table's history no longer tells: these directories may hold
                    # committed rows. Neither aborted nor committed again; left alone.
                    log.warning("sink=%s epoch=%d: %d director(ies) under %s left alone, "
                                "neither aborted nor committed: %s", sink_id, epoch,
                                len(dirs), self.describe(), exc)
                    continue
            named = set(held.values())
            for d in dirs:
                if d in named:
                    continue
                ctx = parse_participant(participant_of(d))
                if ctx is None or ctx.sink_id != sink_id or ctx.epoch != epoch:
                    continue  # not a directory txsink made: never touched
                rel = f"{self.epoch_folder(sink_id, epoch)}/{d}"
                files = [DataFile(f.path, f.size, f.rows) for f in self._list_files(rel)]
                yield self._committable(ctx, d, files), ctx.participant in held

    def _list_files(self, rel_dir: str) -> list[DataFile]:
        fs, root = self._fs()
        infos = fs.get_file_info(pafs.FileSelector(self.absolute(rel_dir), recursive=True,
                                                   allow_not_found=True))
        return [DataFile(i.path[len(root) + 1:], int(i.size), 0) for i in infos
                if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")]

    def list_prepared(self, sink_id: str) -> Iterable[Committable]:
        return [c for c, superseded in self._prepared(sink_id, None) if not superseded]

    def abort_orphans(self, sink_id: str, protected: Collection[str],
                      up_to_epoch: int | None = None) -> list[Committable]:
        aborted: list[Committable] = []
        for c, superseded in list(self._prepared(sink_id, up_to_epoch)):
            if superseded:
                # The table names another directory of this participant: this one
                # holds a second copy of its rows, never to be committed.
                log.info("sink=%s epoch=%d: deleting %s, a second attempt of participant %s "
                         "whose first attempt the table holds", sink_id, c.epoch,
                         c.payload["dir"], c.participant)
                self.abort(c)
                continue
            if c.participant in protected:
                continue
            self.abort(c)
            aborted.append(c)
        return aborted

    # -- ownership ------------------------------------------------------------------------

    def claim_sink(self, sink_id: str, state_id: str, state_location: str) -> None:
        """Record which txsink state owns ``sink_id`` in ``txsink/<sink id>/_owner.json``.

        A new state for a sink id the table holds is a query whose checkpoint went with
        its state: Spark reads the source from its start, and the table would take every
        row a second time (and each state's orphan scan would delete the other's
        prepared files). Refused, as every backend that records an owner does. On local
        disk the file is created once (a link never replaces a name); on S3 it is read
        before it is written and read back after."""
        fs, _ = self._fs()
        path = self.absolute(self.owner_file(sink_id))
        document = {"sink_id": sink_id, "state_id": state_id,
                    "state_location": state_location}
        owner = self._read_owner(path)
        if owner is None:
            if self._local():
                folder = os.path.dirname(path)
                os.makedirs(folder, exist_ok=True)
                tmp = f"{folder}/.{OWNER_FILE}.{uuid.uuid4().hex[:8]}"
                try:
                    with open(tmp, "wb") as f:
                        f.write(json.dumps(document).encode())
                        os.fsync(f.fileno())
                    with contextlib.suppress(FileExistsError):
                        os.link(tmp, path)  # of two claims at once, one name wins
                finally:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
            else:
                with fs.open_output_stream(path) as out:
                    out.write(json.dumps(document).encode())
            owner = self._read_owner(path) or document
        self._refuse_owner(owner, sink_id, state_id, state_location)

    def owner_file(self, sink_id: str) -> str:
        """The sink's owner file, relative to the data root."""
        return f"{self._sink_folder(sink_id)}/{OWNER_FILE}"

    def check_claim(self, sink_id: str, state_id: str, state_location: str) -> None:
        """:meth:`claim_sink`'s refusal from the owner file as it is (a read, no write)."""
        owner = self._read_owner(self.absolute(self.owner_file(sink_id)))
        if owner is not None:
            self._refuse_owner(owner, sink_id, state_id, state_location)

    def _refuse_owner(self, owner: Mapping[str, Any], sink_id: str, state_id: str,
                      state_location: str, remedy: str | None = None) -> None:
        """Refuse ``state_id`` if the owner record names another state; ``remedy``: how
        to drop that record (default: delete the owner file)."""
        remedy = remedy or f"delete {self.uri(self.owner_file(sink_id))}"
        if str(owner.get("state_id")) != state_id:
            raise SinkOwnedError(
                f"{self.name} backend: sink id {sink_id!r} in {self.describe()} belongs to "
                f"the txsink state at {owner.get('state_location')!r}, not "
                f"{state_location!r}: two queries must not share a sink id (a new "
                "checkpoint reads the source again, and the table would hold its rows "
                "twice). Use another sink_id, or, if the old query and its checkpoint are "
                f"gone for good, {remedy} and accept that the source is read again",
                field="sink_id", sink_id=sink_id,
                owner_state=str(owner.get("state_location")))

    def _read_owner(self, path: str) -> dict[str, Any] | None:
        fs, _ = self._fs()
        try:
            with fs.open_input_stream(path) as f:
                found = json.loads(f.read())
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise StateError(f"{self.name} backend: the owner file {path} is unreadable "
                             f"({exc}); delete it if its state is gone") from exc
        except OSError as exc:
            # Not the file's fault: deleting it (the advice above) would drop the claim.
            said = self.s3_access().hide_secrets(str(exc)) if self.on_s3() else str(exc)
            if unreachable(said):
                raise ServerUnavailableError(
                    f"{self.name} backend: the store of {self.describe()} is down or "
                    f"unreachable: reading the owner file {path}: {said}",
                    field="endpoint_url") from None
            raise StateError(f"{self.name} backend: cannot read the owner file {path} "
                             f"({said}); it stays the sink's claim: fix the access to it, "
                             "do not delete it") from None
        if not isinstance(found, dict):
            raise StateError(f"{self.name} backend: the owner file {path} is not a JSON "
                             "object; delete it if its state is gone")
        return found

    # reset_sink: Backend's default, which refuses (txsink does not take committed
    # epochs out of a table). An override that only refused hid that from a group's
    # reset, which checks for the default before it deletes any target's output.


class ConflictError(StateError):
    """Another writer committed to the table between our read and our append."""


# -- the marker of a table entry ------------------------------------------------------------
#
# Each entry txsink appends carries these keys (Delta: in its commit info; Iceberg: in
# its snapshot's summary). A commit reads them first, so an entry whose outcome was
# unknown is recognised and never added twice.

SINK_KEY = "txsink.sink"
EPOCH_KEY = "txsink.epoch"
PARTICIPANTS_KEY = "txsink.participants"
#: The sink's highest epoch in the table once the entry is in: an epoch may commit after
#: a higher one (two batch writes reserve 5 and 6, 6 commits first), so the epochs of a
#: table's entries are not in order, but these are.
HIGHEST_KEY = "txsink.highest"


def marker_json(participants: Iterable[str]) -> str:
    """The participant directories of one table entry, as its marker carries them."""
    return json.dumps(sorted(participants), separators=(",", ":"))


def marker_dirs(text: str) -> dict[str, str]:
    """Inverse of :func:`marker_json`: participant -> directory."""
    try:
        dirs = json.loads(text)
    except ValueError as exc:
        raise StateError(f"unreadable txsink marker in the table: {exc}") from exc
    return {participant_of(str(d)): str(d) for d in dirs}


def marker(sink_id: str, epoch: int, participants: Iterable[str], highest: int
           ) -> dict[str, str]:
    """The marker of the entry adding ``participants`` (their directories) for ``epoch``,
    ``highest`` being the sink's highest epoch in the table once it is in."""
    return {SINK_KEY: sink_id, EPOCH_KEY: str(epoch),
            PARTICIPANTS_KEY: marker_json(participants), HIGHEST_KEY: str(highest)}


def marked_highest(entry: Mapping[str, Any] | None, sink_id: str) -> int | None:
    """The sink's highest epoch as ``entry``'s marker records it (its epoch, for entries
    made before that key); None when the entry is not the sink's."""
    if entry is None or entry.get(SINK_KEY) != sink_id:
        return None
    return int(entry.get(HIGHEST_KEY, entry[EPOCH_KEY]))


class EpochSearch:
    """What a table's entries, read newest first, mark for one epoch of one sink.

    :meth:`read` takes each entry's marker keys (None for an entry without any) and says
    when to stop: an entry of the sink whose highest epoch is below the one sought was
    made before that epoch could be committed, and so was every older one.
    """

    def __init__(self, sink_id: str, epoch: int) -> None:
        self.sink_id = sink_id
        self.epoch = epoch
        #: The participant directories the entries read so far mark for the epoch
        #: (participant -> directory), None when none does.
        self.found: dict[str, str] | None = None
        #: An entry of a later epoch of the sink was read (its highest epoch not below
        #: the one sought).
        self.later = False

    def read(self, entry: Mapping[str, Any] | None) -> bool:
        """Take the next older entry; True when no older entry can be of the epoch."""
        if entry is None or entry.get(SINK_KEY) != self.sink_id:
            return False
        epoch = int(entry[EPOCH_KEY])
        if epoch == self.epoch:
            self.found = {**(self.found or {}), **marker_dirs(str(entry[PARTICIPANTS_KEY]))}
        elif int(entry.get(HIGHEST_KEY, epoch)) < self.epoch:
            return True
        else:
            self.later = True
        return False
