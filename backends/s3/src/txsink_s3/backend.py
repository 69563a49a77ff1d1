"""The S3 backend: one multipart upload per participant.

Protocol mapping (docs/backends/s3.md):

* ``begin_transaction``/``write``: rows are encoded as they arrive (Parquet, JSON
  Lines or CSV) and uploaded as parts of ``part_size`` bytes; the upload itself is
  created with the first part, so memory is bounded by the part size (plus one
  Parquet row group and the parts in flight), never by the partition.
* ``pre_commit``: uploads the last part and returns bucket, key, upload id and
  part ETags. The object is invisible until the upload is completed.
* ``commit``: ``CompleteMultipartUpload``, of an epoch's participants in parallel
  (``commit_concurrency``). Idempotent: when the server no longer knows the upload,
  an object under the key with the expected multipart ETag (or the participant's
  own token) means it was committed before; no such object means a lost
  participant, raising :class:`ParticipantLostError`.
* ``abort``: ``AbortMultipartUpload``; orphans come from ``ListMultipartUploads``
  under the sink's prefix.
* ``epoch_committed``: writes the epoch manifest that downstream readers wait for.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from txsink.backend import Backend, Capability, CommitOutcome, Transaction
from txsink.errors import (
    ConfigError,
    ParticipantLostError,
    RetriableCommitError,
    ServerUnavailableError,
    SinkOwnedError,
    TxsinkError,
)
from txsink.model import Committable, DeliveryGuarantee, TransactionContext, validate_sink_id
from txsink.options import Options, Secret
from txsink.redact import redact

from txsink_s3 import keys, native
from txsink_s3.conditional import error_code, probe_conditional_put, status
from txsink_s3.fast_complete import FastCompleter
from txsink_s3.formats import Encoder, PartBuffer, make_encoder
from txsink_s3.session import shared_botocore_session

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

_T = TypeVar("_T")
MIB = 1024 * 1024
#: S3's smallest part (every part but the last) and largest part.
MIN_PART_SIZE = 5 * MIB
MAX_PART_SIZE = 5 * 1024 * MIB
MAX_PARTS = 10_000
DEFAULT_PART_SIZE = 16 * MIB
FORMATS = ("parquet", "jsonl", "csv")
#: Option ``writer``: txsink's Python writer, or Spark's own Parquet writer (native path).
WRITERS = ("txsink", "spark")
COMPRESSIONS = ("snappy", "zstd", "gzip", "lz4", "none")
#: CompleteMultipartUpload requests one commit_all keeps in flight (option
#: ``commit_concurrency``): each waits on the server, not on this process.
#: Epoch manifests kept (``manifest_retention_epochs``); readers of older epochs list
#: their ``epoch=<N>/`` prefix instead.
DEFAULT_MANIFEST_RETENTION = 10_000
#: Manifests are pruned once every this many epochs.
MANIFEST_PRUNE_EVERY = 100
DEFAULT_COMMIT_CONCURRENCY = 16
MAX_COMMIT_CONCURRENCY = 64
MANIFEST_FORMAT = "txsink-s3-epoch-manifest"
MANIFEST_VERSION = 1
#: Object metadata keys (boto3 returns user metadata keys in lower case).
META_PARTICIPANT = "txsink-participant"
META_TOKEN = "txsink-token"

_pool: ThreadPoolExecutor | None = None
_pool_pid = 0
_pool_lock = threading.Lock()


def commit_pool() -> ThreadPoolExecutor:
    """The threads every S3 backend of this process completes uploads on (at most
    :data:`MAX_COMMIT_CONCURRENCY`; each ``commit_all`` uses ``commit_concurrency`` of
    them). A forked child makes its own: the parent's threads are not there."""
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():
            _pool = ThreadPoolExecutor(max_workers=MAX_COMMIT_CONCURRENCY,
                                       thread_name_prefix="txsink-s3-commit")
            _pool_pid = os.getpid()
        return _pool


_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmg]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1024, "m": MIB, "g": 1024 * MIB}


def parse_size(opts: Options, key: str, default: int, *, minimum: int, maximum: int,
               why_minimum: str) -> int:
    """A byte size option: ``8388608``, ``8MiB``, ``8m`` and ``8MB`` all mean 8 MiB."""
    raw = opts.optional(key)
    if raw is None:
        return default
    m = _SIZE_RE.match(raw.replace("_", ""))
    if m is None:
        raise ConfigError(f"s3 backend: option '{key}' must be a size in bytes such as "
                          f"16777216 or 16MiB, got {raw!r}", field=key)
    unit = (m[2] or "").lower()[:1]
    value = int(m[1]) * _UNITS[unit]
    if value < minimum:
        raise ConfigError(f"s3 backend: option '{key}' must be at least {minimum // MIB} MiB "
                          f"({minimum} bytes), got {value} bytes: {why_minimum}", field=key)
    if value > maximum:
        raise ConfigError(f"s3 backend: option '{key}' must be at most {maximum // MIB} MiB, "
                          f"got {value} bytes", field=key)
    return value


def default_row_group_bytes(part_size: int) -> int:
    """A quarter of the part (Arrow bytes), at least 1 MiB.

    pyarrow's Parquet writer peaks at several times the Arrow size of the row group
    it encodes (measured ~5x with dictionary encoding), so row groups of a whole part
    would make the encoder, not the part, the biggest thing in memory.
    """
    return max(MIB, part_size // 4)


def multipart_etag(part_etags: Sequence[str]) -> str | None:
    """The ETag S3 gives a completed multipart object: md5 of the part md5s, ``-N``.

    ``None`` when a part ETag is not a plain MD5 (e.g. SSE-KMS on AWS); the commit
    check then relies on the participant token stored in the object's metadata.
    """
    digests = []
    for etag in part_etags:
        raw = etag.strip('"')
        if not re.fullmatch(r"[0-9a-fA-F]{32}", raw):
            return None
        digests.append(bytes.fromhex(raw))
    return f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(digests)}"


_error_code = error_code
_status = status

#: (endpoint, bucket) -> whether conditional PUTs are honoured, probed once per process.
_conditional: dict[tuple[str, str], bool] = {}
_conditional_lock = threading.Lock()


#: Words of connection failures that only mean "not reachable right now".
_DNS_FAILURES = ("name or service not known", "nodename nor servname", "failed to resolve",
                 "temporary failure in name resolution", "no address associated")


def _transient(exc: BaseException) -> bool:
    """A failure that waiting may cure: connection refused/reset/timed out, or a 5xx."""
    from botocore.exceptions import (  # type: ignore[import-untyped,unused-ignore]
        ClientError,
        ConnectionClosedError,
        ConnectTimeoutError,
        EndpointConnectionError,
        ReadTimeoutError,
    )

    if isinstance(exc, ClientError):
        status = _status(exc)
        return status is not None and status >= 500
    if isinstance(exc, EndpointConnectionError):
        text = str(getattr(exc, "kwargs", {}).get("error", exc)).lower()
        return not any(word in text for word in _DNS_FAILURES)
    return isinstance(exc, (ConnectionClosedError, ConnectTimeoutError, ReadTimeoutError))


