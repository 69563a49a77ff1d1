"""A model-based test of Real-time Mode: positions per source partition, kept in the target.

Real-time Mode has no epochs: each target stores, in the same transaction as the rows,
the highest source offset it holds per source partition, and a replay skips what it
holds (``docs/realtime.md``). This machine drives the Spark adapter's writer
(:class:`~txsink.spark.realtime.RealtimeForeachWriter`, with the source topics' ids,
pickled to its tasks as Spark ships it; one writer per task and batch, sessions kept
between the batches of one run) and the checks a start makes before any data moves, as
the adapter makes them for a single sink and a group alike (each target's stored
positions judged by :func:`txsink.gate.position_refusal` against the topic's id and
the destination, then :func:`txsink.realtime.group.start_refusal` against the
checkpoint's record of the targets), into the in-memory real-time target
:mod:`txsink.testing.realtime_memory`, which keeps PostgreSQL's protocol (a progress
row with a generation from a sequence, the topic id and the destination) without a
server. Spark's part is played here:

* **the source** is a Kafka topic of one or two partitions; a record's value is a
  number unique across the model's life, its position (topic, partition, offset). The
  topic can be deleted and created again: its offsets start at 0 again, under a new
  topic id (Kafka gives every topic one);
* **Spark's checkpoint** keeps each partition's committed offset; a real-time batch
  reads from there to the end, one long task per partition, and Spark commits the
  batch's end offsets when every task ended. A new checkpoint starts from
  ``startingOffsets`` (earliest or latest). A checkpoint whose offsets lie beyond a
  recreated topic's end is refused by Spark (``failOnDataLoss``): the model then starts
  on a new checkpoint, as an operator must;
* **a driver killed** in the middle of a batch leaves each task where it was: what a
  writer committed stays, its open transaction is gone (the connection died), and
  Spark replays the batch; a task of the dead driver may go on running (a zombie) and
  commit later.

Operations: batches (a writer committing after every record, or only at the end of its
task), the driver killed mid-batch and the query run again, a zombie task going on (by
itself, or while the next run's batch is under way), the checkpoint deleted (from
earliest or latest), a start-over as docs/realtime.md says it (``txsink reset``: every
target's positions deleted and the checkpoint; then the targets emptied; then a run
from the earliest records), one target's positions deleted in a group (its rows
emptied too, or kept), the source topic deleted and recreated; each on one sink or a
group of two targets (one with a ``where``).

The oracle, after every step: no record twice in any target, and nothing there that no
task read; after every batch Spark commits, each target holds every record the
committed batches read (its ``where`` applied) since the last start-over. A refused
start raised a :class:`~txsink.errors.TxsinkError` before any data moved; the model
follows its way out (a new checkpoint from earliest; the recreated topic's positions
deleted, ``txsink reset --source-topic``) and the query must go on. Records a target
lost with its rows that the source no longer retains (a recreated topic's old ones)
are not expected back. Failures still open are in ``KNOWN``.
"""

from __future__ import annotations

import collections
import os
import pickle
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

from hypothesis import reject
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from pyspark.sql import Row
from txsink.errors import FencedError, TxsinkError
from txsink.gate import position_refusal
from txsink.realtime import SESSIONS
from txsink.realtime.group import (
    MEMBERS_FILE,
    StartPoint,
    members_record,
    options_field,
    read_members,
    start_refusal,
)
from txsink.spark.realtime import POSITION_COLUMNS, RealtimeForeachWriter
from txsink.targets import ROUTE_PREFIX, target_sink_id
from txsink.testing import realtime_memory
from txsink.testing.realtime_memory import MemoryRealtimeSpec

from tests.operations_model import FIRED

SINK = "opsrt"
TOPIC = "orders"
#: Target b of a group takes only even values.
WHERE = "value % 2 = 0"
KNOWN_ENV = "TXSINK_OPERATIONS_KNOWN"
KNOWN: dict[str, str] = {}


def known_issues() -> set[str]:
    raw = os.environ.get(KNOWN_ENV)
    return set(KNOWN) if raw is None else {x.strip() for x in raw.split(",") if x.strip()}


def _keep(where: str | None, value: int) -> bool:
    return where is None or value % 2 == 0


