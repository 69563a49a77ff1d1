"""The Python examples of docs/multi-target.md, run as written against real servers.

A streaming group (``python-group``) and grouped writes in ``foreachBatch``
(``python-grouped-writes``) write Kafka, PostgreSQL and S3 through Spark; the
reader examples (``kafka-reader``, ``s3-reader``) then read what they wrote. Only
the checkpoint paths (``/chk/...``) are moved under the test's directory; the names
the page leaves to the reader (``spark``, ``brokers``, ``dsn``, ``s3``, ``df``,
``last_offsets``, ``handle``, ``archive_options``, ``last_epoch``) are bound here,
and the tables, topics and bucket the page writes are created first. The grouped
writes example failed with ``UNRESOLVED_COLUMN`` once (an aggregate handed to a
target whose ``select`` names other columns).
"""

from __future__ import annotations

import collections
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.chaos.multi import Group

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("TXSINK_EXAMPLE_TESTS") != "1",
                                 reason="starts Kafka, PostgreSQL, SeaweedFS and Spark and "
                                 "runs two streaming queries (minutes): runs in `tox -e "
                                 "examples`, or with TXSINK_EXAMPLE_TESTS=1")]

PAGE = Path(__file__).resolve().parents[2] / "docs" / "multi-target.md"
ORDERS = [{"order_id": i, "customer": f"c{i % 3}", "qty": 1 + i % 4, "price": 10 * (i % 5),
           "status": "new" if i % 2 else "paid"} for i in range(40)]


def example(name: str) -> str:
    found = re.search(rf"<!-- example: {name} -->\s*```python\n(.*?)```", PAGE.read_text(),
                      re.S)
    assert found, name
    return found.group(1)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("txsink-docs-multi-target")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.host", "127.0.0.1").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
        from tests.e2e.test_kafka_source_spark import _stop_jvm

        _stop_jvm()


def run_all(spark: Any, code: str, ns: dict[str, Any]) -> None:
    """Run an example that starts a streaming query, until it has read all input."""
    exec(compile(code, str(PAGE), "exec"), ns)
    for query in spark.streams.active:
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        assert query.exception() is None, query.exception()


def test_the_python_examples_run_as_written(multi_group: Group, spark: Any,
                                            tmp_path: Path) -> None:
    from txsink_kafka.testing import create_topic

    kafka = multi_group.servers["events"]
    pg = multi_group.servers["totals"].server  # type: ignore[attr-defined]
    s3_server = multi_group.servers["archive"].server  # type: ignore[attr-defined]
    brokers = kafka.bootstrap  # type: ignore[attr-defined]
    dsn = pg.url_with_password
    s3 = {"endpoint_url": s3_server.endpoint_url, "region": "us-east-1",
          "access_key_id": s3_server.access_key, "secret_access_key": s3_server.secret_key}
    for topic in ("orders", "orders-new"):
        create_topic(brokers, topic, partitions=2)
    s3_server.client().create_bucket(Bucket="archive")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.order_totals (order_id bigint, customer text, "
                     "total bigint, txsink_epoch bigint)")
        conn.execute("CREATE TABLE public.customer_totals (customer text, total bigint)")
    source = tmp_path / "in"
    source.mkdir()
    for part in range(2):  # two micro-batches
        (source / f"{part}.jsonl").write_text("".join(
            json.dumps(o) + "\n" for o in ORDERS[part * 20:(part + 1) * 20]))
    df = (spark.readStream.schema("order_id long, customer string, qty long, price long, "
                                  "status string").option("maxFilesPerTrigger", 1)
          .json(str(source)))
    ns: dict[str, Any] = {"spark": spark, "brokers": brokers, "dsn": dsn, "s3": s3, "df": df}

    def here(code: str) -> str:
        return code.replace('"/chk/', f'"{tmp_path}/chk/')

    run_all(spark, here(example("python-group")), ns)
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT order_id, customer, total, txsink_epoch "
                            "FROM public.order_totals").fetchall()
    assert sorted((r[0], r[1], r[2]) for r in rows) == sorted(
        (o["order_id"], o["customer"], o["qty"] * o["price"]) for o in ORDERS)
    assert {r[3] for r in rows} == {0, 1}

    run_all(spark, here(example("python-grouped-writes")), ns)
    want: collections.Counter[str] = collections.Counter()
    for o in ORDERS:
        want[o["customer"]] += o["qty"] * o["price"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        got: collections.Counter[str] = collections.Counter()
        for customer, total in conn.execute(
                "SELECT customer, total FROM public.customer_totals").fetchall():
            got[customer] += total
    assert got == want

    # The readers, up to the page's cut (11: past every epoch written here).
    handled: list[Any] = []
    ns.update(last_offsets=None, handle=handled.append)
    exec(compile(example("kafka-reader"), str(PAGE), "exec"), ns)
    assert sorted(json.loads(m.value())["order_id"] for m in handled) == [
        o["order_id"] for o in ORDERS]
    assert ns["last_offsets"]
    ns.update(archive_options={"bucket": "archive", "prefix": "orders", **s3}, last_epoch=-1)
    exec(compile(example("s3-reader"), str(PAGE), "exec"), ns)
    assert sorted(ns["table"].column("order_id").to_pylist()) == [
        o["order_id"] for o in ORDERS]
