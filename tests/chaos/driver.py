"""One chaos pipeline run: the protocol in real processes, for any installed backend.

It plays the engine: each epoch's partitions are written by forked writer processes
(executors), their committables go to the coordinator, then the engine's own commit
log is written. Faults arrive from outside: ``TXSINK_FAULTS`` SIGKILLs this driver at
a coordinator point; the flags below kill writer tasks or add speculative twins; a
table's own faults (``lake_faults``, :mod:`tests.chaos.lake`) are armed on its commit.
Every task fault that fires is appended to ``<state>/faults.log``.

    python -m tests.chaos.driver SPEC.json
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
from txsink.backend import Backend
from txsink.coordinator import Coordinator
from txsink.faults import ENV as FAULTS_ENV
from txsink.faults import FaultInjector, parse
from txsink.model import Committable, TransactionContext
from txsink.plugins import get_plugins
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant

ROWS = 200


def row_ids(epoch: int, partition: int) -> range:
    base = (epoch * 1000 + partition) * ROWS
    return range(base, base + ROWS)


def make_batch(kind: str, epoch: int, partition: int) -> pa.RecordBatch:
    ids = row_ids(epoch, partition)
    keys = [f"k{i % 13}" for i in ids]
    if kind == "kafka":
        return pa.record_batch({"key": pa.array([k.encode() for k in keys], pa.binary()),
                                "value": pa.array([str(i).encode() for i in ids], pa.binary())})
    return pa.record_batch({"id": pa.array(ids, pa.int64()), "key": pa.array(keys),
                            "value": pa.array([i * 7 for i in ids], pa.int64())})


def _note(state: Path, what: str) -> None:
    with open(state / "faults.log", "a") as f:
        f.write(what + "\n")
        f.flush()
        os.fsync(f.fileno())


def run_task(backend: Backend, spec: dict[str, Any], state: Path, epoch: int, partition: int,
             attempt: int, fault: str | None, failover: Any = None) -> Committable | None:
    """One writer task attempt in a forked process; ``None`` if it died.

    ``failover``: the :class:`tests.chaos.failover.Injector` when a failover fault is
    due in this task; it fires between the two halves of the task's rows."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            ctx = TransactionContext(spec["sink_id"], epoch, partition, attempt)

            def batches() -> Any:
                batch = make_batch(spec["kind"], epoch, partition)
                mid_write = failover.task_fault(epoch, partition) if failover else None
                if mid_write is None:
                    yield batch
                else:
                    from tests.chaos.failover import halves

                    first, second = halves(batch)
                    yield first
                    failover.in_task(mid_write)
                    yield second
                if fault == "task-dies-before-prepare":
                    _note(state, f"{fault}@{epoch}:{partition}")
                    os.kill(os.getpid(), signal.SIGKILL)

            c = write_participant(backend, ctx, batches())
            if fault == "task-dies-after-prepare":
                _note(state, f"{fault}@{epoch}:{partition}")
                os.kill(os.getpid(), signal.SIGKILL)
            os.write(write, c.to_bytes())
        finally:
            os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 65536):
        data += chunk
    os.close(read)
    _, status = os.waitpid(pid, 0)
    return Committable.from_bytes(data) if os.WIFEXITED(status) and data else None


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    state = Path(spec["state"])
    state.mkdir(parents=True, exist_ok=True)
    backend = get_plugins().create_backend(spec["backend"], spec["options"])
    backend.preflight(spec["sink_id"])
    task_faults: dict[str, str] = spec.get("task_faults", {})
    fired = set((state / "faults.log").read_text().split("\n")) if (
        state / "faults.log").exists() else set()
    if spec.get("lake_faults"):  # a table's own faults, armed on its commit
        from tests.chaos import lake

        lake.arm(backend, {int(e): k for e, k in spec["lake_faults"].items()},
                 lambda what: _note(state, what), fired)
    failover = None
    faults = FaultInjector.from_env()
    if spec.get("failover"):
        from tests.chaos.failover import Injector

        failover = Injector(spec, state)
        faults = FaultInjector(parse(os.environ.get(FAULTS_ENV, "")), callback=failover.at_point)
    coordinator = Coordinator(backend, DirectoryStateStore(state / "txsink"), spec["sink_id"],
                              backend_options=spec["options"], faults=faults)
    coordinator.start()
    log = state / "engine-commit-log"
    done = int(log.read_text()) if log.exists() else -1
    attempts: dict[tuple[int, int], int] = {}
    # pyarrow imports pandas the first time a batch is built from a dict: pay that here,
    # once, rather than in every forked writer.
    make_batch(spec["kind"], 0, 0)
    for epoch in range(done + 1, spec["epochs"]):
        if failover is not None:
            failover.epoch_starting(epoch)
        msgs = []
        for p in range(spec["partitions"]):
            fault = task_faults.get(f"{epoch}:{p}")
            while True:
                attempt = attempts.get((epoch, p), 0)
                attempts[(epoch, p)] = attempt + 1
                # Task attempts are unique per driver run, as Spark's attempt ids are.
                attempt_id = spec.get("run", 0) * 1000 + attempt
                injected = (fault if attempt == 0 and f"{fault}@{epoch}:{p}" not in fired
                            else None)
                if injected == "speculative-twin":
                    _note(state, f"{injected}@{epoch}:{p}")
                    run_task(backend, spec, state, epoch, p, attempt_id + 500, None)
                    injected = None
                c = run_task(backend, spec, state, epoch, p, attempt_id, injected, failover)
                if c is not None:
                    break
            msgs.append(c)
        if failover is not None:
            failover.messages = msgs
        coordinator.commit_epoch(epoch, msgs)
        log.write_text(str(epoch))
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
