"""Reading a sink's objects up to a group's consistent cut, by its epoch manifests.

Each committed epoch has a manifest (``_txsink/manifests/epoch-<N>.json``) listing its
objects; its data keys are under ``epoch=<N>/``. :func:`epochs_up_to` gives the objects
of the epochs in ``(after, cut]``; :func:`read_up_to_cut` reads them as one Arrow table
(Parquet, JSON Lines or CSV, as the sink wrote). Epochs whose manifests may have been
pruned (``manifest_retention_epochs``; below the prune horizon the sink records) are
found by listing their ``epoch=<N>/`` folders: only completed uploads are listed, so
only committed data.
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

    Manifests are not contiguous: epoch numbers have gaps (aborted batch writes), and a
    prune that failed or deleted part of its keys leaves holes above older manifests.
    So an epoch without a manifest is looked for in its ``epoch=<N>/`` folder when its
    manifest may have been pruned (below the recorded prune horizon), and taken for
    never committed otherwise; it is never skipped for sitting past the oldest manifest.
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
        horizon = _prune_horizon(backend, sink_id, found, cut)
        have = {e.epoch for e in found}
        upto = min(horizon - 1, cut)
        if upto > after and len(have.intersection(range(after + 1, upto + 1))) < upto - after:
            found += _listed(client, bucket, base, after, upto, have)
        return sorted(found, key=lambda e: e.epoch)
    finally:
        backend.close()


def _prune_horizon(backend: S3Backend, sink_id: str, found: list[EpochObjects],
                   cut: int) -> int:
    """Epochs below this may have lost their manifests to pruning."""
    recorded = backend.manifests_pruned_below(sink_id)
    if recorded is not None:
        return recorded
    # Pruned before the horizon was recorded: below the oldest manifest of the range,
    # or more than manifest_retention_epochs behind the newest manifest.
    horizon = found[0].epoch if found else cut + 1
    if backend.manifest_retention_epochs:
        newest = backend.highest_epoch(sink_id)
        horizon = max(horizon, (newest if newest is not None else -1)
                      - backend.manifest_retention_epochs)
    return horizon


def _listed(client: Any, bucket: str, base: str, after: int, upto: int,
            have: set[int]) -> list[EpochObjects]:
    """The completed objects of the epochs in ``(after, upto]`` not in ``have``, by listing
    their folders (only completed uploads are listed, so only committed data)."""
    by_epoch: dict[int, list[str]] = {}
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=f"{base}/epoch=", Delimiter="/")
    epochs = sorted(int(str(p["Prefix"]).rstrip("/").rsplit("=", 1)[1])
                    for page in pages for p in page.get("CommonPrefixes", []) or [])
    for epoch in (e for e in epochs if after < e <= upto and e not in have):
        for page in client.get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=f"{base}/epoch={epoch}/"):
            by_epoch.setdefault(epoch, []).extend(
                sorted(str(o["Key"]) for o in page.get("Contents", []) or []))
    return [EpochObjects(e, tuple(ks), from_manifest=False) for e, ks in sorted(by_epoch.items())
            if ks]


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
