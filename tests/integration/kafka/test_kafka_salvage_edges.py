"""Salvage at its edges, on a real broker: compressed output, a driver that was
superseded while salvaging, an output topic that was deleted and recreated.

* Compression: the records of an aborted participant are read back with a raw Fetch
  and decoded by kafka-python, which needs a library per codec; lz4 and snappy were
  missing ("Libraries for lz4 compression codec not found"), so the epoch stayed
  DECIDED until retention turned it into a loss.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from timeout_helpers import (
    batch,
    committed_values,
    digest,
    kafka_sink,
    new_backend,
    restart,
    tid,
    wait_until_not_open,
)
from txsink.coordinator import Coordinator
from txsink.faults import AFTER_DECIDE, FaultInjector, FaultRule, InjectedFault
from txsink.model import TransactionContext
from txsink.plugins import build_plugins
from txsink.state import DirectoryStateStore, EpochState
from txsink.writer import write_participant
from txsink_kafka import testing as kt
from txsink_kafka.local_broker import LocalKafka

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CODECS = ("gzip", "snappy", "lz4", "zstd")


def test_salvage_reads_back_every_compression_codec(short_timeout_kafka: LocalKafka,
                                                     tmp_path: Path) -> None:
    """One decided epoch, one participant per codec (``kafka.compression.type``), the
    driver down past the timeout: the restart salvages all four, exactly once."""
    bootstrap = short_timeout_kafka.bootstrap
    topic, sink, options, backend = kafka_sink(short_timeout_kafka, "cz", 1)
    state = DirectoryStateStore(tmp_path / "state")
    coord = Coordinator(backend, state, sink, plugins=build_plugins(),
                        backend_options=options,
                        faults=FaultInjector([FaultRule(AFTER_DECIDE, 0, "raise")]))
    coord.start()
    msgs, expected = [], []
    for p, codec in enumerate(CODECS):
        writer = new_backend({**options, "kafka.compression.type": codec}, sink)
        try:
            rows = range(p * 100, p * 100 + 50)
            msgs.append(write_participant(writer, TransactionContext(sink, 0, p),
                                          [batch(rows)]))
            expected += [b"v%d" % i for i in rows]
        finally:
            writer.close()
    with pytest.raises(InjectedFault):
        coord.commit_epoch(0, msgs)
    wait_until_not_open(backend, [tid(c) for c in msgs])
    backend.close()

    restart(options, sink, state)
    record = state.get(0)
    assert record is not None and record.state is EpochState.COMMITTED
    assert sorted(o for _, o in record.salvaged) == sorted(c.participant for c in msgs)
    got = committed_values(bootstrap, topic)
    assert digest(got) == digest(expected), sorted(set(got) ^ set(expected))[:10]
    assert kt.broker_open_transactions(bootstrap, f"txsink-{sink}") == {}
