"""The S3 backend's tests use the session's S3 server of ``tests/integration/conftest.py``
(shared with the tests of Delta and Iceberg tables on S3, so one run starts one server)."""

from __future__ import annotations

import uuid

import pytest

from tests.integration.conftest import PART, S3Server

__all__ = ["PART", "S3Server"]


@pytest.fixture
def prefix() -> str:
    """A fresh key prefix per test, so tests never see each other's objects."""
    return f"t-{uuid.uuid4().hex[:10]}"
