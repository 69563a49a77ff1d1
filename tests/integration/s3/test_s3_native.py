"""The S3 target's native path (``writer: spark``) against a real S3 server, no JVM.

What txsink-s3's commit protocol leaves after Spark's job (pending uploads at the task
keys, the uploads of failed and twin attempts beside them, the job document) is made by
:class:`tests.integration.s3_native_driver.SparkWriterStandIn`; the backend's side is
the real one: reading the job document into one committable per upload, refusing a
document it cannot trust before anything is recorded, the orphan scan (dead attempts,
leftovers of writes that stopped), an upload a lifecycle rule aborted. The whole path
with the driver killed at every step is the ``s3-native`` target of
tests/chaos/test_chaos.py; Spark itself is tests/e2e/test_s3_native_spark.py.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
from txsink.backend import CommitOutcome
from txsink.coordinator import Coordinator
from txsink.errors import ConfigError, FencedError, ParticipantLostError, StateError
from txsink.faults import AFTER_FIRST_COMMIT, FaultInjector, FaultRule, InjectedFault
from txsink.model import TransactionContext
from txsink.plugins import get_plugins
from txsink.state import DirectoryStateStore
from txsink_s3 import keys, native
from txsink_s3.backend import S3Backend

from tests.integration.s3.conftest import S3Server
from tests.integration.s3_native_driver import TASKS, SparkWriterStandIn, table_of, tasks_of

SINK = "native-s3"


def make(s3_server: S3Server, prefix: str, **extra: str) -> S3Backend:
    backend = get_plugins().create_backend("s3", s3_server.options(prefix, writer="spark",
                                                                   **extra))
    assert isinstance(backend, S3Backend)
    backend.preflight(SINK)
    return backend


def spark_write(backend: S3Backend, s3_server: S3Server, prefix: str, epoch: int, *,
                version: int = 0, faults: dict[int, str] | None = None, run: int = 0
                ) -> tuple[TransactionContext, str]:
    """What Spark's writer leaves for one native write of ``epoch``."""
    ctx = TransactionContext(SINK, epoch, 0, 1000 + epoch)
    path, dirname = backend.native_staging(ctx)
    assert path.startswith(f"s3a://{backend.bucket}/{prefix}/{SINK}/_txsink/native/"
                           f"epoch={epoch}/")
    SparkWriterStandIn(s3_server.options(prefix, writer="spark"), run=run,
                       task_faults=dict(faults or {})).write(tasks_of(version), path)
    return ctx, dirname


def data_keys(s3_server: S3Server, prefix: str) -> list[str]:
    return sorted(k for k in s3_server.keys(f"{prefix}/") if "/_txsink/" not in k)


def test_each_upload_becomes_the_participant_txsinks_own_writer_would_make(
        s3_server: S3Server, prefix: str) -> None:
    backend = make(s3_server, prefix)
    ctx, dirname = spark_write(backend, s3_server, prefix, 0)
    job = native.job_key(backend.base(SINK), 0, dirname)
    assert job in s3_server.keys(f"{prefix}/")
    found = backend.committables_for_directory(ctx, dirname)
    # One per task with rows, named like the task's participant; the empty task's upload
    # (Spark writes a schema-only file) aborted, not published.
    assert [c.partition for c in found] == list(range(TASKS - 1))
    for c in found:
        task = TransactionContext(SINK, 0, c.partition, c.attempt)
        assert c.participant == task.participant
        assert c.payload["key"] == keys.data_key(backend.base(SINK), task, "parquet")
        assert c.rows == 200 and c.payload["etag"].endswith("-1")
    assert len(s3_server.uploads(f"{prefix}/")) == TASKS - 1
    assert job not in s3_server.keys(f"{prefix}/")  # read once, deleted
    assert data_keys(s3_server, prefix) == []  # nothing visible before the commit
    assert backend.commit_all(found) == [CommitOutcome.COMMITTED] * len(found)
    backend.epoch_committed(SINK, 0, found)
    assert sorted(s3_server.read_ids(f"{prefix}/")) == [
        i for t in tasks_of(0) for i in t.column("id").to_pylist()]
    assert backend.holds_epoch(SINK, 0) and backend.highest_epoch(SINK) == 0
    assert s3_server.uploads(f"{prefix}/") == []
    # A replayed commit (recovery) finds every object in place.
    assert backend.commit_all(found) == [CommitOutcome.ALREADY_COMMITTED] * len(found)


