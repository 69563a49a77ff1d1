"""Entry-point module: registers the directory state store like any third-party plugin."""

from __future__ import annotations

from txsink.hookspecs import hookimpl
from txsink.registry import StateStoreRegistry


@hookimpl
def txsink_register_state_stores(registry: StateStoreRegistry) -> None:
    from txsink.state import DirectoryStateStore

    registry.add("file", DirectoryStateStore)
