"""The built-in files backend (Parquet or JSON Lines), like Flink's ``FileSink``."""

from txsink.files.backend import FilesBackend

__all__ = ["FilesBackend"]
