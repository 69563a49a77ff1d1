"""Entry-point module: registers the S3 backend exactly like any third-party plugin."""

from __future__ import annotations

from txsink.hookspecs import hookimpl
from txsink.registry import BackendRegistry


@hookimpl
def txsink_register_backends(registry: BackendRegistry) -> None:
    # Imported here so that loading the plugin stays cheap (boto3 loads lazily too).
    from txsink_s3.backend import S3Backend

    registry.add(S3Backend)
