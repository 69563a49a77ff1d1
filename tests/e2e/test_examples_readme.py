"""examples/README.md, executed: its commands start the servers, run the PostgreSQL,
S3 and Kafka examples, and read the output back through real clients.

The commands run as written, in a scratch copy of ``examples/`` (so ``out/`` lands
there); only the launcher is swapped: ``uv run python`` / ``uv run txsink`` become
this environment's interpreter and ``txsink`` script.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.spark_harness import kill_group

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("TXSINK_EXAMPLE_TESTS") != "1",
                                 reason="starts PostgreSQL, SeaweedFS and Apache Kafka and "
                                 "runs three Spark pipelines (minutes): runs in `tox -e "
                                 "examples`, or with TXSINK_EXAMPLE_TESTS=1")]

REPO = Path(__file__).resolve().parents[2]
README = REPO / "examples" / "README.md"
TXSINK = str(Path(sys.executable).parent / "txsink")


def _blocks() -> list[str]:
    return [b.strip() for b in re.findall(r"```sh\n(.*?)```", README.read_text(), re.S)]


def _local(command: str) -> str:
    return command.replace("uv run python", sys.executable).replace("uv run txsink", TXSINK)


def _bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(["bash", "-c", f"set -e\n{_local(script)}"], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        kill_group(proc.pid)
    assert proc.returncode == 0, f"{script}\n{out}\n{err[-3000:]}"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_examples_readme_runs_start_to_finish(tmp_path: Path) -> None:
    blocks = _blocks()
    start, load, postgres, s3, kafka = blocks
    assert start == "uv run python examples/dev_servers.py start"
    assert load == ". out/dev-servers.env"
    shutil.copytree(REPO / "examples", tmp_path / "examples",
                    ignore=shutil.ignore_patterns("sqlite-backend"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TXSINK_", "AWS_"))}
    env.update(PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")

    servers = subprocess.Popen(["bash", "-c", _local(start)], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        env_file = tmp_path / "out" / "dev-servers.env"
        deadline = time.monotonic() + 600
        while not env_file.exists():
            assert servers.poll() is None, servers.stdout.read() if servers.stdout else ""
            assert time.monotonic() < deadline, "the servers did not start"
            time.sleep(1)

        out = _bash(f"{load}\n{postgres}", tmp_path, env).stdout
        count, distinct = map(int, out.strip().splitlines()[-1].split("|"))
        assert count == distinct > 0, out

        out = _bash(f"{load}\n{s3}", tmp_path, env).stdout
        objects = int(re.findall(r"^(\d+) object\(s\)$", out, re.M)[-1])
        assert objects > 0 and ".parquet" in out, out

        out = _bash(f"{load}\n{kafka}", tmp_path, env).stdout
        records, ids = map(int, re.findall(
            r"(\d+) committed record\(s\) in rate-events, (\d+) distinct id\(s\)", out)[-1])
        assert records == ids > 0, out

        # Without a broker: the one line the README shows, before Spark starts.
        no_broker = subprocess.run(
            [TXSINK, "run", "examples/pipelines/kafka.yaml", "--max-batches", "1"],
            cwd=tmp_path, env={**env, "TXSINK_KAFKA_BOOTSTRAP": f"127.0.0.1:{_free_port()}"},
            capture_output=True, text=True, timeout=300, check=False)
        assert no_broker.returncode == 1
        lines = no_broker.stderr.strip().splitlines()
        assert len(lines) == 1, no_broker.stderr[-3000:]
        assert lines[0].startswith(
            "txsink: config error: sink.options.kafka.bootstrap.servers: kafka sink: cannot "
            "reach Kafka at "), lines[0]
        assert "spark log:" not in no_broker.stdout
    finally:
        servers.terminate()
        try:
            log, _ = servers.communicate(timeout=120)  # reads and closes the pipe
        finally:
            kill_group(servers.pid)
    assert servers.returncode == 0, log
    assert "stopped" in log
    assert not (tmp_path / "out" / "dev-servers.env").exists()
