"""The classic Spark session of ``txsink run`` and of ``txsink validate``.

A run's session takes the pipeline file's ``spark.master`` and ``spark.conf`` (and,
for Real-time Mode, the settings its latency needs); Spark's own output goes to the
run's log, not the terminal.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from txsink.config import PipelineConfig, duration_ms
from txsink.spark.console import spark_output_to
from txsink.spark.frames import build_frame

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

def prepare_environment(master: str) -> None:
    """Point Spark's Python workers at this interpreter; keep local mode on loopback."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def session_builder(cfg: PipelineConfig, *, master: str | None = None,
                    app_name: str | None = None) -> Any:
    """The builder of a pipeline's session, for ``run`` and ``validate`` alike: the file's
    ``spark.conf`` whole (``spark.jars`` and ``spark.jars.packages`` too: a source from a
    jar must be found by both), and what txsink adds to it. ``validate`` only names
    another master (a local one: analysing needs no cluster) and app name."""
    from pyspark.sql import SparkSession

    master = master or cfg.spark.master
    prepare_environment(master)
    builder = SparkSession.builder.master(master).appName(app_name or cfg.spark.app_name)
    # Spark logs failures with JVM stack traces; `txsink run` reports them itself.
    builder = builder.config("spark.log.level", "ERROR")
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    for key, value in cfg.spark.conf.items():
        builder = builder.config(key, value)
    for key, value in realtime_defaults(cfg).items():
        builder = builder.config(key, value)
    if cfg.source.type == "files" and not cfg.source.schema:
        builder = builder.config("spark.sql.streaming.schemaInference", "true")
    return builder


def build_session(cfg: PipelineConfig) -> SparkSession:
    """The session of ``txsink run``, with txsink's data source registered in it."""
    from txsink.spark import register

    spark: SparkSession = session_builder(cfg).getOrCreate()
    register(spark)
    return spark


#: A real-time pipeline's rows reach its Python ``foreach`` writer through a buffered
#: stream of this many bytes (Spark's default is 64 KiB): a smaller one hands them on
#: sooner, which is what real-time mode is for (docs/realtime.md, "The latency it gives").
REALTIME_BUFFER_BYTES = "512"


#: Spark refuses real-time batches shorter than this setting (5 s by default).
MIN_BATCH_CONF = "spark.sql.streaming.realTimeMode.minBatchDuration"


def realtime_defaults(cfg: PipelineConfig) -> dict[str, str]:
    """Spark settings a real-time pipeline gets unless its ``spark.conf`` sets them: the
    small Python buffer, and a minimum batch length no longer than the trigger's (so
    ``real_time: 1 second`` runs instead of being refused)."""
    if cfg.trigger.kind != "real_time":
        return {}
    out = {"spark.buffer.size": REALTIME_BUFFER_BYTES}
    interval_ms = duration_ms(cfg.trigger.interval or "5 seconds")
    if interval_ms < 5000:
        out[MIN_BATCH_CONF] = str(interval_ms)
    return {k: v for k, v in out.items() if k not in cfg.spark.conf}


def check_pipeline(cfg: PipelineConfig, log_path: Path) -> list[str]:
    """What ``txsink validate`` asks Spark: build the source, analyse the transform.

    The session is the one ``run`` builds (:func:`session_builder`: every ``spark.conf``
    setting, so a source that comes from ``spark.jars`` is found), on a local master
    whatever ``spark.master`` says (no cluster is needed to analyse), and no query runs.
    Returns the output columns.
    """
    with spark_output_to(log_path):
        builder = session_builder(cfg, master="local[1]",
                                  app_name=f"txsink-validate-{cfg.name}")
        if "spark.ui.enabled" not in cfg.spark.conf:
            builder = builder.config("spark.ui.enabled", "false")
        spark = builder.getOrCreate()
        try:
            from txsink.spark.checks import frame_columns

            return frame_columns(build_frame(spark, cfg), cfg)
        finally:
            spark.stop()
