"""commit_all on a real S3-compatible server: an epoch's uploads are completed side by
side, a normal commit is one request, a repeat is idempotent, a lost participant
fails alone."""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa
import pytest
from txsink.backend import CommitOutcome
from txsink.errors import ConfigError, ParticipantLostError
from txsink.model import Committable, TransactionContext
from txsink.plugins import get_plugins
from txsink.writer import write_participant
from txsink_s3.backend import S3Backend

from .conftest import S3Server

pytestmark = pytest.mark.integration

PARTICIPANTS = 24


def make(options: dict[str, str]) -> S3Backend:
    backend = get_plugins().create_backend("s3", options)
    assert isinstance(backend, S3Backend)
    return backend


def prepare_epoch(backend: S3Backend, sink: str, epoch: int, n: int) -> list[Committable]:
    return [write_participant(backend, TransactionContext(sink, epoch, p),
                              iter([pa.record_batch({"id": pa.array([p], pa.int64())})]))
            for p in range(n)]


class _Calls:
    """Counts the S3 operations a client sends and how many were in flight at once."""

    def __init__(self, client: Any) -> None:
        self.names: list[str] = []
        self.in_flight = 0
        self.most = 0
        self._lock = threading.Lock()
        client.meta.events.register("before-call.s3", self._before)
        client.meta.events.register("after-call.s3", self._after)

    def _before(self, model: Any, **_: Any) -> None:
        with self._lock:
            self.names.append(str(model.name))
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)

    def _after(self, **_: Any) -> None:
        with self._lock:
            self.in_flight -= 1


def test_an_epoch_is_completed_in_parallel_one_request_each_and_idempotently(
        s3_server: S3Server, prefix: str) -> None:
    backend = make(s3_server.options(prefix, format="jsonl", commit_concurrency="8"))
    backend._fast = None  # boto3's own path, whose requests _Calls sees (the lean one: below)
    committables = prepare_epoch(backend, "sink1", 0, PARTICIPANTS)
    calls = _Calls(backend.client)
    assert backend.commit_all(committables) == [CommitOutcome.COMMITTED] * PARTICIPANTS
    assert calls.names == ["CompleteMultipartUpload"] * PARTICIPANTS
    assert 1 < calls.most <= 8
    assert sorted(s3_server.read_ids(f"{prefix}/")) == list(range(PARTICIPANTS))
    assert s3_server.uploads(f"{prefix}/") == []
    keys = s3_server.data_keys(f"{prefix}/")
    # Again (a driver that crashed before marking the epoch committed): every upload
    # is gone, so each participant's object is checked, and nothing is written twice.
    calls.names.clear()
    assert backend.commit_all(committables) == (
        [CommitOutcome.ALREADY_COMMITTED] * PARTICIPANTS)
    assert sorted(calls.names) == sorted(["CompleteMultipartUpload", "HeadObject"]
                                         * PARTICIPANTS)
    assert s3_server.data_keys(f"{prefix}/") == keys
    assert sorted(s3_server.read_ids(f"{prefix}/")) == list(range(PARTICIPANTS))
    backend.close()


@pytest.mark.promise("s3-lost-upload-reported", "backend")
def test_a_lost_participant_fails_alone(s3_server: S3Server, prefix: str) -> None:
    backend = make(s3_server.options(prefix, format="jsonl"))
    committables = prepare_epoch(backend, "sink1", 0, 6)
    lost = committables[3]
    s3_server.client().abort_multipart_upload(
        Bucket=s3_server.bucket, Key=lost.payload["key"], UploadId=lost.payload["upload_id"])
    results = backend.commit_all(committables)
    error = results.pop(3)
    assert isinstance(error, ParticipantLostError)
    assert error.participant == lost.participant and lost.payload["key"] in str(error)
    assert s3_server.secret_key is None or s3_server.secret_key not in str(error)
    assert results == [CommitOutcome.COMMITTED] * 5
    assert sorted(s3_server.read_ids(f"{prefix}/")) == [0, 1, 2, 4, 5]
    backend.close()


def test_a_manifest_follows_a_parallel_commit(s3_server: S3Server, prefix: str) -> None:
    backend = make(s3_server.options(prefix, format="jsonl"))
    committables = prepare_epoch(backend, "sink1", 7, 5)
    assert set(backend.commit_all(committables)) == {CommitOutcome.COMMITTED}
    backend.epoch_committed("sink1", 7, committables)
    assert backend.holds_epoch("sink1", 7)
    manifests = [k for k in s3_server.keys(f"{prefix}/") if "/manifests/" in k]
    assert len(manifests) == 1 and manifests[0].endswith(f"epoch-{7:020d}.json")
    backend.close()


@pytest.mark.parametrize("value", ["0", "65", "many"])
def test_commit_concurrency_is_validated(s3_server: S3Server, prefix: str,
                                         value: str) -> None:
    with pytest.raises(ConfigError, match="commit_concurrency") as info:
        make(s3_server.options(prefix, commit_concurrency=value))
    assert info.value.field == "commit_concurrency"


def test_the_connection_pool_fits_the_commit_concurrency(s3_server: S3Server,
                                                         prefix: str) -> None:
    backend = make(s3_server.options(prefix, commit_concurrency="40"))
    assert backend.client.meta.config.max_pool_connections >= 40
    backend.close()


def test_commits_take_the_lean_request_and_fall_back_to_boto3_for_anything_else(
        s3_server: S3Server) -> None:
    """An http:// endpoint addressed path-style: each completion is one signed request
    (txsink_s3.fast_complete), keys with spaces, '+', '#' and non-ASCII characters
    included; a completion repeated (412) or of an upload gone (404) goes down boto3's
    path, which says already committed, or lost."""
    from txsink_s3 import fast_complete

    if not s3_server.endpoint_url.startswith("http://"):
        pytest.skip("the lean request is used for http:// endpoints only")
    prefix = "odd dir/+plus/#hash/ünï"
    backend = make(s3_server.options(prefix))
    assert backend.fast is not None
    before = dict(fast_complete.COUNTS)
    prepared = [write_participant(backend, TransactionContext("fast", 0, p, 0),
                                  iter([pa.record_batch({"id": pa.array([p])})]))
                for p in range(4)]
    assert backend.commit_all(prepared) == [CommitOutcome.COMMITTED] * 4
    assert fast_complete.COUNTS["fast"] - before["fast"] == 4
    assert sorted(s3_server.read_ids(f"{prefix}/")) == [0, 1, 2, 3]
    assert backend.commit_all(prepared) == [CommitOutcome.ALREADY_COMMITTED] * 4
    assert fast_complete.COUNTS["fallback"] - before["fallback"] == 4
    gone = write_participant(backend, TransactionContext("fast", 1, 0, 0),
                             iter([pa.record_batch({"id": pa.array([9])})]))
    backend.abort(gone)
    with pytest.raises(ParticipantLostError, match="no longer exists"):
        backend.commit(gone)
    assert sorted(s3_server.read_ids(f"{prefix}/")) == [0, 1, 2, 3]


def test_a_proxy_in_the_environment_keeps_every_completion_on_boto3(
        s3_server: S3Server, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    backend = make(s3_server.options(prefix))
    assert backend.fast is None
