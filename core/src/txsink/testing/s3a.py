"""Spark's ``s3a://`` filesystem for tests: the jars, resolved once, and the settings.

PySpark ships Hadoop's client but not ``hadoop-aws``; the S3A connector must match
the bundled Hadoop exactly (read from ``pyspark/jars/hadoop-client-api-<v>.jar``).
:func:`s3a_classpath` resolves ``org.apache.hadoop:hadoop-aws:<v>`` and its runtime
dependencies (the AWS SDK v2 ``bundle`` among them) with Maven into the local
repository (``~/.m2``), trying offline first, so only the first run needs the
network. Checked with PySpark 4.3 (Hadoop 3.5.0): hadoop-aws 3.5.0,
software.amazon.awssdk:bundle 2.35.4, analyticsaccelerator-s3 1.3.1,
wildfly-openssl 2.2.5.Final (about 660 MiB, nearly all of it the SDK bundle).

The jars go on the driver's and executors' class path (``extraClassPath``) instead
of ``spark.jars``, which would copy them to every executor of every application.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from txsink.testing.spark_cluster import spark_home

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>txsink.testing</groupId><artifactId>s3a-classpath</artifactId><version>0</version>
  <dependencies>
    <dependency>
      <groupId>org.apache.hadoop</groupId><artifactId>hadoop-aws</artifactId>
      <version>{version}</version>
    </dependency>
  </dependencies>
</project>
"""


class S3AUnavailable(RuntimeError):
    """The S3A jars could not be resolved (no Maven, or no network on a first run)."""


def hadoop_version() -> str:
    """The Hadoop version bundled with the installed PySpark."""
    jars = sorted((spark_home() / "jars").glob("hadoop-client-api-*.jar"))
    if not jars:
        raise S3AUnavailable(f"no hadoop-client-api jar in {spark_home() / 'jars'}")
    m = re.match(r"hadoop-client-api-(.+)\.jar$", jars[-1].name)
    assert m is not None
    return m[1]


def s3a_classpath(timeout: float = 1800.0) -> list[str]:
    """Local paths of hadoop-aws and its runtime dependencies (Maven, cached in ~/.m2)."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise S3AUnavailable("Maven (mvn) is not installed; it resolves hadoop-aws")
    version = hadoop_version()
    with tempfile.TemporaryDirectory(prefix="txsink-s3a-") as tmp:
        pom = Path(tmp) / "pom.xml"
        pom.write_text(_POM.format(version=version))
        out = Path(tmp) / "cp.txt"
        errors = []
        for offline in (True, False):
            cmd = [mvn, "-B", "-q", *(["-o"] if offline else []), "-f", str(pom),
                   "dependency:build-classpath", f"-Dmdep.outputFile={out}",
                   "-Dmdep.includeScope=runtime"]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                      check=False)
            except subprocess.TimeoutExpired:
                errors.append(f"{'offline' if offline else 'online'}: timed out")
                continue
            if done.returncode == 0 and out.exists():
                jars = [p for p in out.read_text().strip().split(":") if p]
                if jars:
                    return jars
            errors.append(f"{'offline' if offline else 'online'}: "
                          f"{(done.stdout + done.stderr).strip()[-400:]}")
    raise S3AUnavailable(f"could not resolve org.apache.hadoop:hadoop-aws:{version}: "
                         + " | ".join(errors))


def s3a_conf(jars: list[str], *, endpoint_url: str | None = None,
             access_key: str | None = None, secret_key: str | None = None,
             region: str = "us-east-1") -> dict[str, str]:
    """Spark settings for ``s3a://`` paths; ``endpoint_url`` for an S3-compatible server.

    Keys given here end up in the Spark configuration: fine for a throw-away test
    server; production uses a credential provider instead.
    """
    classpath = ":".join(jars)
    conf = {
        "spark.driver.extraClassPath": classpath,
        "spark.executor.extraClassPath": classpath,
        "spark.hadoop.fs.s3a.endpoint.region": region,
    }
    if endpoint_url:
        conf.update({
            "spark.hadoop.fs.s3a.endpoint": endpoint_url,
            "spark.hadoop.fs.s3a.path.style.access": "true",
            "spark.hadoop.fs.s3a.connection.ssl.enabled": str(
                endpoint_url.startswith("https")).lower(),
        })
    if access_key and secret_key:
        conf.update({
            "spark.hadoop.fs.s3a.access.key": access_key,
            "spark.hadoop.fs.s3a.secret.key": secret_key,
            "spark.hadoop.fs.s3a.aws.credentials.provider":
                "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        })
    return conf
