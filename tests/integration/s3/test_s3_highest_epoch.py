"""The newest epoch manifest, found with a few one-key listings (what the cut reads).

Manifests sit at sparse epochs (gaps of abandoned batch writes, pruned older ones);
the answer must be the newest one, whatever the gaps, and -1 without any. Readers up
to a cut get exactly the epochs of that range.
"""

from __future__ import annotations

import json

import pytest
from txsink_s3 import keys
from txsink_s3.backend import S3Backend
from txsink_s3.reader import epochs_up_to

from .conftest import S3Server

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("epochs", [[], [0], [5], [0, 1, 2, 3], [3, 4, 17, 18, 100, 1037],
                                    [*range(200, 260), 999]])
def test_highest_epoch_finds_the_newest_manifest(s3_server: S3Server, prefix: str,
                                                 epochs: list[int]) -> None:
    sink = "hi"
    backend = S3Backend.from_options(s3_server.options(prefix))
    base = backend.base(sink)
    for e in epochs:
        doc = {"sink_id": sink, "epoch": e, "objects": [{"key": f"{base}/epoch={e}/part"}]}
        s3_server.client().put_object(Bucket=s3_server.bucket, Key=keys.manifest_key(base, e),
                                      Body=json.dumps(doc).encode())
    try:
        assert backend.highest_epoch(sink) == (max(epochs) if epochs else -1)
    finally:
        backend.close()
    if epochs:
        cut = sorted(epochs)[len(epochs) // 2]
        got = [e.epoch for e in epochs_up_to(s3_server.options(prefix), sink, cut)]
        assert got == [e for e in sorted(epochs) if e <= cut]
        after = [e.epoch for e in epochs_up_to(s3_server.options(prefix), sink, max(epochs),
                                               after=cut)]
        assert after == [e for e in sorted(epochs) if e > cut]
