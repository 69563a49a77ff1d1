"""Entry-point module: registers the Delta Lake backend like any third-party plugin."""

from __future__ import annotations

from txsink.hookspecs import hookimpl
from txsink.registry import BackendRegistry


@hookimpl
def txsink_register_backends(registry: BackendRegistry) -> None:
    # Imported here so loading the plugin stays cheap (deltalake loads on first use).
    from txsink_delta.backend import DeltaBackend

    registry.add(DeltaBackend)
