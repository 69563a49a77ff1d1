"""Spark end-to-end tests: skipped with a reason when Java or PySpark is missing."""

from __future__ import annotations

import shutil

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    missing = None
    if shutil.which("java") is None:
        missing = "Java is not installed (Spark needs Java 17)"
    else:
        try:
            import pyspark  # noqa: F401
        except ImportError:
            missing = "PySpark is not installed (pip install 'txsink[spark]')"
    if missing:
        for item in items:
            if "spark" in item.keywords:
                item.add_marker(pytest.mark.skip(reason=missing))
