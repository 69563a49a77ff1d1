"""One run of a pipeline into a Delta or Iceberg table on S3, for the crash tests: the
engine's part played in one process (writers in-process, a coordinator, the engine's
commit log), killed from outside by ``TXSINK_FAULTS`` at a coordinator point.

Run 0 also prepares a second attempt of partition 0 in every epoch that no decision
holds (a speculative twin): its directory must be gone once the run is over.

    python -m tests.integration.lake_s3_crash SPEC.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
from txsink.coordinator import Coordinator
from txsink.faults import FaultInjector
from txsink.model import TransactionContext
from txsink.plugins import get_plugins
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant

ROWS = 50


def rows(epoch: int, partition: int) -> range:
    base = (epoch * 100 + partition) * ROWS
    return range(base, base + ROWS)


def batch(epoch: int, partition: int) -> pa.RecordBatch:
    ids = rows(epoch, partition)
    return pa.record_batch({"id": pa.array(ids, pa.int64()),
                            "value": pa.array([i * 7 for i in ids], pa.int64())})


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    state = Path(spec["state"])
    state.mkdir(parents=True, exist_ok=True)
    backend = get_plugins().create_backend(spec["backend"], spec["options"])
    backend.preflight(spec["sink_id"])
    coordinator = Coordinator(backend, DirectoryStateStore(state / "txsink"), spec["sink_id"],
                              backend_options=spec["options"],
                              faults=FaultInjector.from_env())
    coordinator.start()
    log = state / "engine-commit-log"
    done = int(log.read_text()) if log.exists() else -1
    for epoch in range(done + 1, spec["epochs"]):
        msgs = []
        for p in range(spec["partitions"]):
            ctx = TransactionContext(spec["sink_id"], epoch, p, spec["run"] * 1000)
            msgs.append(write_participant(backend, ctx, [batch(epoch, p)]))
        if spec["run"] == 0:
            twin = TransactionContext(spec["sink_id"], epoch, 0, 500)
            write_participant(backend, twin, [batch(epoch, 0)])
        coordinator.commit_epoch(epoch, msgs)
        log.write_text(str(epoch))
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
