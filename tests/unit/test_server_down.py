"""A PostgreSQL or S3 server that is down is reported as down (not as a config error),
within the time the message states, like Kafka's (``test_kafka_down.py``).

Before: both said "config error"; a server that accepts connections and never answers
(stopped, hung, a port-forward to nothing) held PostgreSQL's preflight for its 10 s
connect_timeout and S3's for minutes (120 s read_timeout per attempt, several attempts)
while ``txsink run --connect-retry 3`` said it waited 3 s. No server is started here: a
listening socket that never accepts. (A closed port: test_cli_first_hour.py for
PostgreSQL, tests/integration/s3/test_s3_backend.py for S3.)
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from txsink.config import load_pipeline
from txsink.errors import ServerUnavailableError
from txsink.plugins import get_plugins


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose connections complete (the kernel's backlog) and never get a byte."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield int(s.getsockname()[1])


def _backend(name: str, port: int, bound: int) -> Any:
    if name == "postgres":
        pytest.importorskip("psycopg", reason="the PostgreSQL backend's client is not installed")
        options = {"dsn": f"host=127.0.0.1 port={port} dbname=postgres user=nobody",
                   "table": "t", "connect_retry_s": str(bound)}
    else:
        pytest.importorskip("boto3", reason="the S3 backend's client is not installed")
        options = {"bucket": "down-bucket", "endpoint_url": f"http://127.0.0.1:{port}",
                   "access_key_id": "k", "secret_access_key": "s", "region": "us-east-1",
                   "connect_retry_s": str(bound)}
    return get_plugins().create_backend(name, options)


def _down_within_stated_time(backend: Any, bound: int) -> str:
    started = time.monotonic()
    try:
        with pytest.raises(ServerUnavailableError) as caught:
            backend.preflight("down-sink")
    finally:
        backend.close()
    took = time.monotonic() - started
    message = str(caught.value)
    stated = re.search(r" in (\d+)s", message)
    assert stated, message
    # libpq's smallest connect timeout is 2 s; the stated figure is rounded.
    assert took <= max(bound, int(stated.group(1))) + 1.5, (took, message)
    return message


@pytest.mark.parametrize(("name", "bound"), [("postgres", 2), ("s3", 1)])
def test_a_server_that_never_answers_is_down_within_the_bound(
        name: str, bound: int, silent_port: int) -> None:
    message = _down_within_stated_time(_backend(name, silent_port, bound), bound)
    assert f"127.0.0.1:{silent_port}" in message


def test_a_group_with_a_target_down_is_a_server_down_and_claims_nothing(
        tmp_path: Path, silent_port: int) -> None:
    """The group kept the message and lost the class ("config error"); and the files
    target's preflight, run first, had claimed its directory for its sink id: renaming
    that target was then refused there ("belongs to sink 'g--archive'") although the
    pipeline never wrote anything."""
    from txsink.spark.pipeline import preflight

    pytest.importorskip("psycopg", reason="the PostgreSQL backend's client is not installed")
    out = tmp_path / "archive"
    file = tmp_path / "g.yaml"
    file.write_text(f"""
source: {{type: rate}}
sink:
  sink_id: g
  targets:
    - {{name: archive, backend: files, options: {{path: {out}}}}}
    - name: totals
      backend: postgres
      options: {{dsn: "host=127.0.0.1 port={silent_port} dbname=postgres user=x", table: t}}
checkpoint: {tmp_path / 'checkpoint'}
""")
    cfg = load_pipeline(str(file))
    with pytest.raises(ServerUnavailableError) as caught:
        preflight(cfg, get_plugins(), 1)
    assert caught.value.field == "sink.targets[totals].options.dsn", caught.value.field
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.yaml"]


def test_a_group_claim_without_preflight_says_which_s3_target_is_down(
        tmp_path: Path) -> None:
    """`txsink resolve`, `cut` and a first start claim without a preflight: an S3
    endpoint that is down came out of the claim as botocore's EndpointConnectionError (a
    traceback from the CLI). It is a server down naming the target; the group's files
    target is not claimed. About 1 s (a closed port, connect_retry_s 0)."""
    from txsink.group import TargetGroup
    from txsink.targets import parse_targets

    pytest.importorskip("boto3", reason="the S3 backend's client is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    specs = parse_targets([
        {"name": "archive", "backend": "files", "options": {"path": str(tmp_path / "out")}},
        {"name": "objects", "backend": "s3", "options": {
            "bucket": "down-bucket", "endpoint_url": f"http://127.0.0.1:{port}",
            "access_key_id": "key-id", "secret_access_key": "secret-value", "region": "us-east-1",
            "connect_retry_s": "0"}}], "g")
    group = TargetGroup.from_specs("g", specs)
    try:
        with pytest.raises(ServerUnavailableError) as caught:
            group.claim_sink("g", "state-1", "/s")
    finally:
        group.close()
    message = str(caught.value)
    assert message.startswith("target 'objects' (s3://down-bucket/"), message
    assert f"127.0.0.1:{port} is down or unreachable" in message, message
    assert caught.value.field == "targets[objects].options.endpoint_url"
    assert not (tmp_path / "out").exists()
