"""The JVM jars Spark's own sinks need, resolved with Maven once and cached.

PySpark ships none of Spark's Kafka connector, the PostgreSQL JDBC driver or the
S3A filesystem. Each set is resolved with ``mvn dependency:build-classpath`` into the
local Maven repository (``~/.m2``) on the first run; the jar lists are cached, so a
second run starts without Maven or network. The resolvers of the Kafka benchmark
(``kafka_bench.spark_kafka_jars``) and of the s3a test helper
(``txsink.testing.s3a``) are reused as they are, so every script resolves the same
versions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from txsink_kafka.local_broker import maven_classpath

#: The PostgreSQL JDBC driver (Maven Central: org.postgresql:postgresql).
POSTGRES_JDBC = ("org.postgresql", "postgresql", "42.7.8")


@dataclass(frozen=True)
class SparkJars:
    """Jars per connector, and the Maven coordinates printed in the report."""

    kafka: list[str]
    postgres: list[str]
    s3a: list[str]
    coordinates: dict[str, str]

    def classpath(self) -> list[str]:
        """Every jar once, in a stable order (Kafka, JDBC, S3A)."""
        return list(dict.fromkeys([*self.kafka, *self.postgres, *self.s3a]))


def shipped_artifacts() -> set[str]:
    """Artifact names of the jars PySpark ships (never put twice on the class path)."""
    import pyspark

    return {_artifact(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}


def _artifact(jar_name: str) -> str:
    match = re.match(r"(.+?)-\d", jar_name)
    return match[1] if match else jar_name


def resolve(spark_version: str) -> SparkJars:
    """Resolve (or read from the cache) the three connectors' jars."""
    from kafka_bench import spark_kafka_jars
    from txsink.testing.s3a import hadoop_version, s3a_classpath

    kafka_coordinates, kafka = spark_kafka_jars(spark_version)
    group, artifact, version = POSTGRES_JDBC
    postgres = maven_classpath(f"postgresql-jdbc/{version}", [POSTGRES_JDBC])
    shipped = shipped_artifacts()
    s3a = [j for j in s3a_classpath() if _artifact(Path(j).name) not in shipped]
    return SparkJars(kafka=kafka, postgres=postgres, s3a=s3a, coordinates={
        "kafka": kafka_coordinates,
        "postgres": f"{group}:{artifact}:{version}",
        "s3a": f"org.apache.hadoop:hadoop-aws:{hadoop_version()}",
    })
