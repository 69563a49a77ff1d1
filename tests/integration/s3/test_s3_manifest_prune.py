"""A failed manifest prune is retried, and readers never skip the epochs it left behind.

One transient ``SlowDown`` from DeleteObjects (raised once through a botocore event
hook, against the real server) made a prune give up for good: its manifests stayed
while the next prune deleted the following range, and ``epochs_up_to``, which took
the oldest manifest for the prune horizon, skipped every epoch of that range.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from txsink.model import Committable, TransactionContext
from txsink_s3 import backend as s3_backend
from txsink_s3 import keys
from txsink_s3.backend import S3Backend
from txsink_s3.reader import epochs_up_to

from .conftest import S3Server

pytestmark = pytest.mark.integration

SINK = "prune-sink"
EVERY = 10  # manifests pruned every EVERY epochs (100 in production; smaller keeps it fast)
RETENTION = 20


def commit_epoch(backend: S3Backend, epoch: int) -> None:
    """What a committed epoch leaves: one completed data object and its manifest."""
    ctx = TransactionContext(SINK, epoch, 0)
    key = keys.data_key(backend.base(SINK), ctx, backend.format)
    backend.client.put_object(Bucket=backend.bucket, Key=key, Body=b'{"id": %d}\n' % epoch)
    committable = Committable.for_context("s3", ctx, {"bucket": backend.bucket, "key": key},
                                          rows=1)
    backend.epoch_committed(SINK, epoch, [committable])


def slow_down_once(backend: S3Backend) -> list[str]:
    """Make the next DeleteObjects fail the way a throttling S3 answers (503 SlowDown)."""
    from botocore.exceptions import ClientError

    failed: list[str] = []

    def hook(**_: Any) -> None:
        if not failed:
            failed.append("DeleteObjects")
            raise ClientError({"Error": {"Code": "SlowDown", "Message": "Please reduce your "
                                         "request rate."},
                               "ResponseMetadata": {"HTTPStatusCode": 503}}, "DeleteObjects")

    backend.client.meta.events.register("before-call.s3.DeleteObjects", hook)
    return failed


@pytest.mark.promise("s3-failed-prune-finished-later", "backend")
def test_a_failed_prune_is_retried_and_readers_skip_no_epoch(
        s3_server: S3Server, prefix: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(s3_backend, "MANIFEST_PRUNE_EVERY", EVERY)
    options = s3_server.options(prefix, format="jsonl",
                                manifest_retention_epochs=str(RETENTION))
    backend = S3Backend.from_options(options)
    manifests = f"{backend.base(SINK)}/_txsink/manifests/"
    try:
        failed = slow_down_once(backend)
        with caplog.at_level(logging.WARNING, logger="txsink_s3.backend"):
            for epoch in range(RETENTION + 2 * EVERY):  # the prune at 30 (below 10) fails
                commit_epoch(backend, epoch)
        assert failed == ["DeleteObjects"]
        assert "pruning manifests" in caplog.text
        # Until the next prune, every manifest is still there.
        assert len(s3_server.keys(manifests)) == RETENTION + 2 * EVERY
        last = RETENTION + 2 * EVERY
        commit_epoch(backend, last)  # prunes below 20: must also take what 30 left
        got = epochs_up_to(options, SINK, last)
        assert [e.epoch for e in got] == list(range(last + 1))
        assert all(e.keys for e in got)
        assert [e.from_manifest for e in got] == [e >= last - RETENTION for e in range(last + 1)]
        resumed = epochs_up_to(options, SINK, last - 5, after=EVERY // 2)
        assert [e.epoch for e in resumed] == list(range(EVERY // 2 + 1, last - 4))
        left = sorted(s3_server.keys(manifests))
        assert left[0] == keys.manifest_key(backend.base(SINK), last - RETENTION), left[:3]
        assert len(left) == RETENTION + 1
    finally:
        backend.close()


def test_a_reader_reads_the_holes_a_partial_prune_left(
        s3_server: S3Server, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A prune that deleted only part of its range (the server reports per-key errors, or
    the request died half done) leaves holes above older manifests: their epochs are
    read from their folders, never skipped; epochs that never committed are not made up."""
    monkeypatch.setattr(s3_backend, "MANIFEST_PRUNE_EVERY", EVERY)
    options = s3_server.options(prefix, format="jsonl",
                                manifest_retention_epochs=str(RETENTION))
    backend = S3Backend.from_options(options)
    half: list[int] = []

    def delete_half(params: dict[str, Any], **_: Any) -> None:
        if not half:  # this prune deletes only every other manifest of its range
            doomed = params["Delete"]["Objects"]
            params["Delete"]["Objects"] = doomed[1::2]
            half.append(len(doomed))

    backend.client.meta.events.register("before-parameter-build.s3.DeleteObjects",
                                        delete_half)
    never = {5, 25}  # epochs no write committed (an aborted batch write, say)
    committed = [e for e in range(RETENTION + EVERY + 1) if e not in never]
    try:
        for epoch in committed:
            commit_epoch(backend, epoch)
        assert half, "no prune ran"
        got = epochs_up_to(options, SINK, committed[-1])
        assert [e.epoch for e in got] == committed
        assert all(e.keys for e in got)
    finally:
        backend.close()
