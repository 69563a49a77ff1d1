"""A model-based test of every public entry point, on one sink and on a group of targets.

:mod:`tests.operations_model` mixes crashes with operations on one sink through the
coordinator. This machine drives what users call instead, so that the seams between
the entry points are exercised the way pipelines meet them (issue 31): the Spark data
source (``write_stream``, ``write`` with and without ``txnAppId``/``txnVersion``), the
grouped epochs of ``txsink.spark.epoch`` (with and without ``version``, and the
``foreachBatch`` pattern ``version=batch_id``), and the CLI's ``resolve`` (``--commit``,
``--abort``, ``--abort --force``), ``reset`` and ``cut``, on a state shared by all of
them. Spark's part is played here: it plans a batch (the writer is pickled: recovery
runs), runs the tasks (a task context with the batch id and the query id, as Spark sets
them), and calls ``commit``; a batch it did not log is run again with the same rows.

Operations, each on one sink or on a group of two targets (chosen per sequence), with
the stream run either through the data source or as ``foreachBatch``:

* a stream batch (Spark replays an uncommitted batch id with the same rows);
* a batch write: a backfill without identity, a job with ``txnAppId``/``txnVersion``
  (a re-run has the same rows), or a grouped epoch with or without ``version``;
* two grouped writes interleaved, and a cut read between any two steps of a write
  (reserved, one target prepared, all prepared, decided, partially committed), also
  between the cut's own reads of the state and of the targets;
* a driver killed at any protocol step, a transient state-store error (before or
  after the write took effect), a task attempt that failed after preparing;
* ``txsink resolve`` of any epoch the state or a target knows, ``txsink reset``;
* a changed target set (add, remove, rename) for one operation, then put back;
* a second driver, and the first one going on (fenced).

The oracle, after every step: in each target no row twice, and no row of a write that
was refused or never decided; an epoch number holds the rows of one write only, in
every target, for the life of the sink; a cut read never names an epoch some target
lacks or holds in part, and no row ever appears at or below a cut once read. After
every operation that recovered and succeeded, every decided write is whole in every
target. A refused operation raises a :class:`~txsink.errors.TxsinkError` (or the CLI
exits 1) and wrote nothing. Rows given up by ``resolve --abort --force`` (the operator
was told) may stay partial, and stay as they were.

The default run (``tests/unit/test_operations_model.py``) takes 300 sequences;
``tox -e operations-long`` 20,000 (``TXSINK_OPERATIONS_EXAMPLES``).
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import pickle
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar
from unittest import mock

import pyarrow as pa
from hypothesis import reject
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from pyspark import TaskContext
from pyspark.sql.types import LongType, StructField, StructType
from txsink import cli
from txsink import plugins as plugins_module
from txsink import state as state_module
from txsink.cut import consistent_cut, pipeline_cut
from txsink.errors import StateError, TxsinkError
from txsink.faults import POINTS, FaultInjector, FaultRule, InjectedFault
from txsink.group import TargetGroup
from txsink.hookspecs import hookimpl
from txsink.model import parse_participant
from txsink.plugins import Plugins, build_plugins
from txsink.registry import BackendRegistry
from txsink.spark import group as spark_group
from txsink.spark._proc import OWNER_ENV
from txsink.spark.datasource import (
    BATCH_ID_PROPERTY,
    QUERY_ID_PROPERTY,
    TxsinkDataSource,
    decode_messages,
)
from txsink.state import DirectoryStateStore, EpochState
from txsink.targets import TargetSpec
from txsink.testing import memory
from txsink.testing.memory import MemoryBackend

from tests.operations_model import FIRED

SINK = "opsg"
ROWS = 2
GROUP_NAMES = ("a", "b")
#: Failures of issue 31 the model knows, by item: a sequence that meets one is
#: discarded (counted in the rules fired) instead of failing, so the default run stays
#: green while they are open; each has a strict regression test in
#: ``tests/unit/test_operations_model.py``. Remove an item when its fix is merged;
#: ``TXSINK_OPERATIONS_KNOWN=`` (empty) makes every one fail.
KNOWN_ENV = "TXSINK_OPERATIONS_KNOWN"
KNOWN_ISSUES = ""


def known_issues() -> set[int]:
    raw = os.environ.get(KNOWN_ENV, KNOWN_ISSUES)
    # Names are the other models' known failures (tests/operations_native.py, ...).
    return {int(x) for x in raw.split(",") if x.strip().isdigit()}


#: What a write's ``status`` says its rows must be.
NONE, EXPECTED, PARTIAL = "none", "expected", "partial"


# -- the target: the in-memory backend, able to be reset -----------------------------------


class ResettableMemory(MemoryBackend):
    """The in-memory backend with ``reset_sink`` (``txsink reset``), and a hook the
    model uses to run steps of a write between a cut's reads of the state and of the
    targets (the cut asks each target for its highest epoch)."""

    name: ClassVar[str] = "opsmem"
    before_highest: ClassVar[Callable[[], None] | None] = None

    def highest_epoch(self, sink_id: str) -> int | None:
        hook = ResettableMemory.before_highest
        if hook is not None:
            ResettableMemory.before_highest = None
            hook()
        return super().highest_epoch(sink_id)

    def reset_sink(self, sink_id: str) -> list[str]:
        s = self.system

        def mine(name: str) -> bool:
            ctx = parse_participant(name)
            return ctx is not None and ctx.sink_id == sink_id

        with s.lock:
            gone = sum(1 for n, _ in s.output if mine(n))
            s.output = [(n, rows) for n, rows in s.output if not mine(n)]
            s.markers = {(n, t) for n, t in s.markers if not mine(n)}
            for n in [n for n in s.prepared if mine(n)]:
                del s.prepared[n]
        return [f"{gone} participant(s) in memory system {self.system_name}"]


class _Plugin:
    @hookimpl
    def txsink_register_backends(self, registry: BackendRegistry) -> None:
        registry.add(ResettableMemory)


_PLUGINS: Plugins | None = None


def _plugins() -> Plugins:
    global _PLUGINS
    if _PLUGINS is None:
        _PLUGINS = build_plugins(extra_plugins=[("ops-entry-points", _Plugin())])
    return _PLUGINS


# -- Spark's part ----------------------------------------------------------------------------


#: The schema Spark hands the data source for the rows the model writes (:meth:`Write.batch`).
ROWS_SCHEMA = StructType([StructField("id", LongType())])


class _FrameWriter:
    """``df.write`` / ``df.writeStream`` as the txsink helpers call them; ``save()``
    runs the batch write the way Spark runs it (plan, tasks, commit)."""

    def __init__(self, frame: _Frame) -> None:
        self.frame = frame
        self.opts: dict[str, str] = {}

    def format(self, name: str) -> _FrameWriter:
        assert name == "txsink"
        return self

    def mode(self, mode: str) -> _FrameWriter:
        assert mode == "append"
        return self

    def options(self, **opts: str) -> _FrameWriter:
        self.opts.update(opts)
        return self

    def save(self) -> None:
        self.frame.model.spark_batch_write(self.opts, self.frame)


@dataclass
class _Frame:
    """A DataFrame of one write's rows, as far as the txsink helpers touch it."""

    model: EntryPointsModel
    data: Write
    batch_id: int | None = None  # set inside foreachBatch
    query: str | None = None

    @property
    def schema(self) -> StructType:
        return ROWS_SCHEMA

    @property
    def write(self) -> _FrameWriter:
        return _FrameWriter(self)

    @property
    def writeStream(self) -> _FrameWriter:
        return _FrameWriter(self)


