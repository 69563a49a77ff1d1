"""Chaos for the table formats (Delta Lake, Iceberg): their own faults, and what is
counted after recovery.

Faults the driver arms on a table backend (:func:`arm`), one per epoch at most:

* ``concurrent-append``: another writer appends rows to the table between our read of
  the table (the version the commit is based on) and our commit;
* ``concurrent-compact``: the same, with a compaction (Delta ``OPTIMIZE``; on Iceberg
  an overwrite of the whole table with its own rows, as a rewrite job commits) that
  replaces the files of earlier epochs;
* ``commit-unknown``: the log / catalog write takes effect, then the caller sees a
  timeout: the coordinator's retry must find its own marker and not add the files
  twice.

Checks after recovery: the rows a reader of the table sees (the other writer's rows,
key ``other``, left out), the data files under the table no committed version names
(orphans), and the log entries / snapshots carrying each epoch's marker.
"""

from __future__ import annotations

import collections
import copy
import json
import os
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

KINDS = ("concurrent-append", "concurrent-compact", "commit-unknown")
#: The key of the other writer's rows (ids below zero).
OTHER_KEY = "other"
SINK_KEY = "txsink.sink"
EPOCH_KEY = "txsink.epoch"


class CommitOutcomeUnknown(TimeoutError):
    """The injected timeout after a log / catalog write that took effect."""


def arm(backend: Any, faults: Mapping[int, str], note: Any, fired: set[str]) -> None:
    """Wrap ``backend``'s commit so that each fault of ``faults`` (epoch -> kind) fires
    once; ``note(what)`` records a fired fault, ``fired`` holds those of earlier runs."""
    if not faults:
        return
    refuse, append = backend.refuse_if_named, backend.append_epoch

    def due(epoch: int, kinds: tuple[str, ...]) -> str | None:
        kind = faults.get(epoch)
        if kind not in kinds or f"{kind}@{epoch}" in fired:
            return None
        fired.add(f"{kind}@{epoch}")
        return kind

    def refuse_if_named(table: Any, sink_id: str, epoch: int, participants: Any) -> None:
        refuse(table, sink_id, epoch, participants)
        kind = due(epoch, ("concurrent-append", "concurrent-compact"))
        if kind is not None:  # the commit is based on `table`: another writer goes first
            done = concurrent_commit(backend, compact=kind == "concurrent-compact")
            note(f"{kind}@{epoch}" if done == kind else f"{done}@{epoch}")

    def append_epoch(sink_id: str, epoch: int, participants: Any) -> None:
        append(sink_id, epoch, participants)
        if due(epoch, ("commit-unknown",)) is not None:
            note(f"commit-unknown@{epoch}")
            raise CommitOutcomeUnknown(f"epoch {epoch}: the log write timed out after it "
                                       "took effect (injected)")

    backend.refuse_if_named = refuse_if_named
    backend.append_epoch = append_epoch


def _other_rows(n: int, schema: pa.Schema) -> pa.Table:
    ids = list(range(-n, 0))
    cols: dict[str, Any] = {"id": pa.array(ids, pa.int64()),
                            "key": pa.array([OTHER_KEY] * n, pa.string())}
    if "value" in schema.names:
        cols["value"] = pa.array([0] * n, pa.int64())
    return pa.table(cols).select(schema.names).cast(schema)


def concurrent_commit(backend: Any, *, compact: bool) -> str:
    """Another writer commits to ``backend``'s table now, through its own client (a
    fresh table handle / catalog). Returns what it committed (a compaction with fewer
    than two files to rewrite appends instead)."""
    from txsink_delta.backend import DeltaBackend

    if isinstance(backend, DeltaBackend):
        from deltalake import DeltaTable, write_deltalake

        table = DeltaTable(backend.path)
        if compact and len(table.file_uris()) >= 2:
            table.optimize.compact()
            return "concurrent-compact"
        schema = pa.schema(table.schema().to_arrow())  # type: ignore[arg-type]
        write_deltalake(backend.path, _other_rows(10, schema), mode="append")
        return "concurrent-append"
    from txsink_iceberg.backend import IcebergBackend

    assert isinstance(backend, IcebergBackend)
    # Its own client: the same options (a REST catalog's too), no shared connection
    # (a copy: the armed backend's wrapped methods cannot be pickled).
    mine = copy.copy(backend)
    mine._catalog_cache = None
    other = mine._load()
    schema = other.schema().as_arrow()
    if compact and len(list(other.scan().plan_files())) >= 2:
        other.overwrite(other.scan().to_arrow().cast(schema))
        return "concurrent-compact"
    other.append(_other_rows(10, schema))
    return "concurrent-append"


