"""Delta and Iceberg tables in the tests: one copy of what the table tests share.

* a target's options: on local disk, or under a fresh prefix of an S3 server;
* the backend another process would build (:func:`fresh`);
* what a reader of the table sees, through the format's own library (delta-rs,
  pyiceberg) in a handle of its own, never the backend under test: its rows, the
  files it names, the entries txsink marked;
* what is stored under the table besides, and so the orphans: files no version names.
"""

from __future__ import annotations

import json
import pickle
import threading
import urllib.parse
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from txsink.backend import Backend, CommitOutcome
from txsink.coordinator import Coordinator
from txsink.lakehouse import EPOCH_KEY, SINK_KEY, TableBackend
from txsink.model import Committable, TransactionContext
from txsink.plugins import build_plugins, get_plugins
from txsink.state import DirectoryStateStore
from txsink.testing.conformance import BackendConformance
from txsink.writer import write_participant
from txsink_delta.backend import DeltaBackend
from txsink_iceberg.backend import IcebergBackend

if TYPE_CHECKING:
    from tests.integration.conftest import S3Server

KINDS = ("delta", "iceberg")


# -- options and backends -------------------------------------------------------------------


def local_options(kind: str, where: Path, table: str = "db.t") -> dict[str, str]:
    """A table under ``where``: Delta's at ``where/delta``, Iceberg's ``table`` in the
    warehouse ``where/wh`` (its default SQLite catalog there)."""
    if kind == "delta":
        return {"path": str(where / "delta")}
    return {"warehouse": str(where / "wh"), "table": table}


def access(s3: S3Server) -> dict[str, str]:
    """Endpoint and keys, as the S3 backend takes them."""
    opts = {"endpoint_url": s3.endpoint_url, "region": "us-east-1"}
    if s3.access_key is not None and s3.secret_key is not None:
        opts.update(access_key_id=s3.access_key, secret_access_key=s3.secret_key)
    return opts


def s3_options(kind: str, s3: S3Server, tmp_path: Path, *, name: str | None = None,
               table: str = "db.t") -> dict[str, str]:
    """A fresh table under a prefix of its own in the server's bucket (its last part
    ``name``; by default ``table`` for Delta, ``warehouse`` for Iceberg, whose SQL
    catalog is a SQLite file of its own in ``tmp_path``)."""
    run = f"lake-{uuid.uuid4().hex[:10]}"
    if kind == "delta":
        return {"path": f"s3://{s3.bucket}/{run}/{name or 'table'}", **access(s3)}
    return {"warehouse": f"s3://{s3.bucket}/{run}/{name or 'warehouse'}", "table": table,
            "catalog_uri": f"sqlite:///{tmp_path / f'catalog-{run}.db'}", **access(s3)}


def make(kind: str, options: Mapping[str, str]) -> TableBackend:
    """The backend, built from its options as a run builds it."""
    backend = get_plugins().create_backend(kind, options)
    assert isinstance(backend, TableBackend)
    return backend


def fresh(backend: TableBackend) -> TableBackend:
    """The same backend as a new process gets it (pickled, as executors get it): no
    cached catalog, connection or filesystem."""
    copy = pickle.loads(pickle.dumps(backend))
    assert isinstance(copy, type(backend))
    return copy


class LakeConformance(BackendConformance):
    """The conformance kit on a table, read back as a reader of the table reads it; a
    subclass names the backend and gives the ``backend_options`` fixture."""

    #: A partition costs a fixed ~90 MiB whatever its size: the 16 MiB row group held
    #: until it is encoded, its encoded pages, and the writer's code and threads
    #: (measured on local disk: 2 MiB of Arrow data +32 MiB, 20 MiB +84 MiB, 48 MiB
    #: +90 MiB, 160 MiB +91 MiB). The partition is larger than the bound, so a writer
    #: that kept it would fail; the bound leaves room above the fixed cost.
    large_partition_bytes = 160 * 1024 * 1024
    memory_bound_bytes = 128 * 1024 * 1024

    def read_ids(self, backend: Backend, sink_id: str) -> list[int]:
        assert isinstance(backend, TableBackend)
        return table_ids(backend)


