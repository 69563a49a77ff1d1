"""A crashed run leaves a hanging transaction: `txsink status` shows it, `resolve` ends it."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import Broker
from txsink.cli import main
from txsink.coordinator import Coordinator
from txsink.model import TransactionContext
from txsink.plugins import build_plugins, get_plugins
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant
from txsink_kafka import testing as kt
from txsink_kafka.backend import KafkaBackend

pytestmark = pytest.mark.integration


def committed_values(bootstrap: str, topic: str) -> list[bytes]:
    return sorted(m.value() for m in kt.read_topic(bootstrap, topic))


@pytest.mark.promise("kafka-status-lists-open-transactions", "cli")
def test_status_shows_a_hanging_transaction_and_resolve_lets_readers_on(
        kafka_broker: Broker, marker_topic: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from confluent_kafka import Producer

    bootstrap = kafka_broker.bootstrap
    topic = f"h-{uuid.uuid4().hex[:8]}"
    kt.create_topic(bootstrap, topic, partitions=1)
    sink = f"hang-{uuid.uuid4().hex[:8]}"
    options = {"kafka.bootstrap.servers": bootstrap, "topic": topic,
               "marker.topic": marker_topic}
    backend = get_plugins().create_backend("kafka", options)
    assert isinstance(backend, KafkaBackend)
    backend.preflight(sink)
    checkpoint = tmp_path / "checkpoint"
    Coordinator(backend, DirectoryStateStore(checkpoint / "txsink"), sink,
                backend_options=options, plugins=build_plugins()).start()
    # The run prepares epoch 3 and its driver dies before deciding it.
    hanging = write_participant(backend, TransactionContext(sink, 3, 0, 0), [pa.record_batch(
        {"value": pa.array([b"lost-1", b"lost-2"], pa.binary())})])
    backend.close()
    # Another application commits records to the same partition after it.
    other = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"app-{sink}"})
    other.init_transactions(30)
    other.begin_transaction()
    other.produce(topic, b"later", partition=0)
    other.commit_transaction(30)
    del other
    # A read_committed reader is stuck at the hanging transaction: it sees nothing.
    assert committed_values(bootstrap, topic) == []

    assert main(["status", str(checkpoint)]) == 0
    out = capsys.readouterr().out
    tid = str(hanging.payload["transactional_id"])
    line = next(line for line in out.splitlines() if tid in line)
    assert hanging.participant in line and "Ongoing" in line
    assert "of its 600s timeout" in line
    assert f"holds back read_committed readers of {topic}[0]" in line
    assert main(["status", str(checkpoint), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    [row] = report["open_transactions"]
    # The data partition and the sink's marker partition (the marker opens it).
    assert {p["topic"] for p in row["partitions"]} == {topic, marker_topic}
    [part] = [p for p in row["partitions"] if p["topic"] == topic]
    assert part["last_stable_offset"] < part["high_watermark"]
    assert part["transaction_start_offset"] == part["last_stable_offset"]
    assert [p["epoch"] for p in report["prepared_undecided"]] == [3]

    assert main(["resolve", str(checkpoint), "--epoch", "3", "--abort"]) == 0
    capsys.readouterr()
    # The reader goes on: the other application's record, none of the aborted ones.
    assert committed_values(bootstrap, topic) == [b"later"]
    assert main(["status", str(checkpoint), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["open_transactions"] == [] and report["prepared_undecided"] == []
