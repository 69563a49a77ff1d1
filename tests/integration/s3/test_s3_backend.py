"""S3 backend behaviour beyond the conformance kit, on a real S3-compatible server:
bad input fails clearly before anything is written, formats, manifests, lost
participants, credentials never leak."""

from __future__ import annotations

import json
import logging
import pickle
import socket
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from txsink.backend import CommitOutcome
from txsink.coordinator import Coordinator, EpochOutcome
from txsink.errors import ConfigError, ParticipantLostError, ServerUnavailableError
from txsink.faults import BEFORE_MARK_COMMITTED, FaultInjector, FaultRule, InjectedFault
from txsink.model import TransactionContext
from txsink.plugins import build_plugins, get_plugins
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant
from txsink_s3 import keys
from txsink_s3.backend import S3Backend

from .conftest import S3Server

pytestmark = pytest.mark.integration


def make(options: dict[str, str]) -> S3Backend:
    backend = get_plugins().create_backend("s3", options)
    assert isinstance(backend, S3Backend)
    return backend


def batch(ids: range) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(ids, pa.int64()),
                            "name": pa.array([f"row-{i}" for i in ids]),
                            "amount": pa.array([i * 0.5 for i in ids])})


def prepare(backend: S3Backend, sink: str, epoch: int, partition: int, ids: range):  # type: ignore[no-untyped-def]
    return write_participant(backend, TransactionContext(sink, epoch, partition),
                             iter([batch(ids)]))


def coordinator(backend: S3Backend, state: Path, sink: str,
                faults: FaultInjector | None = None) -> Coordinator:
    return Coordinator(backend, DirectoryStateStore(state), sink, plugins=build_plugins(),
                       faults=faults or FaultInjector())


# -- bad input: clear errors, nothing written ---------------------------------------------


@pytest.mark.promise("s3-preflight-checks", "backend")
@pytest.mark.promise("s3-never-creates-buckets", "backend")
def test_missing_bucket_fails_preflight_naming_the_bucket(s3_server: S3Server,
                                                          prefix: str) -> None:
    backend = make(s3_server.options(prefix, bucket="txsink-no-such-bucket"))
    with pytest.raises(ConfigError, match=r"txsink-no-such-bucket.*does not exist") as info:
        backend.preflight("sink1")
    assert info.value.field == "bucket"
    names = [b["Name"] for b in s3_server.client().list_buckets()["Buckets"]]
    assert "txsink-no-such-bucket" not in names


@pytest.mark.promise("s3-preflight-checks", "backend")
def test_bad_credentials_fail_preflight_without_leaking_the_secret(
    s3_server: S3Server, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    s3_server.require_local()
    wrong = f"wrong-{uuid.uuid4().hex}"
    backend = make(s3_server.options(prefix, secret_access_key=wrong))
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ConfigError, match=r"denied.*credentials") as info:
        backend.preflight("sink1")
    assert info.value.field == "secret_access_key"
    assert wrong not in str(info.value) and wrong not in caplog.text
    assert wrong not in repr(backend.secret_access_key)
    assert s3_server.keys(prefix) == [] and s3_server.uploads(prefix) == []


@pytest.mark.promise("s3-bad-options-without-io", "backend")
def test_part_size_below_five_mib_is_refused_before_any_io() -> None:
    with pytest.raises(ConfigError, match=r"part_size.*at least 5 MiB") as info:
        S3Backend.from_options({"bucket": "abc", "part_size": "4MiB"})
    assert info.value.field == "part_size"


