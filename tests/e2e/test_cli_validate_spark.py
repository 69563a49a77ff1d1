"""``txsink validate`` with Spark takes the pipeline file's ``spark.conf`` as ``run`` does.

Before: validate's session took only ``spark.sql.*`` settings, so a source that comes
from a jar (Spark's own Kafka source, through ``spark.jars``) failed validate with
"Failed to find the data source: kafka" while ``run`` read it. One validate, one Spark
start.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.realtime_harness import connector_jars
from tests.e2e.spark_harness import kill_group

pytestmark = [pytest.mark.spark]


def test_validate_finds_a_source_that_comes_from_spark_jars(tmp_path: Path) -> None:
    f = tmp_path / "from-a-jar.yaml"
    f.write_text(f"""
source:
  type: spark
  format: kafka
  options: {{kafka.bootstrap.servers: "127.0.0.1:9", subscribe: orders}}
transform: SELECT CAST(value AS STRING) AS v, topic, partition, offset FROM source
checkpoint: {tmp_path}/chk
sink:
  backend: files
  sink_id: from-a-jar
  options: {{path: {tmp_path}/out, format: jsonl}}
spark:
  conf:
    spark.jars: "{",".join(connector_jars())}"
""")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.Popen([sys.executable, "-m", "txsink.cli", "validate", str(f)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        kill_group(proc.pid)
    assert proc.returncode == 0, err
    assert out.startswith("ok: pipeline 'from-a-jar' (streaming): source: spark kafka"), out
    assert "output columns: v string, topic string, partition int, offset bigint" in out, out
    assert not (tmp_path / "chk").exists() and not (tmp_path / "out").exists()
