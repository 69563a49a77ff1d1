"""Tables on S3 for the table-format backends: their S3 options, the pyarrow filesystem
their data files go through, and the checks made before any data moves.

The options are the S3 backend's (``endpoint_url``, ``region``, ``addressing_style``,
``access_key_id``, ``secret_access_key``, ``session_token``), with the same rules: keys
given as options are secrets (never logged, stored in the state or put into
committables); without them the AWS credential chain of each process is used
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``, ``AWS_PROFILE``,
instance roles), on the driver and on every executor. The endpoint falls back to
``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` and the region to ``AWS_REGION`` /
``AWS_DEFAULT_REGION``, resolved here once so pyarrow, delta-rs and pyiceberg (three
S3 clients) talk to the same place.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import pyarrow.fs as pafs

from txsink.errors import ConfigError
from txsink.options import Options, Secret

#: URI schemes taken for S3 (``s3a://`` as Spark's Hadoop names the same objects).
SCHEMES = ("s3://", "s3a://")
#: The options of an S3 location, as the S3 backend names them.
OPTION_KEYS = ("endpoint_url", "region", "addressing_style", "access_key_id",
               "secret_access_key", "session_token")
SECRET_KEYS = frozenset({"secret_access_key", "session_token"})
DEFAULT_REGION = "us-east-1"
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,62}$")


def is_s3(uri: str) -> bool:
    return uri.startswith(SCHEMES)


def split_uri(uri: str, *, owner: str, field: str) -> tuple[str, str]:
    """``s3://bucket/key`` (or ``s3a://``) as (bucket, key without slashes at its ends)."""
    rest = uri.split("://", 1)[1]
    bucket, _, key = rest.partition("/")
    if not _BUCKET.match(bucket):
        raise ConfigError(f"{owner}: option '{field}' {uri!r} does not name a bucket "
                          "(s3://<bucket>/<prefix>)", field=field)
    key = key.strip("/")
    if any(part in (".", "..") for part in key.split("/")) or "//" in key or any(
            c in key for c in "*?[]{}\\"):
        raise ConfigError(f"{owner}: option '{field}' {uri!r}: the prefix must not hold empty, "
                          "'.' or '..' segments or glob characters", field=field)
    return bucket, key


def unreachable(text: str) -> bool:
    """An Arrow S3 filesystem error that means no connection (not a refusal)."""
    return "NETWORK_CONNECTION" in text or "curlCode" in text


class S3Names(NamedTuple):
    """What one S3 client library calls each setting :meth:`S3Access.properties` gives."""

    region: str
    endpoint: str
    virtual_addressing: str
    access_key_id: str
    secret_access_key: str
    session_token: str


