"""A minimal driver for crash tests: the protocol without Spark, in a real process.

It plays Spark's part: writes each epoch's partitions (each in a forked writer
process, as executors do), hands the committables to the coordinator, then
records the epoch in its own "commit log" — so SIGKILL can land between any two
steps, including between txsink's commit and the engine's log.

    python -m tests.integration.files_pipeline OUT STATE --epochs 4 --partitions 3
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import pyarrow as pa
from txsink.coordinator import Coordinator
from txsink.files.backend import FilesBackend
from txsink.model import Committable, TransactionContext
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant

SINK = "crash-files"
ROWS = 1000


def batch(epoch: int, partition: int) -> pa.RecordBatch:
    base = (epoch * 100 + partition) * ROWS
    ids = range(base, base + ROWS)
    return pa.record_batch({"id": pa.array(ids, pa.int64()),
                            "key": pa.array([f"k{i % 17}" for i in ids]),
                            "value": pa.array([i * 3 for i in ids], pa.int64())})


def run_task(backend: FilesBackend, epoch: int, partition: int, attempt: int,
             die_after_prepare: bool) -> Committable | None:
    """Run one writer task in a forked process; None if it died."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the "executor"
        os.close(read)
        c = write_participant(backend, TransactionContext(SINK, epoch, partition, attempt),
                              [batch(epoch, partition)])
        if die_after_prepare:
            os.kill(os.getpid(), signal.SIGKILL)
        os.write(write, c.to_bytes())
        os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 65536):
        data += chunk
    os.close(read)
    _, status = os.waitpid(pid, 0)
    return Committable.from_bytes(data) if os.WIFEXITED(status) and data else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("state")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--kill-task", default="", help="EPOCH:PARTITION whose first attempt dies")
    args = ap.parse_args(argv)
    backend = FilesBackend(args.out)
    backend.preflight(SINK)
    coordinator = Coordinator(backend, DirectoryStateStore(args.state), SINK)
    coordinator.start()
    log = Path(args.state) / "engine-commit-log"
    done = int(log.read_text()) if log.exists() else -1
    for epoch in range(done + 1, args.epochs):
        msgs = []
        for p in range(args.partitions):
            attempt = 0
            while True:
                dies = args.kill_task == f"{epoch}:{p}" and attempt == 0
                c = run_task(backend, epoch, p, attempt, dies)
                if c is not None:
                    break
                attempt += 1  # the engine retries a lost task
            msgs.append(c)
        coordinator.commit_epoch(epoch, msgs)
        log.write_text(str(epoch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
