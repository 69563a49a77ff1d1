"""Coordinator state on S3: ``s3://bucket/prefix`` (or ``s3a://``, as Spark writes it).

A pipeline whose Spark checkpoint lives on object storage keeps its txsink state
there too, so a driver can be replaced by one on another machine. The directory
store gets its guarantees from an exclusive file lock around "check the lease,
then write"; S3 has no locks, so every guarantee comes from conditional writes on
one small object:

* ``<prefix>/head.json`` holds the lease (owner, generation), the sink metadata and
  an index of the epochs (state, timestamps, and the key of the object holding
  their committables). Every change is a read-modify-write of the head made with
  ``If-Match: <ETag read>`` (``If-None-Match: *`` for the first one): a change based
  on a stale read fails with ``PreconditionFailed`` and is retried on a fresh read.
  So no update is lost, and a write is fenced exactly when the fresh read shows
  another lease: a coordinator that was taken over gets
  :class:`~txsink.errors.FencedError`, never a write in between. The head carries
  a sequence number bumped on every change, because S3 ETags are content hashes:
  without it, a head returning to an earlier content would match a stale ETag.
* ``<prefix>/records/<epoch>-<random>.json`` hold the committables of one epoch.
  They are written once, under a fresh name, *before* the head points at them, and
  never changed, so any process can cache them; the head change is the commit
  point of a decision. An object no head points at (its writer crashed or was
  fenced) is garbage, removed when a new owner takes the lease.

Each write costs one ``GetObject`` and one ``PutObject`` of the head (a few KiB:
about 150 bytes per retained epoch), plus one ``PutObject`` per new decision.
Conditional writes are probed once per process and bucket before the first lease
is taken: an endpoint that ignores them would let two drivers both write, so it is
refused with an error instead.

The client uses boto3's standard configuration of the process that runs the
coordinator (on Spark: the driver and its Python workers): ``AWS_ENDPOINT_URL_S3``
(or ``AWS_ENDPOINT_URL``), ``AWS_REGION``, and the usual credential chain
(environment, profile, instance role). Nothing secret is ever written to the state.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from txsink.errors import ConfigError, FencedError, StateError
from txsink.state import (
    FENCED_OWNERS_KEPT,
    STATE_FORMAT_VERSION,
    EpochRecord,
    EpochState,
    Lease,
    SinkMeta,
    StateStore,
)

from txsink_s3.conditional import conflict as _conflict
from txsink_s3.conditional import error_code as _error_code
from txsink_s3.conditional import probe_conditional_put
from txsink_s3.conditional import status as _status

log = logging.getLogger(__name__)

SCHEMES = ("s3", "s3a")
HEAD_FORMAT = "txsink-s3-state"
#: Record objects fetched at once by a process that has none of them cached.
FETCH_CONCURRENCY = 16
#: Attempts of one read-modify-write of the head before giving up (contention).
MAX_ATTEMPTS = 50
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")

#: (endpoint, bucket) pairs whose conditional writes were probed by this process.
_probed: set[tuple[str, str]] = set()
_probe_lock = threading.Lock()


def _missing(exc: BaseException) -> bool:
    return _status(exc) == 404 or _error_code(exc) in ("NoSuchKey", "404", "NotFound")


def parse_location(location: str) -> tuple[str, str, str]:
    """``s3://bucket/a/b/`` -> ``("s3", "bucket", "a/b")``; ConfigError when malformed."""
    scheme, sep, rest = location.partition("://")
    if not sep or scheme not in SCHEMES:
        raise ConfigError(f"state location {location!r}: the S3 state store takes "
                          "s3://bucket/prefix or s3a://bucket/prefix", field="state_location")
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET_RE.match(bucket) or ".." in bucket:
        raise ConfigError(f"state location {location!r}: {bucket[:80]!r} is not a valid "
                          "bucket name (3-63 characters from a-z 0-9 . -)",
                          field="state_location")
    parts = [p for p in prefix.split("/") if p]
    if any(p in (".", "..") for p in parts) or any(not c.isprintable() for c in prefix):
        raise ConfigError(f"state location {location!r}: the prefix must not contain '.' "
                          "or '..' segments or control characters", field="state_location")
    return scheme, bucket, "/".join(parts)


class _ReusedRecordGone(Exception):
    """Internal: retry a put whose reused record object was unlinked meanwhile."""


