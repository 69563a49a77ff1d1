"""Entry-point module: registers the S3 backend and the S3 state store, exactly like
any third-party plugin."""

from __future__ import annotations

from typing import TYPE_CHECKING

from txsink.hookspecs import hookimpl
from txsink.registry import BackendRegistry, StateStoreRegistry

if TYPE_CHECKING:
    from txsink.state import StateStore


@hookimpl
def txsink_register_backends(registry: BackendRegistry) -> None:
    # Imported here so that loading the plugin stays cheap (boto3 loads lazily too).
    from txsink_s3.backend import S3Backend

    registry.add(S3Backend)


def _open_state_store(location: str) -> StateStore:
    from txsink_s3.state import open_store

    return open_store(location)


@hookimpl
def txsink_register_state_stores(registry: StateStoreRegistry) -> None:
    # s3a:// is how Spark names the same bucket, so a state location derived from an
    # s3a checkpoint location lands here too.
    for scheme in ("s3", "s3a"):
        registry.add(scheme, _open_state_store)
