"""Reading a sink's objects up to a group's consistent cut, by its epoch manifests.

Each committed epoch has a manifest (``_txsink/manifests/epoch-<N>.json``) listing its
objects; its data keys are under ``epoch=<N>/``. :func:`epochs_up_to` gives the objects
of the epochs in ``(after, cut]``; :func:`read_up_to_cut` reads them as one Arrow table
(Parquet, JSON Lines or CSV, as the sink wrote). Epochs older than the retained
manifests (``manifest_retention_epochs``) are found by listing their ``epoch=<N>/``
folders: only completed uploads are listed, so only committed data.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from txsink.errors import TxsinkError

from txsink_s3 import keys
from txsink_s3.backend import S3Backend

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class EpochObjects:
    epoch: int
    #: Object keys of the epoch's data, in partition order.
    keys: tuple[str, ...]
    #: From the epoch's manifest (True), or by listing its folder (manifest pruned).
    from_manifest: bool = True


def epochs_up_to(options: Mapping[str, str], sink_id: str, cut: int, *,
                 after: int = -1) -> list[EpochObjects]:
    """The objects of ``sink_id``'s epochs in ``(after, cut]``, oldest first.

    ``options`` are the sink's (target's) options: bucket, prefix, endpoint and
    credentials. Resume with ``after=`` the last epoch read.
    """
    backend = S3Backend.from_options(options)
    try:
        client, bucket = backend.client, backend.bucket
        base = backend.base(sink_id)
        prefix = keys.manifests_prefix(base)
        found: list[EpochObjects] = []
        start = keys.manifest_key(base, after) if after >= 0 else prefix
        last = keys.manifest_key(base, cut)
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix, StartAfter=start)
        manifests: list[str] = []
        for page in pages:
            names = [str(o["Key"]) for o in page.get("Contents", []) or []]
            manifests += [n for n in names if n <= last]
            if names and names[-1] > last:
                break
        for key in manifests:
            doc = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
            if doc.get("sink_id") != sink_id:
                raise TxsinkError(f"s3 reader: manifest s3://{bucket}/{key} belongs to sink "
                                  f"{doc.get('sink_id')!r}, not {sink_id!r}")
            found.append(EpochObjects(int(doc["epoch"]), tuple(
                str(o["key"]) for o in doc.get("objects", []))))
        oldest = found[0].epoch if found else cut + 1
        if oldest > after + 1:
            # Manifests below ``oldest`` were pruned (or the range holds none): list the
            # folders of those epochs instead.
            found = _listed(client, bucket, base, after, min(oldest - 1, cut)) + found
        return found
    finally:
        backend.close()


def _listed(client: Any, bucket: str, base: str, after: int, upto: int) -> list[EpochObjects]:
    by_epoch: dict[int, list[str]] = {}
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=f"{base}/epoch=", Delimiter="/")
    epochs = sorted(int(str(p["Prefix"]).rstrip("/").rsplit("=", 1)[1])
                    for page in pages for p in page.get("CommonPrefixes", []) or [])
    for epoch in (e for e in epochs if after < e <= upto):
        for page in client.get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=f"{base}/epoch={epoch}/"):
            by_epoch.setdefault(epoch, []).extend(
                sorted(str(o["Key"]) for o in page.get("Contents", []) or []))
    return [EpochObjects(e, tuple(ks), from_manifest=False) for e, ks in sorted(by_epoch.items())]


def read_up_to_cut(options: Mapping[str, str], sink_id: str, cut: int, *,
                   after: int = -1) -> pa.Table:
    """The rows of the epochs in ``(after, cut]`` as one table."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.json as pajson
    import pyarrow.parquet as pq

    backend = S3Backend.from_options(options)
    try:
        tables = []
        for epoch in epochs_up_to(options, sink_id, cut, after=after):
            for key in epoch.keys:
                body = backend.client.get_object(Bucket=backend.bucket, Key=key)["Body"].read()
                if key.endswith(".parquet"):
                    tables.append(pq.read_table(io.BytesIO(body)))
                elif key.endswith(".jsonl"):
                    tables.append(pajson.read_json(io.BytesIO(body)))
                else:
                    tables.append(pacsv.read_csv(io.BytesIO(body)))
        return pa.concat_tables(tables, promote_options="default") if tables else pa.table({})
    finally:
        backend.close()
