"""The Spark adapter's driver-side pieces that need no JVM: options, messages, owner token."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.types import LongType, StructField, StructType
from txsink import procfs
from txsink.errors import ConfigError, StateError
from txsink.model import Committable, TransactionContext
from txsink.spark import _proc
from txsink.spark.datasource import (
    SinkSettings,
    TxsinkCommitMessage,
    TxsinkDataSource,
    decode_messages,
)


def _opts(**kw: str) -> dict[str, str]:
    base = {"backend": "files", "sink_id": "s1", "checkpointLocation": "/chk/q1",
            "path": "/out/s1"}
    base.update(kw)
    return {k: v for k, v in base.items() if v != "-"}


def test_options_split_between_txsink_and_backend() -> None:
    settings = SinkSettings.parse({**_opts(), "queryName": "q", "FORMAT": "jsonl"})
    assert settings.backend == "files"
    assert settings.sink_id == "s1"
    assert settings.state_location == "/chk/q1/txsink"
    # Spark lower-cases keys; txsink's own options and queryName never reach the backend.
    assert dict(settings.backend_options) == {"path": "/out/s1", "format": "jsonl"}


def test_state_location_overrides_checkpoint() -> None:
    settings = SinkSettings.parse(_opts(checkpointLocation="-", state_location="/state/x"))
    assert settings.state_location == "/state/x"


@pytest.mark.promise("options-validated-before-data", "datasource")
@pytest.mark.parametrize(("options", "field"), [
    (_opts(backend="-"), "backend"),
    (_opts(sink_id="-"), "sink_id"),
    (_opts(sink_id="no spaces"), "sink_id"),
    (_opts(checkpointLocation="-"), "checkpointLocation"),
    (_opts(backend="nosuch"), "backend"),
    (_opts(path="-"), "path"),
    (_opts(colour="red"), "colour"),
    (_opts(txnStreamCheckpoint="/chk/stream"), "txnStreamCheckpoint"),
    (_opts(txnAppId="a", txnVersion="1", txnStreamCheckpoint="s3a://b/chk"),
     "txnStreamCheckpoint"),
    (_opts(lease_owner="x" * 201), "lease_owner"),
])
def test_bad_options_fail_before_writing(options: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        TxsinkDataSource(options)
    assert info.value.field == field


def test_a_lease_owner_option_names_the_owner_of_both_writers() -> None:
    """`txsink run --remote` hands its run's token to the data source: a Connect client
    has no driver JVM the server's workers and the client could both name."""
    source = TxsinkDataSource({**_opts(), "lease_owner": "host:connect:abc"})
    schema = StructType([StructField("id", LongType())])
    assert source.streamWriter(schema, False).owner == "host:connect:abc"
    assert "lease_owner" not in source.settings.backend_options


def test_the_stream_checkpoint_option_reads_the_streams_query_id(tmp_path: Path) -> None:
    chk = tmp_path / "stream-chk"
    chk.mkdir()
    settings = SinkSettings.parse({**_opts(), "txnAppId": "a", "txnVersion": "3",
                                   "txnStreamCheckpoint": f"file://{chk}"})
    with pytest.raises(StateError, match="no streaming query id in its metadata"):
        settings.stream_query_id()
    (chk / "metadata").write_text('{"id":"6d0039bb-00f6-43f8-9504-ef90a1a6b6fc"}\n')
    assert settings.stream_query_id() == "6d0039bb-00f6-43f8-9504-ef90a1a6b6fc"
    assert "txnstreamcheckpoint" not in settings.backend_options


@pytest.mark.promise("append-only-modes", "datasource")
def test_overwrite_is_refused() -> None:
    source = TxsinkDataSource(_opts())
    with pytest.raises(ConfigError, match="complete"):
        source.streamWriter(None, True)  # type: ignore[arg-type]


def test_commit_messages_round_trip() -> None:
    c = Committable.for_context("files", TransactionContext("s1", 3, 1, 42), {"final": None},
                                rows=5)
    decoded = decode_messages([TxsinkCommitMessage(c.to_bytes()), None])
    assert decoded == [c, None]
    with pytest.raises(StateError):
        decode_messages([object()])  # type: ignore[list-item]


def test_owner_token_is_stable_within_a_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_proc.OWNER_ENV, raising=False)
    assert _proc.owner_token() == _proc.owner_token()
    monkeypatch.setenv(_proc.OWNER_ENV, "operator-1")
    assert _proc.owner_token() == "operator-1"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_owner_token_names_the_ancestor_jvm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_proc.OWNER_ENV, raising=False)
    # This test process has no JVM ancestor: a per-process token is used instead.
    assert _proc.driver_jvm() is None
    assert f":{os.getpid()}:" in _proc.owner_token()
    # With a JVM ancestor, every process below it gets the same token.
    me = os.getpid()
    fake = {me: ("python3", 100, 1, "R"), 100: ("python3", 50, 2, "S"),
            50: ("java", 1, 777, "S")}
    monkeypatch.setattr(procfs, "stat", lambda pid: fake.get(pid))
    assert _proc.driver_jvm() == (50, 777)
    assert _proc.owner_token().endswith(":jvm50:777")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_a_driver_started_by_another_jvm_names_its_own_sparks_jvm(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver process (``txsink run``, a notebook) started by a JVM that is not Spark's
    (a CI agent, a scheduler: Jenkins, Oozie, Rundeck) has that JVM as its nearest
    ancestor. Its native path and grouped writes took the lease under that JVM's token,
    which ``txsink run`` did not release (it releases its Spark JVM's), and the next run
    was refused (``checkpoint ... is in use by another run``) for as long as the
    launching JVM lived. The token names the JVM of the driver's own SparkContext."""
    from types import SimpleNamespace

    from pyspark.core.context import SparkContext

    monkeypatch.delenv(_proc.OWNER_ENV, raising=False)
    me = os.getpid()
    fake = {me: ("python3", 50, 1, "R"), 50: ("java", 1, 777, "S"),  # the CI agent
            60: ("java", me, 888, "S")}  # the JVM this driver started for Spark
    monkeypatch.setattr(procfs, "stat", lambda pid: fake.get(pid))
    context = SimpleNamespace(_gateway=SimpleNamespace(proc=SimpleNamespace(pid=60)))
    monkeypatch.setattr(SparkContext, "_active_spark_context", context)
    assert _proc.owner_token().endswith(":jvm60:888")
    assert _proc.owner_token() == _proc.jvm_owner_token(60)  # what `txsink run` releases
    # A Python worker of that JVM (no SparkContext of its own) names it as its ancestor.
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    fake[me] = ("python3", 60, 1, "R")
    assert _proc.owner_token().endswith(":jvm60:888")
