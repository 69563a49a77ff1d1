"""Whether an S3 endpoint honours conditional PUTs (``If-None-Match: *``, ``If-Match``).

txsink relies on them twice: the S3 state store fences coordinators with them, and
the S3 sink claims its sink id with a create-only PUT. Some S3-compatible servers
and gateways ignore the headers and answer 200, so the promise is probed, not
assumed: once per process, endpoint and bucket.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

#: Servers answer a failed precondition with 412; AWS answers 409 when two
#: conditional writes of one key race. Both mean "read again and retry".
CONFLICT_STATUS = (409, 412)


def status(exc: BaseException) -> int | None:
    """The HTTP status of a botocore ``ClientError`` (None for anything else)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        value = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return int(value) if value is not None else None
    return None


def error_code(exc: BaseException) -> str:
    """The S3 error code of a botocore ``ClientError`` ("" for anything else)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def conflict(exc: BaseException) -> bool:
    return status(exc) in CONFLICT_STATUS or error_code(exc) in (
        "PreconditionFailed", "ConditionalRequestConflict")


def probe_conditional_put(client: Any, bucket: str, key: str) -> str | None:
    """PUT a scratch object at ``key`` three ways and delete it: None when the server
    refuses a create over an existing object and a write with a wrong ETag (and takes
    one with the right ETag), else what it did wrong. Other failures are raised."""
    from botocore.exceptions import ClientError  # type: ignore[import-untyped,unused-ignore]

    broken: str | None = None
    try:
        first = client.put_object(Bucket=bucket, Key=key, Body=b"1", IfNoneMatch="*")
        for what, kwargs in (
            ("If-None-Match: * on an existing object", {"IfNoneMatch": "*"}),
            ("If-Match with a wrong ETag", {"IfMatch": '"0123456789abcdef0123456789abcdef"'}),
        ):
            try:
                client.put_object(Bucket=bucket, Key=key, Body=b"2", **kwargs)
            except ClientError as exc:
                if not conflict(exc):
                    raise
            else:
                broken = f"a PUT with {what} succeeded"
                break
        if broken is None:
            client.put_object(Bucket=bucket, Key=key, Body=b"3", IfMatch=first["ETag"])
    except ClientError as exc:
        if status(exc) in (400, 501) or error_code(exc) in ("NotImplemented",):
            broken = f"the server rejected a conditional PUT ({error_code(exc) or status(exc)})"
        else:
            raise
    finally:
        try:
            client.delete_object(Bucket=bucket, Key=key)
        except Exception:
            log.debug("could not delete probe object s3://%s/%s", bucket, key, exc_info=True)
    return broken