@pytest.mark.promise("s3-native-refused-before-write", "native")
def test_a_job_document_the_backend_cannot_trust_records_nothing(
        s3_server: S3Server, prefix: str) -> None:
    backend = make(s3_server, prefix)
    base = backend.base(SINK)
    # None at all: Spark's s3a:// wrote to another store (or bucket) than this target's.
    ctx = TransactionContext(SINK, 3, 0, 1)
    _, missing = backend.native_staging(ctx)
    with pytest.raises(StateError, match="wrote somewhere else") as info:
        backend.committables_for_directory(ctx, missing)
    assert info.value.epoch == 3
    # Another job's document, an upload at a key that is not its task's, rows unknown.
    ctx, dirname = spark_write(backend, s3_server, prefix, 1)
    key = native.job_key(base, 1, dirname)
    good = json.loads(s3_server.client().get_object(Bucket=s3_server.bucket,
                                                    Key=key)["Body"].read())
    moved = json.loads(json.dumps(good))
    moved["files"][0]["key"] = f"{base}/epoch=1/elsewhere.parquet"
    unknown = json.loads(json.dumps(good))
    unknown["files"][1]["rows"] = -1
    twice = json.loads(json.dumps(good))
    twice["files"][1]["partition"] = 0
    for doc, words in ((dict(good, job="someone-e1-p0-a1.0123456789ab"), "names job"),
                       (moved, "not s3://"), (unknown, "not a job document"),
                       (twice, "not s3://"), ({"format": "other"}, "not a job document")):
        s3_server.client().put_object(Bucket=s3_server.bucket, Key=key,
                                      Body=json.dumps(doc).encode())
        with pytest.raises(StateError, match=words):
            backend.committables_for_directory(ctx, dirname)
    assert data_keys(s3_server, prefix) == []


@pytest.mark.promise("s3-native-orphans-aborted", "native")
def test_the_orphan_scan_aborts_dead_attempts_never_the_decided_uploads(
        s3_server: S3Server, prefix: str, tmp_path: Path) -> None:
    """Spark retried task 0 (its first attempt died after uploading), raced a twin of
    task 1: only the winners are in the job document; the commit's orphan scan aborts
    the others and leaves nothing pending."""
    backend = make(s3_server, prefix)
    coordinator = Coordinator(backend, DirectoryStateStore(tmp_path / "state"), SINK)
    coordinator.start()  # recovery (and its orphan scan) before the epoch is written
    ctx, dirname = spark_write(backend, s3_server, prefix, 0, faults={
        0: "task-dies-after-prepare", 1: "speculative-twin", 2: "task-dies-before-prepare"})
    found = backend.committables_for_directory(ctx, dirname)
    assert len(s3_server.uploads(f"{prefix}/")) == len(found) + 3
    coordinator.commit_epoch(0, found)
    assert s3_server.uploads(f"{prefix}/") == []
    assert data_keys(s3_server, prefix) == sorted(c.payload["key"] for c in found)
    assert sorted(s3_server.read_ids(f"{prefix}/")) == list(range(600))


