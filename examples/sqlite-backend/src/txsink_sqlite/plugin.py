"""Entry-point module named in pyproject.toml (group ``txsink``)."""

from __future__ import annotations

from txsink.hookspecs import hookimpl
from txsink.registry import BackendRegistry


@hookimpl
def txsink_register_backends(registry: BackendRegistry) -> None:
    from txsink_sqlite.backend import SqliteBackend  # lazy: keep plugin loading cheap

    registry.add(SqliteBackend)
