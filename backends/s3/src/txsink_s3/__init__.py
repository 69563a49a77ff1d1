"""txsink backend for S3 and S3-compatible object stores (multipart-upload 2PC)."""

from __future__ import annotations

from txsink_s3.backend import S3Backend

__all__ = ["S3Backend"]