@pytest.mark.promise("s3-native-orphans-aborted", "native")
def test_leftovers_of_writes_that_stopped_go_once_their_epoch_is_done(
        s3_server: S3Server, prefix: str) -> None:
    """A write that stopped before its job document was read leaves the document (and,
    on a bucket whose S3A tracks pending uploads in S3, its magic directory): the orphan
    scan deletes them with the uploads, for epochs it is done with only."""
    backend = make(s3_server, prefix)
    base = backend.base(SINK)
    _, dirname = spark_write(backend, s3_server, prefix, 5)
    magic = f"{base}/__magic_job-{dirname}/job-{dirname}/00/tasks/a/__base/x.parquet.pending"
    s3_server.client().put_object(Bucket=s3_server.bucket, Key=magic, Body=b"{}")
    assert backend.abort_orphans(SINK, set(), up_to_epoch=4) == []
    left = [k for k in s3_server.keys(f"{prefix}/") if "/_txsink/native/" in k
            or "/__magic" in k]
    assert len(left) == 2 and len(s3_server.uploads(f"{prefix}/")) == TASKS
    aborted = backend.abort_orphans(SINK, set(), up_to_epoch=5)
    assert len(aborted) == TASKS
    assert s3_server.uploads(f"{prefix}/") == []
    assert [k for k in s3_server.keys(f"{prefix}/") if "/_txsink/native/" in k
            or "/__magic" in k] == []


def test_a_state_restored_while_a_native_epoch_was_half_committed_stops(
        s3_server: S3Server, prefix: str, tmp_path: Path) -> None:
    """The state's copy was taken before epoch 1's decision, whose commit completed one
    of Spark's uploads and stopped before the manifest: the restored state's start stops
    (``has no decision for it``), the other uploads stay prepared, and the newest state
    put back finishes the epoch (each row once, nothing pending)."""
    backend = make(s3_server, prefix)
    state, backup, newest = tmp_path / "state", tmp_path / "backup", tmp_path / "newest"
    crash = FaultInjector([FaultRule(AFTER_FIRST_COMMIT, 1, "raise")])
    coordinator = Coordinator(backend, DirectoryStateStore(state), SINK, faults=crash)
    coordinator.start()
    for epoch in (0, 1):
        ctx, dirname = spark_write(backend, s3_server, prefix, epoch, version=epoch)
        found = backend.committables_for_directory(ctx, dirname)
        if epoch == 0:
            coordinator.commit_epoch(0, found)
            shutil.copytree(state, backup)
            continue
        with pytest.raises(InjectedFault):
            coordinator.commit_epoch(1, found)
    pending = s3_server.uploads(f"{prefix}/")
    assert len(pending) == TASKS - 2  # one of epoch 1's completed, the others prepared
    shutil.copytree(state, newest)
    shutil.rmtree(state)
    shutil.copytree(backup, state)
    with pytest.raises(StateError, match="has no decision for it"):
        Coordinator(backend, DirectoryStateStore(state), SINK).start()
    assert s3_server.uploads(f"{prefix}/") == pending
    shutil.rmtree(state)
    shutil.copytree(newest, state)
    Coordinator(backend, DirectoryStateStore(state), SINK).start()
    want = [i for v in (0, 1) for t in tasks_of(v) for i in t.column("id").to_pylist()]
    assert sorted(s3_server.read_ids(f"{prefix}/")) == sorted(want)
    assert s3_server.uploads(f"{prefix}/") == []


def test_an_upload_a_lifecycle_rule_aborted_fails_the_commit_by_name(
        s3_server: S3Server, prefix: str, tmp_path: Path) -> None:
    """Decided, then the bucket's rule for incomplete uploads aborts one: the commit
    stops with the participant's name, and the epoch stays decided (never half shown
    as done)."""
    backend = make(s3_server, prefix)
    ctx, dirname = spark_write(backend, s3_server, prefix, 0)
    found = backend.committables_for_directory(ctx, dirname)
    gone = found[1]
    s3_server.client().abort_multipart_upload(Bucket=s3_server.bucket, Key=gone.payload["key"],
                                              UploadId=gone.payload["upload_id"])
    results = backend.commit_all(found)
    assert isinstance(results[1], ParticipantLostError)
    assert gone.payload["key"] in str(results[1]) and "lifecycle rule" in str(results[1])
    assert results[1].participant == gone.participant