@dataclass
class Write:
    """One piece of a source's data: a stream batch, a job's input, a backfill."""

    wid: int
    what: str
    parts: int
    status: str = NONE
    #: The epoch a stream batch is written as (its batch id).
    epoch: int | None = None
    #: Per target, the rows a forced resolve left visible (status PARTIAL).
    kept: dict[str, frozenset[int]] = field(default_factory=dict)

    def ids(self) -> set[int]:
        return {self.wid * 1000 + p * 100 + i for p in range(self.parts) for i in range(ROWS)}

    def batch(self, partition: int) -> pa.RecordBatch:
        base = self.wid * 1000 + partition * 100
        return pa.record_batch({"id": pa.array(range(base, base + ROWS), pa.int64())})


class Refused(Exception):
    """The user's own code failed inside a grouped write (``with ... as tx``)."""


class _Abandoned(BaseException):
    """The driver died between two steps of a grouped write: the block never ends."""


#: Steps of a grouped write where the model may read a cut or kill the driver.
GROUP_STEPS = ("reserved", "prepared-one", "prepared-all")


class EntryPointsModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="txsink-opsg-"))
        self.chk = self.tmp / "chk"
        self.pipeline = self.tmp / "pipeline.yaml"
        self.tag = uuid.uuid4().hex[:10]
        self.saved_plugins = plugins_module._cached
        plugins_module._cached = _plugins()
        self.saved_owner = os.environ.get(OWNER_ENV)
        #: Fail on the known failures too (the regression tests set it).
        self.strict = False
        # No power loss is modelled (a crash is an exception), so the state's fsyncs
        # only cost time: about 10 ms each on these disks, most of a sequence's time.
        self.no_fsync = mock.patch.object(os, "fsync", return_value=None)
        self.no_fsync.start()
        self.kind = "group"
        self.mode = "datasource"
        self.names: tuple[str, ...] = GROUP_NAMES
        self.names_now: tuple[str, ...] = GROUP_NAMES
        self.query = "q-0"
        self.queries = 1
        self.spark_next = 0
        self.runs = 0
        self.owner = self.new_run()
        self.zombie: str | None = None
        self.attempts = 0
        self.writes: dict[tuple[Any, ...], Write] = {}
        self.by_wid: dict[int, Write] = {}
        self.epoch_origin: dict[int, int] = {}
        self.forced: set[int] = set()
        self.frozen_cut = -1
        self.frozen: dict[str, list[int]] = {}
        self.current: Op | None = None
        self.ops: list[Op] = []
        self.saved: list[tuple[str, int]] = []
        #: The highest committed version per (txnAppId, driving query or None).
        self.versions: dict[tuple[str, str | None], int] = {}
        #: A batch write was decided on this state since it was (re)made.
        self.batch_written = False

    @initialize(kind=st.sampled_from(["group", "single"]),
                mode=st.sampled_from(["datasource", "foreachBatch"]))
    def choose(self, kind: str, mode: str) -> None:
        self.kind, self.mode = kind, mode
        self.names = self.names_now = GROUP_NAMES if kind == "group" else (SINK,)
        FIRED[f"sink: {kind}, stream via {mode}"] += 1

    def teardown(self) -> None:
        self.no_fsync.stop()
        plugins_module._cached = self.saved_plugins
        if self.saved_owner is None:
            os.environ.pop(OWNER_ENV, None)
        else:
            os.environ[OWNER_ENV] = self.saved_owner
        ResettableMemory.before_highest = None
        TaskContext._setTaskContext(None)
        for name in [n for n in memory.SYSTEMS if self.tag in n]:
            memory.SYSTEMS.pop(name, None)
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- the world ---------------------------------------------------------------------------

    def new_run(self) -> str:
        self.runs += 1
        self.owner = f"run-{self.runs}"
        return self.owner

    def system_name(self, target: str) -> str:
        return f"opsg-{self.tag}-{target}"

    def sink_id_of(self, target: str) -> str:
        return SINK if self.kind == "single" else f"{SINK}--{target}"

    def system(self, target: str) -> memory.MemorySystem:
        return memory.system(self.system_name(target))

    def write_for(self, key: tuple[Any, ...], parts: int, what: str) -> Write:
        w = self.writes.get(key)
        if w is None:
            w = Write(len(self.by_wid) + 1, what, parts)
            self.writes[key] = w
            self.by_wid[w.wid] = w
        return w

    def visible(self, target: str) -> list[tuple[int, str, int]]:
        """(epoch, participant, row id) of every committed row of ``target``."""
        out = []
        sink = self.sink_id_of(target)
        for name, rows in self.system(target).output:
            ctx = parse_participant(name)
            if ctx is not None and ctx.sink_id == sink:
                out += [(ctx.epoch, name, int(r["id"])) for r in rows]
        return out

    def held(self, target: str) -> set[int]:
        """The epochs ``target``'s own markers show committed."""
        sink = self.sink_id_of(target)
        return {ctx.epoch for name, _ in self.system(target).markers
                if (ctx := parse_participant(name)) is not None and ctx.sink_id == sink}

    def store(self) -> DirectoryStateStore:
        return DirectoryStateStore(self.chk / "txsink")

    def records(self) -> dict[int, Any]:
        if not (self.chk / "txsink").exists():
            return {}
        return {e: (r.state, r.committables) for e, r in self.store().records().items()}

    def outputs(self) -> dict[str, list[str]]:
        return {t: [n for n, _ in self.system(t).output] for t in self.names}

    def cut_backend(self) -> Any:
        """The backend ``txsink cut`` builds from the pipeline file."""
        if self.kind == "single":
            return ResettableMemory(self.system_name(SINK))
        return TargetGroup.from_specs(SINK, [
            TargetSpec(n, "opsmem", {"system": self.system_name(n)}) for n in self.names],
            _plugins())

    def specs(self, names: tuple[str, ...]) -> list[dict[str, Any]]:
        return [spark_group.target(n, "opsmem", system=self.system_name(n)) for n in names]

    def target_set(self, names: tuple[str, ...] | None = None) -> spark_group.TargetSet:
        return spark_group.targets(SINK, self.specs(names or self.names_now),
                                   checkpoint_location=str(self.chk))

    def sink_options(self, **extra: str) -> dict[str, str]:
        """The data source's options for the sink (a group: what TargetSet gives)."""
        if self.kind == "group":
            opts = self.target_set().write_stream(_Frame(self, Write(0, "", 1))).opts
        else:
            opts = {"backend": "opsmem", "sink_id": SINK, "checkpointLocation": str(self.chk),
                    "system": self.system_name(SINK)}
        return {**opts, **extra}

    def write_pipeline(self, names: tuple[str, ...]) -> None:
        if self.kind == "group":
            targets = "\n".join(f"    - {{name: {n}, backend: opsmem, options: {{system: "
                                f"{self.system_name(n)}}}}}" for n in names)
            sink = f"sink:\n  sink_id: {SINK}\n  targets:\n{targets}\n"
        else:
            sink = (f"sink: {{sink_id: {SINK}, backend: opsmem, options: {{system: "
                    f"{self.system_name(SINK)}}}}}\n")
        self.pipeline.write_text(f"source: {{type: rate}}\ncheckpoint: {self.chk}\n{sink}")

    @contextlib.contextmanager
    def task(self, partition: int, batch_id: int | None, query: str | None) -> Iterator[None]:
        props = {}
        if batch_id is not None:
            props[BATCH_ID_PROPERTY] = str(batch_id)
        if query is not None:
            props[QUERY_ID_PROPERTY] = query
        self.attempts += 1
        TaskContext._setTaskContext(None)
        TaskContext(partitionId=partition, attemptNumber=0, taskAttemptId=self.attempts,
                    stageId=0, localProperties=props)
        try:
            yield
        finally:
            TaskContext._setTaskContext(None)

    def run_tasks(self, writer: Any, data: Write, batch_id: int | None,
                  query: str | None) -> list[Any]:
        """The tasks of one write; each participant is noted as the running op's."""
        messages = []
        for p in range(data.parts):
            with self.task(p, batch_id, query):
                messages.append(writer.write(iter([data.batch(p)])))
            self.note(messages[-1:])
        if self.current is not None and self.current.orphan:
            with self.task(0, batch_id, query):
                lost = writer.write(iter([data.batch(0)]))  # a failed attempt: not reported
            self.note([lost])
        return messages

    def note(self, messages: list[Any]) -> None:
        """Note the participants of ``messages`` (a skipped write's carry none)."""
        committables = decode_messages([m for m in messages if m.committable])
        if self.current is not None:
            self.current.participants |= {c.participant for c in committables
                                          if c is not None}

    def spark_batch_write(self, opts: dict[str, str], frame: _Frame) -> None:
        """``df.write.format("txsink")...save()``: plan (the writer's constructor), tasks,
        ``commit``."""
        writer = TxsinkDataSource(opts).writer(ROWS_SCHEMA, False)
        messages = self.run_tasks(writer, frame.data, frame.batch_id, frame.query)
        writer.commit(messages)

    def ensure_spark_checkpoint(self) -> None:
        """Spark writes the query's id into ``<checkpoint>/metadata`` when it starts."""
        meta = self.chk / "metadata"
        if self.mode == "datasource" and not meta.exists():
            self.chk.mkdir(parents=True, exist_ok=True)
            meta.write_text(json.dumps({"id": self.query}) + "\n")

    # -- interleaving: cuts, kills, store errors --------------------------------------------

    @contextlib.contextmanager
    def faults(self, kill: str | None, cut: str | None, store_fault: tuple[int, bool] | None
               ) -> Iterator[None]:
        """Crash (``raise``) at a protocol point, read a cut at one, fail the store once
        (before the write took effect, or after: a lost reply)."""
        def at(point: str, epoch: int | None) -> None:
            if cut is not None and point == cut:
                self.read_cut(f"at {point} of epoch {epoch}")

        injector = FaultInjector([FaultRule(kill, None, "raise")] if kill else [], at)
        real = state_module.write_file_atomically
        calls = [0]

        def flaky(path: Path, payload: bytes, *, what: str) -> None:
            calls[0] += 1
            if store_fault is None or calls[0] != store_fault[0]:
                return real(path, payload, what=what)
            FIRED["store error " + ("after" if store_fault[1] else "before") + " a write"] += 1
            if store_fault[1]:
                real(path, payload, what=what)
                raise StateError(f"{what}: {path} was written but its directory could not "
                                 "be synced (injected)")
            raise StateError(f"{what}: cannot write {path} (injected); nothing was changed")

        with mock.patch.object(FaultInjector, "from_env", classmethod(lambda cls: injector)), \
                mock.patch.object(state_module, "write_file_atomically", flaky):
            yield

    # -- the oracle ------------------------------------------------------------------------

    def known(self, item: int, message: str) -> None:
        """A failure issue 31 lists: discard the sequence while it is open, else fail."""
        if item in known_issues() and not self.strict:
            FIRED[f"known: issue 31 item {item} (sequence discarded)"] += 1
            reject()
        raise AssertionError(f"issue 31 item {item}: {message}")

    def quiescent(self, what: str) -> None:
        """After an operation that recovered and succeeded: every decided write whole."""
        for t in self.names:
            have = collections.Counter(i for _, _, i in self.visible(t))
            for w in self.by_wid.values():
                mine = {i for i in have if i // 1000 == w.wid}
                if w.status == EXPECTED and mine != w.ids():
                    message = (f"after {what}: {w.what} was committed (or decided), but "
                               f"target {t} holds {len(mine)} of its {len(w.ids())} rows")
                    if w.epoch is not None and not mine and self.batch_written:
                        # Batch writes took numbers on this state: the stream's batch
                        # was taken for a replay of one (item 1).
                        self.known(1, f"{message}; batch writes were committed on the "
                                   "same state")
                    raise AssertionError(message)
                elif w.status == PARTIAL:
                    assert mine <= w.kept.get(t, frozenset()), (
                        f"after {what}: {w.what}, given up by a forced resolve, grew in {t}")

    @invariant()
    def exact_or_loud(self) -> None:
        for t in self.names:
            seen = self.visible(t)
            ids = [i for _, _, i in seen]
            twice = sorted(i for i, n in collections.Counter(ids).items() if n > 1)
            assert not twice, f"target {t}: rows {twice} visible twice"
            for epoch, name, i in seen:
                w = self.by_wid[i // 1000]
                assert w.status != NONE, (
                    f"target {t}: row {i} of {w.what} is visible (participant {name}), but "
                    "that write was refused or never decided")
                if w.status == PARTIAL:
                    assert i in w.kept.get(t, frozenset()), (
                        f"target {t}: row {i} of {w.what} appeared after a forced resolve "
                        "gave that write up")
                origin = self.epoch_origin.setdefault(epoch, w.wid)
                if origin != w.wid:
                    message = (f"epoch {epoch} means two sets of rows: target {t} holds rows "
                               f"of {w.what} in it, and {self.by_wid[origin].what} was there "
                               "first")
                    if epoch in self.forced:
                        self.known(3, message + " (the number was given up by resolve --force)")
                    raise AssertionError(message)
            low = sorted(i for e, _, i in seen if e <= self.frozen_cut)
            if low != self.frozen.get(t, []):
                self.known(5, f"target {t}: rows at or below the cut {self.frozen_cut} a reader "
                           f"took changed since: "
                           f"{sorted(set(low) ^ set(self.frozen.get(t, [])))} (the reader "
                           "never sees them)")

    def read_cut(self, when: str, race: Callable[[], None] | None = None) -> None:
        """``txsink cut PIPELINE`` (``pipeline_cut``); check it, and freeze what is below.

        ``race``: steps of writes that run after the cut read the state and before it
        asks the targets."""
        FIRED["cut read " + ("at rest" if when == "at rest" else "during writes")] += 1
        ResettableMemory.before_highest = race
        try:
            if self.names_now != self.names:  # the file changed: all of `txsink cut FILE`
                self.write_pipeline(self.names_now)
                cut = pipeline_cut(self.pipeline).cut
            else:  # what `txsink cut` computes once it has read the file
                cut = consistent_cut(self.cut_backend(), self.store(), SINK).cut
        except TxsinkError:
            FIRED["loud: cut refused"] += 1
            return
        finally:
            ResettableMemory.before_highest = None
        for e in range(cut + 1):
            if e in self.forced:
                continue
            holders = {t for t in self.names if e in self.held(t)}
            if holders and holders != set(self.names):
                self.known(5, f"cut {cut} read {when} names epoch {e}, which target(s) "
                           f"{', '.join(sorted(set(self.names) - holders))} lack")
            origin = self.epoch_origin.get(e)
            for t in self.names:
                rows = {i for ep, _, i in self.visible(t) if ep == e}
                if origin is not None and rows != self.by_wid[origin].ids():
                    self.known(5, f"cut {cut} read {when} names epoch {e}, which target {t} "
                               f"holds in part ({len(rows)} of "
                               f"{len(self.by_wid[origin].ids())} rows)")
        if cut > self.frozen_cut:
            self.frozen_cut = cut
            for t in self.names:
                self.frozen[t] = sorted(i for e, _, i in self.visible(t) if e <= cut)

    # -- operations as steps ---------------------------------------------------------------

    def stream_steps(self, data: Write, batch: int) -> Iterator[str]:
        """One micro-batch: plan (the writer is pickled: recovery), tasks, commit."""
        if self.mode == "foreachBatch":
            yield from self.foreach_batch_steps(data, batch)
            return
        self.ensure_spark_checkpoint()
        writer = TxsinkDataSource(self.sink_options()).streamWriter(
            ROWS_SCHEMA, False)
        shipped = pickle.dumps(writer)
        yield "planned"
        messages = self.run_tasks(pickle.loads(shipped), data, batch, None)
        yield "prepared-all"
        pickle.loads(shipped).commit(messages, batch)

    def foreach_batch_steps(self, data: Write, batch: int) -> Iterator[str]:
        """``foreachBatch`` with the documented identity: ``version=batch_id``."""
        frame = _Frame(self, data, batch, self.query)
        if self.kind == "group":
            yield from self.grouped_steps(frame, version=batch)
            return
        opts = {**self.sink_options(), "txnAppId": SINK, "txnVersion": str(batch)}
        yield from self.batch_steps(opts, frame)

    def batch_steps(self, opts: dict[str, str], frame: _Frame) -> Iterator[str]:
        """``df.write.format("txsink")...save()``: the writer's constructor plans (and
        reserves the epoch), the tasks prepare, ``commit`` decides."""
        writer = TxsinkDataSource(opts).writer(ROWS_SCHEMA, False)
        if self.current is not None:
            self.current.skipped = writer.skip
        yield "reserved"
        messages = self.run_tasks(writer, frame.data, frame.batch_id, frame.query)
        yield "prepared-all"
        writer.commit(messages)

    def grouped_steps(self, frame: _Frame, *, version: int | None,
                      fail: bool = False) -> Iterator[str]:
        """``with txsink.spark.epoch(spark, group, version=...) as tx:`` writing every
        target, one ``tx.write`` per target. A driver killed inside the block never
        reaches its end (the generator is closed)."""
        group = self.target_set()
        tx = spark_group.epoch(None, group, version=version)  # type: ignore[arg-type]
        tx.__enter__()
        if self.current is not None:
            self.current.skipped = tx.skipped
        try:
            yield "reserved"
            for i, name in enumerate(group.names):
                tx.write(frame, name)  # type: ignore[arg-type]
                if fail:
                    raise Refused("the user's code failed inside the block")
                yield "prepared-one" if i == 0 else "prepared-all"
        except (GeneratorExit, InjectedFault):
            raise
        except BaseException as exc:
            tx.__exit__(type(exc), exc, exc.__traceback__)
            raise
        tx.__exit__(None, None, None)

    def planner_steps(self) -> Iterator[str]:
        """A (re)started query's first planning: recovery, nothing written."""
        self.ensure_spark_checkpoint()
        pickle.dumps(TxsinkDataSource(self.sink_options()).streamWriter(
            ROWS_SCHEMA, False))
        yield from ()

    def make_op(self, kind: str, *, version: int = 0, parts: int = 1, orphan: bool = False,
                fail: bool = False, owner: str | None = None) -> Op:
        if self.kind == "single" and kind.startswith("grouped"):
            kind = kind.removeprefix("grouped ").replace("grouped", "backfill")
        identity: tuple[str, int, str | None] | None = None
        if kind == "stream":
            batch = self.spark_next
            data = self.write_for(("stream", self.query, batch), parts,
                                  f"stream batch {batch} of query {self.query} ({self.mode})")
            steps = self.stream_steps(data, batch)
            if self.mode == "datasource":
                data.epoch = batch
            else:
                identity = (SINK, batch, self.query)
        elif kind in ("backfill", "grouped"):
            data = self.write_for((kind, len(self.writes)), parts, f"a {kind} write")
            frame = _Frame(self, data)
            steps = (self.grouped_steps(frame, version=None, fail=fail) if kind == "grouped"
                     else self.batch_steps(self.sink_options(), frame))
        else:  # a job with an identity, re-run with the same rows
            data = self.write_for((kind, version), parts, f"{kind} version {version}")
            identity = (SINK, version, None)
            frame = _Frame(self, data)
            steps = (self.grouped_steps(frame, version=version, fail=fail)
                     if kind == "grouped job" else
                     self.batch_steps(self.sink_options(txnAppId=SINK,
                                                        txnVersion=str(version)), frame))
        FIRED[f"op: {kind}"] += 1
        return Op(f"{data.what}", data, steps, owner or self.owner, orphan,
                  stream=kind == "stream", identity=identity)

    def advance(self, op: Op) -> None:
        """One step of ``op``; its end (success, or a failure that must be loud)."""
        if op.state != "running":
            return
        self.current = op
        os.environ[OWNER_ENV] = op.owner
        try:
            next(op.steps)
            return
        except StopIteration:
            op.state = "ok"
            if op.stream and op.owner == self.owner:
                self.spark_next += 1  # Spark logs the batch
            if op.skipped:
                self.check_skip(op)
            else:
                self.written(op)
        except (TxsinkError, InjectedFault, Refused) as exc:
            op.state = "failed"
            op.error = f"{type(exc).__name__}: {exc}"
            self.failed(op)
            if isinstance(exc, InjectedFault):
                FIRED[f"driver killed at {exc.point}"] += 1
                self.kill()
            else:
                FIRED[f"loud: {type(exc).__name__}"] += 1
        finally:
            self.current = None
            TaskContext._setTaskContext(None)

    def failed(self, op: Op) -> None:
        """A write that failed was decided (recovery finishes it) or wrote nothing."""
        decided = any(state in (EpochState.DECIDED, EpochState.COMMITTED)
                      and {c.participant for c in cs} & op.participants
                      for state, cs in self.records().values())
        if decided:
            self.written(op)
            return
        shown = {n for names in self.outputs().values() for n in names}
        assert not shown & op.participants, (
            f"{op.what} failed ({op.error}) without a decision, but its participant(s) "
            f"{sorted(shown & op.participants)} are visible")

    def written(self, op: Op) -> None:
        """``op``'s rows are committed (or decided: recovery commits them)."""
        self.batch_written |= not op.stream or self.mode == "foreachBatch"
        op.data.status = EXPECTED
        op.data.kept = {}
        if op.identity is not None:
            app, version, query = op.identity
            self.versions[app, query] = max(version, self.versions.get((app, query), -1))

    def check_skip(self, op: Op) -> None:
        """A write skipped as already written: only if its own identity (app id and
        driving query) has that version or a higher one committed (Delta's rule)."""
        assert op.identity is not None, f"{op.what} has no identity but was skipped"
        app, version, query = op.identity
        if self.versions.get((app, query), -1) >= version:
            FIRED["skipped as written (its identity is committed)"] += 1
            return
        others = {q: v for (a, q), v in self.versions.items() if a == app and v >= version}
        message = (f"{op.what} was skipped as already written, but version {version} of "
                   f"txnAppId {app!r} was committed only by "
                   + ", ".join(f"the query {q}" if q else "a batch job" for q in others)
                   + f", not by {'the query ' + query if query else 'a batch job'}; its rows "
                   "are in no target, and only a WARNING says so")
        if others:
            self.known(2, message)
        raise AssertionError(message)

    def kill(self) -> None:
        """The driver dies: every write it had in flight stops where it is."""
        for op in self.ops:
            if op.state == "running":
                op.steps.close()
                op.state = "failed"
                op.error = "driver killed"
                self.failed(op)
        self.new_run()

    def run_one(self, kind: str, *, kill: str | None = None, **kw: Any) -> Op:
        """One write of ``kind`` (:meth:`make_op`) to its end, the driver killed at the
        protocol point ``kill`` if given: what the regression tests drive."""
        op = self.make_op(kind, **kw)
        with self.faults(kill, None, None):
            self.run_ops([op], [], None, None)
        return op

    def run_ops(self, ops: list[Op], schedule: list[int], cut: tuple[int, int] | None,
                kill_at: int | None) -> None:
        """Advance ``ops`` in ``schedule`` order (indices), a cut read spanning the
        tokens ``cut`` (its state read before, its targets read after them), a kill
        before token ``kill_at``; then every op to its end."""
        self.ops = ops

        def tokens(lo: int, hi: int) -> None:
            for k in range(lo, hi):
                if kill_at == k:
                    FIRED["driver killed between steps"] += 1
                    self.kill()
                self.advance(ops[schedule[k]])

        if cut is None:
            tokens(0, len(schedule))
        else:
            tokens(0, cut[0])
            self.read_cut(f"around steps {cut[0]}-{cut[1]} of {', '.join(o.what for o in ops)}",
                          race=lambda: tokens(cut[0], cut[1]))
            tokens(cut[1], len(schedule))
        if kill_at == len(schedule):
            self.kill()
        for op in ops:
            while op.state == "running":
                self.advance(op)
        self.ops = []

    def cli(self, *argv: str) -> tuple[int, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(list(argv))
        return code, out.getvalue() + err.getvalue()

    def start_over(self) -> None:
        """After ``txsink reset``: no output, no state, a new query from batch 0."""
        for w in self.by_wid.values():
            w.status, w.kept = NONE, {}
        self.epoch_origin.clear()
        self.versions.clear()
        self.batch_written = False
        self.forced.clear()
        self.frozen_cut, self.frozen = -1, {}
        self.query = f"q-{self.queries}"
        self.queries += 1
        self.spark_next = 0
        self.saved.clear()
        self.zombie = None  # its lease went with the state
        self.new_run()

    def wids_of(self, participants: set[str]) -> set[int]:
        out = set()
        for t in self.names:
            s = self.system(t)
            for name, p in s.prepared.items():
                if name in participants:
                    out |= {int(r["id"]) // 1000 for r in p.rows}
            for name, rows in s.output:
                if name in participants:
                    out |= {int(r["id"]) // 1000 for r in rows}
        return out

    # -- rules -------------------------------------------------------------------------------

    @rule(data=st.data())
    def writes(self, data: st.DataObject) -> None:
        """One write, or two at once, with a cut read, a kill or a store error anywhere."""
        kinds = ["stream", "backfill", "job", "grouped", "grouped job"]
        first = data.draw(st.sampled_from(kinds), label="write")
        ops = [self.make_op(first, version=data.draw(st.integers(0, 2), label="version"),
                            parts=data.draw(st.integers(1, 2), label="partitions"),
                            orphan=data.draw(st.booleans(), label="failed task attempt"),
                            fail=data.draw(st.sampled_from([False] * 5 + [True]),
                                           label="user code fails in the block"))]
        if data.draw(st.booleans(), label="a second write at once"):
            second = data.draw(st.sampled_from([k for k in kinds if k != "stream"
                                                or first != "stream"]), label="second write")
            ops.append(self.make_op(second, version=data.draw(st.integers(0, 2)),
                                    parts=data.draw(st.integers(1, 2))))
            FIRED["two writes at once"] += 1
        schedule = data.draw(st.lists(st.integers(0, len(ops) - 1), max_size=8),
                             label="schedule")
        span = data.draw(st.none() | st.tuples(st.integers(0, len(schedule)),
                                               st.integers(0, len(schedule))), label="cut")
        cut = None if span is None else (min(span), max(span))
        kill_at = data.draw(st.sampled_from([None] * 3 + list(range(len(schedule) + 1))),
                            label="kill before step")
        kill_point = data.draw(st.sampled_from([None] * 4 + list(POINTS)), label="kill at")
        cut_point = data.draw(st.sampled_from([None] * 3 + list(POINTS)), label="cut at")
        store_fault = data.draw(st.sampled_from([None] * 4) | st.tuples(
            st.integers(1, 10), st.booleans()), label="store error at write, after it")
        with self.faults(kill_point, cut_point, store_fault):
            self.run_ops(ops, schedule, cut, kill_at)
        if all(op.state == "ok" for op in ops):
            self.quiescent(" and ".join(op.what for op in ops))

    @rule(batches=st.integers(1, 3))
    def stream_runs(self, batches: int) -> None:
        """The stream's next batches, one after the other, nothing else."""
        for _ in range(batches):
            op = self.make_op("stream")
            self.run_ops([op], [], None, None)
            if op.state != "ok":
                return
        self.quiescent("stream batches")

    @rule(kind=st.sampled_from(["backfill", "job", "grouped", "grouped job"]),
          version=st.integers(0, 2), parts=st.integers(1, 2))
    def batch_write(self, kind: str, version: int, parts: int) -> None:
        """One batch write, nothing else."""
        op = self.make_op(kind, version=version, parts=parts)
        self.run_ops([op], [], None, None)
        if op.state == "ok":
            self.quiescent(op.what)

    @rule()
    def restart_query(self) -> None:
        """The driver is killed between operations; a new one starts the query."""
        FIRED["restart"] += 1
        self.new_run()
        op = Op("a restart", Write(0, "a restart", 0), self.planner_steps(), self.owner)
        self.run_ops([op], [], None, None)
        if op.state == "ok":
            self.quiescent("a restart")

    @precondition(lambda self: self.has_state())
    @rule()
    def cut_at_rest(self) -> None:
        self.read_cut("at rest")

    @precondition(lambda self: self.has_state())
    @rule(data=st.data(), how=st.sampled_from(["--commit", "--abort", "--force"]))
    def resolve(self, data: st.DataObject, how: str) -> None:
        """``txsink resolve CHECKPOINT --epoch N`` (the query stopped first)."""
        records = self.records()
        prepared = {c.epoch for t in self.names for p in self.system(t).prepared.values()
                    if (c := p.committable)}
        open_epochs = {e for e, (state, _) in records.items() if state is not EpochState.COMMITTED}
        epoch = data.draw(st.sampled_from(sorted(open_epochs | prepared) or sorted(records)
                                          or [0]), label="epoch")
        FIRED[f"resolve {how}"] += 1
        record = records.get(epoch)
        gives_up = set()
        if how == "--force" and record is not None and record[0] is EpochState.DECIDED:
            gives_up = self.wids_of({c.participant for c in record[1]})
        before = (records, self.outputs())
        argv = ["--abort", "--force"] if how == "--force" else [how]
        if not (self.chk / "txsink").exists():
            return
        code, text = self.cli("resolve", str(self.chk), "--epoch", str(epoch), *argv)
        self.new_run()  # the operator stopped the query; it is started again after
        if code != 0:
            assert (self.records(), self.outputs()) == before, (
                f"resolve {how} of epoch {epoch} refused ({text.strip()}) but changed things")
            FIRED["loud: resolve refused"] += 1
            return
        if gives_up:
            self.forced.add(epoch)
            for wid in gives_up:
                w = self.by_wid[wid]
                w.status = PARTIAL
                w.kept = {t: frozenset(i for _, _, i in self.visible(t) if i // 1000 == wid)
                          for t in self.names}

    @precondition(lambda self: self.has_state())
    @rule()
    def reset(self) -> None:
        """``txsink reset PIPELINE --yes --force`` (the query stopped first)."""
        FIRED["reset" + (" with the targets changed" if self.names_now != self.names else "")
              ] += 1
        before = (self.records(), self.outputs())
        self.write_pipeline(self.names_now)
        try:
            code, text = self.cli("reset", str(self.pipeline), "--yes", "--force")
        finally:
            self.write_pipeline(self.names)
        if code != 0:
            assert (self.records(), self.outputs()) == before, (
                f"reset refused ({text.strip()}) but changed things")
            FIRED["loud: reset refused"] += 1
            self.new_run()
            return
        for t in self.names:
            if self.visible(t) or self.held(t):
                message = (f"txsink reset (targets {', '.join(self.names_now)}) said it started "
                           f"the sink over, but target {t} still holds {len(self.visible(t))} "
                           f"row(s) of epochs {sorted(self.held(t))}: {text.strip()!r}")
                if self.names_now != self.names:
                    self.known(4, message)
                raise AssertionError(message)
        self.start_over()

    @precondition(lambda self: self.kind == "group" and self.has_state())
    @rule(change=st.sampled_from(["add", "remove", "rename"]),
          what=st.sampled_from(["write", "reset", "cut"]), data=st.data())
    def targets_changed(self, change: str, what: str, data: st.DataObject) -> None:
        """The group's targets changed in the file or the code, for one operation."""
        FIRED[f"targets {change}: {what}"] += 1
        self.names_now = {"add": ("a", "b", "c"), "remove": ("a",), "rename": ("a", "c")}[change]
        try:
            if what == "reset":
                self.reset()
            elif what == "cut":
                self.read_cut(f"with the targets {', '.join(self.names_now)}")
            else:
                before = (self.records(), self.outputs())
                try:
                    op = self.make_op(data.draw(st.sampled_from(
                        ["stream", "backfill", "job", "grouped", "grouped job"])),
                        version=data.draw(st.integers(0, 2)))
                except TxsinkError as exc:
                    # Refused while the write is planned (TargetSet checks the state's
                    # targets before Spark plans anything): loud, and nothing changed.
                    FIRED[f"loud: {type(exc).__name__} before planning"] += 1
                    assert (self.records(), self.outputs()) == before, (  # noqa: PT017
                        f"refused before planning ({exc}) but changed things")
                    return
                self.run_ops([op], [], None, None)
                assert op.state == "failed", (
                    f"{op.what} with the targets {', '.join(self.names_now)} succeeded; the "
                    f"group's targets are {', '.join(self.names)}")
                assert (self.records(), self.outputs()) == before or op.error == (
                    "driver killed"), f"{op.what} was refused ({op.error}) but changed things"
        finally:
            self.names_now = self.names

    def has_state(self) -> bool:
        return (self.chk / "txsink" / "meta.json").is_file()

    @precondition(lambda self: self.has_state())
    @rule()
    def second_driver(self) -> None:
        """Another driver takes the query over; the first one, if it held the lease, is
        kept, still running."""
        FIRED["second driver"] += 1
        lease = self.store().lease_info()
        if lease.get("owner") == self.owner and lease.get("released_at") is None:
            self.zombie = self.owner
        self.restart_query()

    @precondition(lambda self: self.zombie is not None)
    @rule(kind=st.sampled_from(["stream", "backfill", "job", "grouped", "grouped job"]))
    def fenced_driver_goes_on(self, kind: str) -> None:
        """The taken-over driver writes on: refused, and nothing changed."""
        FIRED["fenced driver goes on"] += 1
        zombie, self.zombie = self.zombie, None
        assert zombie is not None
        before = (self.records(), self.outputs())
        op = self.make_op(kind, owner=zombie)
        self.run_ops([op], [], None, None)
        assert op.state == "failed", f"{op.what} by the fenced driver {zombie} succeeded"
        assert (self.records(), self.outputs()) == before, (
            f"{op.what} by the fenced driver {zombie} changed things ({op.error})")

    @precondition(lambda self: self.spark_next > 0)
    @rule()
    def new_stream_checkpoint(self) -> None:
        """Spark's checkpoint of the stream is deleted: a new query, batch ids from 0."""
        FIRED["new stream checkpoint"] += 1
        self.saved.append((self.query, self.spark_next))
        self.query = f"q-{self.queries}"
        self.queries += 1
        self.spark_next = 0
        (self.chk / "metadata").unlink(missing_ok=True)

    @precondition(lambda self: self.saved)
    @rule(data=st.data())
    def restore_stream_checkpoint(self, data: st.DataObject) -> None:
        FIRED["restore stream checkpoint"] += 1
        self.query, self.spark_next = data.draw(st.sampled_from(self.saved))
        (self.chk / "metadata").unlink(missing_ok=True)


@dataclass(eq=False)
class Op:
    """One write in flight: its steps, and what it prepared."""

    what: str
    data: Write
    steps: Iterator[str]
    owner: str
    orphan: bool = False
    stream: bool = False
    participants: set[str] = field(default_factory=set)
    state: str = "running"
    error: str = ""
    #: (txnAppId, version, driving query) of a write with an identity.
    identity: tuple[str, int, str | None] | None = None
    #: The write found its identity committed and wrote nothing.
    skipped: bool = False


def settings_for(default: int) -> dict[str, Any]:
    """Hypothesis settings: ``default`` sequences (or ``TXSINK_OPERATIONS_EXAMPLES``) of
    up to 20 steps; a step here is a whole operation (a write runs its Spark plan, its
    tasks and its commit), so sequences are shorter than the coordinator model's."""
    from tests.operations_model import settings_for as base

    return {**base(default), "stateful_step_count": 20}


