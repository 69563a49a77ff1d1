"""PostgreSQL backend for txsink: ``COPY`` into a transaction, ``PREPARE``, commit on the driver."""

from txsink_postgres.backend import PostgresBackend

__all__ = ["PostgresBackend"]
