"""Keep Spark's own output off the terminal of ``txsink run`` and ``validate``.

The JVM and the Python workers it forks write to the file descriptors they
inherit: log4j lines, JVM warnings, and for a failed task dozens of Java and
Python stack frames. While Spark runs, descriptor 2 points at a log file, so
all of that lands there; txsink's own messages go to the real stderr, and an
error names the log file. Nothing here imports pyspark.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

#: Loggers of the Spark client libraries: their records go to the log file only.
#: PySpark's own named loggers (``SQLQueryContextLogger``, ...) are left alone: PySpark
#: makes them ``PySparkLogger`` instances, which take keyword arguments a plain logger
#: does not, and creating one here first made every analysis error a TypeError. Their
#: records come from PySpark's files, and the root handlers' filter sends those to the
#: log file.
SPARK_LOGGERS = ("py4j", "pyspark")


def default_log_path(checkpoint: str, name: str) -> Path:
    """``<checkpoint>-spark.log`` beside a local checkpoint, else in the temp directory."""
    if "://" not in checkpoint or checkpoint.startswith("file://"):
        local = Path(checkpoint.removeprefix("file://").rstrip("/"))
        return local.with_name(f"{local.name}-spark.log")
    return Path(tempfile.gettempdir()) / f"txsink-{name}-spark.log"


#: Loggers of the client libraries the backends use. They log every reconnect of a
#: server that restarts (kafka-python: an ERROR per refused connection, a WARNING per
#: metadata retry); txsink rides that out and says so in its own retry lines, so
#: theirs go to the log file, not the terminal.
CLIENT_LOGGERS = ("kafka", "botocore", "boto3", "urllib3", "psycopg", "s3transfer")


class _SparkRecordsToFile(logging.Filter):
    """Sends records that py4j logs through the root logger (``logging.exception``
    when a call is interrupted), and those of the backends' client libraries, to the
    log file instead of the terminal."""

    _PACKAGES = (f"{os.sep}py4j{os.sep}", f"{os.sep}pyspark{os.sep}")

    def __init__(self, file_handler: logging.Handler) -> None:
        super().__init__()
        self.file_handler = file_handler

    def filter(self, record: logging.LogRecord) -> bool:
        if any(p in record.pathname for p in self._PACKAGES) or (
                record.name.split(".", 1)[0] in CLIENT_LOGGERS):
            self.file_handler.handle(record)
            return False
        return True


@contextlib.contextmanager
def spark_output_to(path: Path) -> Iterator[TextIO]:
    """Send descriptor 2 (and Spark's Python loggers) to ``path``; yield the real stderr.

    Log handlers that wrote to stderr are pointed at the real stderr meanwhile, so
    ``-v`` still shows txsink's logs. Everything is restored on exit.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = os.dup(2)
    console = os.fdopen(os.dup(saved), "w", buffering=1, encoding="utf-8", errors="replace")
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    # sys.stderr stays on descriptor 2: handlers Spark's Python side creates while
    # this runs (PySparkLogger adds its own) write to the log file too.
    file_handler = logging.FileHandler(path, encoding="utf-8")
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    to_file = _SparkRecordsToFile(file_handler)
    moved: list[tuple[logging.StreamHandler[TextIO], TextIO]] = []
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stderr:
            moved.append((handler, handler.stream))
            handler.setStream(console)
            handler.addFilter(to_file)
    quiet: list[tuple[logging.Logger, bool]] = []
    for name in SPARK_LOGGERS:
        logger = logging.getLogger(name)
        quiet.append((logger, logger.propagate))
        logger.propagate = False
        logger.addHandler(file_handler)
    try:
        yield console
    finally:
        for logger, propagate in quiet:
            logger.removeHandler(file_handler)
            logger.propagate = propagate
        file_handler.close()
        for handler, stream in moved:
            handler.removeFilter(to_file)
            handler.setStream(stream)
        with contextlib.suppress(Exception):
            console.flush()
        os.dup2(saved, 2)
        os.close(saved)
        console.close()
