"""Delta tables on S3 (the session's SeaweedFS): the conformance kit, two committers of
one log version racing (exactly one wins: delta-rs's create-only PUT, which the store
honours), and the checks that refuse a bad endpoint, bucket or credentials before any
data moves."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from txsink.backend import Backend, CommitOutcome
from txsink.errors import ConfigError
from txsink.model import TransactionContext
from txsink.plugins import get_plugins
from txsink.testing.conformance import BackendConformance
from txsink.writer import write_participant
from txsink_delta.backend import DeltaBackend

from tests.integration.conftest import S3Server
from tests.integration.lake_s3 import (
    access,
    killed_after_decide_then_restarted,
    orphans,
    read_ids,
    table_options,
)
from tests.long_runs import lake_s3_run

pytestmark = pytest.mark.integration


def delta(options: Mapping[str, str]) -> DeltaBackend:
    backend = get_plugins().create_backend("delta", options)
    assert isinstance(backend, DeltaBackend)
    return backend


def batch(ids: range) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(list(ids), pa.int64())})


@lake_s3_run
class TestDeltaS3Conformance(BackendConformance):
    backend_name = "delta"
    #: Through pyarrow's S3 stream a partition costs a fixed ~80-100 MiB (a 16 MiB row
    #: group, its encoder, the parts in flight), whatever its size (measured: 24 MiB of
    #: Arrow data +82 MiB, 96 MiB +99 MiB, 240 MiB +82 MiB).
    large_partition_bytes = 160 * 1024 * 1024
    memory_bound_bytes = 128 * 1024 * 1024

    @pytest.fixture
    def backend_options(self, s3_server: S3Server, tmp_path: Path) -> Mapping[str, str]:
        return table_options("delta", s3_server, tmp_path)

    def read_ids(self, backend: Backend, sink_id: str) -> list[int]:
        assert isinstance(backend, DeltaBackend)
        return read_ids(backend)


def test_two_delta_rs_writers_of_one_log_version_on_s3_one_wins(
        s3_server: S3Server, tmp_path: Path) -> None:
    """What the backend builds on: both writers load the same version, then both write
    the next one. Without a create-only PUT honoured by the store, the second would
    overwrite the first's entry and both would answer success."""
    from deltalake import CommitProperties, DeltaTable
    from deltalake.exceptions import CommitFailedError

    backend = delta(table_options("delta", s3_server, tmp_path))
    backend.preflight("race")
    options = backend.storage_options()
    DeltaTable.create(backend.path, schema=pa.schema([("id", pa.int64())]),
                      storage_options=options)
    rounds = 4
    for r in range(rounds):
        tables = [DeltaTable(backend.path, storage_options=options) for _ in range(2)]
        barrier = threading.Barrier(2, timeout=60)
        answers: list[str] = []

        def commit(table: Any, who: int, barrier: threading.Barrier,
                   answers: list[str]) -> None:
            props = CommitProperties(custom_metadata={"who": str(who)}, max_commit_retries=0)
            barrier.wait()
            try:
                table.create_write_transaction([], "append", table.schema(),
                                               commit_properties=props)
                answers.append("won")
            except CommitFailedError:
                answers.append("lost")

        threads = [threading.Thread(target=commit, args=(t, i, barrier, answers))
                   for i, t in enumerate(tables)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert sorted(answers) == ["lost", "won"], (r, answers)
    table = DeltaTable(backend.path, storage_options=options)
    assert table.version() == rounds  # one entry per round: no loser's entry overwrote it
    assert len([h for h in table.history() if "who" in h]) == rounds


def test_two_committers_of_one_epoch_on_s3_add_it_once(s3_server: S3Server,
                                                       tmp_path: Path) -> None:
    """Two txsink committers of one epoch read the log before either appends (a barrier
    holds them): one adds the epoch, the other answers already committed."""
    options = table_options("delta", s3_server, tmp_path)
    first = delta(options)
    first.preflight("s")
    first.commit(write_participant(first, TransactionContext("s", 9, 0), [batch(range(9000,
                                                                                   9010))]))
    msgs = [write_participant(first, TransactionContext("s", 0, p),
                              [batch(range(p * 100, p * 100 + 10))]) for p in range(3)]
    barrier = threading.Barrier(2, timeout=60)

    class Racing(DeltaBackend):
        reads = 0

        def table_epoch(self, sink_id: str, epoch: int, table: Any = None
                        ) -> dict[str, str] | None:
            found = super().table_epoch(sink_id, epoch, table)
            self.reads += 1
            if self.reads == 1 and epoch == 0:
                barrier.wait()
            return found

    racers = [Racing(first.path, s3=first.s3) for _ in range(2)]
    results: list[Any] = [None, None]

    def run(i: int) -> None:
        results[i] = racers[i].commit_all(msgs)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(str(r[0]) for r in results) == sorted(
        [str(CommitOutcome.COMMITTED), str(CommitOutcome.ALREADY_COMMITTED)]), results
    assert sorted(read_ids(first)) == sorted(
        [p * 100 + i for p in range(3) for i in range(10)] + list(range(9000, 9010)))
    assert orphans(first) == []


@lake_s3_run
@pytest.mark.fault
def test_coordinator_killed_after_decide_on_s3_restarts_exact(s3_server: S3Server,
                                                              tmp_path: Path) -> None:
    killed_after_decide_then_restarted("delta", s3_server, tmp_path)


# -- refused before any data moves -----------------------------------------------------------


def refused(options: Mapping[str, str], s3: S3Server, prefix: str | None) -> ConfigError:
    """The preflight's error; under ``prefix`` (in the test bucket) nothing was written,
    not even the probe object."""
    backend = delta(options)
    with pytest.raises(ConfigError) as info:
        backend.preflight("s")
    if prefix is not None:
        assert s3.keys(prefix) == []
    secret = options.get("secret_access_key")
    if secret:
        assert secret not in str(info.value)
    return info.value


def test_a_missing_bucket_is_named(s3_server: S3Server) -> None:
    err = refused({"path": f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/t",
                   **access(s3_server)}, s3_server, None)
    assert err.field == "path" and "does not exist" in str(err)


def test_a_bad_endpoint_is_named(s3_server: S3Server) -> None:
    prefix = f"lake-{uuid.uuid4().hex[:8]}"
    err = refused({"path": f"s3://{s3_server.bucket}/{prefix}/t",
                   **{**access(s3_server), "endpoint_url": "http://127.0.0.1:9"}},
                  s3_server, prefix)
    assert err.field == "endpoint_url" and "cannot reach" in str(err)


@pytest.mark.promise("delta-secrets-never-stored", "backend")
def test_wrong_credentials_are_named_without_the_secret(s3_server: S3Server) -> None:
    s3_server.require_local()
    prefix = f"lake-{uuid.uuid4().hex[:8]}"
    err = refused({"path": f"s3://{s3_server.bucket}/{prefix}/t",
                   **{**access(s3_server), "secret_access_key": "not-the-secret-0042"}},
                  s3_server, prefix)
    assert err.field == "secret_access_key"
    assert "access_key_id/secret_access_key" in str(err)


def test_missing_credentials_are_named(s3_server: S3Server, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    s3_server.require_local()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    prefix = f"lake-{uuid.uuid4().hex[:8]}"
    err = refused({"path": f"s3://{s3_server.bucket}/{prefix}/t",
                   "endpoint_url": s3_server.endpoint_url}, s3_server, prefix)
    assert err.field == "access_key_id" and "none found" in str(err)


def test_credentials_and_endpoint_from_the_environment(s3_server: S3Server,
                                                       monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """No S3 options at all: pyarrow, delta-rs and the check read the AWS environment,
    and the state keeps only the path."""
    s3_server.require_local()
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server.endpoint_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", str(s3_server.access_key))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", str(s3_server.secret_key))
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    backend = delta({"path": f"s3://{s3_server.bucket}/{uuid.uuid4().hex[:8]}/t"})
    backend.preflight("s")
    backend.commit(write_participant(backend, TransactionContext("s", 0, 0),
                                     [batch(range(5))]))
    assert sorted(read_ids(backend)) == list(range(5))
    assert backend.safe_options({"path": backend.path}) == {"path": backend.path}
