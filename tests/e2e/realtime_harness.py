"""Shared pieces of the Real-time Mode tests: Spark with Spark's Kafka connector."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from txsink_kafka.local_broker import maven_classpath

#: Spark's Kafka connector: 4.3.0 is not on Maven Central (DESIGN-checked), 4.2.0 runs on
#: PySpark 4.3 and has the real-time read path.
SPARK_KAFKA = ("org.apache.spark", "spark-sql-kafka-0-10_2.13", "4.2.0")


def connector_jars() -> list[str]:
    """The connector and the dependencies PySpark does not ship (cached after one run)."""
    import pyspark

    def artifact(name: str) -> str:
        match = re.match(r"(.+?)-\d", name)
        return match[1] if match else name

    shipped = {artifact(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    jars = maven_classpath(f"spark-sql-kafka/{SPARK_KAFKA[2]}", [SPARK_KAFKA])
    return [j for j in jars if artifact(Path(j).name) not in shipped]


def make_spark(app: str, cores: int = 2, **conf: str) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(f"local[{cores}]").appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.jars", ",".join(connector_jars())))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def stop_jvm() -> None:
    """session.stop() leaves the JVM running until pytest exits: end it now."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    gateway.shutdown()
    if proc is not None:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(15)
        except Exception:
            proc.kill()
            proc.wait(15)
    SparkContext._gateway = None
    SparkContext._jvm = None