# -- what a reader sees, and what is counted -----------------------------------------------


def _iceberg(options: Mapping[str, str]) -> Any:
    from txsink_iceberg.backend import IcebergBackend

    return IcebergBackend.from_options(options)


def live_files(backend: str, options: Mapping[str, str]) -> list[str]:
    """Absolute paths of the data files the table's current version names."""
    if backend == "delta":
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            table = DeltaTable(options["path"])
        except TableNotFoundError:
            return []
        return [urllib.parse.unquote(u.removeprefix("file://")) for u in table.file_uris()]
    table = _iceberg(options)._load()
    if table is None:
        return []
    return [t.file.file_path.removeprefix("file://") for t in table.scan().plan_files()]


def rows(backend: str, options: Mapping[str, str]) -> list[tuple[int, str]]:
    """(id, key) of every row a reader of the table sees, the other writer's left out."""
    import pyarrow.parquet as pq

    out: list[tuple[int, str]] = []
    for path in live_files(backend, options):
        t = pq.read_table(path, columns=["id", "key"])
        out += [(int(i), str(k)) for i, k in zip(t.column("id").to_pylist(),
                                                 t.column("key").to_pylist(), strict=True)
                if k != OTHER_KEY]
    return out


def epoch_of(path: str) -> int:
    """The epoch of a data file txsink wrote (``.../txsink/<sink>/e<epoch>/...``), -1
    for another writer's file (a compaction's)."""
    parts = path.split("/")
    for i, part in enumerate(parts[:-2]):
        if part == "txsink" and parts[i + 2][:1] == "e" and parts[i + 2][1:].isdigit():
            return int(parts[i + 2][1:])
    return -1


def epoch_rows(backend: str, options: Mapping[str, str]) -> list[tuple[int, int]]:
    """(epoch, id) of every row a reader sees (the group chaos checks epochs)."""
    import pyarrow.parquet as pq

    out: list[tuple[int, int]] = []
    for path in live_files(backend, options):
        epoch = epoch_of(path)
        out += [(epoch, int(i)) for i in pq.read_table(path, columns=["id"]).column(
            "id").to_pylist()]
    return out


def _delta_named(path: Path) -> set[str]:
    """Every data file any version of the Delta log added (absolute paths)."""
    named: set[str] = set()
    log = path / "_delta_log"
    for name in sorted(os.listdir(log)) if log.exists() else []:
        if not name.endswith(".json"):
            continue
        for line in (log / name).read_text().splitlines():
            add = json.loads(line).get("add")
            if add:
                named.add(str(path / urllib.parse.unquote(add["path"])))
    return named


def orphan_files(backend: str, options: Mapping[str, str]) -> list[str]:
    """Parquet files under the table's data folder that no committed version (snapshot)
    of the table names: what neither an abort nor a commit accounted for."""
    if backend == "delta":
        root = Path(options["path"])
        named = _delta_named(root)
        files = {str(p) for p in root.rglob("*.parquet") if "_delta_log" not in p.parts}
    else:
        b = _iceberg(options)
        table = b._load()
        root = Path(b.data_root())
        files = {str(p) for p in root.rglob("*.parquet")}
        named = set()
        for snap in (table.metadata.snapshots if table is not None else []):
            named |= {t.file.file_path.removeprefix("file://")
                      for t in table.scan(snapshot_id=snap.snapshot_id).plan_files()}
    return sorted(files - named)


def entries(backend: str, options: Mapping[str, str], sink_id: str) -> collections.Counter[int]:
    """Per epoch of ``sink_id``: how many log entries (Delta) / snapshots (Iceberg, every
    one the table's metadata keeps) carry its marker."""
    found: collections.Counter[int] = collections.Counter()
    if backend == "delta":
        log = Path(options["path"]) / "_delta_log"
        for name in sorted(os.listdir(log)) if log.exists() else []:
            if name.endswith(".json"):
                for line in (log / name).read_text().splitlines():
                    info = json.loads(line).get("commitInfo") or {}
                    if info.get(SINK_KEY) == sink_id:
                        found[int(info[EPOCH_KEY])] += 1
        return found
    table = _iceberg(options)._load()
    for snap in (table.metadata.snapshots if table is not None else []):
        summary = snap.summary
        if summary is not None and summary.get(SINK_KEY) == sink_id:
            found[int(summary[EPOCH_KEY])] += 1
    return found
