"""`txsink run --metrics-port`: a real pipeline's metrics, scraped while it runs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.spark_harness import kill_group
from tests.long_runs import long_run

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TXSINK = [sys.executable, "-m", "txsink.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.labels.get("sink") == "demo"}


@long_run
def test_scraped_metrics_match_the_committed_state(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client", reason="the metrics extra is not installed")
    port = _free_port()
    env = {**os.environ, "TXSINK_DEMO_DIR": str(tmp_path / "demo"),
           "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    for name in ("TXSINK_FAULTS", "PROMETHEUS_MULTIPROC_DIR", "TXSINK_METRICS"):
        env.pop(name, None)
    proc = subprocess.Popen(
        [*TXSINK, "run", str(REPO / "examples/pipelines/demo.yaml"), "--max-batches", "4",
         "--metrics-port", str(port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    url = f"http://127.0.0.1:{port}/metrics"
    last: dict[str, float] = {}
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                seen = _scrape(url)
            except (urllib.error.URLError, ConnectionError):
                seen = {}
            if seen.get("txsink_epochs_committed_total", 0) >= 1:
                last = seen
            if last.get("txsink_epochs_committed_total", 0) >= 2:
                break
            time.sleep(0.3)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        kill_group(proc.pid)
    assert proc.returncode == 0, stdout + stderr[-4000:]
    assert f"metrics: {url}" in stdout
    assert last, "never scraped a committed epoch from " + url
    # Compare the scrape with the coordinator's durable log of the same run.
    status = subprocess.run([*TXSINK, "status", str(tmp_path / "demo" / "checkpoint"),
                             "--json"], env=env, capture_output=True, text=True, timeout=60,
                            check=True)
    epochs = {e["epoch"]: e for e in json.loads(status.stdout)["epochs"]}
    top = int(last["txsink_last_committed_epoch"])
    upto = [e for n, e in epochs.items() if n <= top]
    assert last["txsink_epochs_committed_total"] == len(upto)
    assert last["txsink_rows_committed_total"] == sum(e["rows"] for e in upto)
    assert last["txsink_last_epoch_rows"] == epochs[top]["rows"]
    assert last["txsink_commit_latency_seconds_count"] == len(upto)
    assert last["txsink_participants_in_doubt"] == 0
    assert last["txsink_participant_timeout_seconds"] == 0  # files never time out
    # The endpoint is gone with the run.
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(url, timeout=2)