@pytest.mark.promise("s3-native-lifecycle-rule-warned", "native")
def test_a_lifecycle_rule_for_incomplete_uploads_is_warned_about_on_this_path_too(
        s3_server: S3Server, prefix: str, caplog: pytest.LogCaptureFixture) -> None:
    s3_server.require_local()
    bucket = "txsink-native-lifecycle"
    client = s3_server.client()
    client.create_bucket(Bucket=bucket)
    client.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": [
        {"ID": "abort-uploads", "Status": "Enabled", "Filter": {"Prefix": ""},
         "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}}]})
    caplog.set_level(logging.WARNING, logger="txsink_s3")
    make(s3_server, prefix, bucket=bucket)
    assert any("'abort-uploads'" in r.getMessage() for r in caplog.records)


@pytest.mark.promise("s3-native-refused-before-write", "native")
def test_the_session_check_refuses_a_spark_without_a_jvm(s3_server: S3Server,
                                                         prefix: str) -> None:
    class ConnectClient:
        _jvm = None

    with pytest.raises(ConfigError, match="Spark Connect") as info:
        make(s3_server, prefix).native_session_conf(ConnectClient())
    assert info.value.field == "writer"


def test_participants_sort_by_task_and_empty_jobs_record_none(s3_server: S3Server,
                                                              prefix: str) -> None:
    """An epoch without rows: Spark writes one schema-only file; nothing is recorded
    and nothing stays pending."""
    backend = make(s3_server, prefix)
    ctx = TransactionContext(SINK, 0, 0, 1)
    path, dirname = backend.native_staging(ctx)
    SparkWriterStandIn(s3_server.options(prefix, writer="spark")).write([table_of([])], path)
    assert backend.committables_for_directory(ctx, dirname) == []
    assert s3_server.uploads(f"{prefix}/") == [] and s3_server.keys(f"{prefix}/{SINK}/epoch")\
        == []


def test_the_jar_is_built_and_found_as_the_docs_say() -> None:
    """docs/backends/s3.md: ``python -m txsink_s3.jvm build``, then ``... path`` names
    the jar to put on Spark's class path (it holds the protocol class)."""
    import shutil
    import subprocess
    import sys
    import zipfile

    if shutil.which("javac") is None or shutil.which("mvn") is None:
        pytest.skip("building txsink-s3's jar needs a JDK and Maven")
    built = subprocess.run([sys.executable, "-m", "txsink_s3.jvm", "build"],
                           capture_output=True, text=True, timeout=1800, check=False)
    assert built.returncode == 0, built.stderr
    found = subprocess.run([sys.executable, "-m", "txsink_s3.jvm", "path"],
                           capture_output=True, text=True, timeout=60, check=True)
    jar = Path(found.stdout.strip())
    assert jar == Path(built.stdout.strip()) and jar.is_file()
    from txsink_s3.jvm import PROTOCOL_CLASS

    with zipfile.ZipFile(jar) as z:
        assert PROTOCOL_CLASS.replace(".", "/") + ".class" in z.namelist()


def test_a_write_the_gate_refuses_is_undone_at_once(s3_server: S3Server, prefix: str) -> None:
    """``discard_staging`` (a failed write, or rows the gate refused): every upload of the
    epoch's folder aborted (winners and lost attempts), the job document gone; another
    epoch's uploads untouched."""
    backend = make(s3_server, prefix)
    keep_ctx, keep_dir = spark_write(backend, s3_server, prefix, 1)
    ctx, dirname = spark_write(backend, s3_server, prefix, 2, faults={
        0: "task-dies-after-prepare", 1: "speculative-twin"}, run=1)
    backend.discard_staging(ctx, dirname)
    left = s3_server.uploads(f"{prefix}/")
    assert left and all("/epoch=1/" in u["Key"] for u in left)
    assert not [k for k in s3_server.keys(f"{prefix}/") if f"/epoch=2/{dirname}" in k
                or dirname in k]
    assert len(backend.committables_for_directory(keep_ctx, keep_dir)) == TASKS - 1


def test_a_second_query_on_the_same_sink_is_refused_before_spark_writes(
        s3_server: S3Server, prefix: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two queries (two states) with one sink id on the native path: the second is
    refused by the target's owner record before its Spark job runs; the first's objects
    stay as they were and nothing is left pending."""
    from txsink.errors import SinkOwnedError
    from txsink.spark.group import TargetSet
    from txsink.targets import TargetSpec

    from tests.integration.s3_native_driver import FakeFrame
    from tests.integration.s3_native_driver import SparkWriterStandIn as Writer

    monkeypatch.setattr(native, "session_conf", lambda backend, spark: {
        "spark.sql.sources.commitProtocolClass": "stand-in"})
    opts = s3_server.options(prefix, writer="spark")

    def query(state: str) -> TargetSet:
        return TargetSet(SINK, [TargetSpec(SINK, "s3", opts)], state_location=state,
                         single=True)

    query(str(tmp_path / "a")).write_epoch(FakeFrame(tasks_of(0), Writer(opts)), 0)
    before = data_keys(s3_server, prefix)
    assert len(before) == TASKS - 1
    spark_wrote: list[str] = []

    class Watched(Writer):
        def write(self, tasks: list, path: str) -> None:  # type: ignore[type-arg]
            spark_wrote.append(path)
            super().write(tasks, path)

    with pytest.raises(SinkOwnedError, match="two queries must not share a sink id"):
        query(str(tmp_path / "b")).write_epoch(FakeFrame(tasks_of(1), Watched(opts)), 0)
    assert spark_wrote == []
    assert data_keys(s3_server, prefix) == before
    assert s3_server.uploads(f"{prefix}/") == []


@pytest.mark.promise("fenced-run-changes-nothing", "native")
def test_a_fenced_runs_failed_native_write_aborts_nothing_of_the_newer_run(
        s3_server: S3Server, prefix: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Two drivers on one stream (docs/operations.md: the run that started last takes
    the lease, a fenced run changes nothing). The older run's Spark job for micro-batch 0
    is still running when the newer run writes, records and is about to decide the same
    batch; then the older run's job fails. Undoing its write must leave the newer run's
    prepared uploads alone: they are its decision's participants."""
    from txsink.spark._proc import OWNER_ENV
    from txsink.spark.group import GroupEpoch, TargetSet
    from txsink.targets import TargetSpec

    from tests.integration.s3_native_driver import FakeFrame, without_jvm_checks

    without_jvm_checks()
    opts = s3_server.options(prefix, writer="spark")
    group = TargetSet(SINK, [TargetSpec(SINK, "s3", opts)],
                      state_location=str(tmp_path / "state"), single=True)
    newer: list[GroupEpoch] = []

    class OlderJob(SparkWriterStandIn):
        def write(self, tasks: list[Any], path: str) -> None:
            super().write(tasks, path)  # the older run's tasks uploaded...
            # ...while the newer driver started and wrote the same micro-batch
            monkeypatch.setenv(OWNER_ENV, "driver-b")
            run = GroupEpoch(group_frame.sparkSession, group, version=None, app_id=None,
                             stream_batch=0)
            run.__enter__()
            run.write(FakeFrame(tasks_of(0), SparkWriterStandIn(opts, run=2)),  # type: ignore[arg-type]
                      SINK)
            newer.append(run)
            raise RuntimeError("the older run's Spark job failed")

    monkeypatch.setenv(OWNER_ENV, "driver-a")
    group_frame = FakeFrame(tasks_of(0), OlderJob(opts, run=1))
    older = GroupEpoch(group_frame.sparkSession, group, version=None, app_id=None,
                       stream_batch=0)
    older.__enter__()
    with pytest.raises(RuntimeError, match="older run's Spark job failed") as failed:
        older.write(group_frame, SINK)  # type: ignore[arg-type]
    assert "may be that run's participants" in caplog.text
    with pytest.raises(FencedError, match="taken over by a newer run"):
        older.__exit__(type(failed.value), failed.value, None)
    [run] = newer
    run.__exit__(None, None, None)  # decides and commits what it prepared
    assert sorted(s3_server.read_ids(f"{prefix}/")) == sorted(
        i for t in tasks_of(0) for i in t.column("id").to_pylist())
    assert s3_server.uploads(f"{prefix}/") == []