@pytest.mark.promise("s3-preflight-checks", "backend")
def test_unreachable_endpoint_names_the_option(prefix: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    backend = make({"bucket": "abc", "endpoint_url": f"http://127.0.0.1:{port}",
                    "region": "us-east-1", "access_key_id": "a", "secret_access_key": "b" * 8,
                    "max_attempts": "1", "connect_timeout": "1", "connect_retry_s": "0"})
    with pytest.raises(ServerUnavailableError, match="is down or unreachable") as info:
        backend.preflight("sink1")
    assert info.value.field == "endpoint_url"


@pytest.mark.promise("s3-preflight-checks", "backend")
def test_preflight_leaves_nothing_behind(s3_server: S3Server, prefix: str) -> None:
    backend = make(s3_server.options(prefix))
    backend.preflight("sink1")
    assert s3_server.keys(prefix) == []
    assert s3_server.uploads(prefix) == []


# -- formats ------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_text_formats_round_trip(s3_server: S3Server, prefix: str, fmt: str) -> None:
    backend = make(s3_server.options(prefix, format=fmt))
    c = prepare(backend, "sink1", 0, 0, range(1000))
    assert c.payload["key"].endswith(f".{fmt}")
    assert backend.commit(c) is CommitOutcome.COMMITTED
    table = s3_server.read_table(c.payload["key"])
    assert table.column("id").to_pylist() == list(range(1000))
    assert table.column("name").to_pylist()[:2] == ["row-0", "row-1"]


def test_key_layout_and_parts(s3_server: S3Server, prefix: str) -> None:
    """Deterministic key with epoch and partition; parts of part_size bytes."""
    backend = make(s3_server.options(prefix, format="jsonl"))
    ctx = TransactionContext("sink1", 7, 3, 1)
    # ~12 MiB of JSON: two full 5 MiB parts and a short last one.
    batches = (batch(range(i, i + 50_000)) for i in range(0, 250_000, 50_000))
    c = write_participant(backend, ctx, batches)
    assert c.payload["key"] == f"{prefix}/sink1/epoch=7/part-00003-a1.jsonl"
    parts = s3_server.client().list_parts(Bucket=s3_server.bucket, Key=c.payload["key"],
                                          UploadId=c.payload["upload_id"])["Parts"]
    assert len(parts) >= 2
    assert all(p["Size"] >= 5 * 1024 * 1024 for p in parts[:-1])
    assert backend.commit(c) is CommitOutcome.COMMITTED
    head = s3_server.client().head_object(Bucket=s3_server.bucket, Key=c.payload["key"])
    assert head["ETag"].strip('"') == c.payload["etag"]
    assert len(s3_server.read_ids(f"{prefix}/")) == 250_000


# -- commit idempotency edge cases --------------------------------------------------------


def test_commit_after_a_lost_reply_is_already_committed(s3_server: S3Server,
                                                        prefix: str) -> None:
    backend = make(s3_server.options(prefix))
    c = prepare(backend, "sink1", 0, 0, range(10))
    # The upload completes but the reply never reaches the committer.
    s3_server.client().complete_multipart_upload(
        Bucket=s3_server.bucket, Key=c.payload["key"], UploadId=c.payload["upload_id"],
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in c.payload["parts"]]})
    assert backend.commit(c) is CommitOutcome.ALREADY_COMMITTED
    assert sorted(s3_server.read_ids(f"{prefix}/")) == list(range(10))


@pytest.mark.promise("s3-lost-upload-reported", "backend")
def test_vanished_upload_is_a_lost_participant(s3_server: S3Server, prefix: str) -> None:
    backend = make(s3_server.options(prefix))
    c = prepare(backend, "sink1", 0, 0, range(10))
    # E.g. a bucket lifecycle rule aborted the incomplete upload.
    s3_server.client().abort_multipart_upload(Bucket=s3_server.bucket, Key=c.payload["key"],
                                              UploadId=c.payload["upload_id"])
    with pytest.raises(ParticipantLostError, match=c.payload["key"]) as info:
        backend.commit(c)
    assert info.value.participant == c.participant
    assert s3_server.keys(prefix) == []


# -- the epoch manifest -------------------------------------------------------------------


def test_manifest_written_once_an_epoch_is_committed(s3_server: S3Server, prefix: str,
                                                     tmp_path: Path) -> None:
    backend = make(s3_server.options(prefix))
    crash = FaultInjector([FaultRule(BEFORE_MARK_COMMITTED, 0, "raise")])
    first = coordinator(backend, tmp_path, "sink1", crash)
    first.start()
    msgs = [prepare(backend, "sink1", 0, p, range(p * 100, p * 100 + 100)) for p in range(3)]
    msgs.append(prepare(backend, "sink1", 0, 3, range(0)))  # an empty partition
    with pytest.raises(InjectedFault):
        first.commit_epoch(0, msgs)
    key = keys.manifest_key(backend.base("sink1"), 0)
    s3_server.client().delete_object(Bucket=s3_server.bucket, Key=key)
    # Recovery re-runs the hook: the manifest is there whatever moment the driver died.
    assert coordinator(backend, tmp_path, "sink1").start().recommitted_epochs == [0]
    manifest = json.loads(s3_server.client().get_object(
        Bucket=s3_server.bucket, Key=key)["Body"].read())
    assert manifest["epoch"] == 0 and manifest["rows"] == 300
    assert [o["partition"] for o in manifest["objects"]] == [0, 1, 2]
    assert sorted(o["key"] for o in manifest["objects"]) == sorted(
        s3_server.data_keys(f"{prefix}/"))
    assert sum(o["rows"] for o in manifest["objects"]) == len(s3_server.read_ids(f"{prefix}/"))


@pytest.mark.promise("s3-sink-owner", "backend")
def test_second_state_for_the_same_sink_id_is_refused(s3_server: S3Server, prefix: str,
                                                      tmp_path: Path) -> None:
    backend = make(s3_server.options(prefix))
    coordinator(backend, tmp_path / "a", "sink1").start()
    coordinator(backend, tmp_path / "a", "sink1").start()  # same state: fine
    with pytest.raises(ConfigError, match="belongs to the txsink state") as info:
        coordinator(backend, tmp_path / "b", "sink1").start()
    assert info.value.field == "sink_id"


