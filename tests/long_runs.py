"""Tests kept out of the default run (``uv run pytest``, what CI runs), by tier.

The default run has a budget of 15 minutes on 2 cores (README). It keeps every backend,
both guarantees and one crash at every protocol step of every backend (the coverage
map, checked by ``tests/unit/test_coverage_map.py``); the deeper runs live in tox
environments, each switched on by its variable:

* ``TXSINK_LONG=1`` (``tox -e e2e-long``): several Spark drivers per test;
* ``TXSINK_CHAOS=1`` (``tox -e chaos``): random chaos, 20 faults per backend, the group
  of targets and the three-node Kafka cluster's failovers;
* ``TXSINK_CLUSTER_LONG=1`` (``tox -e cluster``): a Spark standalone cluster;
* ``TXSINK_KAFKA_LONG=1`` (``tox -e kafka-long``): a producer epoch exhausted;
* ``TXSINK_LAKE_S3=1`` (``tox -e integration-delta``, ``-e integration-iceberg``): the
  conformance kits and crash tests of Delta and Iceberg tables on S3.
"""

from __future__ import annotations

import os

import pytest

ENV = "TXSINK_LONG"
BUDGET = "the default run's budget is 15 minutes on 2 cores"

#: Mark a test (or a module's ``pytestmark``) as kept out of the default run.
long_run = pytest.mark.skipif(
    os.environ.get(ENV) != "1",
    reason=f"long run (several Spark drivers): kept out of the default run ({BUDGET}); "
           f"`tox -e e2e-long` or {ENV}=1 runs it")

CHAOS_ENV = "TXSINK_CHAOS"

#: Random chaos: minutes per backend. The default run keeps one crash at every protocol
#: step of every backend (``test_a_crash_at_every_protocol_step``).
chaos_run = pytest.mark.skipif(
    os.environ.get(CHAOS_ENV) != "1",
    reason=f"random chaos (minutes per backend): kept out of the default run ({BUDGET}), "
           f"which keeps one crash at every protocol step; `tox -e chaos` or {CHAOS_ENV}=1 "
           f"runs it")

CLUSTER_ENV = "TXSINK_CLUSTER_LONG"

#: A Spark standalone cluster (master, two workers, executors killed): minutes each.
cluster_run = pytest.mark.skipif(
    os.environ.get(CLUSTER_ENV) != "1",
    reason=f"Spark standalone cluster (minutes per test): kept out of the default run "
           f"({BUDGET}); `tox -e cluster` or {CLUSTER_ENV}=1 runs it")

KAFKA_ENV = "TXSINK_KAFKA_LONG"

#: Kafka tests that drive a broker for minutes (a producer epoch exhausted).
kafka_long_run = pytest.mark.skipif(
    os.environ.get(KAFKA_ENV) != "1",
    reason=f"long run (a pooled id driven through 32,767 producer epochs, minutes per "
           f"transaction version): kept out of the default run ({BUDGET}); "
           f"`tox -e kafka-long` or {KAFKA_ENV}=1 runs it")

LAKE_S3_ENV = "TXSINK_LAKE_S3"

#: The conformance kits of Delta and Iceberg tables on S3 (SeaweedFS) and their crash
#: tests (a coordinator killed after its decision), on top of the default run's race
#: and bad-input tests of those tables.
lake_s3_run = pytest.mark.skipif(
    os.environ.get(LAKE_S3_ENV) != "1",
    reason=f"conformance kit and crash test on S3 tables (about a minute per format): "
           f"kept out of the "
           f"default run ({BUDGET}); `tox -e integration-delta` / `-e integration-iceberg` "
           f"or {LAKE_S3_ENV}=1 runs it")

ICEBERG_REST_ENV = "TXSINK_ICEBERG_REST"

#: The Iceberg conformance kit through Iceberg's own REST catalog server and through a
#: SQL catalog on PostgreSQL, and the REST target's chaos; the default run keeps the
#: REST catalog's credentials test and its server killed between decision and commit.
iceberg_rest_run = pytest.mark.skipif(
    os.environ.get(ICEBERG_REST_ENV) != "1",
    reason=f"the Iceberg conformance kit behind a REST catalog and a PostgreSQL catalog, "
           f"and the REST target's chaos (about two minutes): kept out of the default run "
           f"({BUDGET}); `tox -e iceberg-rest` or {ICEBERG_REST_ENV}=1 runs it")
