"""A writer forked from a process whose Kafka clients are in use gets clients of its own.

kafka-python's clients run an IO thread, which a fork does not copy: a child using
the parent's client waited for ever (seen in the chaos driver, which forks its
writer tasks after its coordinator talked to the broker).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time

import pytest
from conftest import Broker
from txsink.model import Committable, TransactionContext
from txsink.plugins import get_plugins
from txsink.writer import write_participant
from txsink_kafka.backend import KafkaBackend

pytestmark = [pytest.mark.integration,
              pytest.mark.filterwarnings("ignore:This process .* fork:DeprecationWarning")]


def test_a_forked_writer_does_not_wait_on_the_parents_clients(
        kafka_broker: Broker, topic: str, marker_topic: str) -> None:
    import pyarrow as pa

    options = {"kafka.bootstrap.servers": kafka_broker.bootstrap, "topic": topic,
               "marker.topic": marker_topic}
    backend = get_plugins().create_backend("kafka", options)
    assert isinstance(backend, KafkaBackend)
    sink = "fork-sink"
    backend.preflight(sink)
    batch = pa.record_batch({"key": pa.array([b"k"]), "value": pa.array([b"v"])})
    # The parent's clients are live: a participant written and committed here.
    first = write_participant(backend, TransactionContext(sink, 0, 0), [batch])
    backend.commit(first)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(read)
        try:
            c = write_participant(backend, TransactionContext(sink, 1, 0), [batch])
            os.write(write, c.to_bytes())
        except BaseException as exc:  # shown by the parent's assertion
            os.write(write, f"child failed: {type(exc).__name__}: {exc}".encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], 120)
        assert ready, "the forked writer hung (it used the parent's Kafka clients)"
        data = b""
        deadline = time.monotonic() + 30
        while (chunk := os.read(read, 65536)) and time.monotonic() < deadline:
            data += chunk
    finally:
        os.close(read)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert not data.startswith(b"child failed"), data.decode()
    prepared = Committable.from_bytes(data)
    assert prepared.epoch == 1
    # The parent commits what the child prepared, as a Spark driver would.
    backend.commit(prepared)
    backend.close()