@dataclass(frozen=True)
class S3Access:
    """How to reach an S3 location: endpoint, region, addressing and (optional) keys."""

    endpoint_url: str | None = None
    region: str | None = None
    addressing_style: str = "auto"
    access_key_id: str | None = None
    secret_access_key: Secret | None = None
    session_token: Secret | None = None

    @classmethod
    def from_options(cls, opts: Options, owner: str) -> S3Access:
        endpoint = opts.optional("endpoint_url")
        if endpoint is not None:
            if not re.match(r"^https?://[^/\s]+/?$", endpoint):
                raise ConfigError(f"{owner}: option 'endpoint_url' {endpoint!r} must be an "
                                  "http(s)://host[:port] URL", field="endpoint_url")
            if "@" in endpoint:
                raise ConfigError(f"{owner}: option 'endpoint_url' must not hold credentials; "
                                  "use access_key_id/secret_access_key or the AWS credential "
                                  "chain", field="endpoint_url")
        region = opts.optional("region")
        addressing = opts.choice("addressing_style", ("auto", "path", "virtual"), "auto")
        key_id = opts.optional("access_key_id")
        secret = opts.secret("secret_access_key")
        token = opts.secret("session_token")
        if (key_id is None) != (secret is None):
            missing = "secret_access_key" if secret is None else "access_key_id"
            raise ConfigError(f"{owner}: option '{missing}' is required when the other of "
                              "access_key_id/secret_access_key is given (or give neither and "
                              "let the AWS credential chain find them)", field=missing)
        if token is not None and secret is None:
            raise ConfigError(f"{owner}: option 'session_token' needs access_key_id and "
                              "secret_access_key", field="session_token")
        return cls(endpoint.rstrip("/") if endpoint else None, region, addressing, key_id,
                   secret, token)

    @staticmethod
    def refuse_for_local(options: Mapping[str, str], owner: str, field: str) -> None:
        """S3 options given for a local table are a mistake (a path missing its s3://)."""
        given = sorted(k for k in OPTION_KEYS if options.get(k) not in (None, ""))
        if given:
            raise ConfigError(f"{owner}: option {given[0]!r} applies to tables on S3 only; "
                              f"option '{field}' names a local directory (an S3 location "
                              "is written s3://<bucket>/<prefix>)", field=given[0])

    # -- resolved settings ----------------------------------------------------------------

    def endpoint(self) -> str | None:
        return (self.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3")
                or os.environ.get("AWS_ENDPOINT_URL") or None)

    def region_name(self) -> str:
        return (self.region or os.environ.get("AWS_REGION")
                or os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION)

    def secrets(self) -> list[str]:
        return [s.reveal() for s in (self.secret_access_key, self.session_token) if s]

    def hide_secrets(self, text: str) -> str:
        """``text`` (an Arrow filesystem's error) with this access's keys masked."""
        for secret in self.secrets():
            text = text.replace(secret, "***")
        return text

    def credentials_source(self) -> str:
        """Where the keys come from, for error messages (never the keys themselves)."""
        if self.access_key_id is not None:
            return "the options access_key_id/secret_access_key"
        if os.environ.get("AWS_ACCESS_KEY_ID"):
            return "the environment (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)"
        if os.environ.get("AWS_PROFILE"):
            return f"the profile {os.environ['AWS_PROFILE']!r} (AWS_PROFILE)"
        return ("none found: no access_key_id/secret_access_key options and no "
                "AWS_ACCESS_KEY_ID in the environment (anonymous unless a shared "
                "credentials file or an instance role provides some)")

    def where(self, bucket: str) -> str:
        endpoint = self.endpoint()
        return f"s3://{bucket}" + (f" at {endpoint}" if endpoint else "")

    def properties(self, names: S3Names) -> dict[str, str]:
        """This access as a client library's string settings, under its ``names``: the
        region; the endpoint when one is known; the addressing style when one is chosen;
        the keys when given as options (without them the library's own AWS credential
        chain finds them, in each process)."""
        out = {names.region: self.region_name()}
        endpoint = self.endpoint()
        if endpoint:
            out[names.endpoint] = endpoint
        if self.addressing_style != "auto":
            out[names.virtual_addressing] = str(self.addressing_style == "virtual").lower()
        if self.access_key_id is not None and self.secret_access_key is not None:
            out[names.access_key_id] = self.access_key_id
            out[names.secret_access_key] = self.secret_access_key.reveal()
            if self.session_token is not None:
                out[names.session_token] = self.session_token.reveal()
        return out

    def filesystem(self, max_attempts: int = 5) -> pafs.S3FileSystem:
        """pyarrow's S3 filesystem for the data files (one per process: not pickled).
        The checks before a run use 2 attempts: a wrong endpoint is named at once."""
        kwargs: dict[str, object] = {
            "region": self.region_name(), "connect_timeout": 10.0, "request_timeout": 120.0,
            "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=max_attempts)}
        endpoint = self.endpoint()
        if endpoint:
            scheme, host = endpoint.split("://", 1)
            kwargs.update(endpoint_override=host.rstrip("/"), scheme=scheme)
        if self.addressing_style != "auto":
            kwargs["force_virtual_addressing"] = self.addressing_style == "virtual"
        if self.access_key_id is not None and self.secret_access_key is not None:
            kwargs.update(access_key=self.access_key_id,
                          secret_key=self.secret_access_key.reveal())
            if self.session_token is not None:
                kwargs["session_token"] = self.session_token.reveal()
        return pafs.S3FileSystem(**kwargs)  # type: ignore[arg-type]

    # -- checks before any data moves -----------------------------------------------------

    def check(self, bucket: str, key: str, *, owner: str, field: str) -> None:
        """Raise :class:`ConfigError` naming the problem unless ``bucket`` exists, the
        credentials are accepted and an object can be written and deleted under ``key``.
        """
        fs = self.filesystem(max_attempts=2)
        where = self.where(bucket)
        try:
            info = fs.get_file_info(bucket)
        except OSError as exc:
            raise self._explain(exc, where, owner, field) from None
        if info.type == pafs.FileType.NotFound:
            raise ConfigError(f"{owner}: bucket {bucket!r} does not exist at {where} "
                              f"(option '{field}'); txsink never creates buckets",
                              field=field)
        probe = "/".join(p for p in (key, f"_txsink-probe-{uuid.uuid4().hex[:12]}") if p)
        try:
            with fs.open_output_stream(f"{bucket}/{probe}") as out:
                out.write(b"txsink write probe")
            fs.delete_file(f"{bucket}/{probe}")
        except OSError as exc:
            raise self._explain(exc, where, owner, field, writing=True) from None

    def _explain(self, exc: OSError, where: str, owner: str, field: str, *,
                 writing: bool = False) -> ConfigError:
        text = self.hide_secrets(str(exc))
        if unreachable(text):
            return ConfigError(f"{owner}: cannot reach {where}: {text} (option "
                               "'endpoint_url', or AWS_ENDPOINT_URL_S3/AWS_ENDPOINT_URL)",
                               field="endpoint_url")
        if any(code in text for code in ("ACCESS_DENIED", "INVALID_ACCESS_KEY_ID",
                                         "SIGNATURE_DOES_NOT_MATCH", "Forbidden",
                                         "UNRECOGNIZED_CLIENT", "EXPIRED_TOKEN")):
            field = "secret_access_key" if self.secret_access_key else "access_key_id"
            action = "writing under" if writing else "reading"
            return ConfigError(f"{owner}: {where} refused {action} the table's location "
                               f"({text.split(':', 1)[-1].strip()}); credentials from "
                               f"{self.credentials_source()}: check them and the bucket "
                               "policy", field=field)
        return ConfigError(f"{owner}: cannot use {where}: {text}", field=field)


def table_location(opts: Options, options: Mapping[str, str], owner: str,
                   field: str) -> tuple[str, S3Access | None]:
    """A table backend's location option: ``s3://bucket/prefix`` (with its S3 access
    from the options) or a local directory (made absolute; S3 options refused there)."""
    location = opts.str(field, required=True)
    if is_s3(location):
        bucket, key = split_uri(location, owner=owner, field=field)
        return f"s3://{bucket}/{key}".rstrip("/"), S3Access.from_options(opts, owner)
    if location.startswith("file://") or "://" not in location:
        S3Access.refuse_for_local(options, owner, field)
        return os.path.abspath(location.removeprefix("file://")), None
    raise ConfigError(f"{owner}: option '{field}' must be a local directory or "
                      f"s3://<bucket>/<prefix>, got {location!r}", field=field)
