"""What reaches the terminal while Spark runs: txsink's own lines, not its client
libraries' reconnect noise (issue: a Kafka broker restarting under a running query
printed 22 ERRORs and 73 WARNINGs of kafka-python's own loggers)."""

from __future__ import annotations

import io
import logging
import sys
from pathlib import Path

import pytest
from txsink.spark.console import spark_output_to


def test_client_library_loggers_go_to_the_log_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = io.StringIO()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    monkeypatch.setattr(root, "level", logging.WARNING)
    log_path = tmp_path / "spark.log"
    try:
        with spark_output_to(log_path) as console:
            monkeypatch.setattr(console, "write", terminal.write)
            logging.getLogger("kafka.net.manager").error(
                "Connection failed: KafkaConnectionError: 111 ECONNREFUSED")
            logging.getLogger("kafka.cluster").warning(
                "No node available for metadata refresh - backoff/retry")
            logging.getLogger("botocore.endpoint").warning("retrying a request")
            logging.getLogger("txsink_kafka.retry").warning(
                "sink=s epoch=3: Kafka unavailable (attempt 1); retrying in 0.5s")
    finally:
        root.removeHandler(handler)
    shown = terminal.getvalue()
    assert "Kafka unavailable" in shown  # txsink's own retry line stays visible
    assert "ECONNREFUSED" not in shown and "No node available" not in shown, shown
    assert "retrying a request" not in shown
    kept = log_path.read_text()
    assert "ECONNREFUSED" in kept and "No node available" in kept and "retrying a request" in kept
