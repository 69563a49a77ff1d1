"""Tests too long for the default run (``uv run pytest``, what CI runs).

The default run takes about 35 minutes on 2 cores (README); these run in the tox
environments ``e2e-long`` (``TXSINK_LONG=1``) and ``kafka-long``
(``TXSINK_KAFKA_LONG=1``).
"""

from __future__ import annotations

import os

import pytest

ENV = "TXSINK_LONG"

#: Mark a test (or a module's ``pytestmark``) as kept out of the default run.
long_run = pytest.mark.skipif(
    os.environ.get(ENV) != "1",
    reason=f"long run (several Spark drivers): kept out of the default run, which "
           f"takes about 35 minutes on 2 cores; `tox -e e2e-long` or {ENV}=1 runs it")

KAFKA_ENV = "TXSINK_KAFKA_LONG"

#: Kafka tests that drive a broker for minutes (a producer epoch exhausted).
kafka_long_run = pytest.mark.skipif(
    os.environ.get(KAFKA_ENV) != "1",
    reason=f"long run (a pooled id driven through 32,767 producer epochs, minutes per "
           f"transaction version): kept out of the default run, which takes about 35 minutes "
           f"on 2 cores; `tox -e kafka-long` or {KAFKA_ENV}=1 runs it")