# -- credentials --------------------------------------------------------------------------


def test_credentials_from_the_environment_chain(s3_server: S3Server, prefix: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    if s3_server.access_key is None or s3_server.secret_key is None:
        pytest.skip("the external server's credentials come from the environment already")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    options = s3_server.options(prefix)
    del options["access_key_id"], options["secret_access_key"]
    backend = make(options)
    backend.preflight("sink1")
    c = prepare(backend, "sink1", 0, 0, range(5))
    assert backend.commit(c) is CommitOutcome.COMMITTED


@pytest.mark.promise("s3-secrets-never-stored", "backend")
def test_secrets_stay_out_of_logs_committables_state_and_pickles(
    s3_server: S3Server, prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    options = s3_server.options(prefix)
    secret = options.get("secret_access_key")
    if not secret:
        pytest.skip("no explicit secret in the options for this server")
    caplog.set_level(logging.DEBUG)
    backend = make(options)
    backend.preflight("sink1")
    coord = Coordinator(backend, DirectoryStateStore(tmp_path), "sink1",
                        backend_options=options, plugins=build_plugins(),
                        faults=FaultInjector())
    coord.start()
    msgs = [prepare(backend, "sink1", 0, 0, range(10))]
    assert coord.commit_epoch(0, msgs) is EpochOutcome.COMMITTED
    assert secret not in caplog.text
    assert all(secret not in m.to_bytes().decode() for m in msgs)
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    assert secret not in backend.describe()
    # Executors get the backend pickled: without the live client, still usable.
    clone = pickle.loads(pickle.dumps(backend))
    assert clone._s3 is None
    assert clone.commit(msgs[0]) is CommitOutcome.ALREADY_COMMITTED


def test_example_pipeline_builds_a_valid_backend() -> None:
    from txsink.config import load_pipeline

    repo = Path(__file__).resolve().parents[3]
    cfg = load_pipeline(repo / "examples/pipelines/s3.yaml",
                        env={"TXSINK_S3_BUCKET": "my-bucket",
                             "TXSINK_S3_ENDPOINT": "http://127.0.0.1:8333"})
    assert cfg.sink.backend == "s3"
    backend = make(dict(cfg.sink.options))
    assert (backend.bucket, backend.format, backend.part_size) == (
        "my-bucket", "parquet", 16 * 2**20)


def test_already_committed_recognised_by_token_when_etags_are_not_md5(
    s3_server: S3Server, prefix: str
) -> None:
    """Stores with non-MD5 part ETags (e.g. SSE-KMS) give no expected ETag: the
    participant's token in the object metadata (and the size) identify it instead."""
    import dataclasses

    backend = make(s3_server.options(prefix))
    c = prepare(backend, "sink1", 0, 0, range(10))
    assert backend.commit(c) is CommitOutcome.COMMITTED
    head = s3_server.client().head_object(Bucket=s3_server.bucket, Key=c.payload["key"])
    if "txsink-token" not in head.get("Metadata", {}):
        pytest.skip("this server does not keep user metadata of multipart uploads")
    no_etag = dataclasses.replace(c, payload={**c.payload, "etag": None})
    assert backend.commit(no_etag) is CommitOutcome.ALREADY_COMMITTED


def test_orphan_listing_is_exact_per_sink_id(s3_server: S3Server, prefix: str) -> None:
    """Sink ids that prefix each other never see each other's uploads."""
    backend = make(s3_server.options(prefix))
    mine = prepare(backend, "ab", 0, 0, range(5))
    other = prepare(backend, "ab-c", 0, 0, range(5))
    try:
        assert [c.participant for c in backend.list_prepared("ab")] == [mine.participant]
        assert [c.participant for c in backend.list_prepared("ab-c")] == [other.participant]
        aborted = backend.abort_orphans("ab", protected=set())
        assert [c.participant for c in aborted] == [mine.participant]
        assert [u["Key"] for u in s3_server.uploads(f"{prefix}/")] == [other.payload["key"]]
    finally:
        backend.abort(other)


@pytest.mark.promise("s3-lifecycle-rule-warned", "backend")
def test_lifecycle_rule_aborting_uploads_is_warned_about(
    s3_server: S3Server, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    s3_server.require_local()  # creates a bucket of its own
    bucket = "txsink-lifecycle"
    client = s3_server.client()
    client.create_bucket(Bucket=bucket)
    client.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": [
        {"ID": "abort-uploads", "Status": "Enabled", "Filter": {"Prefix": ""},
         "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}},
        {"ID": "elsewhere", "Status": "Enabled", "Filter": {"Prefix": "other/"},
         "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 2}},
    ]})
    caplog.set_level(logging.WARNING, logger="txsink_s3")
    make(s3_server.options(prefix, bucket=bucket)).preflight("sink1")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "'abort-uploads'" in warnings[0] and "1 day(s)" in warnings[0]
    assert "sink=sink1" in warnings[0]