class LakeS3Conformance(LakeConformance):
    """The conformance kit on a table under a fresh prefix of the session's S3 server."""

    #: Through pyarrow's S3 stream the fixed cost is about the same, ~80-100 MiB (the
    #: row group, its encoder, the parts in flight; measured: 24 MiB of Arrow data
    #: +82 MiB, 96 MiB +99 MiB, 240 MiB +82 MiB), so the same size and bound hold.

    @pytest.fixture
    def backend_options(self, s3_server: S3Server, tmp_path: Path) -> Mapping[str, str]:
        return s3_options(self.backend_name, s3_server, tmp_path, table="db.orders")


# -- writing epochs -------------------------------------------------------------------------------


def prepare(backend: Backend, epoch: int, sink_id: str = "s", rows: int = 10) -> Committable:
    """One participant of ``epoch`` (partition 0) with the ids ``epoch * rows`` up to
    ``(epoch + 1) * rows``."""
    batch = pa.record_batch({"id": pa.array(range(epoch * rows, (epoch + 1) * rows),
                                            pa.int64())})
    return write_participant(backend, TransactionContext(sink_id, epoch, 0, 0), [batch])


def coordinator(backend: Backend, state: Path, sink_id: str = "s") -> Coordinator:
    """A started coordinator of ``sink_id`` with its state under ``state``."""
    coord = Coordinator(backend, DirectoryStateStore(state), sink_id, plugins=build_plugins())
    coord.start()
    return coord


def commit_racing(backend: TableBackend, committables: Sequence[Committable]
                  ) -> list[list[CommitOutcome | Exception]]:
    """Two committers of one epoch (copies of ``backend``, as two processes) commit
    ``committables`` at once: both read the table before either appends (a barrier holds
    each at its first read of epoch 0). What each ``commit_all`` answered."""
    barrier = threading.Barrier(2, timeout=60)

    def racer() -> TableBackend:
        copy = fresh(backend)
        read, reads = copy.table_epoch, [0]

        def table_epoch(sink_id: str, epoch: int, table: Any = None) -> dict[str, str] | None:
            found = read(sink_id, epoch, table)
            reads[0] += 1
            if reads[0] == 1 and epoch == 0:
                barrier.wait()
            return found

        copy.table_epoch = table_epoch  # type: ignore[method-assign]
        return copy

    racers = [racer() for _ in range(2)]
    results: list[Any] = [None, None]

    def run(i: int) -> None:
        results[i] = racers[i].commit_all(committables)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


# -- what a reader of the table sees -----------------------------------------------------------


def delta_table(backend: DeltaBackend, version: int | None = None) -> Any:
    """delta-rs's handle of the table (at ``version``): on local disk at the URL the
    backend gives delta-rs (spaces and non-ASCII names escaped), on S3 at the location
    as a user writes it, with the backend's storage options."""
    from deltalake import DeltaTable

    where = backend.path if backend.on_s3() else backend.table_uri()
    return DeltaTable(where, version=version, storage_options=backend.storage_options())


def _loaded(backend: TableBackend) -> Any:
    """The table as a reader loads it now (None when there is none)."""
    if isinstance(backend, DeltaBackend):
        from deltalake.exceptions import TableNotFoundError

        try:
            return delta_table(backend)
        except TableNotFoundError:
            return None
    reader = fresh(backend)
    try:
        return reader.load_table()
    finally:
        reader.close()


