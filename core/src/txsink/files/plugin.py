"""Entry-point module: registers the files backend like any third-party plugin."""

from __future__ import annotations

from txsink.hookspecs import hookimpl
from txsink.registry import BackendRegistry


@hookimpl
def txsink_register_backends(registry: BackendRegistry) -> None:
    from txsink.files.backend import FilesBackend

    registry.add(FilesBackend)
