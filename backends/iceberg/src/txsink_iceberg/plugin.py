"""Entry-point module: registers the Apache Iceberg backend like any third-party plugin."""

from __future__ import annotations

from txsink.hookspecs import hookimpl
from txsink.registry import BackendRegistry


@hookimpl
def txsink_register_backends(registry: BackendRegistry) -> None:
    # Imported here so loading the plugin stays cheap (pyiceberg loads on first use).
    from txsink_iceberg.backend import IcebergBackend

    registry.add(IcebergBackend)
