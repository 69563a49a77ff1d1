"""``txsink validate`` builds its Spark session as ``run`` does: the pipeline file's whole
``spark.conf``.

Before: validate took only the ``spark.sql.*`` settings, so a pipeline whose source
comes from a jar (``spark.jars``) failed validate ("Failed to find the data source")
while run worked. No JVM here: the builders' settings are compared.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from txsink.config import parse_pipeline

pytest.importorskip("pyspark", reason="the Spark session needs PySpark")

CONF = {"spark.jars": "/opt/jars/spark-sql-kafka.jar,/opt/jars/kafka-clients.jar",
        "spark.jars.packages": "org.example:thing:1.0",
        "spark.driver.extraJavaOptions": "-Dx=y", "spark.sql.shuffle.partitions": "3"}


def _cfg(tmp_path: Path, **spark: Any) -> Any:
    return parse_pipeline({
        "name": "jar-source",
        "source": {"type": "spark", "format": "kafka",
                   "options": {"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t"}},
        "checkpoint": str(tmp_path / "chk"),
        "sink": {"backend": "files", "sink_id": "s", "options": {"path": str(tmp_path)}},
        "spark": {"master": "local[2]", "conf": CONF, **spark}})


def test_validate_and_run_build_the_session_from_the_same_settings(tmp_path: Path) -> None:
    from txsink.spark.session import session_builder

    cfg = _cfg(tmp_path)
    run = dict(session_builder(cfg)._options)
    validate = dict(session_builder(cfg, master="local[1]", app_name="v")._options)
    for key, value in CONF.items():
        assert run[key] == validate[key] == value, key
    assert run.pop("spark.master") == "local[2]" and validate.pop("spark.master") == "local[1]"
    run.pop("spark.app.name")
    validate.pop("spark.app.name")
    assert run == validate


def test_check_pipeline_takes_that_builder(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from txsink.spark import session

    asked: list[tuple[Any, dict[str, Any]]] = []

    class Builder:
        def config(self, key: str, value: str) -> Builder:
            asked.append((None, {key: value}))
            return self

        def getOrCreate(self) -> Any:
            raise RuntimeError("no JVM in a unit test")

    def builder(cfg: Any, **kw: Any) -> Builder:
        asked.append((cfg, kw))
        return Builder()

    monkeypatch.setattr(session, "session_builder", builder)
    cfg = _cfg(tmp_path)
    with pytest.raises(RuntimeError, match="no JVM"):
        session.check_pipeline(cfg, tmp_path / "spark.log")
    assert asked[0] == (cfg, {"master": "local[1]", "app_name": "txsink-validate-jar-source"})
    assert asked[1] == (None, {"spark.ui.enabled": "false"})
