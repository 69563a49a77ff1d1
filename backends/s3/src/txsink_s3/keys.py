"""The object-key layout of one sink: data objects, epoch manifests, the preflight probe.

Every key lives under ``<prefix>/<sink id>/``, so orphans of a sink are exactly the
multipart uploads ListMultipartUploads returns for that prefix, and two sinks that
share a prefix never see each other's uploads. Data keys use Hive-style
``epoch=N`` directories, so dataset readers get an ``epoch`` column for free;
txsink's own bookkeeping sits in ``_txsink/``, which Spark and pyarrow skip.
"""

from __future__ import annotations

import re

from txsink.model import TransactionContext

#: File extension per output format.
EXTENSIONS = {"parquet": "parquet", "jsonl": "jsonl", "csv": "csv"}
CONTENT_TYPES = {
    "parquet": "application/vnd.apache.parquet",
    "jsonl": "application/x-ndjson",
    "csv": "text/csv",
}
BOOKKEEPING_DIR = "_txsink"

_DATA_KEY = re.compile(r"^epoch=(?P<epoch>\d+)/part-(?P<partition>\d+)-a(?P<attempt>\d+)\.[a-z]+$")


def normalize_prefix(prefix: str) -> str:
    """``/a//b/`` -> ``a/b``: keys never start with or double a slash."""
    return "/".join(part for part in prefix.split("/") if part)


def sink_base(prefix: str, sink_id: str) -> str:
    """The folder that holds everything of ``sink_id`` (no trailing slash)."""
    prefix = normalize_prefix(prefix)
    return f"{prefix}/{sink_id}" if prefix else sink_id


def data_key(base: str, ctx: TransactionContext, fmt: str) -> str:
    """Deterministic key of one participant: one per (epoch, partition, attempt)."""
    return (f"{base}/epoch={ctx.epoch}/part-{ctx.partition:05d}-a{ctx.attempt}"
            f".{EXTENSIONS[fmt]}")


def parse_data_key(base: str, sink_id: str, key: str) -> TransactionContext | None:
    """Inverse of :func:`data_key`; ``None`` for keys txsink did not make."""
    if not key.startswith(base + "/"):
        return None
    m = _DATA_KEY.match(key[len(base) + 1:])
    if m is None:
        return None
    return TransactionContext(sink_id, int(m["epoch"]), int(m["partition"]), int(m["attempt"]))


def manifest_key(base: str, epoch: int) -> str:
    """Per-epoch manifest; zero-padded so a listing returns epochs in order."""
    return f"{base}/{BOOKKEEPING_DIR}/manifests/epoch-{epoch:020d}.json"


def manifests_prefix(base: str) -> str:
    return f"{base}/{BOOKKEEPING_DIR}/manifests/"


def pruned_key(base: str) -> str:
    """The prune horizon: every epoch below it may have lost its manifest to pruning."""
    return f"{base}/{BOOKKEEPING_DIR}/manifests-pruned-below.json"


def preflight_key(base: str) -> str:
    return f"{base}/{BOOKKEEPING_DIR}/preflight-probe"


def owner_key(base: str) -> str:
    """Which txsink state owns the sink id (see ``S3Backend.claim_sink``)."""
    return f"{base}/{BOOKKEEPING_DIR}/owner.json"
