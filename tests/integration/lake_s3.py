"""Delta and Iceberg tables on the session's S3 server: their options, and what a reader
of the table (delta-rs, pyiceberg) and a listing of the bucket see."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
from txsink.lakehouse import TableBackend
from txsink.plugins import get_plugins
from txsink_delta.backend import DeltaBackend
from txsink_iceberg.backend import IcebergBackend

from tests.integration.conftest import S3Server
from tests.timeouts import scaled

ROOT = Path(__file__).resolve().parents[2]


def access(s3: S3Server) -> dict[str, str]:
    """Endpoint and keys, as the S3 backend takes them."""
    opts = {"endpoint_url": s3.endpoint_url, "region": "us-east-1"}
    if s3.access_key is not None and s3.secret_key is not None:
        opts.update(access_key_id=s3.access_key, secret_access_key=s3.secret_key)
    return opts


def table_options(kind: str, s3: S3Server, tmp_path: Path) -> dict[str, str]:
    """A fresh table under its own prefix (the Iceberg catalog: SQLite in ``tmp_path``)."""
    run = f"lake-{uuid.uuid4().hex[:10]}"
    if kind == "delta":
        return {"path": f"s3://{s3.bucket}/{run}/table", **access(s3)}
    return {"warehouse": f"s3://{s3.bucket}/{run}/warehouse", "table": "db.orders",
            "catalog_uri": f"sqlite:///{tmp_path / 'catalog.db'}", **access(s3)}


def read_ids(backend: TableBackend) -> list[int]:
    """The ``id`` column as a reader of the table sees it (whole epochs only)."""
    if isinstance(backend, DeltaBackend):
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            table = DeltaTable(backend.path, storage_options=backend.storage_options())
        except TableNotFoundError:
            return []
        return [int(i) for i in table.to_pyarrow_table(columns=["id"]).column("id").to_pylist()]
    assert isinstance(backend, IcebergBackend)
    fresh = IcebergBackend(backend.table, backend.warehouse, backend.catalog_uri,
                           s3=backend.s3)
    loaded = fresh.load_table()
    if loaded is None:
        return []
    return [int(i) for i in loaded.scan(selected_fields=("id",)).to_arrow().column(
        "id").to_pylist()]


def named_files(backend: TableBackend) -> set[str]:
    """Data files the table names, relative to the data root."""
    root = backend.uri("")
    if isinstance(backend, DeltaBackend):
        from deltalake import DeltaTable

        table = DeltaTable(backend.path, storage_options=backend.storage_options())
        return {u.removeprefix(root) for u in table.file_uris()}
    assert isinstance(backend, IcebergBackend)
    loaded = IcebergBackend(backend.table, backend.warehouse, backend.catalog_uri,
                            s3=backend.s3).load_table()
    if loaded is None or loaded.current_snapshot() is None:
        return set()
    return {task.file.file_path.removeprefix(root) for task in loaded.scan().plan_files()}


def stored_files(backend: TableBackend) -> set[str]:
    """Every object under the data root, relative to it (a listing of the bucket)."""
    fs, root = backend._fs()
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    return {i.path[len(root) + 1:] for i in infos if i.type == pafs.FileType.File}


def orphans(backend: TableBackend) -> list[str]:
    """Parquet files under txsink's data folder that the table does not name."""
    named = named_files(backend)
    return sorted(p for p in stored_files(backend)
                  if p.startswith("txsink/") and p.endswith(".parquet") and p not in named)


# -- a pipeline killed after its decision, restarted ---------------------------------------

CRASH_EPOCHS, CRASH_PARTITIONS = 2, 2


def _crash_run(spec: dict[str, Any], tmp_path: Path, run: int, faults: str = ""
               ) -> subprocess.CompletedProcess[str]:
    spec_file = tmp_path / f"spec-{run}.json"
    spec_file.write_text(json.dumps({**spec, "run": run}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXSINK_FAULTS")}
    if faults:
        env["TXSINK_FAULTS"] = faults
    return subprocess.run([sys.executable, "-m", "tests.integration.lake_s3_crash",
                           str(spec_file)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=scaled(120), check=False)


def killed_after_decide_then_restarted(kind: str, s3: S3Server, tmp_path: Path) -> None:
    """The coordinator is SIGKILLed once epoch 1's decision is durable and before any of
    it is committed; the restarted run commits it from the decision. The table then holds
    every row once (count and checksum), one entry per epoch, and no file under txsink's
    folder that the table does not name (the killed run's twins and the replay's files
    are gone)."""
    from txsink.faults import AFTER_DECIDE

    from tests.integration.lake_s3_crash import rows

    options = table_options(kind, s3, tmp_path)
    spec = {"backend": kind, "options": options, "sink_id": f"crash-{kind}",
            "state": str(tmp_path / "state"), "epochs": CRASH_EPOCHS,
            "partitions": CRASH_PARTITIONS}
    crashed = _crash_run(spec, tmp_path, 0, faults=f"{AFTER_DECIDE}@1:kill")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    backend = get_plugins().create_backend(kind, options)
    assert isinstance(backend, TableBackend)
    assert not backend.holds_epoch(spec["sink_id"], 1)  # decided, not committed
    assert orphans(backend)  # epoch 1's files, named by no table entry yet
    restarted = _crash_run(spec, tmp_path, 1)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    want = sorted(i for e in range(CRASH_EPOCHS) for p in range(CRASH_PARTITIONS)
                  for i in rows(e, p))
    got = sorted(read_ids(backend))
    assert len(got) == len(want)
    assert hashlib.sha256(repr(got).encode()).digest() == hashlib.sha256(
        repr(want).encode()).digest()
    for e in range(CRASH_EPOCHS):
        assert backend.holds_epoch(spec["sink_id"], e)
    assert orphans(backend) == []
    if isinstance(backend, IcebergBackend):
        loaded = backend.load_table()
        assert loaded is not None
        assert sum(1 for s in loaded.snapshots()
                   if (s.summary or {}).get("txsink.sink") == spec["sink_id"]) == CRASH_EPOCHS
    else:
        assert isinstance(backend, DeltaBackend)
        from deltalake import DeltaTable

        history = DeltaTable(backend.path, storage_options=backend.storage_options()).history()
        assert sum(1 for h in history if h.get("txsink.sink") == spec["sink_id"]) == (
            CRASH_EPOCHS)