@dataclass
class Checkpoint:
    """Spark's checkpoint of the real-time query: each partition's committed offset
    (None: no batch committed yet, the query starts from ``startingOffsets``)."""

    earliest: bool = True
    committed: dict[int, int] | None = None
    #: Where a fresh checkpoint starts per partition (latest: the end at its start).
    start: dict[int, int] = field(default_factory=dict)


@dataclass
class Task:
    """One task of a batch: a writer over one source partition, from ``at`` to ``end``."""

    writer: Any
    partition: int
    at: int
    end: int
    opened: bool = False


class RealtimeModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="txsink-opsrt-"))
        self.chk = self.tmp / "chk"
        self.chk.mkdir()
        self.system = f"opsrt-{uuid.uuid4().hex[:10]}"
        self.strict = False
        self.patches = [
            # The writer's timer only commits rows that arrived just before a pause; the
            # model commits by record (interval 0) or at the task's end instead.
            mock.patch.object(RealtimeForeachWriter, "_tick", return_value=None)]
        for p in self.patches:
            p.start()
        self.kind = "single"
        self.targets: dict[str, str | None] = {}
        self.partitions = 1
        # the source
        self.topic_id = uuid.uuid4().hex[:8]
        self.log: dict[int, list[int]] = {}
        self.values = 0
        # Spark
        self.spark = Checkpoint()
        self.runs = 0
        self.run = ""
        self.started = False
        self.zombie: Task | None = None
        #: The targets as the driver prepared them at the query's start (each with the
        #: run's generation): what the writer ships to the tasks.
        self.prepared: dict[str, MemoryRealtimeSpec] = {}
        # the oracle
        self.expected: set[int] = set()
        self.read: set[int] = set()
        self.events: set[str] = set()
        self.last_error: TxsinkError | None = None
        #: Run once inside the next batch, after its first record (another process).
        self.interleave: Any = None
        self.zombie_outlived_start_over = False
        #: Per target: records it lost with its rows that the source no longer retains.
        self.unretained: dict[str, set[int]] = {}

    @initialize(kind=st.sampled_from(["single", "group"]), partitions=st.integers(1, 2))
    def choose(self, kind: str, partitions: int) -> None:
        self.kind, self.partitions = kind, partitions
        self.targets = {"": None} if kind == "single" else {"a": None, "b": WHERE}
        self.log = {p: [] for p in range(partitions)}
        FIRED[f"realtime: {kind}, {partitions} source partition(s)"] += 1

    def teardown(self) -> None:
        for p in reversed(self.patches):
            p.stop()
        SESSIONS.clear()
        realtime_memory.SYSTEMS.pop(self.system, None)
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- the world ---------------------------------------------------------------------------

    def sink_id(self, name: str) -> str:
        return target_sink_id(SINK, name) if name else SINK

    def spec(self, name: str) -> MemoryRealtimeSpec:
        return MemoryRealtimeSpec(self.sink_id(name), self.system, f"table-{name or SINK}")

    def specs(self) -> dict[str, MemoryRealtimeSpec]:
        return {n: self.spec(n) for n in self.targets}

    def visible(self, name: str) -> list[int]:
        return [int(r["value"]) for r in realtime_memory.realtime_system(self.system).rows(
            f"table-{name or SINK}")]

    def wants(self, name: str, values: set[int]) -> set[int]:
        return {v for v in values if _keep(self.targets[name], v)}

    def known(self, item: str, message: str) -> None:
        if item in known_issues() and not self.strict:
            FIRED[f"known: {item} (sequence discarded)"] += 1
            reject()
        raise AssertionError(f"{item}: {message}")

    # -- Spark: a query run, its batches ------------------------------------------------------

    def start(self) -> bool:
        """The driver starts the query: the checks before any data moves (a group's), the
        group's record in the checkpoint; False when refused (loudly)."""
        self.runs += 1
        self.run = f"{SINK}/run-{self.runs}"
        SESSIONS.clear()  # a new driver's tasks run in new processes
        if self.spark.committed is not None and any(
                self.spark.committed[p] > len(self.log[p]) for p in self.log):
            # Spark's Kafka source: the offsets went backwards (failOnDataLoss); the
            # operator starts the query on a new checkpoint.
            FIRED["realtime: Spark refused a checkpoint beyond the topic's end"] += 1
            self.new_checkpoint(earliest=True)
        if self.spark.committed is None and not self.spark.start:
            self.spark.start = {p: 0 if self.spark.earliest else len(self.log[p])
                                for p in self.log}
        # What the Spark adapter checks before the query starts (spark/realtime.py's
        # _start_plan; a single sink is a group of one target named ""): each target's
        # stored positions judged against the source topic's id and the destination, then
        # what a run may start with against the checkpoint's record of the targets.
        specs = self.specs()
        topic_ids = {TOPIC: self.topic_id}
        positions = {}
        for name, spec in specs.items():
            spec.prepare()
            stored = spec.stored()
            refusal = position_refusal(spec.sink_id, stored, spec.destination(), topic_ids,
                                       self.ends, field=options_field("targets", name))
            if refusal is not None:
                return self.refused(refusal)
            positions[name] = {s: p.offset for s, p in stored.items()}
        members = self.chk / MEMBERS_FILE
        recorded = read_members(members.read_text() if members.exists() else None)
        start = StartPoint(fresh=self.spark.committed is None, earliest=self.spark.earliest)
        backends = {n: "memory" for n in specs}
        group_refusal, _ = start_refusal(SINK, backends, specs, positions, recorded, start)
        if group_refusal is not None:
            return self.refused(group_refusal)
        members.write_text(members_record(SINK, backends, specs))
        self.prepared = specs
        self.started = True
        return True

    def refused(self, exc: TxsinkError) -> bool:
        FIRED[f"realtime: loud start refused: {' '.join(str(exc).split()[:5])}"] += 1
        self.last_error = exc
        return False

    def ends(self, topic: str) -> dict[int, int]:
        """The source topic's end offset per partition (Kafka's ListOffsets)."""
        assert topic == TOPIC
        return {p: len(records) for p, records in self.log.items()}

    def offsets(self) -> dict[int, int]:
        return self.spark.committed if self.spark.committed is not None else self.spark.start

    def writer(self, interval: float) -> RealtimeForeachWriter:
        routes = {n: (f"{ROUTE_PREFIX}{n}" if w else None) for n, w in self.targets.items()}
        writer = RealtimeForeachWriter([(n, s, routes[n]) for n, s in self.prepared.items()],
                                       POSITION_COLUMNS, interval, "one", SINK, run=self.run,
                                       topic_ids={TOPIC: self.topic_id})
        return pickle.loads(pickle.dumps(writer))  # shipped to the tasks

    def row(self, partition: int, offset: int) -> Row:
        value = self.log[partition][offset]
        data: dict[str, Any] = {"value": value, "topic": TOPIC, "partition": partition,
                                "offset": offset}
        for n, where in self.targets.items():
            if where is not None:
                data[f"{ROUTE_PREFIX}{n}"] = Row(value=value) if _keep(where, value) else None
        return Row(**data)

    def batch(self, grow: int, interval: float, kill_at: int | None) -> str:
        """One real-time batch: ``ok`` (Spark commits its offsets), ``killed`` (the driver
        died after ``kill_at`` records), ``refused`` (a start refused, loudly)."""
        if not self.started and not self.start():
            return "refused"
        for p in self.log:
            for _ in range(grow):
                self.values += 1
                self.log[p].append(self.values)
        begin = dict(self.offsets())
        tasks = [Task(self.writer(interval), p, begin[p], len(self.log[p])) for p in self.log]
        done = 0
        try:
            for task in tasks:
                task.writer.open(task.partition, 0)
                task.opened = True
                while task.at < task.end:
                    if kill_at is not None and done == kill_at:
                        return self.kill(tasks, task)
                    self.read.add(self.log[task.partition][task.at])
                    task.writer.process(self.row(task.partition, task.at))
                    task.at += 1
                    done += 1
                    if self.interleave is not None:  # another process, meanwhile
                        step, self.interleave = self.interleave, None
                        step()
                if kill_at is not None and done == kill_at:
                    return self.kill(tasks, task)
                task.writer.close(None)
        except TxsinkError as exc:
            # A task failed (Real-time Mode retries no task): the query stops, loudly;
            # what the writers committed stays, their open transactions are gone.
            FIRED[f"realtime: query failed: {type(exc).__name__}"] += 1
            self.last_error = exc
            self.started = False
            return "failed"
        self.spark.committed = {t.partition: t.end for t in tasks}
        for t in tasks:
            self.expected |= set(self.log[t.partition][begin[t.partition]:t.end])
        return "ok"

    def kill(self, tasks: list[Task], current: Task) -> str:
        """The driver dies: no task ends cleanly; one may live on as a zombie."""
        FIRED["realtime: driver killed mid-batch"] += 1
        self.zombie = current if current.at < current.end else None
        self.started = False
        return "killed"

    def exact(self, what: str) -> None:
        self.nothing_twice_nothing_unread()
        for n in self.targets:
            have = collections.Counter(self.visible(n))
            missing = sorted(self.wants(n, self.expected) - set(have))
            missing = sorted(set(missing) - self.unretained.get(n, set()))
            if missing:
                raise AssertionError(f"after {what}: target {n or SINK} lacks records "
                                     f"{missing}, which committed batches read")

    @invariant()
    def nothing_twice_nothing_unread(self) -> None:
        for n in self.targets:
            have = collections.Counter(self.visible(n))
            twice = sorted(v for v, c in have.items() if c > 1)
            assert not twice, f"target {n or SINK}: records {twice} are visible twice"
            stray = sorted(set(have) - self.wants(n, self.read))
            assert not stray, f"target {n or SINK}: records {stray} were read by no task"

    def go_on(self, what: str, *, grow: int = 1) -> None:
        """The query runs a batch to its end, following the way out of a refused start."""
        for _ in range(3):
            outcome = self.batch(grow, 0.0, None)
            if outcome == "ok":
                self.exact(what)
                return
            if outcome == "failed":
                grow = 0
                continue  # the operator starts the query again
            assert outcome == "refused" and self.last_error is not None
            self.remedy(self.last_error)
        raise AssertionError(f"after {what}: the query cannot go on: {self.last_error}")

    def remedy(self, exc: TxsinkError) -> None:
        text = str(exc)
        FIRED["realtime: remedy followed"] += 1
        topic = re.search(r"source_topics=\[\'([^']+)\'\]", text)
        if topic is not None:
            # `txsink reset PIPELINE_FILE --source-topic T` (from Python, delete_positions),
            # then a start on a new checkpoint, as the refusal says.
            for spec in self.specs().values():
                spec.delete_positions([topic[1]])
            self.new_checkpoint(earliest=True)
            FIRED["realtime: positions of the recreated topic deleted"] += 1
            return
        if "startingOffsets" in text and "earliest" in text:
            kept = re.search(r"target '([^']+)' holds no position", text)
            if (kept is not None and "delete those rows first" in text
                    and f"positions of {kept[1]} deleted, rows kept" in self.events):
                # The operator kept that target's rows: the refusal says to delete them.
                self.empty(kept[1])
                self.events.discard(f"positions of {kept[1]} deleted, rows kept")
                FIRED["realtime: kept rows deleted as the refusal says"] += 1
            self.new_checkpoint(earliest=True)
            return
        raise AssertionError(f"a refusal the model cannot follow: {text}")

    def new_checkpoint(self, *, earliest: bool) -> None:
        shutil.rmtree(self.chk)
        self.chk.mkdir()
        self.spark = Checkpoint(earliest=earliest)
        self.started = False

    # -- rules ---------------------------------------------------------------------------------

    @rule(grow=st.integers(0, 3), per_record=st.booleans(),
          kill=st.none() | st.integers(0, 6))
    def batch_runs(self, grow: int, per_record: bool, kill: int | None) -> None:
        """A real-time batch; its writers commit after every record or at their end; the
        driver maybe killed after ``kill`` records (Spark replays the batch)."""
        FIRED["realtime: batch" + (" (a commit per record)" if per_record else "")] += 1
        outcome = self.batch(grow, 0.0 if per_record else 1e9, kill)
        if outcome == "ok":
            self.exact("a batch")
        elif outcome == "failed":
            self.go_on("a failed query's restart", grow=0)
        elif outcome == "refused":
            assert self.last_error is not None
            self.remedy(self.last_error)
            self.go_on("a refused start's way out")
        else:
            self.go_on("the driver killed mid-batch", grow=0)

    @precondition(lambda self: self.zombie is not None)
    @rule(records=st.integers(0, 3), meanwhile=st.booleans())
    def zombie_goes_on(self, records: int, meanwhile: bool) -> None:
        """A task of the dead driver goes on: reads more, and ends its task; now, or
        while the next run's batch is under way (after that batch claimed)."""
        FIRED["realtime: zombie task goes on" + (" during a batch" if meanwhile else "")] += 1
        task, self.zombie = self.zombie, None
        assert task is not None
        if meanwhile:
            self.interleave = lambda: self.zombie_ends(task, records)
            self.go_on("a batch while a zombie task went on", grow=1)
            self.interleave = None
        else:
            self.zombie_ends(task, records)
            self.go_on("a zombie task's end", grow=0)

    def zombie_ends(self, task: Task, records: int) -> None:
        after = " after a start-over" if self.zombie_outlived_start_over else ""
        try:
            for _ in range(records):
                if task.at >= task.end:
                    break
                self.read.add(self.log[task.partition][task.at])
                task.writer.process(self.row(task.partition, task.at))
                task.at += 1
            task.writer.close(None)
        except FencedError:
            FIRED["realtime: zombie fenced" + after] += 1
        except TxsinkError as exc:  # fenced by the offset check ("did not move")
            FIRED[f"realtime: zombie stopped{after}: {type(exc).__name__}"] += 1

    @rule(earliest=st.booleans())
    def checkpoint_deleted(self, earliest: bool) -> None:
        """The checkpoint is deleted; the query starts from startingOffsets."""
        FIRED[f"realtime: checkpoint deleted ({'earliest' if earliest else 'latest'})"] += 1
        # From latest, the records between the old position and the end are never read:
        # no committed batch reads them, so none is expected (docs: by choice).
        self.new_checkpoint(earliest=earliest)
        self.go_on("the checkpoint deleted")

    @rule(zombie_meanwhile=st.booleans())
    def start_over(self, zombie_meanwhile: bool) -> None:
        """docs/realtime.md's start-over, literally: ``txsink reset`` (every target's
        positions deleted, fencing first, and the checkpoint), then the targets emptied,
        then a run from the earliest records; a task of the dead driver, if there is one,
        may go on meanwhile."""
        FIRED["realtime: start over"] += 1
        self.zombie_outlived_start_over = self.zombie is not None
        if self.zombie is not None and zombie_meanwhile:
            FIRED["realtime: zombie task goes on during a start-over's batch"] += 1
            task, self.zombie = self.zombie, None
            self.interleave = lambda: self.zombie_ends(task, 3)
        for spec in self.specs().values():
            spec.delete_positions()
        self.new_checkpoint(earliest=True)
        system = realtime_memory.realtime_system(self.system)
        for n in self.targets:
            system.truncate(f"table-{n or SINK}")
        self.expected, self.read, self.unretained = set(), set(), {}
        try:
            self.go_on("a start-over")
        finally:
            self.interleave = None

    @precondition(lambda self: self.kind == "group")
    @rule(name=st.sampled_from(["a", "b"]), emptied=st.booleans())
    def positions_deleted(self, name: str, emptied: bool) -> None:
        """One target's positions are deleted (its rows too, or kept)."""
        FIRED["realtime: one target's positions deleted" + (", rows too" if emptied else "")
              ] += 1
        self.spec(name).delete_positions()
        if emptied:
            self.empty(name)
        else:
            self.events.add(f"positions of {name} deleted, rows kept")
        self.started = False  # the operator stopped the query first
        self.go_on("one target's positions deleted")

    def empty(self, name: str) -> None:
        """Delete every row of target ``name``."""
        realtime_memory.realtime_system(self.system).truncate(f"table-{name}")
        # What the source no longer holds (a recreated topic's old records) cannot
        # come back into the emptied target (docs/realtime.md says so).
        retained = {v for records in self.log.values() for v in records}
        self.unretained[name] = self.wants(name, self.expected) - retained

    @rule()
    def topic_recreated(self) -> None:
        """The source topic is deleted and created again: offsets from 0, a new topic id;
        Spark's checkpoint holds the old topic's offsets."""
        FIRED["realtime: source topic recreated"] += 1
        self.topic_id = uuid.uuid4().hex[:8]
        self.log = {p: [] for p in range(self.partitions)}
        self.started = False
        self.zombie = None  # its partition is gone
        self.go_on("the source topic recreated", grow=2)

    @rule()
    def restart(self) -> None:
        FIRED["realtime: restart"] += 1
        self.started = False
        self.go_on("a restart", grow=0)


def settings_for(default: int) -> dict[str, Any]:
    from tests.operations_model import settings_for as base

    return {**base(default), "stateful_step_count": 15}