def table_rows(backend: TableBackend, columns: Sequence[str] | None = None, *,
               version: int | None = None) -> list[dict[str, Any]]:
    """Every row (of ``columns``) a reader of the table sees; ``version``: a Delta log
    version or an Iceberg snapshot id to read instead of the latest. No table: none."""
    if isinstance(backend, DeltaBackend):
        if version is not None:
            table = delta_table(backend, version)
        elif (table := _loaded(backend)) is None:
            return []
        found = table.to_pyarrow_table(columns=list(columns) if columns else None)
        return list(found.to_pylist())
    assert isinstance(backend, IcebergBackend)
    loaded = _loaded(backend)
    if loaded is None:
        return []
    scan = loaded.scan(snapshot_id=version, selected_fields=tuple(columns or ("*",)))
    return list(scan.to_arrow().to_pylist())


def table_ids(backend: TableBackend) -> list[int]:
    """The ``id`` column a reader of the table sees, sorted (duplicates kept)."""
    return sorted(int(r["id"]) for r in table_rows(backend, ["id"]))


def marked(backend: TableBackend, sink_id: str) -> list[tuple[int, int]]:
    """(log version / snapshot id, epoch) of each table entry carrying ``sink_id``'s
    marker, oldest first: every entry of the Delta log, every snapshot the Iceberg
    table's metadata keeps (on any branch)."""
    loaded = _loaded(backend)
    if loaded is None:
        return []
    if isinstance(backend, DeltaBackend):
        return sorted((int(e["version"]), int(e[EPOCH_KEY])) for e in loaded.history()
                      if e.get(SINK_KEY) == sink_id)
    return [(int(s.snapshot_id), int(s.summary[EPOCH_KEY])) for s in loaded.metadata.snapshots
            if s.summary is not None and s.summary.get(SINK_KEY) == sink_id]


def delta_log(path: Path) -> list[dict[str, Any]]:
    """The commit info of every entry of the Delta log at ``path`` (local), oldest
    first, as its files hold it."""
    out = []
    log = path / "_delta_log"
    for name in sorted(p.name for p in log.iterdir()) if log.exists() else []:
        if name.endswith(".json"):
            for line in (log / name).read_text().splitlines():
                action = json.loads(line)
                if "commitInfo" in action:
                    out.append(action["commitInfo"])
    return out


# -- what is stored under the table ------------------------------------------------------------


def named_files(backend: TableBackend, *, ever: bool = False) -> set[str]:
    """The data files the table's current version names, relative to the data root;
    ``ever``: those any version it keeps names (a compaction's replaced files too)."""
    root = backend.uri("")
    loaded = _loaded(backend)
    if loaded is None:
        return set()
    if isinstance(backend, DeltaBackend):
        if not ever:
            return {urllib.parse.unquote(u.removeprefix("file://")).removeprefix(root)
                    for u in loaded.file_uris()}
        fs, top = backend._fs()
        entries = fs.get_file_info(pafs.FileSelector(f"{top}/_delta_log", allow_not_found=True))
        named: set[str] = set()
        for info in entries:
            if not info.base_name.endswith(".json"):
                continue
            with fs.open_input_stream(info.path) as f:
                for line in f.read().decode().splitlines():
                    add = json.loads(line).get("add")
                    if add:
                        named.add(urllib.parse.unquote(add["path"]))
        return named
    snapshots = loaded.metadata.snapshots if ever else [loaded.current_snapshot()]
    return {task.file.file_path.removeprefix("file://").removeprefix(root)
            for s in snapshots if s is not None
            for task in loaded.scan(snapshot_id=s.snapshot_id).plan_files()}


def stored_files(backend: TableBackend) -> set[str]:
    """Every file under the data root, relative to it (a listing of the store)."""
    fs, root = backend._fs()
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    return {i.path[len(root) + 1:] for i in infos if i.type == pafs.FileType.File}


def orphans(backend: TableBackend, *, ever: bool = False) -> list[str]:
    """Parquet files under the data root (Delta's log aside) that the table's current
    version does not name; ``ever``: that no version it keeps names."""
    named = named_files(backend, ever=ever)
    return sorted(p for p in stored_files(backend) if p.endswith(".parquet")
                  and not p.startswith("_delta_log/") and p not in named)
