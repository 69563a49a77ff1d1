"""Files backend: in-progress file -> pending file (pre_commit) -> final file (commit).

Layout under the base ``path`` (one sink per base directory)::

    part-<epoch>-<partition>.<ext>             final, visible to readers
    _txsink/sink.json                          which sink id owns this directory
    _txsink/inprogress/<participant>.<rand>.<ext>
    _txsink/pending/<participant>.<ext>        prepared: durable, invisible
    _txsink/staging/<participant>.<nonce>/     the native data path: Spark's own Parquet
                                               writer's files of one epoch, invisible

Readers that skip ``_``-prefixed paths (Spark, Hive, pyarrow datasets) never see
uncommitted data. Both state changes use ``link`` + ``unlink`` instead of
``rename``: a link never replaces an existing name, so no step can overwrite a
committed file, and a crash between link and unlink leaves two names for one
inode, which the next commit recognises.

The coordinator commits the participants of an epoch in one :meth:`FilesBackend.commit_all`
call: all links, one fsync of the output directory, all unlinks, one fsync of the
pending directory, so an epoch costs two directory fsyncs however many files it
publishes. The final names are made durable before any pending name is removed;
a crash anywhere in between leaves each file under one or both names, and
committing the epoch again (recovery) completes it.

The native data path (``TargetSet.write`` / ``write_stream`` and pipeline files, format
parquet): Spark's own Parquet writer writes the epoch's files into a fresh staging
directory; the driver makes them durable and records their names and sizes as one
participant (:meth:`FilesBackend.committable_for_directory`); the commit links each to
``part-<epoch>-<n>.parquet`` (``n``: its place among the staged files, so a replayed
commit picks the same names) and then drops the staging directory, in the same steps
as pending files.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import datetime
import decimal
import errno
import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, ClassVar

import pyarrow as pa

from txsink.backend import Backend, Capability, CommitOutcome, Transaction
from txsink.columnar import DICTIONARY_MODES, dictionary_columns
from txsink.errors import (
    ConfigError,
    FatalCommitError,
    ParticipantLostError,
    SinkOwnedError,
    StateError,
)
from txsink.faults import NATIVE_MID_PUBLISH, FaultInjector
from txsink.model import (
    SOURCE_DIGEST_LENGTH,
    Committable,
    DeliveryGuarantee,
    TransactionContext,
    parse_participant,
)
from txsink.options import Options
from txsink.state import write_file_atomically

log = logging.getLogger(__name__)

_EXT = {"parquet": "parquet", "jsonl": "jsonl"}
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


#: Epoch markers kept (``marker_retention_epochs``); older epochs are found by listing.
DEFAULT_MARKER_RETENTION = 1000
#: Markers are pruned once every this many epochs.
MARKER_PRUNE_EVERY = 100


def final_name(epoch: int, partition: int, ext: str) -> str:
    return f"part-{epoch:010d}-{partition:05d}.{ext}"


def direct_name(epoch: int, partition: int, attempt: int, ext: str) -> str:
    """The final name of a file a task published itself (at_least_once / none): each
    attempt has its own, so a retried task adds a file instead of failing on a name."""
    return f"part-{epoch:010d}-{partition:05d}-a{attempt}.{ext}"


def _fsync_path(path: Path, *, directory: bool = False) -> None:
    flags = os.O_RDONLY | (os.O_DIRECTORY if directory else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _create_json_once(path: Path, data: Mapping[str, str]) -> dict[str, Any]:
    """Create ``path`` holding ``data`` unless it exists; return what it holds.

    The document is written whole to a temporary file first and linked into place
    (a link never replaces an existing name), so a full disk leaves no empty or
    half-written marker behind to wedge the sink.
    """
    if not path.exists():
        tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            write_file_atomically(tmp, json.dumps(data).encode(), what="files backend")
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
            _fsync_path(path.parent, directory=True)
        except OSError as exc:
            raise StateError(f"files backend: cannot write {path} ({exc.strerror}); free "
                             "space or make the directory writable") from exc
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
    found = _existing_json(path)
    if found is None:
        raise StateError(f"files backend: {path} is unreadable (it vanished right after it "
                         "was written); restart")
    return found


def _existing_json(path: Path) -> dict[str, Any] | None:
    """What ``path`` holds, or None if there is no such file (nothing is written)."""
    try:
        found = json.loads(path.read_text())
        if not isinstance(found, dict):
            raise ValueError("not a JSON object")
    except FileNotFoundError:
        return None
    except (ValueError, OSError) as exc:
        raise StateError(f"files backend: {path} is unreadable ({exc}); if it is empty or "
                         "cut short (a full disk under an older txsink), delete it and "
                         "restart") from exc
    return found


def _json_default(value: object) -> object:
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


#: Parquet row groups are buffered up to this many rows or bytes. Spark hands Arrow
#: batches of 10,000 rows; written as one row group each, the per-group costs
#: (dictionary pages, statistics) make Parquet output about 3x slower. Memory per
#: open participant stays near the byte cap (Spark's own writer buffers 128 MiB).
ROW_GROUP_ROWS = 1 << 20
ROW_GROUP_BYTES = 16 << 20


class _FileTransaction(Transaction):
    """One participant's in-progress file.

    Parquet row groups are encoded on a helper thread (``write_table`` releases the
    GIL) while the task thread reads the next Arrow batches from Spark; at most one
    group is being encoded at a time, so memory stays near two row groups.
    """

    def __init__(self, ctx: TransactionContext, path: Path) -> None:
        super().__init__(ctx)
        self.path = path
        self.parquet: Any = None
        self.stream: IO[bytes] | None = None
        self.group: list[pa.RecordBatch] = []
        self.group_rows = 0
        self.group_bytes = 0
        self._encoder: concurrent.futures.ThreadPoolExecutor | None = None
        self._encoding: concurrent.futures.Future[None] | None = None

    def add_to_group(self, batch: pa.RecordBatch) -> None:
        self.group.append(batch)
        self.group_rows += batch.num_rows
        self.group_bytes += batch.nbytes
        if self.group_rows >= ROW_GROUP_ROWS or self.group_bytes >= ROW_GROUP_BYTES:
            self.flush_group()

    def flush_group(self) -> None:
        if self.group:
            table = pa.Table.from_batches(self.group)
            self.wait_encoding()
            if self._encoder is None:
                self._encoder = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix=f"txsink-parquet-{self.ctx.participant}")
            self._encoding = self._encoder.submit(self.parquet.write_table, table)
        self.group, self.group_rows, self.group_bytes = [], 0, 0

    def wait_encoding(self) -> None:
        """Wait for the row group being encoded; its error surfaces here."""
        pending, self._encoding = self._encoding, None
        if pending is not None:
            pending.result()

    def stop_encoder(self) -> None:
        if self._encoder is not None:
            self._encoder.shutdown(wait=True)
            self._encoder = None

    def close_writer(self, *, fsync: bool = True) -> None:
        if self.parquet is not None:
            try:
                self.flush_group()
                self.wait_encoding()
            finally:
                self.stop_encoder()
            self.parquet.close()
            self.parquet = None
        if self.stream is not None:
            self.stream.flush()
            if fsync:
                os.fsync(self.stream.fileno())
            self.stream.close()
            self.stream = None


class FilesBackend(Backend):
    """Exactly-once files in a local (or locally mounted) directory."""

    name: ClassVar[str] = "files"
    capabilities: ClassVar[frozenset[Capability]] = frozenset({
        Capability.COMMIT_FROM_ANY_PROCESS,
        Capability.LIST_PREPARED,
        Capability.COMMIT_MARKER,
        Capability.SURVIVES_RESTART,
    })
    guarantees: ClassVar[frozenset[DeliveryGuarantee]] = frozenset(DeliveryGuarantee)
    native_parquet: ClassVar[bool] = True

    @classmethod
    def native_parquet_for(cls, options: Mapping[str, str]) -> bool:
        # JSON lines keep txsink's own writer (Spark's JSON is another encoding).
        return str(options.get("format") or "parquet") == "parquet"

    def __init__(self, path: str, fmt: str = "parquet", compression: str = "snappy",
                 dictionary: str = "auto",
                 marker_retention_epochs: int = DEFAULT_MARKER_RETENTION) -> None:
        self.marker_retention_epochs = marker_retention_epochs
        self.base = Path(path).absolute()
        self.format = fmt
        self.ext = _EXT[fmt]
        self.compression = compression
        self.dictionary = dictionary
        self._meta = self.base / "_txsink"
        self._inprogress = self._meta / "inprogress"
        self._pending = self._meta / "pending"
        #: One empty file per committed epoch, for :meth:`holds_epoch`.
        self._epochs = self._meta / "epochs"
        #: The source offsets' digest of each stream epoch, for :meth:`epoch_source`.
        self._sources = self._meta / "sources"
        #: The native data path's directories (one per participant).
        self._staging = self._meta / "staging"

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> FilesBackend:
        opts = Options(options, owner="files backend")
        path = opts.str("path", required=True)
        if path.startswith("file://"):
            path = path[len("file://"):]
        elif "://" in path:
            raise ConfigError(
                f"files backend: option 'path' must be a local directory, got {path!r}; "
                "use the s3 backend for object stores", field="path")
        fmt = opts.choice("format", list(_EXT), "parquet")
        compression = opts.choice("compression", ["snappy", "zstd", "gzip", "none"], "snappy")
        dictionary = opts.choice("parquet_dictionary", list(DICTIONARY_MODES), "auto")
        if fmt != "parquet" and "parquet_dictionary" in options:
            raise ConfigError("files backend: option 'parquet_dictionary' applies to "
                              f"format=parquet only, not {fmt}", field="parquet_dictionary")
        retention = opts.int("marker_retention_epochs", DEFAULT_MARKER_RETENTION, minimum=0)
        opts.check_unknown()
        return cls(path, fmt, compression, dictionary, retention)

    def describe(self) -> str:
        return f"files {self.format} at {self.base}"

    @classmethod
    def destination(cls, options: Mapping[str, str]) -> dict[str, str]:
        # The directory, absolute as the state records it; format and compression say
        # how the files are written, not where.
        path = str(options.get("path") or "").removeprefix("file://")
        return {"path": str(Path(path).absolute()) if path else ""}

    def safe_options(self, options: Mapping[str, str]) -> dict[str, str]:
        # The state keeps these for `txsink status` / `resolve`, which may run from
        # another directory: a relative path would point them at the wrong files.
        kept = super().safe_options(options)
        if "path" in kept:
            kept["path"] = str(self.base)
        return kept

    # -- sink ownership -----------------------------------------------------------------

    def _claim(self, sink_id: str) -> None:
        """Bind the base directory to one sink id; a second sink id is refused."""
        for d in (self._inprogress, self._pending):
            d.mkdir(parents=True, exist_ok=True)
        self._refuse_other_sink(_create_json_once(self._meta / "sink.json",
                                                  {"sink_id": sink_id}), sink_id)

    def _refuse_other_sink(self, marker: Mapping[str, Any] | None, sink_id: str) -> None:
        """Refuse ``sink_id`` if the directory's sink marker names another sink."""
        owner = sink_id if marker is None else marker.get("sink_id")
        if owner != sink_id:
            raise ConfigError(
                f"files backend: directory {self.base} belongs to sink {owner!r}, not "
                f"{sink_id!r}; give each sink its own 'path'", field="path",
                sink_id=sink_id) from None

    def _refuse_other_state(self, owner: Mapping[str, Any] | None, sink_id: str,
                            state_id: str) -> None:
        """Refuse ``state_id`` if the directory's owner record names another state."""
        if owner is not None and owner.get("state_id") != state_id:
            owner_file = self._meta / "state.json"
            raise SinkOwnedError(
                f"files backend: sink {sink_id!r} at {self.base} is already written by "
                f"another query (txsink state at {owner.get('state_location')!r}). A sink "
                "id belongs to one query: give this query its own sink_id and path, or, "
                f"if the old query and its checkpoint are gone for good, delete {owner_file}",
                field="sink_id", sink_id=sink_id,
                owner_state=owner.get("state_location")) from None

    def claim_sink(self, sink_id: str, state_id: str, state_location: str) -> None:
        self._claim(sink_id)
        owner = _create_json_once(self._meta / "state.json",
                                  {"state_id": state_id, "state_location": state_location})
        self._refuse_other_state(owner, sink_id, state_id)

    def check_claim(self, sink_id: str, state_id: str, state_location: str) -> None:
        """:meth:`claim_sink`'s refusals, from the markers as they are; nothing is made."""
        self._refuse_other_sink(_existing_json(self._meta / "sink.json"), sink_id)
        self._refuse_other_state(_existing_json(self._meta / "state.json"), sink_id,
                                 state_id)

    def holds_epoch(self, sink_id: str, epoch: int) -> bool:
        """A final file of ``epoch`` exists in the directory ``sink_id`` owns."""
        try:
            owner = json.loads((self._meta / "sink.json").read_text()).get("sink_id")
        except (OSError, ValueError, AttributeError):
            return False
        if owner != sink_id:
            return False
        # commit_all marks each epoch it publishes: one stat, however many files the
        # directory holds (a listing cost 0.1 ms at 200 files, 1.8 ms at 4,000).
        if os.path.exists(os.path.join(self._epochs, f"{epoch:010d}")):
            return True
        since = self._epochs_since()
        if since is not None and epoch >= max(since, self._pruned_below()):
            # No marker: not published, unless a commit stopped between the final
            # names' sync and the marker's; then a pending file of the epoch also has
            # its final name.
            if self._staged_epoch_published(sink_id, epoch):
                return True
            try:
                pending = os.listdir(self._pending)
            except FileNotFoundError:
                return False
            for name in pending:
                ctx = parse_participant(name.rsplit(".", 1)[0])
                if ctx is not None and ctx.sink_id == sink_id and ctx.epoch == epoch and (
                        os.path.exists(os.path.join(
                            self.base, final_name(epoch, ctx.partition, self.ext)))):
                    return True
            return False
        # Epochs published before the markers existed (an older txsink): a listing.
        try:
            names = os.listdir(self.base)
        except FileNotFoundError:
            return False
        return f"\0part-{epoch:010d}-" in "\0" + "\0".join(names)

    def highest_epoch(self, sink_id: str) -> int | None:
        """The newest epoch marker (markers are pruned from the old end only); before
        the markers existed, the newest final file."""
        try:
            owner = json.loads((self._meta / "sink.json").read_text()).get("sink_id")
        except (OSError, ValueError, AttributeError):
            return -1
        if owner != sink_id:
            return -1
        try:
            marked = [int(n) for n in os.listdir(self._epochs) if n.isdigit()]
        except FileNotFoundError:
            marked = []
        if marked:
            return max(marked)
        try:
            names = os.listdir(self.base)
        except FileNotFoundError:
            names = []
        finals = [int(n[5:15]) for n in names if n.startswith("part-") and n[5:15].isdigit()]
        return max([-1, *finals])

    def _epochs_since(self) -> int | None:
        """The first epoch committed with an epoch marker (later ones all have one)."""
        try:
            return int(json.loads((self._epochs / "since.json").read_text())["since"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _pruned_below(self) -> int:
        """Markers of epochs below this were pruned (their epochs are found by listing)."""
        try:
            return int(json.loads((self._epochs / "pruned.json").read_text())["below"])
        except (OSError, ValueError, KeyError, TypeError):
            return -1

    def _mark_epochs(self, epochs: set[int]) -> bool:
        """Create the epoch markers of ``epochs``; True if one was new (its directory
        then needs an fsync). The first call records the epoch markers start at."""
        if not epochs:
            return False  # every participant was empty: epoch_committed marks the epoch
        if not self._epochs.is_dir():
            self._epochs.mkdir(exist_ok=True)
            _fsync_path(self._meta, directory=True)
        _create_json_once(self._epochs / "since.json", {"since": str(min(epochs))})
        created = False
        for epoch in epochs:
            path = os.path.join(self._epochs, f"{epoch:010d}")
            with contextlib.suppress(FileExistsError):
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                created = True
        if created and self.marker_retention_epochs and any(
                e % MARKER_PRUNE_EVERY == 0 for e in epochs):
            self._prune_markers(max(epochs) - self.marker_retention_epochs)
        return created

    def _prune_markers(self, below: int) -> None:
        """Keep the markers of the last ``marker_retention_epochs`` epochs.

        The boundary is written (durably) before any marker goes: an epoch below it is
        then looked for by listing the directory, as before the markers existed. So
        ``holds_epoch`` stays right for every epoch, and the directory stays bounded.
        """
        if below <= self._pruned_below():
            return
        write_file_atomically(self._epochs / "pruned.json",
                              json.dumps({"below": below}).encode(), what="files backend")
        for folder in (self._epochs, self._sources):
            with contextlib.suppress(FileNotFoundError):
                for name in os.listdir(folder):
                    if name.isdigit() and int(name) < below:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(os.path.join(folder, name))

    def note_epoch_source(self, sink_id: str, epoch: int, source: str) -> None:
        """One small file per epoch, pruned with the epoch markers. Not synced: a note
        lost to a power cut leaves the epoch as an older release wrote it (a replay is
        then recognised by its number alone, with a warning)."""
        self._sources.mkdir(parents=True, exist_ok=True)
        path = self._sources / f"{epoch:010d}"
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
        tmp.write_text(source, encoding="utf-8")
        os.replace(tmp, path)

    def epoch_source(self, sink_id: str, epoch: int) -> str | None:
        try:
            note = (self._sources / f"{epoch:010d}").read_text(encoding="utf-8").strip()
        except (OSError, ValueError):
            return None
        return note if len(note) == SOURCE_DIGEST_LENGTH else None

    def epoch_committed(self, sink_id: str, epoch: int,
                        committables: Sequence[Committable]) -> None:
        """Mark ``epoch`` published where its tasks published it themselves
        (``at_least_once``/``none``), or where it published no file at all (every
        participant empty: the directory holds that epoch too, which the consistent cut
        of a group of targets reads): :meth:`commit_all` marks the others."""
        files = [c.payload.get("final") for c in committables]
        if any(files) and not any(c.payload.get("direct") for c in committables):
            return
        if self._mark_epochs({epoch}):
            _fsync_path(self._epochs, directory=True)

    def reset_sink(self, sink_id: str) -> list[str]:
        marker = self._meta / "sink.json"
        if not marker.exists():
            strays = list(self.base.glob(f"part-*.{self.ext}"))
            if strays:
                # Without the owner record nothing says these files are this sink's:
                # another writer's output may share the directory.
                raise ConfigError(
                    f"files backend: {self.base} holds {len(strays)} part-*.{self.ext} "
                    f"file(s) but no owner record ({marker}), so nothing says they are sink "
                    f"{sink_id!r}'s; nothing deleted. Delete them yourself if they are",
                    field="path", sink_id=sink_id)
        else:
            try:
                owner = json.loads(marker.read_text())["sink_id"]
            except (ValueError, KeyError, OSError) as exc:
                raise StateError(f"{marker} is unreadable: {exc}") from exc
            if owner != sink_id:
                raise ConfigError(f"files backend: directory {self.base} belongs to sink "
                                  f"{owner!r}, not {sink_id!r}; nothing deleted", field="path",
                                  sink_id=sink_id)
        removed = []
        # The files of every format: ``format`` may change between runs (to Parquet, for
        # Spark's own writer), and files left in the other one were read again after a
        # reset, beside the same rows written anew.
        for ext in [self.ext, *(e for e in _EXT.values() if e != self.ext)]:
            finals = sorted(p for p in self.base.glob(f"part-*.{ext}") if p.is_file())
            for path in finals:
                path.unlink()
            if finals or ext == self.ext:
                removed.append(f"{len(finals)} file(s) part-*.{ext} in {self.base}")
        if self._meta.exists():
            shutil.rmtree(self._meta)
            removed.append(f"{self._meta} (pending files and the owner record)")
        with contextlib.suppress(OSError):  # only if nothing else lives there
            self.base.rmdir()
        return removed

    def preflight(self, sink_id: str) -> None:
        """Another sink's directory is refused; a directory it could not write is too.
        Nothing is created: a run refused later (a server of another target down, a
        target that belongs to another query) left the directory claimed for this
        sink id, and renaming the target, or a new sink_id, was then refused there
        although nothing had been written (the claim is :meth:`claim_sink`'s)."""
        marker = self._meta / "sink.json"
        try:
            owner = json.loads(marker.read_text()).get("sink_id")
        except FileNotFoundError:
            owner = sink_id
        except (OSError, ValueError, AttributeError):
            owner = None  # unreadable: _claim says what is wrong with it
        try:
            if owner != sink_id:
                self._claim(sink_id)
            # The nearest directory that exists is where this run's directories go.
            where = next(d for d in (self._meta, *self._meta.parents) if d.is_dir())
            probe = where / f".txsink-probe-{uuid.uuid4().hex[:8]}"
            try:
                probe.write_bytes(b"txsink")  # a byte needs space: a full disk fails here
            finally:
                probe.unlink(missing_ok=True)
        except OSError as exc:
            raise ConfigError(f"files backend: cannot write to {self.base}: {exc.strerror}",
                              field="path", sink_id=sink_id) from exc

    # -- executor side ------------------------------------------------------------------

    def begin_transaction(self, ctx: TransactionContext) -> Transaction:
        self._claim(ctx.sink_id)
        path = self._inprogress / f"{ctx.participant}.{uuid.uuid4().hex[:8]}.{self.ext}"
        return _FileTransaction(ctx, path)

    def write(self, txn: Transaction, batch: pa.RecordBatch) -> None:
        assert isinstance(txn, _FileTransaction)
        if self.format == "parquet":
            if txn.parquet is None:
                import pyarrow.parquet as pq

                use_dictionary: Any = dictionary_columns(batch, self.dictionary)
                txn.parquet = pq.ParquetWriter(txn.path, batch.schema,
                                               compression=self.compression,  # type: ignore[arg-type]
                                               use_dictionary=use_dictionary)
            txn.add_to_group(batch)
        else:
            if txn.stream is None:
                txn.stream = open(txn.path, "wb")  # noqa: SIM115 - closed in pre_commit/discard
            lines = [json.dumps(row, default=_json_default, ensure_ascii=False)
                     for row in batch.to_pylist()]
            txn.stream.write(("\n".join(lines) + "\n").encode())
        txn.rows += batch.num_rows

    def pre_commit(self, txn: Transaction) -> Committable:
        assert isinstance(txn, _FileTransaction)
        ctx = txn.ctx
        txn.close_writer()
        if txn.rows == 0:
            # Nothing to publish: like Spark's own file sink, an empty partition has no file.
            return Committable.for_context(self.name, ctx, {"final": None}, rows=0)
        if self.format == "parquet":
            _fsync_path(txn.path)
        pending = self._pending / f"{ctx.participant}.{self.ext}"
        try:
            os.link(txn.path, pending)
        except FileExistsError:
            raise StateError(
                f"files backend: participant {ctx.participant} is already prepared at {pending};"
                " a decided epoch may still hold it - let recovery finish first",
                sink_id=ctx.sink_id, epoch=ctx.epoch, participant=ctx.participant) from None
        os.unlink(txn.path)
        _fsync_path(self._pending, directory=True)
        size = pending.stat().st_size
        return Committable.for_context(
            self.name, ctx,
            {"pending": pending.name, "final": final_name(ctx.epoch, ctx.partition, self.ext),
             "bytes": size},
            rows=txn.rows)

    def finish_in_task(self, txn: Transaction, guarantee: DeliveryGuarantee) -> Committable:
        """Publish the file from the task: in-progress straight to its final name."""
        assert isinstance(txn, _FileTransaction)
        ctx = txn.ctx
        durable = guarantee is not DeliveryGuarantee.NONE
        txn.close_writer(fsync=durable)
        if txn.rows == 0:
            return Committable.for_context(self.name, ctx, {"final": None}, rows=0)
        if durable and self.format == "parquet":
            _fsync_path(txn.path)
        final = self.base / direct_name(ctx.epoch, ctx.partition, ctx.attempt, self.ext)
        os.link(txn.path, final)
        os.unlink(txn.path)
        if durable:
            _fsync_path(self.base, directory=True)
        return Committable.for_context(self.name, ctx, {"final": final.name, "direct": True},
                                       rows=txn.rows)

    def discard(self, txn: Transaction) -> None:
        assert isinstance(txn, _FileTransaction)
        txn.group = []  # nothing of a discarded participant is worth writing
        with contextlib.suppress(Exception):
            txn.wait_encoding()
        with contextlib.suppress(Exception):
            txn.close_writer()
        with contextlib.suppress(FileNotFoundError):
            txn.path.unlink()

    # -- the native data path: Spark's own Parquet writer -------------------------------

    def native_staging(self, ctx: TransactionContext) -> tuple[str, str]:
        self._staging.mkdir(parents=True, exist_ok=True)
        dirname = f"{ctx.participant}.{uuid.uuid4().hex[:12]}"
        # A file:// URI: a plain path would name the cluster's default file system
        # (HDFS, say) for Spark, where this backend's directory is local or mounted.
        return f"file://{self._staging / dirname}", dirname

    def discard_staging(self, ctx: TransactionContext, dirname: str, *,
                        still_ours: Callable[[], bool] | None = None) -> None:
        # Only this write's own directory (its job's name): nothing another run staged.
        self._safe(dirname, ctx.participant)
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self._staging / dirname)

    def native_write_options(self) -> dict[str, str]:
        opts = {"compression": self.compression}
        if self.dictionary == "none":
            opts["parquet.enable.dictionary"] = "false"
        return opts

    def committable_for_directory(self, ctx: TransactionContext, dirname: str) -> Committable:
        """Make the staged files durable (each file, the staging directories) and record
        their names, sizes and final names: what the commit checks before linking."""
        self._safe(dirname, ctx.participant)
        staged = self._staging / dirname
        try:
            files = self._staged_files(ctx.epoch, staged, strict=True)
            for f in files:
                _fsync_path(staged / f["name"])
            _fsync_path(staged, directory=True)
            _fsync_path(self._staging, directory=True)
        except FileNotFoundError as exc:
            raise StateError(
                f"files backend: {ctx.describe()}: the files Spark staged in {staged} were "
                f"deleted before they were recorded ({exc.filename}): another run of this "
                "sink took over and cleaned up this run's unrecorded files; nothing of "
                "them is committed. Two runs of one query must never write at once",
                sink_id=ctx.sink_id, epoch=ctx.epoch, participant=ctx.participant) from None
        for f in files:  # each: tasks on other hosts may have written as other users
            self._check_linkable(ctx, staged / f["name"])
        return self._staged_committable(ctx, dirname, files)

    def _check_linkable(self, ctx: TransactionContext, staged: Path) -> None:
        """The commit publishes a staged file by linking it to its final name: find out
        now, before the epoch is decided, whether this process may (a decided epoch
        whose files cannot be linked could never commit). Asked of every file: one
        that may be linked says nothing of the others."""
        probe = self.base / f".txsink-link-{uuid.uuid4().hex[:12]}"
        try:
            os.link(staged, probe)
        except OSError as exc:
            why = {errno.EXDEV: f"{self._staging} is on another mount than {self.base}",
                   errno.EPERM: "the executors that wrote them run as another user, and "
                                "the kernel's fs.protected_hardlinks lets only a file's "
                                "owner link it",
                   errno.EACCES: f"{self.base} is not writable by the driver"}.get(
                exc.errno or 0, exc.strerror or str(exc))
            raise StateError(
                f"files backend: {ctx.describe()}: the driver cannot link the files Spark's "
                f"executors staged in {staged.parent} to their final names in {self.base} "
                f"({why}), so this epoch could never be committed; nothing of it was "
                "decided and its staged files are deleted. Run the executors as the "
                "driver's user (or the driver as root), keep the whole path on one file "
                "system, or write this target with txsink's own writer (format jsonl)",
                sink_id=ctx.sink_id, epoch=ctx.epoch, participant=ctx.participant) from None
        with contextlib.suppress(FileNotFoundError):
            probe.unlink()

    def _staged_committable(self, ctx: TransactionContext, dirname: str,
                            files: Sequence[Mapping[str, Any]]) -> Committable:
        return Committable.for_context(
            self.name, ctx, {"staged": dirname, "files": [dict(f) for f in files],
                             "final": files[0]["final"] if files else None},
            rows=sum(int(f["rows"]) for f in files))

    def _staged_files(self, epoch: int, staged: Path, *, strict: bool
                      ) -> list[dict[str, Any]]:
        """The Parquet files Spark wrote into ``staged`` (its ``_SUCCESS``, ``.crc`` and
        ``_temporary`` are not data), in name order, each with its final name: the
        ``n``-th data file becomes ``part-<epoch>-<n>.parquet``, so listing the same
        directory again (recovery) gives the same names. Files without rows (Spark
        writes one for an empty epoch) are not published. ``strict``: a file whose
        footer cannot be read is an error (at prepare); otherwise it is listed with
        unknown rows (the orphan scan only deletes it)."""
        import pyarrow.parquet as pq

        try:
            names = sorted(n for n in os.listdir(staged)
                           if n.endswith(".parquet") and not n.startswith(("_", ".")))
        except FileNotFoundError:
            if strict:
                raise
            return []
        out: list[dict[str, Any]] = []
        for n, name in enumerate(names):
            path = staged / name
            try:
                rows = pq.ParquetFile(path).metadata.num_rows
            except FileNotFoundError:
                if strict:
                    raise
                continue
            except Exception as exc:
                if strict:
                    raise StateError(f"files backend: {path}, written by Spark, is not a "
                                     f"readable Parquet file ({exc})") from exc
                rows = -1
            if rows == 0:
                continue
            out.append({"name": name, "size": path.stat().st_size, "rows": max(rows, 0),
                        "final": final_name(epoch, n, self.ext)})
        return out

    def _safe(self, value: object, participant: str) -> str:
        # Committables come back from state files: never let one name a path outside.
        if not isinstance(value, str) or not _SAFE_NAME.match(value) or ".." in value:
            raise StateError(f"files backend: committable of {participant} names an "
                             f"unsafe file {value!r}", participant=participant)
        return value

    def _staged(self, c: Committable) -> tuple[str, list[tuple[str, int, str]]]:
        """The staging directory of a native committable and its (staged, size, final)
        file paths, every name checked."""
        staged = os.path.join(self._staging, self._safe(c.payload["staged"], c.participant))
        files = [(os.path.join(staged, self._safe(f["name"], c.participant)), int(f["size"]),
                  os.path.join(self.base, self._safe(f["final"], c.participant)))
                 for f in c.payload.get("files") or []]
        return staged, files

    def _publish_staged(self, c: Committable) -> tuple[CommitOutcome, list[str], str | None]:
        """Link each staged file of ``c`` to its final name; the staged names to drop.

        Every file is checked before the first link: there and whole (its recorded
        size), or already under its final name (a replayed commit), and no final name
        taken by other content; so a participant is published whole or not at all.
        """
        staged, files = self._staged(c)
        todo: list[tuple[str, str]] = []
        for src, size, dst in files:
            try:
                st = os.stat(src)
            except FileNotFoundError:
                if os.path.isfile(dst) and os.stat(dst).st_size == size:
                    continue  # published by an earlier attempt of this commit
                raise ParticipantLostError(
                    f"files backend: {c.describe()}: staged file {src} is gone and {dst} "
                    "does not hold it; it was aborted or deleted outside txsink",
                    sink_id=c.sink_id, epoch=c.epoch, participant=c.participant) from None
            if st.st_size != size:
                raise ParticipantLostError(
                    f"files backend: {c.describe()}: staged file {src} has {st.st_size} "
                    f"bytes, {size} were prepared; it was changed outside txsink",
                    sink_id=c.sink_id, epoch=c.epoch, participant=c.participant)
            if os.path.exists(dst) and not os.path.samefile(src, dst):
                raise FatalCommitError(
                    f"files backend: {c.describe()}: {dst} already exists with other "
                    "content; refusing to overwrite committed output",
                    sink_id=c.sink_id, epoch=c.epoch, participant=c.participant)
            todo.append((src, dst))
        faults = FaultInjector.from_env()
        for i, (src, dst) in enumerate(todo):
            with contextlib.suppress(FileExistsError):  # the same file (checked above)
                os.link(src, dst)
            if i == 0:
                faults.hit(NATIVE_MID_PUBLISH, c.epoch)
        outcome = CommitOutcome.COMMITTED if todo else CommitOutcome.ALREADY_COMMITTED
        return outcome, [src for src, _ in todo], staged if os.path.isdir(staged) else None

    # -- driver side --------------------------------------------------------------------

    def _names(self, c: Committable) -> tuple[str, str] | None:
        """The pending and final file names of ``c`` (None: an empty participant)."""
        final = c.payload.get("final")
        if final is None:
            return None
        pending = c.payload.get("pending")
        # Committables come back from state files: never let one name a path outside.
        for value in (pending, final):
            if not isinstance(value, str) or not _SAFE_NAME.match(value) or ".." in value:
                raise StateError(f"files backend: committable of {c.participant} names an "
                                 f"unsafe file {value!r}", participant=c.participant)
        assert isinstance(pending, str)
        return pending, final

    def _paths(self, c: Committable) -> tuple[Path, Path] | None:
        names = self._names(c)
        return None if names is None else (self._pending / names[0], self.base / names[1])

    def commit(self, committable: Committable) -> CommitOutcome:
        result = self.commit_all([committable])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def commit_all(
        self, committables: Sequence[Committable]
    ) -> list[CommitOutcome | Exception]:
        """Publish every pending file in four steps, whatever the number of participants:
        link each to its final name, fsync the output directory once, unlink the
        pending names, fsync the pending directory once.

        The final names are durable before any pending name goes, so a crash at any
        point leaves each file under its pending name, its final name, or both (one
        inode); committing again links what is missing and drops the pending name.
        Paths are plain strings here: per file, pathlib cost more than the syscalls.
        """
        pending_dir, base = os.fspath(self._pending), os.fspath(self.base)
        results: list[CommitOutcome | Exception] = []
        # (index in results, pending or staged paths, staging directory to drop)
        linked: list[tuple[int, list[str], str | None]] = []
        published: set[int] = set()  # epochs with a file now under its final name
        for c in committables:
            try:
                if "staged" in c.payload:
                    outcome, drop, staged = self._publish_staged(c)
                else:
                    outcome, pending = self._link(c, pending_dir, base)
                    drop, staged = ([] if pending is None else [pending]), None
            except Exception as exc:  # handed back to the coordinator, which retries
                results.append(exc)
                continue
            if drop or staged is not None:
                linked.append((len(results), drop, staged))
            if c.payload.get("final") is not None:
                published.add(c.epoch)
            results.append(outcome)
        if not linked:
            return results
        try:
            _fsync_path(self.base, directory=True)
            # The epoch markers are durable before any pending name goes: an epoch
            # with pending names and no marker is checked through those names.
            if self._mark_epochs(published):
                _fsync_path(self._epochs, directory=True)
        except (OSError, StateError) as exc:  # not durable yet: keep the pending names
            for i, _, _ in linked:
                results[i] = exc
            return results
        unlinked: list[int] = []
        pending_any = staged_any = False
        for i, drop, staged in linked:
            try:
                for path in drop:
                    with contextlib.suppress(FileNotFoundError):  # an earlier attempt did it
                        os.unlink(path)
                if staged is not None:  # what Spark left beside its files (_SUCCESS, .crc)
                    shutil.rmtree(staged)
                    staged_any = True
                else:
                    pending_any = True
            except OSError as exc:
                results[i] = exc
                continue
            unlinked.append(i)
        if unlinked:
            try:
                if pending_any:
                    _fsync_path(self._pending, directory=True)
                if staged_any:
                    _fsync_path(self._staging, directory=True)
            except OSError as exc:
                for i in unlinked:
                    results[i] = exc
        return results

    def _link(self, committable: Committable, pending_dir: str,
              base: str) -> tuple[CommitOutcome, str | None]:
        """Give one pending file its final name; its pending path when that must go."""
        names = self._names(committable)
        if names is None:
            return CommitOutcome.COMMITTED, None
        pending, final = os.path.join(pending_dir, names[0]), os.path.join(base, names[1])
        try:
            os.link(pending, final)
        except FileNotFoundError:
            if (os.path.isfile(final)
                    and os.stat(final).st_size == committable.payload.get("bytes")):
                return CommitOutcome.ALREADY_COMMITTED, None
            raise ParticipantLostError(
                f"files backend: {committable.describe()}: pending file {names[0]} is gone "
                f"and {final} does not hold it; it was aborted or deleted outside txsink",
                sink_id=committable.sink_id, epoch=committable.epoch,
                participant=committable.participant) from None
        except FileExistsError:
            if not os.path.samefile(pending, final):
                raise FatalCommitError(
                    f"files backend: {committable.describe()}: {final} already exists with "
                    "other content; refusing to overwrite committed output",
                    sink_id=committable.sink_id, epoch=committable.epoch,
                    participant=committable.participant) from None
        return CommitOutcome.COMMITTED, pending

    def is_committed(self, committable: Committable) -> bool | None:
        if "staged" in committable.payload:
            # Many files: a commit stopped mid-way published some of them, and whether
            # the participant's rows are visible is then neither yes nor no. Every file
            # under its final name is committed, whether or not the staging directory
            # was dropped yet.
            published = [self._published(src, size, dst)
                         for src, size, dst in self._staged(committable)[1]]
            if all(published):
                return True
            return False if not any(published) else None
        paths = self._paths(committable)
        return paths is None or (paths[1].exists() and not paths[0].exists())

    @staticmethod
    def _published(src: str, size: int, dst: str) -> bool:
        """Whether staged file ``src`` (``size`` bytes when prepared) is under its final
        name ``dst``: the same file, or (its staging name dropped) one of its size."""
        try:
            st = os.stat(dst)
        except FileNotFoundError:
            return False
        try:
            return os.path.samefile(src, dst)
        except FileNotFoundError:
            return st.st_size == size

    def take_back(self, committable: Committable) -> bool:
        """A native participant published in part (a commit stopped between its files'
        links) is unpublished: each final name that is still a link to one of its staged
        files is removed, made durable, then the staging directory goes. A final name
        whose staged file is gone cannot be told from other output and stays (False)."""
        if "staged" not in committable.payload:
            return super().take_back(committable)
        undone = True
        removed = False
        for src, _, dst in self._staged(committable)[1]:
            try:
                if os.path.samefile(src, dst):
                    os.unlink(dst)
                    removed = True
            except FileNotFoundError:
                undone = undone and not os.path.exists(dst)
        if removed:
            _fsync_path(self.base, directory=True)
        self.abort(committable)
        return undone

    def abort(self, committable: Committable) -> None:
        if "staged" in committable.payload:
            # Only the staging names go: a file already linked to its final name (a
            # decided epoch) keeps that name.
            staged, _ = self._staged(committable)
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(staged)
            return
        paths = self._paths(committable)
        if paths is not None:
            pending, final = paths
            with contextlib.suppress(FileNotFoundError):
                if not (final.exists() and os.path.samefile(pending, final)):
                    pending.unlink()
        for leftover in self._inprogress.glob(f"{committable.participant}.*"):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()

    def list_prepared(self, sink_id: str) -> Iterable[Committable]:
        out: list[Committable] = []
        for staged_ctx, dirname in self._staged_dirs(sink_id):
            out.append(self._staged_committable(
                staged_ctx, dirname, self._staged_files(staged_ctx.epoch,
                                                        self._staging / dirname,
                                                        strict=False)))
        if not self._pending.is_dir():
            return out
        for path in sorted(self._pending.iterdir()):
            ctx = parse_participant(path.name.rsplit(".", 1)[0])
            if ctx is None or ctx.sink_id != sink_id:
                continue
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue
            out.append(Committable.for_context(
                self.name, ctx,
                {"pending": path.name, "final": final_name(ctx.epoch, ctx.partition, self.ext),
                 "bytes": size}))
        return out

    def abort_orphans(self, sink_id: str, protected: Collection[str],
                      up_to_epoch: int | None = None) -> list[Committable]:
        aborted = super().abort_orphans(sink_id, protected, up_to_epoch)
        if self._inprogress.is_dir():
            for path in self._inprogress.iterdir():
                ctx = parse_participant(path.name.split(".", 1)[0])
                if ctx is None or ctx.sink_id != sink_id:
                    continue
                if up_to_epoch is not None and ctx.epoch > up_to_epoch:
                    continue
                log.info("sink=%s epoch=%d partition=%d participant=%s: deleting in-progress "
                         "file of a dead writer", sink_id, ctx.epoch, ctx.partition,
                         ctx.participant)
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        return aborted

    def _staged_dirs(self, sink_id: str) -> list[tuple[TransactionContext, str]]:
        """The native path's staging directories of ``sink_id``, with their participant."""
        try:
            names = sorted(os.listdir(self._staging))
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            ctx = parse_participant(name.rsplit(".", 1)[0])
            if ctx is not None and ctx.sink_id == sink_id:
                out.append((ctx, name))
        return out

    def _staged_epoch_published(self, sink_id: str, epoch: int) -> bool:
        """A staged participant of ``epoch`` has a file under its final name (a commit
        stopped between the final names' sync and the epoch's marker)."""
        # Asked before every decision (the epoch's own staged files are there then): the
        # final names follow from the listing alone, no footer is read.
        for ctx, dirname in self._staged_dirs(sink_id):
            if ctx.epoch != epoch:
                continue
            try:
                count = sum(1 for n in os.listdir(self._staging / dirname)
                            if n.endswith(".parquet") and not n.startswith(("_", ".")))
            except FileNotFoundError:
                continue
            if any(os.path.exists(os.path.join(self.base, final_name(epoch, n, self.ext)))
                   for n in range(count)):
                return True
        return False

    def leftovers(self) -> list[Path]:
        """In-progress, pending and staged files still present (tests, ``txsink
        status``)."""
        return [p for d in (self._inprogress, self._pending, self._staging) if d.is_dir()
                for p in sorted(d.iterdir())]
