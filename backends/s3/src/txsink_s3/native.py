"""The native data path into S3: Spark's own Parquet writer prepares the participants.

With ``writer: spark`` an S3 target is written by Spark's Parquet writer through
``s3a://`` instead of txsink's Python writer, with the commit protocol of
:mod:`txsink_s3.jvm` (``NativeCommitProtocol``): S3A's magic committer uploads each
task's one file as a multipart upload to exactly the key txsink's own writer gives that
task (``<sink>/epoch=N/part-<partition>-a<attempt>.parquet``, attempt = Spark's task
attempt id) and nothing completes it. Spark's job commit lists the uploads of the tasks
Spark's commit coordinator let commit, with the rows each wrote, in
``<sink>/_txsink/native/epoch=N/<job>/job.json``.

:func:`participants` reads that document and returns one committable per upload, the
same committable txsink's own writer returns for that task: so the decision, commit
(``CompleteMultipartUpload``), abort, the orphan scan (uploads of failed, retried and
speculative attempts name no participant of a decision), the epoch manifest and
``txsink cut`` are the S3 target's own. Nothing else stays behind: the job document is
deleted once read, and the orphan scan deletes the documents and S3A's magic
directories of writes that never got that far (:func:`leftovers`).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from txsink.errors import ConfigError, StateError
from txsink.faults import S3_NATIVE_AFTER_WRITE, FaultInjector
from txsink.model import Committable, TransactionContext, parse_participant

from txsink_s3 import keys

if TYPE_CHECKING:
    from txsink_s3.backend import S3Backend

log = logging.getLogger(__name__)

JOB_FORMAT = "txsink-s3-native-job"
JOB_VERSION = 1
#: Spark's name for each compression txsink's own writer offers.
SPARK_CODECS = {"snappy": "snappy", "zstd": "zstd", "gzip": "gzip", "lz4": "lz4_raw",
                "none": "uncompressed"}
#: S3A's path capability of a bucket it writes through the magic committer.
MAGIC_CAPABILITY = "fs.s3a.capability.magic.committer"
#: Characters a prefix must not hold for this path: Hadoop paths take ``%XX`` for an
#: escape and refuse ``:`` in a path segment, so S3A would write other keys.
HADOOP_UNSAFE = frozenset("%:")
_DIRNAME = re.compile(r"^(?P<participant>[A-Za-z0-9_-]+)\.[0-9a-f]{12}$")

#: (Spark application id, endpoint, bucket) pairs whose s3a:// was checked to reach the
#: backend's store.
_checked: set[tuple[str, str, str]] = set()
_checked_lock = threading.Lock()


def check_options(prefix: str, fmt: str) -> None:
    """``writer: spark`` with options the native path can write (no I/O)."""
    if fmt != "parquet":
        raise ConfigError(f"s3 backend: writer 'spark' (Spark's own Parquet writer) writes "
                          f"format parquet only, not {fmt!r}; use writer 'txsink' for "
                          f"{fmt}", field="writer")
    bad = sorted({c for c in prefix if c in HADOOP_UNSAFE})
    if bad:
        raise ConfigError(f"s3 backend: writer 'spark' writes through Hadoop paths, which "
                          f"read {bad!r} in the prefix {prefix[:80]!r} as something else "
                          "(an escape, a scheme); choose a prefix without them or use "
                          "writer 'txsink'", field="prefix")


def job_dir(base: str, epoch: int, dirname: str) -> str:
    return f"{base}/{keys.BOOKKEEPING_DIR}/native/epoch={epoch}/{dirname}"


def job_key(base: str, epoch: int, dirname: str) -> str:
    return f"{job_dir(base, epoch, dirname)}/job.json"


def staging(backend: S3Backend, ctx: TransactionContext) -> tuple[str, str]:
    """The output path Spark's writer is given (where its job document goes) and its
    name; the job name also names S3A's magic directory (``__magic_job-<name>``)."""
    dirname = f"{ctx.participant}.{uuid.uuid4().hex[:12]}"
    base = backend.base(ctx.sink_id)
    return f"s3a://{backend.bucket}/{job_dir(base, ctx.epoch, dirname)}", dirname


