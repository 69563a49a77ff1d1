"""The S3 server dies during the protocol: prepared uploads survive, nothing is lost or doubled.

These restart the session's local SeaweedFS (SIGKILL, then start on the same data),
so they are skipped against an external ``TXSINK_S3_ENDPOINT``.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from txsink.coordinator import Coordinator, EpochOutcome, RetryPolicy
from txsink.errors import RetriableCommitError
from txsink.faults import AFTER_FIRST_COMMIT, FaultInjector
from txsink.model import Committable, TransactionContext
from txsink.plugins import build_plugins, get_plugins
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant
from txsink_s3 import keys
from txsink_s3.backend import S3Backend

from .conftest import S3Server
from .test_s3_backend import batch

pytestmark = [pytest.mark.integration, pytest.mark.fault, pytest.mark.slow]

SINK = "restart-sink"
PARTITIONS = 4
ROWS = 5_000


def backend_for(s3_server: S3Server, prefix: str) -> S3Backend:
    # Fail fast while the server is down; the coordinator's retries do the waiting.
    backend = get_plugins().create_backend(
        "s3", s3_server.options(prefix, max_attempts="1", connect_timeout="1",
                                read_timeout="10"))
    assert isinstance(backend, S3Backend)
    return backend


def prepare_epoch(backend: S3Backend, epoch: int) -> list[Committable]:
    out = []
    for p in range(PARTITIONS):
        start = (epoch * PARTITIONS + p) * ROWS
        out.append(write_participant(backend, TransactionContext(SINK, epoch, p),
                                     iter([batch(range(start, start + ROWS))])))
    return out


def expected_ids(epochs: list[int]) -> list[int]:
    return sorted(i for e in epochs for i in range(e * PARTITIONS * ROWS,
                                                     (e + 1) * PARTITIONS * ROWS))


def check_output(s3_server: S3Server, backend: S3Backend, epochs: list[int]) -> None:
    base = backend.base(SINK)
    ids = s3_server.read_ids(base + "/")
    want = expected_ids(epochs)
    assert len(ids) == len(want) and sum(ids) == sum(want)
    assert sorted(ids) == want
    assert s3_server.uploads(base + "/") == []
    for epoch in epochs:
        key = keys.manifest_key(base, epoch)
        s3_server.client().head_object(Bucket=s3_server.bucket, Key=key)


def coordinator(backend: S3Backend, state: Path, faults: FaultInjector | None = None,
                retry: RetryPolicy | None = None) -> Coordinator:
    return Coordinator(backend, DirectoryStateStore(state), SINK, plugins=build_plugins(),
                       faults=faults or FaultInjector(), retry=retry)


def test_prepared_uploads_survive_a_server_crash(s3_server: S3Server, prefix: str,
                                                 tmp_path: Path) -> None:
    server = s3_server.require_local()
    backend = backend_for(s3_server, prefix)
    coord = coordinator(backend, tmp_path)
    coord.start()
    msgs = prepare_epoch(backend, 0)
    server.restart()
    backend.close()  # drop pooled connections to the dead server
    assert coord.commit_epoch(0, msgs) is EpochOutcome.COMMITTED
    check_output(s3_server, backend, [0])


def test_server_crash_during_commit_then_recovery(s3_server: S3Server, prefix: str,
                                                  tmp_path: Path) -> None:
    """Killed after the first participant is committed: the epoch stays DECIDED, the
    next start (server back) commits the rest, the first one is ALREADY_COMMITTED."""
    server = s3_server.require_local()
    backend = backend_for(s3_server, prefix)

    def kill_server(point: str, epoch: int | None) -> None:
        if point == AFTER_FIRST_COMMIT:
            server.kill()

    quick = RetryPolicy(attempts=2, initial_backoff_s=0.05, max_backoff_s=0.1)
    first = coordinator(backend, tmp_path, FaultInjector(callback=kill_server), quick)
    first.start()
    msgs = prepare_epoch(backend, 0)
    try:
        with pytest.raises(RetriableCommitError, match="stays DECIDED"):
            first.commit_epoch(0, msgs)
    finally:
        server.start()
    backend.close()
    # An orphan of the next epoch, prepared before the crash, is cleaned up too.
    orphan = prepare_epoch(backend, 1)[0]
    second = coordinator(backend, tmp_path)
    report = second.start()
    assert report.recommitted_epochs == [0]
    assert orphan.participant in report.aborted_orphans
    check_output(s3_server, backend, [0])


@pytest.mark.promise("target-restart-retried", "backend")
def test_commit_retries_ride_over_a_server_restart(s3_server: S3Server, prefix: str,
                                                   tmp_path: Path) -> None:
    """The server is back while the coordinator is still retrying: no error at all."""
    server = s3_server.require_local()
    backend = backend_for(s3_server, prefix)
    restarted = threading.Event()
    errors: list[BaseException] = []

    def restart() -> None:
        try:
            server.start()
        except BaseException as exc:  # reported by the test below
            errors.append(exc)
        finally:
            restarted.set()

    def crash_and_restart(point: str, epoch: int | None) -> None:
        if point == AFTER_FIRST_COMMIT and epoch == 1:
            server.kill()
            threading.Thread(target=restart, daemon=True).start()

    # Up to ~75 s of retries: a restart takes 4-10 s here, longer on a loaded machine.
    patient = RetryPolicy(attempts=40, initial_backoff_s=0.2, max_backoff_s=2.0)
    coord = coordinator(backend, tmp_path, FaultInjector(callback=crash_and_restart), patient)
    coord.start()
    assert coord.commit_epoch(0, prepare_epoch(backend, 0)) is EpochOutcome.COMMITTED
    msgs = prepare_epoch(backend, 1)
    try:
        assert coord.commit_epoch(1, msgs) is EpochOutcome.COMMITTED
    finally:
        restarted.wait(120)
    assert errors == []
    check_output(s3_server, backend, [0, 1])
