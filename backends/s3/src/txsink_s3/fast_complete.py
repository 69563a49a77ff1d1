"""``CompleteMultipartUpload`` in one signed HTTP request, for the commit of an epoch.

An epoch's commit is one ``CompleteMultipartUpload`` per participant. Through boto3 each
costs about 1 ms of CPU under the GIL (parameter validation, the event system,
serialisation, signing, response parsing): at 128 participants that is more CPU than
the S3 server spends completing them. Here the same request is built and signed with
botocore's own SigV4 signer and sent over a plain urllib3 pool, at about half the CPU.

Only the plain success is taken from it: a 200 whose body is a
``CompleteMultipartUploadResult``. Any other answer, and any failure to get one, sends
the participant down boto3's path (:meth:`txsink_s3.backend.S3Backend.commit`), which
completes it again idempotently and says what went wrong. Used only where that path's
request is certain: an ``http://`` endpoint addressed path-style (S3-compatible stores,
SeaweedFS, MinIO), with no proxy configured in the environment; AWS and ``https://``
endpoints keep boto3 for every request.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit

log = logging.getLogger(__name__)

_PROXY_VARS = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY",
               "all_proxy")
#: Requests completed here, per process (for tests and benchmarks).
COUNTS = {"fast": 0, "fallback": 0}
_counts_lock = threading.Lock()


def _path_style(endpoint: str, addressing_style: str) -> bool:
    host = urlsplit(endpoint).hostname or ""
    if addressing_style == "path":
        return True
    if addressing_style == "virtual":
        return False
    try:  # "auto": an IP address or localhost cannot carry the bucket as a host name
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return host == "localhost"


class FastCompleter:
    """Completes multipart uploads of one endpoint with signed urllib3 requests."""

    def __init__(self, endpoint: str, region: str, credentials: Any, *, pool_size: int,
                 connect_timeout: float, read_timeout: float) -> None:
        import urllib3

        self.endpoint = endpoint.rstrip("/")
        self.region = region
        self.credentials = credentials
        self.timeout = urllib3.Timeout(connect=connect_timeout, read=read_timeout)
        self.pool = urllib3.PoolManager(maxsize=pool_size, block=False, retries=False)

    @classmethod
    def for_backend(cls, endpoint: str | None, addressing_style: str, client: Any,
                    session: Any, *, pool_size: int, connect_timeout: float,
                    read_timeout: float) -> FastCompleter | None:
        """The completer for this client's endpoint, or None where boto3 must do it."""
        if (not endpoint or not endpoint.startswith("http://")
                or not _path_style(endpoint, addressing_style)
                or any(os.environ.get(v) for v in _PROXY_VARS)):
            return None
        credentials = session.get_credentials()
        region = client.meta.region_name
        if credentials is None or not region:
            return None
        return cls(endpoint, region, credentials, pool_size=pool_size,
                   connect_timeout=connect_timeout, read_timeout=read_timeout)

    def complete(self, payload: Mapping[str, Any], *, only_if_absent: bool) -> bool:
        """Complete the upload of ``payload``; True only for the plain success."""
        from botocore.auth import S3SigV4Auth  # type: ignore[import-untyped,unused-ignore]
        from botocore.awsrequest import AWSRequest  # type: ignore[import-untyped,unused-ignore]

        parts = "".join(
            f"<Part><PartNumber>{int(n)}</PartNumber><ETag>{_xml(str(etag))}</ETag></Part>"
            for n, etag in payload["parts"])
        body = (f'<CompleteMultipartUpload xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
                f"{parts}</CompleteMultipartUpload>").encode()
        url = (f"{self.endpoint}/{quote(str(payload['bucket']), safe='')}/"
               f"{quote(str(payload['key']), safe='/~')}"
               f"?uploadId={quote(str(payload['upload_id']), safe='~')}")
        headers = {"Content-Type": "application/xml"}
        if only_if_absent:
            headers["If-None-Match"] = "*"
        try:
            request = AWSRequest(method="POST", url=url, data=body, headers=headers)
            S3SigV4Auth(self.credentials.get_frozen_credentials(), "s3",
                        self.region).add_auth(request)
            response = self.pool.request("POST", url, body=body,
                                         headers=dict(request.headers.items()),
                                         timeout=self.timeout)
        except Exception as exc:  # boto3's path retries it and says what went wrong
            log.debug("fast completion of %s failed (%s); completing it through boto3",
                      payload.get("key"), exc)
            self._count("fallback")
            return False
        text = response.data
        done = (response.status == 200 and b"CompleteMultipartUploadResult" in text
                and b"<Error>" not in text)
        self._count("fast" if done else "fallback")
        return done

    @staticmethod
    def _count(what: str) -> None:
        with _counts_lock:
            COUNTS[what] += 1

    def close(self) -> None:
        self.pool.clear()


def _xml(text: str) -> str:
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))