def _digest(record: EpochRecord) -> str:
    body = json.dumps([c.to_dict() for c in record.committables], sort_keys=True)
    extra = f"{record.write!r}:{record.owner!r}" if record.write or record.owner else ""
    if record.salvaged:
        extra += f":{record.salvaged!r}"
    return hashlib.sha256(f"{record.decided_at!r}:{body}{extra}".encode()).hexdigest()


class S3StateStore(StateStore):
    """Pending-transaction state in an S3 bucket, fenced by conditional writes.

    :param location: ``s3://bucket/prefix`` or ``s3a://bucket/prefix``.
    :param client: a boto3 S3 client; by default one from the standard AWS
        configuration of this process (tests and embedders pass their own).
    """

    def __init__(self, location: str, *, client: Any = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        scheme, self.bucket, self.prefix = parse_location(location)
        self.location = f"{scheme}://{self.bucket}/{self.prefix}".rstrip("/")
        self._client = client
        self._sleep = sleep
        #: Immutable record objects by key: safe to keep forever.
        self._bodies: dict[str, EpochRecord] = {}
        self._head_cache: tuple[str, dict[str, Any]] | None = None

    # -- keys and client -------------------------------------------------------------------

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    @property
    def head_key(self) -> str:
        return self._key("head.json")

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3  # type: ignore[import-untyped,unused-ignore]
            from botocore.config import Config  # type: ignore[import-untyped,unused-ignore]

            config = Config(retries={"max_attempts": 5, "mode": "standard"},
                            connect_timeout=10, read_timeout=60)
            from txsink_s3.session import shared_botocore_session

            self._client = boto3.session.Session(
                botocore_session=shared_botocore_session()).client("s3", config=config)
        return self._client

    def _where(self) -> str:
        endpoint = getattr(getattr(self.client, "meta", None), "endpoint_url", None)
        return f"{self.location}" + (f" (endpoint {endpoint})" if endpoint else "")

    def _fail(self, action: str, exc: Exception) -> StateError | ConfigError:
        """A StateError naming the location, never the credentials."""
        from botocore.exceptions import NoCredentialsError  # type: ignore[import-untyped,unused-ignore]

        if isinstance(exc, NoCredentialsError):
            return ConfigError(f"state {self._where()}: no AWS credentials found to {action}: "
                               "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or an "
                               "instance role for the driver", field="state_location")
        status = _status(exc)
        if _error_code(exc) == "NoSuchBucket":
            return ConfigError(f"state {self._where()}: bucket {self.bucket!r} does not exist; "
                               "create it first (txsink never creates buckets)",
                               field="state_location")
        if status in (401, 403):
            return ConfigError(f"state {self._where()}: access denied (HTTP {status}) to "
                               f"{action}: the driver's credentials need s3:GetObject, "
                               "s3:PutObject, s3:DeleteObject and s3:ListBucket on the prefix",
                               field="state_location")
        return StateError(f"state {self._where()}: could not {action}: "
                          f"{type(exc).__name__}: {_error_code(exc) or exc}")

    # -- the probe -----------------------------------------------------------------------

    def probe(self) -> None:
        """Refuse an endpoint that does not honour ``If-None-Match``/``If-Match`` on PUT."""
        from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped,unused-ignore]

        endpoint = str(getattr(getattr(self.client, "meta", None), "endpoint_url", ""))
        with _probe_lock:
            if (endpoint, self.bucket) in _probed:
                return
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            if _missing(exc):
                raise ConfigError(f"state {self._where()}: bucket {self.bucket!r} does not "
                                  "exist; create it first (txsink never creates buckets)",
                                  field="state_location") from None
            raise self._fail("reach the bucket", exc) from None
        except BotoCoreError as exc:
            raise self._fail("reach the bucket", exc) from None
        key = self._key(f"probe/{uuid.uuid4().hex}")
        try:
            broken = probe_conditional_put(self.client, self.bucket, key)
        except ClientError as exc:
            raise self._fail("probe conditional writes", exc) from None
        except BotoCoreError as exc:
            if "IfMatch" in str(exc) or "IfNoneMatch" in str(exc):
                raise ConfigError(f"state {self.location}: this boto3 cannot send conditional "
                                  "writes (If-Match/If-None-Match); upgrade boto3 to 1.36 or "
                                  "newer", field="state_location") from None
            raise self._fail("probe conditional writes", exc) from None
        if broken is not None:
            raise ConfigError(
                f"state {self._where()}: the S3 endpoint does not honour conditional writes "
                f"({broken}). Without them two drivers could both write the state and a "
                "superseded driver could not be fenced, so txsink refuses to keep state "
                "there. Use a server that supports If-None-Match and If-Match on PUT (AWS S3, "
                "SeaweedFS 4.x, recent MinIO), or a local/shared directory as state_location",
                field="state_location")
        with _probe_lock:
            _probed.add((endpoint, self.bucket))

    # -- the head ------------------------------------------------------------------------

    def _read_head(self) -> tuple[dict[str, Any] | None, str | None]:
        from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped,unused-ignore]

        kwargs: dict[str, Any] = {}
        if self._head_cache is not None:
            kwargs["IfNoneMatch"] = self._head_cache[0]
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self.head_key, **kwargs)
            body = response["Body"].read()
        except ClientError as exc:
            if _status(exc) == 304 and self._head_cache is not None:
                etag, cached = self._head_cache
                return copy.deepcopy(cached), etag
            if _missing(exc) and _error_code(exc) != "NoSuchBucket":
                self._head_cache = None
                return None, None
            raise self._fail("read the state", exc) from None
        except BotoCoreError as exc:
            raise self._fail("read the state", exc) from None
        try:
            head = json.loads(body)
        except ValueError as exc:
            raise StateError(f"state {self.location}: {self.head_key} is corrupt: {exc}") \
                from None
        if not isinstance(head, dict) or head.get("format") != HEAD_FORMAT:
            raise StateError(f"state {self.location}: {self.head_key} is not a txsink state "
                             "head object")
        if head.get("v") != STATE_FORMAT_VERSION:
            raise StateError(f"state {self.location}: state format {head.get('v')!r} is not "
                             "supported by this txsink; upgrade txsink")
        etag = str(response["ETag"])
        self._head_cache = (etag, head)
        return copy.deepcopy(head), etag

    @staticmethod
    def _new_head() -> dict[str, Any]:
        return {"format": HEAD_FORMAT, "v": STATE_FORMAT_VERSION, "seq": 0, "lease": None,
                "meta": None, "epochs": {}}

    @staticmethod
    def _lease_of(head: dict[str, Any] | None) -> Lease | None:
        data = head.get("lease") if head else None
        return None if not data else Lease(str(data["owner"]), int(data["generation"]))

    def _fence(self, head: dict[str, Any] | None, lease: Lease) -> None:
        current = self._lease_of(head)
        if current != lease:
            raise FencedError(
                f"state {self.location}: another coordinator "
                f"({current.owner if current else '?'}, generation "
                f"{current.generation if current else '?'}) took over this sink; this one "
                f"({lease.owner}, generation {lease.generation}) must stop. Two queries must "
                "never share a checkpoint location or sink id.")

    def _update(self, change: Callable[[dict[str, Any]], bool], lease: Lease | None,
                action: str) -> dict[str, Any]:
        """Read-modify-write of the head; ``change`` edits it and says whether to write."""
        from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped,unused-ignore]

        delay = 0.01
        for _ in range(MAX_ATTEMPTS):
            head, etag = self._read_head()
            if lease is not None:
                self._fence(head, lease)
            new = head if head is not None else self._new_head()
            if not change(new):
                return new
            new["seq"] = int(new.get("seq", 0)) + 1
            body = json.dumps(new, sort_keys=True, separators=(",", ":")).encode()
            condition = {"IfMatch": etag} if etag is not None else {"IfNoneMatch": "*"}
            try:
                response = self.client.put_object(Bucket=self.bucket, Key=self.head_key,
                                                  Body=body, ContentType="application/json",
                                                  **condition)
            except ClientError as exc:
                if not _conflict(exc):
                    raise self._fail(action, exc) from None
                log.debug("state %s: head changed under %s; reading it again", self.location,
                          action)
                self._sleep(random.uniform(0, delay))
                delay = min(delay * 2, 0.5)
                continue
            except BotoCoreError as exc:
                raise self._fail(action, exc) from None
            self._head_cache = (str(response["ETag"]), copy.deepcopy(new))
            return new
        raise StateError(f"state {self.location}: could not {action}: the head object kept "
                         f"changing under {MAX_ATTEMPTS} attempts (is another process writing "
                         "this state in a loop?)")

    # -- lease ---------------------------------------------------------------------------

    def acquire(self, owner: str) -> Lease:
        self.probe()
        taken: dict[str, Lease | None] = {}

        def change(head: dict[str, Any]) -> bool:
            current = self._lease_of(head)
            taken["previous"] = current
            taken.pop("fenced", None)
            if current is not None and current.owner == owner:
                taken["lease"] = current
                return False
            fenced = [str(o) for o in (head.get("lease") or {}).get("fenced", [])]
            if owner in fenced:
                taken["fenced"] = current
                return False
            if current is not None:
                fenced = [*fenced, current.owner][-FENCED_OWNERS_KEPT:]
            lease = Lease(owner, (current.generation + 1) if current else 1)
            head["lease"] = {"owner": owner, "generation": lease.generation,
                             "acquired_at": time.time(), "fenced": fenced}
            taken["lease"] = lease
            return True

        self._update(change, None, "take the lease")
        if "fenced" in taken:
            newer = taken["fenced"]
            raise FencedError(
                f"state {self.location}: {owner} was taken over by a newer run "
                f"({newer.owner if newer else '?'}, generation "
                f"{newer.generation if newer else '?'}) and must stop. Two runs of one query "
                "must never write at once; stop the older one.")
        lease, previous = taken["lease"], taken["previous"]
        assert lease is not None
        if previous is not None and previous != lease:
            log.info("state %s: lease taken over from %s (generation %d -> %d)", self.location,
                     previous.owner, previous.generation, lease.generation)
            # Whatever the previous owner wrote and did not link into the head can never
            # be linked now (its next head write fails): remove it.
            self._sweep(lease)
        return lease

    def check(self, lease: Lease) -> None:
        head, _ = self._read_head()
        self._fence(head, lease)

    # -- meta ----------------------------------------------------------------------------

    def read_meta(self) -> SinkMeta | None:
        head, _ = self._read_head()
        data = head.get("meta") if head else None
        return None if data is None else SinkMeta.from_dict(data)

    def write_meta(self, lease: Lease, meta: SinkMeta) -> None:
        def change(head: dict[str, Any]) -> bool:
            head["meta"] = meta.to_dict()
            return True

        self._update(change, lease, "write the sink metadata")

    # -- records -------------------------------------------------------------------------

    def _body(self, key: str) -> EpochRecord:
        from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped,unused-ignore]

        cached = self._bodies.get(key)
        if cached is not None:
            return cached
        try:
            data = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except ClientError as exc:
            if _missing(exc):
                raise StateError(f"state {self.location}: the head names {key}, which is "
                                 "missing; the state was changed outside txsink") from None
            raise self._fail(f"read {key}", exc) from None
        except BotoCoreError as exc:
            raise self._fail(f"read {key}", exc) from None
        try:
            record = EpochRecord.from_dict(json.loads(data))
        except ValueError as exc:
            raise StateError(f"state {self.location}: {key} is corrupt: {exc}") from None
        self._bodies[key] = record
        return record

    def _record(self, epoch: int, entry: dict[str, Any]) -> EpochRecord:
        body = self._body(str(entry["ref"]))
        try:
            state = EpochState(entry["state"])
            committed_at = entry.get("committed_at")
            return EpochRecord(epoch, state, body.committables, float(entry["decided_at"]),
                               None if committed_at is None else float(committed_at),
                               body.write, body.owner if state is EpochState.RESERVED else None,
                               salvaged=body.salvaged)
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"state {self.location}: malformed entry for epoch {epoch}: "
                             f"{exc}") from None

    def records(self) -> dict[int, EpochRecord]:
        head, _ = self._read_head()
        epochs: dict[str, Any] = head.get("epochs", {}) if head else {}
        missing = sorted({str(e["ref"]) for e in epochs.values()} - set(self._bodies))
        if len(missing) > 1:
            # A new process (Spark starts one per micro-batch to plan it) knows none of
            # the retained records yet: fetch them side by side, not one by one.
            with ThreadPoolExecutor(max_workers=min(FETCH_CONCURRENCY, len(missing)),
                                    thread_name_prefix="txsink-s3-state") as pool:
                list(pool.map(self._body, missing))
        return {int(e): self._record(int(e), entry)
                for e, entry in sorted(epochs.items(), key=lambda kv: int(kv[0]))}

    def states(self) -> dict[int, EpochState]:
        """From the head's index alone: no record object is read, however many are
        retained, so the coordinator's check on every commit stays one request."""
        head, _ = self._read_head()
        epochs: dict[str, Any] = head.get("epochs", {}) if head else {}
        try:
            return {int(e): EpochState(entry["state"])
                    for e, entry in sorted(epochs.items(), key=lambda kv: int(kv[0]))}
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"state {self.location}: malformed epoch index in "
                             f"{self.head_key}: {exc}") from None

    def get(self, epoch: int) -> EpochRecord | None:
        head, _ = self._read_head()
        entry = (head.get("epochs", {}) if head else {}).get(str(epoch))
        return None if entry is None else self._record(epoch, entry)

    def put(self, lease: Lease, record: EpochRecord) -> None:
        for _ in range(MAX_ATTEMPTS):
            try:
                self._put_once(lease, record)
                return
            except _ReusedRecordGone:
                continue  # the record object we meant to reuse was unlinked: write anew
        raise StateError(f"state {self.location}: could not write epoch {record.epoch}: "
                         "its record kept being replaced by another writer")

    def _put_once(self, lease: Lease, record: EpochRecord) -> None:

        digest = _digest(record)
        head, _ = self._read_head()
        self._fence(head, lease)
        existing = (head.get("epochs", {}) if head else {}).get(str(record.epoch))
        written: str | None = None
        if existing is not None and existing.get("digest") == digest:
            ref = str(existing["ref"])  # same committables: only the state changes
        else:
            ref = written = self._write_body(record)
        replaced: list[str] = []

        def change(h: dict[str, Any]) -> bool:
            epochs = h.setdefault("epochs", {})
            old = epochs.get(str(record.epoch))
            replaced.clear()
            if written is None and (old is None or old.get("ref") != ref):
                # A record object, once unlinked, may be deleted and is never linked
                # again; reusing it is only safe while the head still links it.
                raise _ReusedRecordGone
            if old is not None and old.get("ref") != ref:
                replaced.append(str(old["ref"]))
            epochs[str(record.epoch)] = {
                "state": record.state.value, "decided_at": record.decided_at,
                "committed_at": record.committed_at, "ref": ref, "digest": digest}
            return True

        try:
            self._update(change, lease, f"write epoch {record.epoch}")
        except BaseException:
            if written is not None:
                self._delete_keys([written])
            raise
        self._delete_keys(replaced)

    def _write_body(self, record: EpochRecord) -> str:
        """Write ``record`` to a new, never reused object; return its key."""
        from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped,unused-ignore]

        ref = self._key(f"records/{record.epoch:012d}-{uuid.uuid4().hex}.json")
        body = json.dumps(record.to_dict(), sort_keys=True, separators=(",", ":")).encode()
        try:
            self.client.put_object(Bucket=self.bucket, Key=ref, Body=body,
                                   ContentType="application/json", IfNoneMatch="*")
        except (ClientError, BotoCoreError) as exc:
            raise self._fail(f"write the record of epoch {record.epoch}", exc) from None
        self._bodies[ref] = record
        return ref

    def put_new(self, lease: Lease, record: EpochRecord) -> bool:
        """Link ``record`` only if the head has no entry for its epoch (the head's
        ``If-Match`` makes the check and the link one atomic step)."""

        head, _ = self._read_head()
        self._fence(head, lease)
        if str(record.epoch) in (head.get("epochs", {}) if head else {}):
            return False
        ref = self._write_body(record)
        created: list[bool] = []

        def change(h: dict[str, Any]) -> bool:
            created.clear()
            epochs = h.setdefault("epochs", {})
            if str(record.epoch) in epochs:
                return False
            epochs[str(record.epoch)] = {
                "state": record.state.value, "decided_at": record.decided_at,
                "committed_at": record.committed_at, "ref": ref, "digest": _digest(record)}
            created.append(True)
            return True

        try:
            self._update(change, lease, f"reserve epoch {record.epoch}")
        except BaseException:
            self._delete_keys([ref])
            raise
        if not created:
            self._delete_keys([ref])
        return bool(created)

    def delete(self, lease: Lease, epochs: Iterable[int]) -> None:
        wanted = {str(e) for e in epochs}
        removed: list[str] = []

        def change(head: dict[str, Any]) -> bool:
            removed.clear()
            current = head.setdefault("epochs", {})
            for epoch in sorted(wanted & set(current)):
                removed.append(str(current.pop(epoch)["ref"]))
            return bool(removed)

        self._update(change, lease, "delete old epochs")
        self._delete_keys(removed)

    # -- archive of decided names -------------------------------------------------------

    supports_archive = True

    def _archive_key(self, chunk: int) -> str:
        return self._key(f"archive/{chunk:08d}.json")

    def archive_chunks(self) -> list[int]:
        from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped,unused-ignore]

        prefix = self._key("archive/")
        chunks: list[int] = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=prefix):
                for obj in page.get("Contents", []) or []:
                    name = str(obj["Key"])[len(prefix):]
                    if re.fullmatch(r"\d{8}\.json", name):
                        chunks.append(int(name[:8]))
        except (ClientError, BotoCoreError) as exc:
            raise self._fail("list the archive", exc) from None
        return sorted(chunks)

    def _read_archive(self, chunk: int) -> tuple[dict[str, Any] | None, str | None]:
        from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped,unused-ignore]

        key = self._archive_key(chunk)
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=key)
            data = json.loads(response["Body"].read())
        except ClientError as exc:
            if _missing(exc) and _error_code(exc) != "NoSuchBucket":
                return None, None
            raise self._fail(f"read {key}", exc) from None
        except BotoCoreError as exc:
            raise self._fail(f"read {key}", exc) from None
        except ValueError as exc:
            raise StateError(f"state {self.location}: {key} is corrupt: {exc}") from None
        return data, str(response["ETag"])

    def read_archive(self, chunk: int) -> dict[str, Any] | None:
        return self._read_archive(chunk)[0]

    def merge_archive(self, lease: Lease, chunk: int, epochs: Mapping[str, Any]) -> None:
        """Read-modify-write of the chunk, conditional on the ETag read: a concurrent
        merge makes it read again, so no name is lost; fenced before every write."""
        from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped,unused-ignore]

        key = self._archive_key(chunk)
        delay = 0.01
        for _ in range(MAX_ATTEMPTS):
            data, etag = self._read_archive(chunk)
            self.check(lease)
            data = data or {"v": STATE_FORMAT_VERSION, "epochs": {}}
            data["epochs"] = {**data.get("epochs", {}), **epochs}
            condition = {"IfMatch": etag} if etag is not None else {"IfNoneMatch": "*"}
            try:
                self.client.put_object(
                    Bucket=self.bucket, Key=key, ContentType="application/json",
                    Body=json.dumps(data, sort_keys=True, separators=(",", ":")).encode(),
                    **condition)
                return
            except ClientError as exc:
                if not _conflict(exc):
                    raise self._fail(f"write {key}", exc) from None
            except BotoCoreError as exc:
                raise self._fail(f"write {key}", exc) from None
            self._sleep(random.uniform(0, delay))
            delay = min(delay * 2, 0.5)
        raise StateError(f"state {self.location}: could not write {key}: it kept changing "
                         f"under {MAX_ATTEMPTS} attempts")

    def delete_archive(self, lease: Lease, chunks: Iterable[int]) -> None:
        self.check(lease)
        self._delete_keys([self._archive_key(c) for c in chunks])

    # -- garbage -------------------------------------------------------------------------

    def _delete_keys(self, keys: list[str]) -> None:
        """Best effort: an object left behind is garbage, never state."""
        for key in keys:
            self._bodies.pop(key, None)
            try:
                self.client.delete_object(Bucket=self.bucket, Key=key)
            except Exception:
                log.warning("state %s: could not delete unreferenced %s (harmless; removed "
                            "at the next takeover)", self.location, key, exc_info=True)

    def _sweep(self, lease: Lease) -> None:
        """Delete record objects that no decision links, unless fenced meanwhile.

        The head is read *after* the listing, and must still hold ``lease``: every
        listed object was then written before that read, so by an owner before this
        one (fenced: it can never link it) or it is linked in the head read. A newer
        owner that took over during the listing fences this sweep, which then
        deletes nothing: its new decisions may be among the listed objects.
        """
        listed: list[str] = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key("records/")):
            listed.extend(str(o["Key"]) for o in page.get("Contents", []) or [])
        head, _ = self._read_head()
        self._fence(head, lease)
        linked = {str(e["ref"]) for e in (head.get("epochs", {}) if head else {}).values()}
        garbage = [key for key in listed if key not in linked]
        if garbage:
            log.info("state %s: removing %d record object(s) no decision refers to",
                     self.location, len(garbage))
            self._delete_keys(garbage)


def open_store(location: str) -> S3StateStore:
    """The factory registered for the ``s3`` and ``s3a`` schemes."""
    return S3StateStore(location)