def write_options(backend: S3Backend) -> dict[str, str]:
    """The write's options: the protocol switched on, one file per task, the codec."""
    opts = {"txsink.s3.native": "true", "maxRecordsPerFile": "0",
            "compression": SPARK_CODECS[backend.compression],
            # S3A's own job cleanup must never abort the sink's prepared uploads.
            "fs.s3a.committer.abort.pending.uploads": "false"}
    if backend.dictionary == "none":
        opts["parquet.enable.dictionary"] = "false"
    return opts


def session_conf(backend: S3Backend, spark: Any) -> dict[str, str]:
    """Check that Spark can write the target through the protocol, then name it.

    Refused before anything is written: no JVM (Spark Connect), txsink-s3's jar or
    hadoop-aws missing, S3A's magic committer off for the bucket, or Spark's ``s3a://``
    reaching another store than the backend's ``endpoint_url`` (checked by writing a
    probe object through S3A and looking for it with the backend's own client, once per
    Spark application, endpoint and bucket).
    """
    from txsink_s3.jvm import PROTOCOL_CLASS

    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        raise ConfigError("s3 backend: writer 'spark' needs a Spark driver with a JVM (not "
                          "a Spark Connect client); use writer 'txsink'", field="writer")
    try:
        jvm.org.apache.spark.util.Utils.classForName(PROTOCOL_CLASS, True, False)
    except Exception:
        raise ConfigError(
            f"s3 backend: writer 'spark' needs txsink-s3's jar on Spark's class path "
            f"({PROTOCOL_CLASS} is not there): build it with `python -m txsink_s3.jvm "
            "build`, then add the path `python -m txsink_s3.jvm path` prints to "
            "spark.jars (or spark.driver/executor.extraClassPath)", field="writer") from None
    app = str(spark.sparkContext.applicationId)
    where = (app, backend.endpoint_url or "", backend.bucket)
    with _checked_lock:
        if where in _checked:
            return {"spark.sql.sources.commitProtocolClass": PROTOCOL_CLASS}
    _probe(backend, spark)
    with _checked_lock:
        _checked.add(where)
    return {"spark.sql.sources.commitProtocolClass": PROTOCOL_CLASS}