class _S3Transaction(Transaction):
    """One participant on the executor: the open upload and its encoder."""

    def __init__(self, ctx: TransactionContext, key: str, encoder_factory: Any) -> None:
        super().__init__(ctx)
        self.key = key
        self.token = uuid.uuid4().hex
        self.upload_id: str | None = None
        self.buffer = PartBuffer()
        self.encoder: Encoder = encoder_factory(self.buffer)
        self.parts: dict[int, str] = {}
        self.next_part = 1
        self.size = 0
        self.pending: list[tuple[int, Future[str]]] = []
        self.pool: ThreadPoolExecutor | None = None


#: Longest prefix: S3 keys hold at most 1024 bytes and txsink appends up to ~200.
MAX_PREFIX_BYTES = 512
_GLOB_CHARS = frozenset("*?[]{}\\")


class S3Backend(Backend):
    """Writes each participant as one object through a multipart upload."""

    name: ClassVar[str] = "s3"
    capabilities: ClassVar[frozenset[Capability]] = frozenset({
        Capability.COMMIT_FROM_ANY_PROCESS,
        Capability.LIST_PREPARED,
        Capability.COMMIT_MARKER,
        Capability.SURVIVES_RESTART,
    })
    secret_options: ClassVar[frozenset[str]] = frozenset({"secret_access_key", "session_token"})
    connect_retry_option: ClassVar[str | None] = "connect_retry_s"
    #: at_least_once / none complete the upload in the task (the default finish_in_task).
    guarantees: ClassVar[frozenset[DeliveryGuarantee]] = frozenset(DeliveryGuarantee)
    payload_version: ClassVar[int] = 1
    #: ``writer: spark`` takes Spark's own Parquet writer (:meth:`native_parquet_for`).
    native_parquet: ClassVar[bool] = False

    def __init__(
        self,
        *,
        bucket: str,
        prefix: str = "",
        fmt: str = "parquet",
        part_size: int = DEFAULT_PART_SIZE,
        row_group_bytes: int | None = None,
        compression: str = "snappy",
        dictionary: str = "auto",
        upload_concurrency: int = 2,
        endpoint_url: str | None = None,
        region: str | None = None,
        addressing_style: str = "auto",
        profile: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: Secret | None = None,
        session_token: Secret | None = None,
        max_attempts: int = 5,
        connect_timeout: float = 10.0,
        read_timeout: float = 120.0,
        connect_retry_s: float = 30.0,
        commit_concurrency: int = DEFAULT_COMMIT_CONCURRENCY,
        manifest_retention_epochs: int = DEFAULT_MANIFEST_RETENTION,
        writer: str = "txsink",
    ) -> None:
        self.bucket = bucket
        #: Who writes the objects: txsink's Python writer, or Spark's own Parquet writer
        #: (the native data path, :mod:`txsink_s3.native`).
        self.writer = writer
        self.commit_concurrency = commit_concurrency
        self.manifest_retention_epochs = manifest_retention_epochs
        self.connect_retry_s = connect_retry_s
        self.prefix = keys.normalize_prefix(prefix)
        self.format = fmt
        self.part_size = part_size
        self.row_group_bytes = row_group_bytes or default_row_group_bytes(part_size)
        self.compression = compression
        self.dictionary = dictionary
        self.upload_concurrency = upload_concurrency
        self.endpoint_url = endpoint_url
        self.region = region
        self.addressing_style = addressing_style
        self.profile = profile
        self.access_key_id = access_key_id
        self.secret_access_key = secret_access_key
        self.session_token = session_token
        self.max_attempts = max_attempts
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._s3: Any = None
        self._session: Any = None
        #: False: not looked at yet; None: commits go through boto3 only.
        self._fast: FastCompleter | bool | None = False
        #: Cleared for a server that refuses If-None-Match on CompleteMultipartUpload.
        self._conditional_complete = True
        #: Whether an orphan scan looked for what native writes leave besides uploads.
        self._native_swept = False

    # -- configuration ------------------------------------------------------------------

    @classmethod
    def destination(cls, options: Mapping[str, str]) -> dict[str, str]:
        # Where the objects go: the store (endpoint), the bucket and the key layout under
        # it. Region, credentials, part sizes and concurrency only say how to get there.
        return {"endpoint_url": str(options.get("endpoint_url") or ""),
                "bucket": str(options.get("bucket") or "").strip(),
                "prefix": keys.normalize_prefix(str(options.get("prefix") or ""))}

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> S3Backend:
        opts = Options(options, owner="s3 backend", secret_keys=cls.secret_options)
        bucket = opts.str("bucket", required=True).strip()
        if not _BUCKET_RE.match(bucket) or ".." in bucket:
            raise ConfigError(
                f"s3 backend: option 'bucket' {bucket[:80]!r} is not a valid bucket name: "
                "use 3-63 characters from a-z 0-9 . - starting and ending with a letter or "
                "digit (just the name, not an s3:// URL)", field="bucket")
        prefix = opts.str("prefix", "")
        if any(part in (".", "..") for part in prefix.split("/")):
            raise ConfigError(f"s3 backend: option 'prefix' {prefix!r} must not contain "
                              "'.' or '..' segments", field="prefix")
        if len(prefix.encode()) > MAX_PREFIX_BYTES:
            raise ConfigError(f"s3 backend: option 'prefix' is {len(prefix.encode())} bytes; "
                              f"at most {MAX_PREFIX_BYTES} leave room for txsink's key names "
                              "within S3's 1024-byte key limit", field="prefix")
        bad = sorted({c for c in prefix if c in _GLOB_CHARS or not c.isprintable()})
        if bad:
            raise ConfigError(f"s3 backend: option 'prefix' {prefix[:80]!r} holds {bad!r}: "
                              "glob and control characters break readers that take the "
                              "path as a pattern (Spark, Hadoop)", field="prefix")
        fmt = opts.choice("format", FORMATS, "parquet")
        part_size = parse_size(opts, "part_size", DEFAULT_PART_SIZE, minimum=MIN_PART_SIZE,
                               maximum=MAX_PART_SIZE,
                               why_minimum="S3 rejects parts under 5 MiB except the last one")
        row_group = parse_size(opts, "row_group_bytes", default_row_group_bytes(part_size),
                               minimum=64 * 1024,
                               maximum=MAX_PART_SIZE, why_minimum="row groups that small "
                               "make Parquet files slow to read")
        compression = opts.choice("compression", COMPRESSIONS, "snappy")
        dictionary = opts.choice("parquet_dictionary", ("auto", "all", "none"), "auto")
        for key, value, default in (("compression", compression, "snappy"),
                                    ("parquet_dictionary", dictionary, "auto")):
            if value != default and fmt != "parquet":
                raise ConfigError(f"s3 backend: option '{key}' applies to format parquet "
                                  f"only (format is {fmt})", field=key)
        concurrency = opts.int("upload_concurrency", 2, minimum=1, maximum=16)
        endpoint_url = opts.optional("endpoint_url")
        if endpoint_url is not None and not re.match(r"^https?://[^/\s]+", endpoint_url):
            raise ConfigError(f"s3 backend: option 'endpoint_url' {endpoint_url!r} must be an "
                              "http:// or https:// URL such as http://127.0.0.1:8333",
                              field="endpoint_url")
        if endpoint_url is not None and "@" in endpoint_url.split("//", 1)[1].split("/", 1)[0]:
            raise ConfigError("s3 backend: option 'endpoint_url' must not hold credentials; "
                              "use access_key_id/secret_access_key or the AWS credential "
                              "chain", field="endpoint_url")
        region = opts.optional("region")
        addressing = opts.choice("addressing_style", ("auto", "path", "virtual"), "auto")
        profile = opts.optional("profile")
        access_key_id = opts.optional("access_key_id")
        secret = opts.secret("secret_access_key")
        token = opts.secret("session_token")
        if (access_key_id is None) != (secret is None):
            missing = "secret_access_key" if secret is None else "access_key_id"
            raise ConfigError(f"s3 backend: option '{missing}' is required when the other "
                              "of access_key_id/secret_access_key is given (or give neither "
                              "and let boto3 find credentials: environment, profile, "
                              "instance role)", field=missing)
        if token is not None and secret is None:
            raise ConfigError("s3 backend: option 'session_token' needs access_key_id and "
                              "secret_access_key", field="session_token")
        if profile is not None and secret is not None:
            raise ConfigError("s3 backend: give either 'profile' or explicit keys, not both",
                              field="profile")
        max_attempts = opts.int("max_attempts", 5, minimum=1, maximum=20)
        connect_timeout = opts.float("connect_timeout", 10.0, minimum=0.1)
        read_timeout = opts.float("read_timeout", 120.0, minimum=1.0)
        connect_retry_s = opts.float("connect_retry_s", 30.0, minimum=0.0)
        commit_concurrency = opts.int("commit_concurrency", DEFAULT_COMMIT_CONCURRENCY,
                                      minimum=1, maximum=MAX_COMMIT_CONCURRENCY)
        manifest_retention = opts.int("manifest_retention_epochs", DEFAULT_MANIFEST_RETENTION,
                                      minimum=0)
        writer = opts.choice("writer", WRITERS, "txsink")
        if writer == "spark":
            native.check_options(prefix, fmt)
        opts.check_unknown()
        return cls(bucket=bucket, prefix=prefix, fmt=fmt, part_size=part_size,
                   row_group_bytes=row_group, compression=compression, dictionary=dictionary,
                   upload_concurrency=concurrency, endpoint_url=endpoint_url, region=region,
                   addressing_style=addressing, profile=profile, access_key_id=access_key_id,
                   secret_access_key=secret, session_token=token, max_attempts=max_attempts,
                   connect_timeout=connect_timeout, read_timeout=read_timeout,
                   connect_retry_s=connect_retry_s, commit_concurrency=commit_concurrency,
                   manifest_retention_epochs=manifest_retention, writer=writer)

    def describe(self) -> str:
        where = f" endpoint={self.endpoint_url}" if self.endpoint_url else ""
        writer = " writer=spark" if self.writer == "spark" else ""
        return (f"s3://{self.bucket}/{self.prefix} format={self.format} "
                f"part_size={self.part_size}{writer}{where}")

    # -- the native data path: Spark's own Parquet writer (txsink_s3.native) ----------

    @classmethod
    def native_parquet_for(cls, options: Mapping[str, str]) -> bool:
        """``writer: spark``: Spark's Parquet writer prepares the participants."""
        return str(options.get("writer") or "txsink").strip() == "spark"

    def native_staging(self, ctx: TransactionContext) -> tuple[str, str]:
        return native.staging(self, ctx)

    def native_write_options(self) -> dict[str, str]:
        return native.write_options(self)

    def native_session_conf(self, spark: Any) -> dict[str, str]:
        return native.session_conf(self, spark)

    def committable_for_directory(self, ctx: TransactionContext, dirname: str) -> Committable:
        """One participant per upload here: see :meth:`committables_for_directory`."""
        raise NotImplementedError("s3 backend: Spark's writer prepares one participant per "
                                  "task; ask committables_for_directory")

    def committables_for_directory(self, ctx: TransactionContext,
                                   dirname: str) -> list[Committable]:
        return native.participants(self, ctx, dirname)

    def discard_staging(self, ctx: TransactionContext, dirname: str, *,
                        still_ours: Callable[[], bool] | None = None) -> None:
        """A native write that failed, or that the gate refused: abort what its job left
        pending and delete its job document and magic directory, now rather than at the
        next orphan scan (the uploads only while ``still_ours``)."""
        native.discard(self, ctx, dirname, still_ours=still_ours)

    def secret_values(self) -> list[str]:
        return [s.reveal() for s in (self.secret_access_key, self.session_token) if s]

    def base(self, sink_id: str) -> str:
        """The key prefix holding everything of ``sink_id`` (no trailing slash)."""
        return keys.sink_base(self.prefix, validate_sink_id(sink_id))

    # -- the client ---------------------------------------------------------------------

    @property
    def client(self) -> Any:
        """The boto3 S3 client, created on first use (never pickled to executors)."""
        if self._s3 is None:
            self._s3 = self._make_client(self.connect_timeout, self.read_timeout,
                                         {"max_attempts": self.max_attempts})
        return self._s3

    @property
    def fast(self) -> FastCompleter | None:
        """The lean path of commits (:mod:`txsink_s3.fast_complete`), where it applies."""
        if self._fast is False:
            client = self.client
            self._fast = FastCompleter.for_backend(
                self.endpoint_url, self.addressing_style, client, self._session,
                pool_size=max(10, self.commit_concurrency),
                connect_timeout=self.connect_timeout, read_timeout=self.read_timeout)
        return self._fast if isinstance(self._fast, FastCompleter) else None

    def _make_client(self, connect_timeout: float, read_timeout: float,
                     retries: dict[str, int]) -> Any:
        import boto3  # type: ignore[import-untyped,unused-ignore]
        from botocore.config import Config  # type: ignore[import-untyped,unused-ignore]

        session = self._session = boto3.session.Session(
            botocore_session=shared_botocore_session(),
            profile_name=self.profile,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=(self.secret_access_key.reveal()
                                   if self.secret_access_key else None),
            aws_session_token=self.session_token.reveal() if self.session_token else None,
            region_name=self.region,
        )
        config = Config(
            retries={**retries, "mode": "standard"},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            s3={"addressing_style": self.addressing_style},
            # Enough for the parts in flight and for commit_all's completions.
            max_pool_connections=max(10, self.upload_concurrency * 2,
                                     self.commit_concurrency),
        )
        return session.client("s3", endpoint_url=self.endpoint_url, config=config)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_s3"] = state["_session"] = None
        state["_fast"] = False
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("connect_retry_s", 30.0)
        state.setdefault("commit_concurrency", DEFAULT_COMMIT_CONCURRENCY)
        state.setdefault("_conditional_complete", True)
        state.setdefault("manifest_retention_epochs", DEFAULT_MANIFEST_RETENTION)
        state.setdefault("writer", "txsink")
        state.setdefault("_native_swept", False)
        state.setdefault("_session", None)
        state.setdefault("_fast", False)
        self.__dict__.update(state)

    def _retrying(self, what: str, action: Callable[[], _T]) -> _T:
        """Run ``action``, riding out an endpoint that restarts or is overloaded.

        Connection failures and 5xx answers are retried with logged, bounded backoff
        for ``connect_retry_s`` (on top of boto3's own short retries); anything else,
        and the last failure once time is up, is raised as it came.
        """
        deadline = time.monotonic() + self.connect_retry_s
        delay = 0.5
        attempt = 1
        while True:
            try:
                return action()
            except Exception as exc:
                if not _transient(exc) or time.monotonic() >= deadline:
                    raise
                log.warning("s3 backend: %s at %s failed (%s); attempt %d, retrying in "
                            "%.2fs", what, self.endpoint_url or "AWS",
                            self._redact(str(exc)), attempt, delay,
                            extra={"txsink_retry": True})
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                attempt += 1

    def close(self) -> None:
        client, self._s3 = self._s3, None
        fast, self._fast = self._fast, False
        if isinstance(fast, FastCompleter):
            fast.close()
        if client is not None:
            client.close()

    def _redact(self, text: str) -> str:
        return redact(text, self.secret_values())

    # -- preflight ----------------------------------------------------------------------

    def preflight(self, sink_id: str) -> None:
        """Bucket reachable, credentials valid, multipart uploads allowed; warn on lifecycle.

        The write probe starts and aborts a multipart upload under ``_txsink/``, so
        it leaves no object behind.
        """
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError  # type: ignore[import-untyped,unused-ignore]

        base = self.base(sink_id)
        where = f"s3://{self.bucket}" + (f" at {self.endpoint_url}" if self.endpoint_url else "")
        # The first request ends within the retry bound: an endpoint that accepts and
        # never answers held the default client for read_timeout (120 s) per attempt,
        # several attempts, while `txsink run` said it waited --connect-retry seconds.
        started = time.monotonic()
        deadline = started + self.connect_retry_s

        def head_bucket() -> Any:
            left = max(1.0, deadline - time.monotonic())
            quick = self._make_client(min(self.connect_timeout, left),
                                      min(self.read_timeout, left), {"total_max_attempts": 1})
            try:
                return quick.head_bucket(Bucket=self.bucket)
            finally:
                quick.close()

        try:
            self._retrying(f"sink={sink_id}: preflight", head_bucket)
        except NoCredentialsError:
            raise ConfigError(
                f"s3 backend: no AWS credentials found for {where}: set access_key_id and "
                "secret_access_key, a profile, or the AWS_ACCESS_KEY_ID/"
                "AWS_SECRET_ACCESS_KEY environment variables", field="access_key_id",
                sink_id=sink_id) from None
        except ClientError as exc:
            status, code = _status(exc), _error_code(exc)
            if status == 404 or code in ("404", "NoSuchBucket", "NotFound"):
                raise ConfigError(f"s3 backend: bucket {self.bucket!r} does not exist at "
                                  f"{where}; create it first (txsink never creates buckets)",
                                  field="bucket", sink_id=sink_id) from None
            if status in (401, 403):
                raise ConfigError(
                    f"s3 backend: access to bucket {self.bucket!r} denied at {where} "
                    f"(HTTP {status}): check the credentials (access_key_id/"
                    "secret_access_key, profile or environment) and the bucket policy",
                    field="secret_access_key" if self.secret_access_key else "access_key_id",
                    sink_id=sink_id) from None
            raise ConfigError(f"s3 backend: cannot use bucket {self.bucket!r} at {where}: "
                              f"{self._redact(str(exc))}", field="bucket",
                              sink_id=sink_id) from None
        except BotoCoreError as exc:
            field = "endpoint_url" if self.endpoint_url else "region"
            if _transient(exc):
                raise ServerUnavailableError(
                    f"s3 backend: {where} is down or unreachable: no answer in "
                    f"{time.monotonic() - started:.0f}s (retried for up to "
                    f"{self.connect_retry_s:g}s, connect_retry_s): "
                    f"{self._redact(str(exc))}", field=field, sink_id=sink_id) from None
            raise ConfigError(f"s3 backend: cannot reach {where}: "
                              f"{self._redact(str(exc))}; check {field}", field=field,
                              sink_id=sink_id) from None
        probe = keys.preflight_key(base)

        def probe_upload() -> None:
            upload = self.client.create_multipart_upload(Bucket=self.bucket, Key=probe)
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=probe,
                                               UploadId=upload["UploadId"])

        try:
            self._retrying(f"sink={sink_id}: preflight upload probe", probe_upload)
        except (ClientError, BotoCoreError) as exc:
            raise ConfigError(
                f"s3 backend: cannot start a multipart upload under "
                f"s3://{self.bucket}/{base}/ ({self._redact(str(exc))}): the credentials "
                "need s3:PutObject, s3:AbortMultipartUpload and s3:ListBucketMultipartUploads",
                field="bucket", sink_id=sink_id) from None
        self._warn_lifecycle(sink_id)

    def claim_sink(self, sink_id: str, state_id: str, state_location: str) -> None:
        """Record which txsink state owns ``sink_id`` (:meth:`_claim`); an endpoint that
        is down is "server down", not the client's own exception."""
        with self._claim_errors(sink_id):
            self._claim(sink_id, state_id, state_location)

    def check_claim(self, sink_id: str, state_id: str, state_location: str) -> None:
        """:meth:`claim_sink`'s refusal from the owner object as it is (a GET, no PUT)."""
        with self._claim_errors(sink_id):
            key = keys.owner_key(self.base(sink_id))
            where = f"s3://{self.bucket}/{key}"
            owner = self._read_owner(sink_id, key, where)
            if owner is not None:
                self._refuse_owner(owner, sink_id, state_id, state_location, where)

    @contextlib.contextmanager
    def _claim_errors(self, sink_id: str) -> Iterator[None]:
        """The claim's requests run without a preflight (`txsink resolve`, `cut`, a first
        start): their failures become what the preflight says, once retried."""
        from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped,unused-ignore]

        where = f"s3://{self.bucket}" + (f" at {self.endpoint_url}" if self.endpoint_url else "")
        field = "endpoint_url" if self.endpoint_url else "region"
        try:
            yield
        except (BotoCoreError, ClientError) as exc:
            said = self._redact(str(exc))
            if _transient(exc):
                raise ServerUnavailableError(
                    f"s3 backend: {where} is down or unreachable (retried for up to "
                    f"{self.connect_retry_s:g}s, connect_retry_s): {said}", field=field,
                    sink_id=sink_id) from None
            raise ConfigError(f"s3 backend: cannot read or write the owner object of sink "
                              f"{sink_id!r} in {where}: {said}", field="bucket",
                              sink_id=sink_id) from None

    def _claim(self, sink_id: str, state_id: str, state_location: str) -> None:
        """Record which txsink state owns ``sink_id`` in ``_txsink/owner.json``.

        A second query with the same sink id (another checkpoint) would abort this
        one's uploads as orphans, so it is refused with the owner's location. The
        owner object is created with ``If-None-Match: *``: of two queries that start
        at once, exactly one creates it; the other reads it and is refused. That
        header is a server promise, so it is probed first (once per process, endpoint
        and bucket); on a server that ignores it the claim is read before it is
        written and read back after, and a WARNING says what is left unguarded.
        """
        from botocore.exceptions import ClientError  # type: ignore[import-untyped,unused-ignore]

        key = keys.owner_key(self.base(sink_id))
        where = f"s3://{self.bucket}/{key}"
        document = {"sink_id": sink_id, "state_id": state_id, "state_location": state_location}
        conditional = self._conditional_puts(sink_id)
        for _ in range(10):
            owner = None if conditional else self._read_owner(sink_id, key, where)
            if owner is None:
                try:
                    self._retrying(
                        f"sink={sink_id}: creating the owner object",
                        lambda: self.client.put_object(
                            Bucket=self.bucket, Key=key, Body=json.dumps(document).encode(),
                            ContentType="application/json", IfNoneMatch="*"))
                    if conditional:
                        log.info("sink=%s: claimed for the txsink state at %s (%s)", sink_id,
                                 state_location, where)
                        return
                except ClientError as exc:
                    # 412: the owner object exists; 409: another claim of it is in flight.
                    if _status(exc) not in (409, 412) and _error_code(exc) not in (
                            "PreconditionFailed", "ConditionalRequestConflict"):
                        raise
                # Read back: what the server kept is the claim, whatever the PUT said.
                owner = self._read_owner(sink_id, key, where)
                if owner is None:
                    continue  # deleted (or not yet visible) in between: claim again
            self._refuse_owner(owner, sink_id, state_id, state_location, where)
            return
        raise ConfigError(f"sink id {sink_id!r}: the owner object {where} kept appearing "
                          "and disappearing; is something deleting it?", field="sink_id",
                          sink_id=sink_id)

    def _refuse_owner(self, owner: Mapping[str, Any], sink_id: str, state_id: str,
                      state_location: str, where: str) -> None:
        """Refuse ``state_id`` if the owner object names another state."""
        if str(owner["state_id"]) != state_id:
            raise SinkOwnedError(
                f"sink id {sink_id!r} under s3://{self.bucket}/{self.base(sink_id)}/ "
                f"belongs to the txsink state at {owner.get('state_location')!r}, not "
                f"{state_location!r}: two queries must not share a sink id. Use another "
                f"sink_id, or delete the owner object {where} if that state is gone for good",
                field="sink_id", sink_id=sink_id, owner_state=owner.get("state_location"))

    def _read_owner(self, sink_id: str, key: str, where: str) -> dict[str, Any] | None:
        """The owner object, or None where there is none."""
        from botocore.exceptions import ClientError  # type: ignore[import-untyped,unused-ignore]

        try:
            body = self._retrying(
                f"sink={sink_id}: reading the owner object",
                lambda: self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        except ClientError as exc:
            if _status(exc) == 404 or _error_code(exc) in ("NoSuchKey", "404"):
                return None
            raise
        try:
            owner = json.loads(body)
            str(owner["state_id"])
        except (ValueError, KeyError, TypeError):
            raise ConfigError(
                f"sink id {sink_id!r}: the owner object {where} is not txsink's; "
                "delete it if nothing else uses this sink id, then start again",
                field="sink_id", sink_id=sink_id) from None
        return dict(owner)

    def _conditional_puts(self, sink_id: str) -> bool:
        """Whether the endpoint honours ``If-None-Match``/``If-Match`` (probed once per
        process, endpoint and bucket); a WARNING the first time it does not."""
        where = (self.endpoint_url or "AWS", self.bucket)
        with _conditional_lock:
            known = _conditional.get(where)
        if known is not None:
            return known
        probe = f"{self.base(sink_id)}/_txsink/probe-{uuid.uuid4().hex}"
        broken = self._retrying(f"sink={sink_id}: probing conditional writes",
                                lambda: probe_conditional_put(self.client, self.bucket, probe))
        if broken is not None:
            log.warning(
                "s3 backend: %s (bucket %s) does not honour conditional writes (%s): the "
                "sink-id claim is read before it is written and read back after, which "
                "refuses a second query that starts after the first; two queries started "
                "at the same moment with one sink id are only told apart by the claim check "
                "of their next batch. Give every query its own sink_id",
                where[0], self.bucket, broken)
        with _conditional_lock:
            _conditional[where] = broken is None
        return broken is None

    def _warn_lifecycle(self, sink_id: str) -> None:
        """A rule aborting incomplete uploads early destroys prepared data: say so."""
        from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped,unused-ignore]

        try:
            rules = self.client.get_bucket_lifecycle_configuration(
                Bucket=self.bucket).get("Rules", [])
        except (ClientError, BotoCoreError):
            return  # none configured, not readable, or not supported by the server
        ours = self.base(sink_id) + "/"
        for rule in rules:
            days = rule.get("AbortIncompleteMultipartUpload", {}).get("DaysAfterInitiation")
            where = rule.get("Filter", {})
            prefix = str(where.get("Prefix", where.get("And", {}).get("Prefix",
                                                                      rule.get("Prefix", ""))))
            if not (ours.startswith(prefix) or prefix.startswith(ours)):
                continue  # the rule is about other keys
            if rule.get("Status") == "Enabled" and days is not None:
                log.warning("sink=%s: bucket %s has lifecycle rule %r aborting incomplete "
                            "multipart uploads after %s day(s); prepared participants older "
                            "than that are lost, so recovery must happen sooner",
                            sink_id, self.bucket, rule.get("ID", "?"), days)

    # -- executor side ------------------------------------------------------------------

    def begin_transaction(self, ctx: TransactionContext) -> Transaction:
        key = keys.data_key(self.base(ctx.sink_id), ctx, self.format)

        def encoder(out: PartBuffer) -> Encoder:
            return make_encoder(self.format, out, compression=self.compression,
                                row_group_bytes=self.row_group_bytes,
                                dictionary=self.dictionary)

        return _S3Transaction(ctx, key, encoder)

    def write(self, txn: Transaction, batch: pa.RecordBatch) -> None:
        assert isinstance(txn, _S3Transaction)
        txn.encoder.write(batch)
        txn.rows += batch.num_rows
        if len(txn.buffer) >= self.part_size:
            self._send_part(txn, txn.buffer.take())

    def _ensure_upload(self, txn: _S3Transaction) -> str:
        if txn.upload_id is None:
            response = self.client.create_multipart_upload(
                Bucket=self.bucket, Key=txn.key, ContentType=keys.CONTENT_TYPES[self.format],
                Metadata={META_PARTICIPANT: txn.ctx.participant, META_TOKEN: txn.token})
            txn.upload_id = str(response["UploadId"])
            log.debug("%s: started multipart upload of s3://%s/%s", txn.describe(),
                      self.bucket, txn.key)
        return txn.upload_id

    def _upload_part(self, txn: _S3Transaction, upload_id: str, number: int,
                     data: bytearray) -> str:
        response = self.client.upload_part(Bucket=self.bucket, Key=txn.key,
                                           UploadId=upload_id, PartNumber=number, Body=data)
        log.debug("%s: uploaded part %d (%d bytes)", txn.describe(), number, len(data))
        return str(response["ETag"])

    def _send_part(self, txn: _S3Transaction, data: bytearray) -> None:
        """Upload one part, in the background when ``upload_concurrency`` allows it.

        At most ``upload_concurrency`` parts are in flight; the writer waits for the
        oldest before sending another, which is what bounds memory.
        """
        number = txn.next_part
        if number > MAX_PARTS:
            raise TxsinkError(
                f"{txn.describe()}: the partition needs more than {MAX_PARTS} parts of "
                f"{self.part_size} bytes; raise the 'part_size' option",
                sink_id=txn.ctx.sink_id, epoch=txn.ctx.epoch, participant=txn.ctx.participant)
        txn.next_part += 1
        txn.size += len(data)
        upload_id = self._ensure_upload(txn)
        if txn.pool is None:
            txn.pool = ThreadPoolExecutor(max_workers=self.upload_concurrency,
                                          thread_name_prefix="txsink-s3-part")
        while len(txn.pending) >= self.upload_concurrency:
            self._collect_oldest(txn)
        txn.pending.append((number, txn.pool.submit(self._upload_part, txn, upload_id,
                                                    number, data)))

    def _collect_oldest(self, txn: _S3Transaction) -> None:
        number, future = txn.pending.pop(0)
        txn.parts[number] = future.result()

    def _drain(self, txn: _S3Transaction) -> None:
        try:
            while txn.pending:
                self._collect_oldest(txn)
        finally:
            self._stop_pool(txn)

    @staticmethod
    def _stop_pool(txn: _S3Transaction) -> None:
        pool, txn.pool = txn.pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def pre_commit(self, txn: Transaction) -> Committable:
        assert isinstance(txn, _S3Transaction)
        started = time.monotonic()
        txn.encoder.finish()
        base_payload: dict[str, Any] = {"bucket": self.bucket, "key": txn.key,
                                        "format": self.format}
        if txn.rows == 0 and txn.upload_id is None:
            # Nothing to publish: no object, no upload, nothing to commit or abort.
            txn.buffer.take()
            log.debug("%s: empty participant, no object written", txn.describe())
            return Committable.for_context(self.name, txn.ctx, {**base_payload, "empty": True},
                                           rows=0, payload_version=self.payload_version)
        last = txn.buffer.take()
        if last or (not txn.parts and not txn.pending):
            self._send_part(txn, last)
        self._drain(txn)
        etags = [txn.parts[n] for n in sorted(txn.parts)]
        payload = {
            **base_payload,
            "upload_id": txn.upload_id,
            "parts": [[n, txn.parts[n]] for n in sorted(txn.parts)],
            "etag": multipart_etag(etags),
            "size": txn.size,
            "token": txn.token,
        }
        log.debug("%s: prepared s3://%s/%s (%d parts, %d bytes) in %.3fs", txn.describe(),
                  self.bucket, txn.key, len(etags), txn.size, time.monotonic() - started)
        return Committable.for_context(self.name, txn.ctx, payload, rows=txn.rows,
                                       payload_version=self.payload_version)

    def discard(self, txn: Transaction) -> None:
        assert isinstance(txn, _S3Transaction)
        txn.buffer.take()
        for _, future in txn.pending:
            future.cancel()
        try:
            self._drain(txn)
        except Exception:
            log.debug("%s: a part upload failed while discarding", txn.describe(),
                      exc_info=True)
        if txn.upload_id is not None:
            self._abort_upload(self.bucket, txn.key, txn.upload_id, txn.describe())
            txn.upload_id = None

    # -- driver side --------------------------------------------------------------------

    def _committed_object(self, c: Committable) -> bool:
        """Whether the participant's object is in place (committed earlier)."""
        from botocore.exceptions import ClientError  # type: ignore[import-untyped,unused-ignore]

        p = c.payload
        try:
            head = self.client.head_object(Bucket=p["bucket"], Key=p["key"])
        except ClientError as exc:
            if _status(exc) == 404 or _error_code(exc) in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        etag = str(head.get("ETag", "")).strip('"')
        if p.get("etag") and etag == p["etag"]:
            return True
        if p.get("token") is None:
            # An upload Spark's writer made (no token in its metadata) whose ETag is no
            # plain MD5 (SSE-KMS): the participant's own key, size and part count.
            return bool(head.get("ContentLength") == p.get("size")
                        and etag.endswith(f"-{len(p.get('parts') or [])}"))
        metadata = {k.lower(): v for k, v in head.get("Metadata", {}).items()}
        return bool(metadata.get(META_TOKEN) == p.get("token")
                    and head.get("ContentLength") == p.get("size"))

    def commit(self, committable: Committable) -> CommitOutcome:
        """``CompleteMultipartUpload`` with ``If-None-Match: *``: one request when all
        goes well.

        Only when it fails does the object at the key tell what happened: no upload
        any more (``NoSuchUpload``) or an object already there (``412``, also what a
        server answers to completing a completed upload again) means committed before
        if the object is this participant's, and lost if there is none.
        """
        from botocore.exceptions import ClientError  # type: ignore[import-untyped,unused-ignore]

        c = committable
        p = c.payload
        if p.get("empty"):
            return CommitOutcome.COMMITTED
        fast = self.fast
        if fast is not None and fast.complete(p, only_if_absent=self._conditional_complete):
            log.debug("%s: committed s3://%s/%s", c.describe(), p["bucket"], p["key"])
            return CommitOutcome.COMMITTED
        try:
            self._complete(c, only_if_absent=self._conditional_complete)
        except ClientError as exc:
            code, status = _error_code(exc), _status(exc)
            if (code == "NotImplemented" or status == 501) and self._conditional_complete:
                # A server that does not take If-None-Match here: complete as before.
                log.info("s3 backend: %s rejects a conditional CompleteMultipartUpload "
                         "(%s); completing without it", self.endpoint_url or "AWS", code)
                self._conditional_complete = False
                return self.commit(c)
            if code == "NoSuchUpload" or status == 404:
                # The upload is gone: completed by an earlier try whose reply was lost,
                # or aborted (e.g. by a bucket lifecycle rule). Only the object can tell.
                if self._committed_object(c):
                    log.debug("%s: already committed", c.describe())
                    return CommitOutcome.ALREADY_COMMITTED
                raise ParticipantLostError(
                    f"{c.describe()}: multipart upload {p['upload_id']} of "
                    f"s3://{p['bucket']}/{p['key']} no longer exists and no object with the "
                    f"expected ETag {p.get('etag')} is at that key; the participant's "
                    "data is lost (was the upload aborted by a lifecycle rule?)",
                    sink_id=c.sink_id, epoch=c.epoch, participant=c.participant) from None
            if status == 412 or code == "PreconditionFailed":
                if self._committed_object(c):
                    log.debug("%s: already committed", c.describe())
                    return CommitOutcome.ALREADY_COMMITTED
                # Another object holds the key (not this participant's): it is
                # replaced, as an unconditional completion always did.
                return self._complete_retriable(c, only_if_absent=False)
            raise self._commit_failed(c, exc) from None
        log.debug("%s: committed s3://%s/%s", c.describe(), p["bucket"], p["key"])
        return CommitOutcome.COMMITTED

    def _complete(self, c: Committable, *, only_if_absent: bool) -> None:
        p = c.payload
        parts = [{"PartNumber": int(n), "ETag": str(etag)} for n, etag in p["parts"]]
        condition = {"IfNoneMatch": "*"} if only_if_absent else {}
        self.client.complete_multipart_upload(
            Bucket=p["bucket"], Key=p["key"], UploadId=p["upload_id"],
            MultipartUpload={"Parts": parts}, **condition)

    def _complete_retriable(self, c: Committable, *, only_if_absent: bool) -> CommitOutcome:
        from botocore.exceptions import ClientError  # type: ignore[import-untyped,unused-ignore]

        try:
            self._complete(c, only_if_absent=only_if_absent)
        except ClientError as exc:
            raise self._commit_failed(c, exc) from None
        return CommitOutcome.COMMITTED

    def _commit_failed(self, c: Committable, exc: Exception) -> RetriableCommitError:
        p = c.payload
        return RetriableCommitError(
            f"{c.describe()}: completing s3://{p['bucket']}/{p['key']} failed: "
            f"{self._redact(str(exc))}", sink_id=c.sink_id, epoch=c.epoch,
            participant=c.participant)

    def _commit_caught(self, c: Committable) -> CommitOutcome | Exception:
        try:
            return self.commit(c)
        except Exception as exc:  # handed to the coordinator, which retries
            return exc

    def commit_all(
        self, committables: Sequence[Committable]
    ) -> list[CommitOutcome | Exception]:
        """Complete the uploads side by side, at most ``commit_concurrency`` at once.

        Each completion is a round trip spent waiting on the server, so an epoch's
        commit costs about ``ceil(n / commit_concurrency)`` of them instead of ``n``.
        The one boto3 client is shared: clients are thread-safe, and its connection
        pool is sized for ``commit_concurrency`` (see :attr:`client`).
        """
        if len(committables) <= 1 or self.commit_concurrency <= 1:
            return [self._commit_caught(c) for c in committables]
        self.client  # noqa: B018 - created here, not raced for by the pool's threads
        lanes = min(self.commit_concurrency, len(committables))
        results: list[CommitOutcome | Exception | None] = [None] * len(committables)

        def lane(first: int) -> None:
            for i in range(first, len(committables), lanes):
                results[i] = self._commit_caught(committables[i])

        # Lanes on the process's shared pool: starting a dozen threads per epoch cost
        # tens of milliseconds on busy cores, more than the completions they wait for.
        for future in [commit_pool().submit(lane, n) for n in range(lanes)]:
            future.result()
        return [r if r is not None else RuntimeError("not committed") for r in results]

    def _abort_upload(self, bucket: str, key: str, upload_id: str, who: str) -> None:
        from botocore.exceptions import ClientError  # type: ignore[import-untyped,unused-ignore]

        try:
            self.client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        except ClientError as exc:
            if _error_code(exc) == "NoSuchUpload" or _status(exc) == 404:
                return  # already gone: aborting twice is harmless
            raise
        log.debug("%s: aborted multipart upload of s3://%s/%s", who, bucket, key)

    def abort(self, committable: Committable) -> None:
        p = committable.payload
        if p.get("empty") or not p.get("upload_id"):
            return
        # The committable's own bucket: it may predate a change of the 'bucket' option.
        self._abort_upload(str(p.get("bucket", self.bucket)), str(p["key"]),
                           str(p["upload_id"]), committable.describe())

    def holds_epoch(self, sink_id: str, epoch: int) -> bool:
        """The epoch's manifest exists (every participant of it was committed), or a data
        object of it does (multipart uploads are invisible until completed): its manifest
        was pruned, or its commit stopped part way. A state restored from a copy taken
        before such an epoch's decision must see that the target holds part of it; asked
        by the manifest alone it aborted the epoch's other uploads as orphans, and the
        replay wrote the epoch again beside the objects already completed."""
        from botocore.exceptions import ClientError  # type: ignore[import-untyped,unused-ignore]

        base = self.base(sink_id)
        key = keys.manifest_key(base, epoch)
        try:
            self._retrying(f"sink={sink_id} epoch={epoch}: looking for the manifest",
                           lambda: self.client.head_object(Bucket=self.bucket, Key=key))
        except ClientError as exc:
            if _status(exc) == 404 or _error_code(exc) in ("404", "NoSuchKey", "NotFound"):
                return bool(self._retrying(
                    f"sink={sink_id} epoch={epoch}: looking for data of the epoch",
                    lambda: self.client.list_objects_v2(
                        Bucket=self.bucket, Prefix=f"{base}/epoch={epoch}/", MaxKeys=1
                    ).get("KeyCount", 0)))
            raise
        return True

    def highest_epoch(self, sink_id: str) -> int | None:
        """The newest epoch manifest (-1: none). Manifest keys sort by epoch, so a few
        listings of one key each find it, however many manifests there are: double a
        bound until no manifest lies past it, then halve the gap."""
        base = self.base(sink_id)
        prefix = keys.manifests_prefix(base)

        def after(epoch: int) -> int | None:
            """The epoch of the first manifest past ``epoch`` (None: none)."""
            start = keys.manifest_key(base, epoch) if epoch >= 0 else prefix
            listed = self._retrying(
                f"sink={sink_id}: listing epoch manifests",
                lambda: self.client.list_objects_v2(Bucket=self.bucket, Prefix=prefix,
                                                    StartAfter=start, MaxKeys=1))
            found = listed.get("Contents") or []
            if not found:
                return None
            name = str(found[0]["Key"]).rsplit("/", 1)[-1]
            return int(name[len("epoch-"):-len(".json")])

        low = after(-1)  # an epoch that has a manifest: low <= newest
        if low is None:
            return -1
        bound, step = low, 1
        while (found := after(bound)) is not None:  # gallop until nothing lies past bound
            low, bound, step = found, found + step, step * 2
        while bound > low:  # newest is in [low, bound]
            mid = (low + bound + 1) // 2
            found = after(mid - 1)
            if found is None:
                bound = mid - 1
            else:
                low = found
        return low

    def abort_orphans(self, sink_id: str, protected: Collection[str],
                      up_to_epoch: int | None = None) -> list[Committable]:
        """The uploads no decision holds (:meth:`list_prepared`); with ``writer: spark``
        also what native writes of those epochs left behind besides their uploads. A
        native write that stopped early always leaves uploads too (Spark writes at least
        one file per job), so that is looked for at a backend's first scan (a start) and
        after a scan that found orphans, not after every commit."""
        aborted = super().abort_orphans(sink_id, protected, up_to_epoch)
        if self.writer == "spark" and (aborted or not self._native_swept):
            self._native_swept = True
            from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped,unused-ignore]

            try:
                native.leftovers(self, sink_id, up_to_epoch)
            except (BotoCoreError, ClientError) as exc:
                log.warning("sink=%s: deleting what native writes left behind failed (%s); "
                            "the next orphan scan tries again", sink_id,
                            self._redact(str(exc)))
        return aborted

    def list_prepared(self, sink_id: str) -> Iterable[Committable]:
        """Every multipart upload under the sink's prefix whose key txsink made.

        This includes uploads still being written; the coordinator only aborts
        those of epochs it has finished with (``up_to_epoch``).
        """
        base = self.base(sink_id)
        found: list[Committable] = []
        paginator = self.client.get_paginator("list_multipart_uploads")
        pages = self._retrying(
            f"sink={sink_id}: listing multipart uploads",
            lambda: list(paginator.paginate(Bucket=self.bucket, Prefix=base + "/")))
        for page in pages:
            for upload in page.get("Uploads", []) or []:
                ctx = keys.parse_data_key(base, sink_id, str(upload["Key"]))
                if ctx is None:
                    continue
                payload = {"bucket": self.bucket, "key": upload["Key"],
                           "upload_id": upload["UploadId"], "format": self.format,
                           "listed": True}
                found.append(Committable.for_context(self.name, ctx, payload,
                                                     payload_version=self.payload_version))
        return found

    # -- epoch manifest -----------------------------------------------------------------

    def manifest(self, sink_id: str, epoch: int,
                 committables: Sequence[Committable]) -> dict[str, Any]:
        """The manifest document of one committed epoch (see docs/backends/s3.md)."""
        objects = [
            {"key": c.payload["key"], "partition": c.partition, "rows": c.rows,
             "size": c.payload.get("size"), "etag": c.payload.get("etag")}
            for c in sorted(committables, key=lambda c: c.partition)
            if not c.payload.get("empty")
        ]
        return {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "sink_id": sink_id,
            "epoch": epoch,
            "data_format": self.format,
            "bucket": self.bucket,
            "rows": sum(c.rows for c in committables),
            "objects": objects,
        }

    def epoch_committed(self, sink_id: str, epoch: int,
                        committables: Sequence[Committable]) -> None:
        """Write ``_txsink/manifests/epoch-<N>.json``: readers wait for it (idempotent)."""
        from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped,unused-ignore]

        key = keys.manifest_key(self.base(sink_id), epoch)
        body = json.dumps(self.manifest(sink_id, epoch, committables), sort_keys=True,
                          indent=1).encode()
        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=body,
                                   ContentType="application/json")
        except (ClientError, BotoCoreError) as exc:
            raise RetriableCommitError(
                f"sink={sink_id} epoch={epoch}: every participant is committed but writing "
                f"the epoch manifest s3://{self.bucket}/{key} failed: "
                f"{self._redact(str(exc))}; the epoch stays DECIDED and the next start "
                "writes it", sink_id=sink_id, epoch=epoch) from None
        log.info("sink=%s epoch=%d: wrote manifest s3://%s/%s (%d object(s))", sink_id, epoch,
                 self.bucket, key, len(committables))
        retention = self.manifest_retention_epochs
        if retention and epoch % MANIFEST_PRUNE_EVERY == 0 and epoch >= retention:
            self._prune_manifests(sink_id, epoch - retention)

    def manifests_pruned_below(self, sink_id: str, *, retry: bool = True) -> int | None:
        """The prune horizon: manifests of epochs below it may have been pruned, none at
        or above it ever were (None: no prune recorded one). Readers list the folders of
        epochs below it that have no manifest, whatever holes a prune left."""
        from botocore.exceptions import ClientError  # type: ignore[import-untyped,unused-ignore]

        key = keys.pruned_key(self.base(sink_id))

        def read() -> bytes:
            return bytes(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())

        try:
            body = (self._retrying(f"sink={sink_id}: reading the manifest prune horizon", read)
                    if retry else read())
        except ClientError as exc:
            if _status(exc) == 404 or _error_code(exc) in ("NoSuchKey", "404"):
                return None
            raise
        try:
            return int(json.loads(body)["below"])
        except (ValueError, KeyError, TypeError):
            raise TxsinkError(f"sink={sink_id}: s3://{self.bucket}/{key} is not txsink's "
                              "manifest prune horizon; delete it and the next prune "
                              "writes it again") from None

    def _prune_manifests(self, sink_id: str, below: int) -> None:
        """Delete every manifest of an epoch below ``below``.

        The horizon is recorded first (``manifests-pruned-below.json``), so a reader knows
        which missing manifests may have been pruned however this prune ends. It lists
        what is left below ``below`` instead of deleting one fixed range, so a prune that
        failed (a transient ``SlowDown``) or deleted part of its keys is finished by the
        next one. Best effort: a failure is logged and retried ``MANIFEST_PRUNE_EVERY``
        epochs later; an epoch whose manifest is gone is still held (its data)."""
        from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped,unused-ignore]

        if below <= 0:
            return
        base = self.base(sink_id)
        prefix, stop = keys.manifests_prefix(base), keys.manifest_key(base, below)
        try:
            recorded = self.manifests_pruned_below(sink_id, retry=False)
            if recorded is None or recorded < below:
                body = json.dumps({"sink_id": sink_id, "below": below}).encode()
                self.client.put_object(Bucket=self.bucket, Key=keys.pruned_key(base),
                                       Body=body, ContentType="application/json")
            doomed: list[str] = []
            for page in self.client.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=prefix, StartAfter=prefix):
                names = [str(o["Key"]) for o in page.get("Contents", []) or []]
                doomed += [n for n in names if n < stop]
                if names and names[-1] >= stop:
                    break
            errors: list[str] = []
            for i in range(0, len(doomed), 1000):  # DeleteObjects takes 1,000 keys at most
                answer = self.client.delete_objects(Bucket=self.bucket, Delete={
                    "Objects": [{"Key": k} for k in doomed[i:i + 1000]], "Quiet": True})
                errors += [f"{e.get('Key')}: {e.get('Code')}"
                           for e in answer.get("Errors", []) or []]
        except (ClientError, BotoCoreError, TxsinkError) as exc:
            log.warning("sink=%s: pruning manifests below epoch %d failed (%s); the next "
                        "prune tries again", sink_id, below, self._redact(str(exc)))
            return
        if errors:
            log.warning("sink=%s: pruning manifests below epoch %d left %d of them (%s); "
                        "the next prune tries again", sink_id, below, len(errors),
                        "; ".join(errors[:3]))
        elif doomed:
            log.debug("sink=%s: pruned %d manifest(s) below epoch %d", sink_id, len(doomed),
                      below)
