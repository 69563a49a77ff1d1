"""Entry point of the ``txsink`` group: registers the ``postgres`` backend."""

from __future__ import annotations

from txsink.hookspecs import hookimpl
from txsink.registry import BackendRegistry


@hookimpl
def txsink_register_backends(registry: BackendRegistry) -> None:
    # Imported here so that loading the plugin (on every txsink start) stays cheap.
    from txsink_postgres.backend import PostgresBackend

    registry.add(PostgresBackend)
