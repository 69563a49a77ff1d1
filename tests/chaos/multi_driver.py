"""One chaos run of a group of targets: the protocol in real processes, one decision per epoch.

Like :mod:`tests.chaos.driver`, it plays the engine: each epoch's partitions are
written by forked writer processes (executors), each preparing a participant in
every target of the group from one shaped batch (a struct column per target, as
Spark's tasks get it), and the committables go to the coordinator, which decides
once for all targets. ``TXSINK_FAULTS`` SIGKILLs this driver at a coordinator point;
the spec's task faults kill writers or add unreported twins.

    python -m tests.chaos.multi_driver SPEC.json
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
from txsink.coordinator import Coordinator
from txsink.group import TargetGroup, write_group
from txsink.model import Committable
from txsink.state import DirectoryStateStore
from txsink.targets import ROUTE_PREFIX, parse_targets

from tests.chaos.driver import _note, row_ids


def goes_to(target: str, row_id: int) -> bool:
    """The rows each target gets: ``totals`` a filtered part, the others all."""
    return row_id % 3 == 0 if target == "totals" else True


def shaped_batch(names: list[str], epoch: int, partition: int) -> pa.RecordBatch:
    """One task's rows, shaped for the group: per target a struct column, null where a
    row does not go to that target (what ``txsink.spark.targets`` makes in Spark)."""
    ids = list(row_ids(epoch, partition))
    keys = [f"k{i % 13}" for i in ids]
    columns: dict[str, pa.Array[Any]] = {}
    for name in names:
        mask = pa.array([not goes_to(name, i) for i in ids])
        if name == "events":  # Kafka: key and value
            fields = [pa.array([k.encode() for k in keys], pa.binary()),
                      pa.array([str(i).encode() for i in ids], pa.binary())]
            columns[ROUTE_PREFIX + name] = pa.StructArray.from_arrays(
                fields, ["key", "value"], mask=mask)
        else:
            fields = [pa.array(ids, pa.int64()), pa.array(keys)]
            columns[ROUTE_PREFIX + name] = pa.StructArray.from_arrays(
                fields, ["id", "key"], mask=mask)
    return pa.record_batch(columns)


def run_task(group: TargetGroup, spec: dict[str, Any], state: Path, epoch: int,
             partition: int, attempt: int, fault: str | None) -> list[Committable] | None:
    """One writer task attempt in a forked process; ``None`` if it died."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            def before_prepare() -> None:
                if fault == "task-dies-before-prepare":
                    _note(state, f"{fault}@{epoch}:{partition}")
                    os.kill(os.getpid(), signal.SIGKILL)

            cs = write_group(group, epoch, partition, attempt,
                             [shaped_batch(list(group.members), epoch, partition)],
                             before_prepare=before_prepare)
            if fault == "task-dies-after-prepare":
                _note(state, f"{fault}@{epoch}:{partition}")
                os.kill(os.getpid(), signal.SIGKILL)
            os.write(write, b"\n".join(c.to_bytes() for c in cs))
        finally:
            os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 65536):
        data += chunk
    os.close(read)
    _, status = os.waitpid(pid, 0)
    if not (os.WIFEXITED(status) and data):
        return None
    return [Committable.from_bytes(line) for line in data.split(b"\n")]


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    state = Path(spec["state"])
    state.mkdir(parents=True, exist_ok=True)
    group = TargetGroup.from_specs(spec["sink_id"], parse_targets(spec["targets"],
                                                                  spec["sink_id"]))
    group.preflight(spec["sink_id"])
    coordinator = Coordinator(group, DirectoryStateStore(state / "txsink"), spec["sink_id"])
    coordinator.start()
    log = state / "engine-commit-log"
    done = int(log.read_text()) if log.exists() else -1
    task_faults: dict[str, str] = spec.get("task_faults", {})
    fired = set((state / "faults.log").read_text().split("\n")) if (
        state / "faults.log").exists() else set()
    attempts: dict[tuple[int, int], int] = {}
    shaped_batch(list(group.members), 0, 0)  # pyarrow's lazy pandas import, before forking
    for epoch in range(done + 1, spec["epochs"]):
        msgs: list[Committable] = []
        for p in range(spec["partitions"]):
            fault = task_faults.get(f"{epoch}:{p}")
            while True:
                attempt = attempts.get((epoch, p), 0)
                attempts[(epoch, p)] = attempt + 1
                attempt_id = spec.get("run", 0) * 1000 + attempt
                injected = (fault if attempt == 0 and f"{fault}@{epoch}:{p}" not in fired
                            else None)
                if injected == "speculative-twin":
                    _note(state, f"{injected}@{epoch}:{p}")
                    run_task(group, spec, state, epoch, p, attempt_id + 500, None)
                    injected = None
                cs = run_task(group, spec, state, epoch, p, attempt_id, injected)
                if cs is not None:
                    break
            msgs += cs
        coordinator.commit_epoch(epoch, msgs)
        log.write_text(str(epoch))
    group.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