def _probe(backend: S3Backend, spark: Any) -> None:
    """Write a probe object through Spark's ``s3a://`` and find it with boto3."""
    from botocore.exceptions import ClientError  # type: ignore[import-untyped,unused-ignore]

    from txsink_s3.conditional import error_code, status

    store = backend.endpoint_url or "AWS"
    key = f"{backend.prefix + '/' if backend.prefix else ''}{keys.BOOKKEEPING_DIR}/" \
          f"native-probe-{uuid.uuid4().hex}"
    jvm = spark._jvm
    try:
        conf = spark._jsparkSession.sessionState().newHadoopConf()
        path = jvm.org.apache.hadoop.fs.Path(f"s3a://{backend.bucket}/{key}")
        fs = path.getFileSystem(conf)
    except Exception as exc:
        raise ConfigError(
            "s3 backend: writer 'spark' writes through s3a://, which this Spark session "
            "does not have: put hadoop-aws matching Spark's Hadoop (and its AWS SDK "
            f"bundle) on the driver and executor class path ({_first_line(exc)})",
            field="writer") from None
    if not fs.hasPathCapability(path, MAGIC_CAPABILITY):
        raise ConfigError(
            f"s3 backend: Spark's s3a:// does not offer S3A's magic committer for bucket "
            f"{backend.bucket!r}: set fs.s3a.committer.magic.enabled=true (or "
            f"fs.s3a.bucket.{backend.bucket}.committer.magic.enabled) in Spark's Hadoop "
            "settings", field="writer")
    try:
        out = fs.create(path, True)
        out.write(bytearray(b"txsink native path probe"))
        out.close()
    except Exception as exc:
        raise ConfigError(f"s3 backend: Spark cannot write s3a://{backend.bucket}/{key} "
                          f"({_first_line(exc)}): check Spark's fs.s3a.* settings for this "
                          "bucket", field="writer") from None
    try:
        try:
            backend.client.head_object(Bucket=backend.bucket, Key=key)
        except ClientError as exc:
            if status(exc) == 404 or error_code(exc) in ("404", "NoSuchKey", "NotFound"):
                raise ConfigError(
                    f"s3 backend: Spark's s3a:// reaches another store than this target's "
                    f"endpoint {store}: an object Spark wrote to s3a://{backend.bucket}/{key} "
                    "is not there. Point Spark's fs.s3a.endpoint (or fs.s3a.bucket."
                    f"{backend.bucket}.endpoint) at {store}, or this target's endpoint_url "
                    "at Spark's", field="endpoint_url") from None
            raise
    finally:
        try:
            fs.delete(path, False)
        except Exception:
            log.debug("could not delete the probe s3a://%s/%s", backend.bucket, key,
                      exc_info=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def participants(backend: S3Backend, ctx: TransactionContext,
                 dirname: str) -> list[Committable]:
    """The uploads Spark's writer left pending for ``ctx``'s write, one committable each.

    Checked before anything is recorded: the job document is the one this write's job
    committed (its name and epoch folder), every upload is in the bucket at the key
    txsink's writer gives its task, and each task's rows are known. An upload without
    rows (Spark writes a file with only the schema for an empty first task) is aborted
    here instead of published.
    """
    from botocore.exceptions import ClientError  # type: ignore[import-untyped,unused-ignore]

    from txsink_s3.conditional import error_code, status

    FaultInjector.from_env().hit(S3_NATIVE_AFTER_WRITE, ctx.epoch)
    if not _DIRNAME.match(dirname):
        raise StateError(f"s3 backend: {ctx.describe()}: {dirname!r} is not a job name of "
                         "the native path", sink_id=ctx.sink_id, epoch=ctx.epoch)
    base = backend.base(ctx.sink_id)
    key = job_key(base, ctx.epoch, dirname)
    where = f"s3://{backend.bucket}/{key}"
    try:
        body = backend._retrying(
            f"{ctx.describe()}: reading the native job document",
            lambda: backend.client.get_object(Bucket=backend.bucket, Key=key)["Body"].read())
    except ClientError as exc:
        if status(exc) == 404 or error_code(exc) in ("404", "NoSuchKey"):
            raise StateError(
                f"s3 backend: {ctx.describe()}: Spark's writer finished but left no job "
                f"document at {where}: Spark's s3a:// wrote somewhere else (another "
                "store or bucket than this target's), or another run of this sink deleted "
                "it; nothing of this write is recorded, its uploads are aborted as orphans",
                sink_id=ctx.sink_id, epoch=ctx.epoch) from None
        raise
    doc = _parse(body, where)
    if doc["job"] != dirname or doc["dir"] != f"epoch={ctx.epoch}":
        raise StateError(f"s3 backend: {where} names job {doc['job']!r} in {doc['dir']!r}, "
                         f"not this write's {dirname!r} of epoch {ctx.epoch}",
                         sink_id=ctx.sink_id, epoch=ctx.epoch)
    found: list[Committable] = []
    empty: list[Committable] = []
    seen: set[int] = set()
    for f in doc["files"]:
        task = TransactionContext(ctx.sink_id, ctx.epoch, f["partition"], f["attempt"])
        want = keys.data_key(base, task, "parquet")
        if f["key"] != want or f["bucket"] != backend.bucket:
            raise StateError(
                f"s3 backend: {where}: task {task.partition} uploaded "
                f"s3://{f['bucket']}/{f['key']}, not s3://{backend.bucket}/{want}",
                sink_id=ctx.sink_id, epoch=ctx.epoch, participant=task.participant)
        if task.partition in seen:
            raise StateError(f"s3 backend: {where} lists task {task.partition} twice: two "
                             "attempts of one task committed", sink_id=ctx.sink_id,
                             epoch=ctx.epoch, participant=task.participant)
        seen.add(task.partition)
        c = committable(backend, task, f)
        (found if c.rows else empty).append(c)
    for c in empty:
        backend.abort(c)
    try:
        # Read once: the document, and S3A's magic directory of the job (what a bucket
        # whose S3A tracks pending uploads as objects leaves: directory markers, failed
        # attempts' .pending files) are of no more use.
        magic = [str(o["Key"]) for page in backend.client.get_paginator(
            "list_objects_v2").paginate(Bucket=backend.bucket,
                                        Prefix=f"{base}/__magic_job-{dirname}/")
                 for o in page.get("Contents", []) or []]
        doomed = [key, *magic]
        for i in range(0, len(doomed), 1000):  # DeleteObjects takes 1,000 keys at most
            backend.client.delete_objects(Bucket=backend.bucket, Delete={
                "Objects": [{"Key": k} for k in doomed[i:i + 1000]], "Quiet": True})
    except Exception:
        log.debug("%s: could not delete %s (the orphan scan does)", ctx.describe(), where,
                  exc_info=True)
    log.debug("%s: Spark's writer prepared %d upload(s) in %d task(s) (%d without rows)",
              ctx.describe(), len(found), doc["tasks"], len(empty))
    return sorted(found, key=lambda c: c.partition)


def committable(backend: S3Backend, task: TransactionContext,
                f: Mapping[str, Any]) -> Committable:
    """The committable of one pending upload: what txsink's writer returns for it."""
    from txsink_s3.backend import multipart_etag

    etags = [str(e) for e in f["etags"]]
    payload = {"bucket": backend.bucket, "key": f["key"], "format": "parquet",
               "upload_id": f["upload_id"],
               "parts": [[n, etag] for n, etag in enumerate(etags, start=1)],
               "etag": multipart_etag(etags), "size": int(f["size"]), "native": True}
    return Committable.for_context(backend.name, task, payload, rows=int(f["rows"]),
                                   payload_version=backend.payload_version)


def _parse(body: bytes, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(body)
        if doc.get("format") != JOB_FORMAT:
            raise ValueError("not a txsink native job document")
        if doc.get("version") != JOB_VERSION:
            raise ValueError(f"version {doc.get('version')!r}, this release reads "
                             f"{JOB_VERSION}")
        files = doc["files"]
        for f in files:
            for name in ("partition", "attempt", "rows", "size"):
                if not isinstance(f[name], int) or f[name] < 0:
                    raise ValueError(f"{name} {f[name]!r}")
            if not f["etags"] or not f["upload_id"]:
                raise ValueError(f"an upload of {f['key']!r} without parts")
        str(doc["job"])
        int(doc["tasks"])
    except (ValueError, KeyError, TypeError) as exc:
        raise StateError(f"s3 backend: {where} is not a job document txsink can read "
                         f"({exc}): was the jar on Spark's class path built from another "
                         "release of txsink-s3?") from None
    return dict(doc)


def leftovers(backend: S3Backend, sink_id: str, up_to_epoch: int | None) -> list[str]:
    """Delete what native writes of epochs ``<= up_to_epoch`` left behind when they
    stopped before their job document was read: the document itself, and S3A's magic
    directory of a bucket that tracks pending uploads in S3. Their uploads are the
    orphan scan's. Returns the keys deleted."""
    base = backend.base(sink_id)
    doomed: list[str] = []
    for prefix in (f"{base}/{keys.BOOKKEEPING_DIR}/native/", f"{base}/__magic_job-"):
        pages = backend.client.get_paginator("list_objects_v2").paginate(
            Bucket=backend.bucket, Prefix=prefix)
        for page in pages:
            for obj in page.get("Contents", []) or []:
                name = str(obj["Key"])
                epoch = _epoch_of(name[len(base) + 1:])
                if epoch is not None and (up_to_epoch is None or epoch <= up_to_epoch):
                    doomed.append(name)
    for i in range(0, len(doomed), 1000):
        backend.client.delete_objects(Bucket=backend.bucket, Delete={
            "Objects": [{"Key": k} for k in doomed[i:i + 1000]], "Quiet": True})
    if doomed:
        log.info("sink=%s: deleted %d object(s) native writes left behind", sink_id,
                 len(doomed))
    return doomed


def _epoch_of(relative: str) -> int | None:
    """The epoch of a native write's leftover from its job name (None: not one)."""
    parts = relative.split("/")
    if parts[0].startswith("__magic_job-"):
        name = parts[0][len("__magic_job-"):]
    elif len(parts) >= 4 and parts[:2] == [keys.BOOKKEEPING_DIR, "native"]:
        name = parts[3]
    else:
        return None
    m = _DIRNAME.match(name)
    ctx = parse_participant(m["participant"]) if m else None
    return ctx.epoch if ctx is not None else None


def discard(backend: S3Backend, ctx: TransactionContext, dirname: str, *,
            still_ours: Callable[[], bool] | None = None) -> None:
    """Undo a native write of ``ctx``'s epoch that never became participants: its job
    document (if Spark's job got that far) and its magic directory deleted, and every
    upload pending in the epoch's folder aborted (a target is written once per epoch by
    the run that reserved it, so they are this write's: its tasks' winners and the
    attempts that lost).

    Another run may have reserved the epoch since (a second driver of the query took it
    over while this write's Spark job ran) and prepared its own uploads there, which
    nothing tells from this write's. ``still_ours`` is asked after the listing: an
    upload listed was started before it, so a run that started it had reserved the
    epoch before too, and the answer is no. Then no upload is aborted here (the owner's
    orphan scan aborts this write's), only this job's own document and directory go."""
    from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped,unused-ignore]

    if not _DIRNAME.match(dirname):
        return
    base = backend.base(ctx.sink_id)
    client, bucket = backend.client, backend.bucket
    try:
        pending: list[tuple[str, str]] = []
        pages = client.get_paginator("list_multipart_uploads").paginate(
            Bucket=bucket, Prefix=f"{base}/epoch={ctx.epoch}/")
        for page in pages:
            for upload in page.get("Uploads", []) or []:
                found = keys.parse_data_key(base, ctx.sink_id, str(upload["Key"]))
                if found is not None and found.epoch == ctx.epoch:
                    pending.append((str(upload["Key"]), str(upload["UploadId"])))
        if pending and still_ours is not None and not still_ours():
            log.warning("%s: the epoch was reserved by another run while this native write "
                        "ran; its %d pending upload(s) may be that run's participants, so "
                        "none is aborted here (the owner's orphan scan aborts this write's)",
                        ctx.describe(), len(pending))
            pending = []
        for key, upload_id in pending:
            backend._abort_upload(bucket, key, upload_id, ctx.describe())
        doomed = [str(o["Key"]) for prefix in (f"{job_dir(base, ctx.epoch, dirname)}/",
                                               f"{base}/__magic_job-{dirname}/")
                  for page in client.get_paginator("list_objects_v2").paginate(
                      Bucket=bucket, Prefix=prefix)
                  for o in page.get("Contents", []) or []]
        for i in range(0, len(doomed), 1000):
            client.delete_objects(Bucket=bucket, Delete={
                "Objects": [{"Key": k} for k in doomed[i:i + 1000]], "Quiet": True})
    except (BotoCoreError, ClientError) as exc:
        log.warning("%s: undoing the native write failed (%s); the next orphan scan "
                    "aborts what it left", ctx.describe(), backend._redact(str(exc)))
        return
    log.info("%s: the native write was undone: %d upload(s) aborted, %d object(s) "
             "deleted", ctx.describe(), len(pending), len(doomed))
