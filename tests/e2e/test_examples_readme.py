"""examples/README.md, executed: its commands start the servers, run the PostgreSQL,
S3 and Kafka examples, the group of targets, the Kafka-in example (Kafka, PostgreSQL
and a Delta table out) and Real-time Mode's group (Kafka and PostgreSQL out, after its
one-command setup), and read the output back through real clients.

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
                                 "runs five Spark pipelines (minutes): runs in `tox -e "
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


def _shape(line: str) -> str:
    """A listing line with its numbers (sizes, epochs, attempts, counts) blanked."""
    return re.sub(r"\d+", "N", line.strip())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _free_s3_port() -> int:
    """A free port whose + 10000 is free too (SeaweedFS puts its gRPC there), so at
    most 55535: an ephemeral port from the OS is often above."""
    import random

    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 30000)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for SeaweedFS")


def test_examples_readme_runs_start_to_finish(tmp_path: Path) -> None:
    blocks = _blocks()
    start, load, postgres, s3, kafka, multi, lake, realtime = blocks
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
        # The sample in the README has the shape of what a run prints, line by line.
        shown = re.findall(r"^## S3.*?```text\n(.*?)\n```", README.read_text(), re.S | re.M)[0]
        shapes = {_shape(line) for line in out.splitlines()}
        for line in shown.splitlines():
            assert line == "..." or _shape(line) in shapes, (line, out)

        out = _bash(f"{load}\n{kafka}", tmp_path, env).stdout
        records, ids = map(int, re.findall(
            r"(\d+) committed record\(s\) in rate-events, (\d+) distinct id\(s\)", out)[-1])
        assert records == ids > 0, out
        source_records = records

        # One epoch, several systems: the group example, its cut and its three targets.
        out = _bash(f"{load}\n{multi}", tmp_path, env).stdout
        cut = int(re.findall(r"^cut: (\d+) \(every target holds every epoch up to \d+\)$",
                             out, re.M)[-1])
        shown = re.findall(r"^## One epoch, several systems.*?```text\n(.*?)\n```",
                           README.read_text(), re.S | re.M)[0]
        shapes = {_shape(line) for line in out.splitlines()}
        for line in shown.splitlines():
            assert _shape(line) in shapes, (line, out)
        records, ids = map(int, re.findall(
            r"(\d+) committed record\(s\) in order-events, (\d+) distinct id\(s\)", out)[-1])
        count, distinct, top = map(int, re.findall(r"^(\d+)\|(\d+)\|(\d+)$", out, re.M)[-1])
        assert records == ids == count == distinct > 0, out  # every order in both, once
        assert top <= cut, out
        manifests = int(re.findall(r"^(\d+) object\(s\)$", out, re.M)[-1])
        assert manifests == cut + 1, out  # one per epoch, every epoch in the archive

        # Kafka in (what the Kafka example wrote), Kafka, PostgreSQL and Delta out.
        out = _bash(f"{load}\n{lake}", tmp_path, env).stdout
        cut = int(re.findall(r"^cut: (\d+) \(every target holds every epoch up to \d+\)$",
                             out, re.M)[-1])
        shown = re.findall(r"^## Kafka in, Kafka, PostgreSQL and a Delta table out.*?"
                           r"```text\n(.*?)\n```", README.read_text(), re.S | re.M)[0]

        def lake_shape(line: str) -> str:  # the table's absolute path differs per run
            return _shape(re.sub(r"\S*(?=/out/kafka-to-lake/)", "", line))

        shapes = {lake_shape(line) for line in out.splitlines()}
        for line in shown.splitlines():
            assert lake_shape(line) in shapes, (line, out)
        records, ids = map(int, re.findall(
            r"(\d+) committed record\(s\) in rate-copies, (\d+) distinct id\(s\)", out)[-1])
        count, distinct, top = map(int, re.findall(r"^(\d+)\|(\d+)\|(\d+)$", out, re.M)[-1])
        rows, row_ids, entries, epochs = map(int, re.findall(
            r"(\d+) row\(s\) in the Delta table \S+, (\d+) distinct id\(s\); (\d+) txsink "
            r"log entries for (\d+) epoch\(s\)", out)[-1])
        # Every event of the source topic in each target once, one log entry per epoch.
        assert source_records == records == ids == count == distinct == rows == row_ids, out
        assert top == cut and entries == epochs == cut + 1, out

        # Real-time Mode: its setup (the connector's jars, topics, table, 1000 orders),
        # the group run until idle, its positions, and each target counted.
        out = _bash(f"{load}\n{realtime}", tmp_path, env).stdout
        assert re.search(r"^export TXSINK_SPARK_JARS=\S*spark-sql-kafka-0-10_2\.13-4\.2\.0\.jar",
                         out, re.M), out
        assert "done (idle: 3 real-time batches in a row without new input)" in out, out
        line = re.compile(r"^real-time batch(es)? [\d-]+ completed: events ([\d,]+) row\(s\) in "
                          r"\d+ commit\(s\) \(visible p50 [\d.]+ m?s, p99 [\d.]+ m?s after "
                          r"reaching the writer\); totals ([\d,]+) row\(s\)", re.M)
        progress = line.findall(out)
        assert progress, out
        assert sum(int(e.replace(",", "")) for _, e, _ in progress) == 1000, out
        assert sum(int(t.replace(",", "")) for _, _, t in progress) == 1000, out
        shown = re.findall(r"^## Real-time Mode.*?```text\n(.*?)\n```", README.read_text(),
                           re.S | re.M)[0]
        assert line.match(shown), shown  # the README's line has the shape of a run's
        for partition in (0, 1):
            assert out.count(f"orders-{partition}: offset 499") == 2, out  # both targets
        records, ids = map(int, re.findall(
            r"(\d+) committed record\(s\) in orders-events, (\d+) distinct id\(s\)", out)[-1])
        count, distinct = map(int, re.findall(r"^(\d+)\|(\d+)$", out, re.M)[-1])
        assert records == ids == count == distinct == 1000, out

        # Without a broker: the one line the README shows, before Spark starts.
        no_broker = subprocess.run(
            [TXSINK, "run", "examples/pipelines/kafka.yaml", "--max-batches", "1"],
            cwd=tmp_path, env={**env, "TXSINK_KAFKA_BOOTSTRAP": f"127.0.0.1:{_free_port()}"},
            capture_output=True, text=True, timeout=300, check=False)
        assert no_broker.returncode == 1
        lines = no_broker.stderr.strip().splitlines()
        assert len(lines) == 1, no_broker.stderr[-3000:]
        assert lines[0].startswith(
            "txsink: server down: sink.options.kafka.bootstrap.servers: kafka sink: Kafka at "
            ), lines[0]
        shown = re.findall(r"Without a broker.*?```text\n(.*?)\n```", README.read_text(), re.S)

        def same(line: str) -> str:  # the port, and the seconds it took (10 or 11)
            line = re.sub(r"127\.0\.0\.1:\d+", "HOST", line)
            return re.sub(r"no answer in \d+s", "no answer in Ns", line)

        assert shown and same(shown[0]) == same(lines[0]), (shown, lines[0])
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


def test_dev_servers_start_detached_on_chosen_ports_and_stop(tmp_path: Path) -> None:
    """``start --detach`` returns once the servers are ready, on the ports asked for
    (every one of them: options and TXSINK_DEV_* variables); ``stop`` stops the whole
    group and removes the variables file."""
    shutil.copytree(REPO / "examples", tmp_path / "examples",
                    ignore=shutil.ignore_patterns("sqlite-backend"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TXSINK_", "AWS_"))}
    pg_port, kafka_port, controller_port = _free_port(), _free_port(), _free_port()
    weed: list[int] = []
    while len(weed) < 4:  # the S3 endpoint, master, volume server, filer (+ 10000 each)
        port = _free_s3_port()
        if all(abs(port - p) not in (0, 10000) for p in weed):
            weed.append(port)
    s3_port, master_port, volume_port, filer_port = weed
    # Some by option, the others by variable.
    env.update({"TXSINK_DEV_S3_MASTER_PORT": str(master_port),
                "TXSINK_DEV_S3_FILER_PORT": str(filer_port),
                "TXSINK_DEV_KAFKA_CONTROLLER_PORT": str(controller_port)})
    script = tmp_path / "examples" / "dev_servers.py"
    started = subprocess.run(
        [sys.executable, str(script), "start", "--detach", "--pg-port", str(pg_port),
         "--s3-port", str(s3_port), "--s3-volume-port", str(volume_port),
         "--kafka-port", str(kafka_port)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False)
    pid_file = tmp_path / "out" / "dev-servers.pid"
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        assert "running in the background" in started.stdout
        variables = (tmp_path / "out" / "dev-servers.env").read_text()
        assert f"port={pg_port}" in variables
        assert f"127.0.0.1:{s3_port}" in variables
        assert f"127.0.0.1:{kafka_port}" in variables
        for port in (pg_port, kafka_port, controller_port, *weed):
            with socket.create_connection(("127.0.0.1", port), timeout=10):
                pass  # a server of the group listens there
        pid = int(pid_file.read_text())
        os.killpg(pid, 0)  # its group runs
        stopped = subprocess.run([sys.executable, str(script), "stop"], cwd=tmp_path,
                                 env=env, capture_output=True, text=True, timeout=120,
                                 check=False)
        assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stderr
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
        assert not (tmp_path / "out" / "dev-servers.env").exists()
    finally:
        if pid_file.exists():
            kill_group(int(pid_file.read_text()))
