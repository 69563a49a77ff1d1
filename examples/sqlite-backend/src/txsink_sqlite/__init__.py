"""Example txsink backend for SQLite, a database without two-phase commit."""

from txsink_sqlite.backend import SqliteBackend

__all__ = ["SqliteBackend"]
