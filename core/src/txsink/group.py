"""One backend per target behind one :class:`~txsink.backend.Backend`: the group.

The coordinator drives a group like any backend: one decision record per epoch
holds the committables of every target (each tagged with its target's name), and
every call that acts on a participant goes to the backend of that participant's
target, under the target's own sink id. So recovery re-commits a decided epoch in
every target, orphans are listed and aborted per target, claims bind each target's
sink id to the group's one state, and each target's own markers say which epochs it
holds. The backends themselves do not change: each still prepares, commits
idempotently and lists its orphans for its own part.

On the executor a task writes a participant in every target
(:func:`write_group`): rows are routed to the targets (all rows to each, or, for a
shaped frame, the rows of each target's struct column), and the task returns one
committable per target.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from txsink.backend import Backend, CommitOutcome, Transaction
from txsink.errors import ConfigError, PluginError, SinkOwnedError, StateError
from txsink.model import Committable, TransactionContext
from txsink.targets import (
    GROUP_BACKEND,
    ROUTE_PREFIX,
    TargetSpec,
    check_columns,
    duplicate_column,
    target_sink_id,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from txsink.plugins import Plugins
    from txsink.realtime.source import SourceTopics

log = logging.getLogger(__name__)
_T = TypeVar("_T")


@dataclass(frozen=True)
class Member:
    """One target of a group: its spec, its backend instance, its own sink id."""

    spec: TargetSpec
    backend: Backend
    sink_id: str

    @property
    def name(self) -> str:
        return self.spec.name


class TargetGroup(Backend):
    """The targets of one group, driven as one backend by the coordinator."""

    name: ClassVar[str] = GROUP_BACKEND

    def __init__(self, group_id: str, members: Sequence[Member]) -> None:
        if not members:
            raise ConfigError("a group needs at least one target", field="targets")
        self.group_id = group_id
        self.members = {m.name: m for m in members}

    @classmethod
    def from_specs(cls, group_id: str, specs: Sequence[TargetSpec],
                   plugins: Plugins | None = None) -> TargetGroup:
        from txsink.plugins import get_plugins

        registry = plugins if plugins is not None else get_plugins()
        members: list[Member] = []
        try:
            for spec in specs:
                try:
                    backend = registry.create_backend(spec.backend, spec.options)
                except ConfigError as exc:
                    where = f"targets[{spec.name}].options" + (f".{exc.field}" if exc.field
                                                                else "")
                    raise ConfigError(f"{where}: {exc}", field=where) from None
                members.append(Member(spec, backend, target_sink_id(group_id, spec.name)))
        except BaseException:
            for m in members:
                m.backend.close()
            raise
        return cls(group_id, members)

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> Backend:
        raise ConfigError("a group of targets is built from its targets, not from options",
                          field="targets")

    # -- targets ------------------------------------------------------------------------

    def member(self, name: str | None) -> Member:
        if name is None or name not in self.members:
            raise StateError(
                f"group {self.group_id!r}: no target named {name!r} (targets: "
                f"{', '.join(self.members)}); the state names a target this run does not "
                "have: run with the group's targets as they were", sink_id=self.group_id)
        return self.members[name]

    def _tag(self, name: str, committables: Iterable[Committable]) -> list[Committable]:
        return [c if c.target == name else dataclasses.replace(c, target=name)
                for c in committables]

    def _by_target(self, committables: Sequence[Committable]) -> dict[str, list[int]]:
        """Indices of ``committables`` per target, in the group's order of targets."""
        out: dict[str, list[int]] = {}
        for i, c in enumerate(committables):
            out.setdefault(self.member(c.target).name, []).append(i)
        return {n: out[n] for n in self.members if n in out}

    def _each(self, names: Sequence[str], action: Callable[[Member], _T]) -> list[_T]:
        """``action`` for the targets ``names``, at once: each waits on its own server."""
        members = [self.members[n] for n in names]
        if len(members) <= 1:
            return [action(m) for m in members]
        with ThreadPoolExecutor(len(members), thread_name_prefix="txsink-group") as pool:
            return list(pool.map(action, members))

    def meta_targets(self) -> dict[str, dict[str, Any]]:
        """What the state keeps of each target (secret-free)."""
        return {m.name: {"backend": m.spec.backend, "sink_id": m.sink_id,
                         "options": m.backend.safe_options(m.spec.options),
                         "destination": type(m.backend).destination(m.spec.options),
                         **({"epoch_column": m.spec.epoch_column}
                            if m.spec.epoch_column else {})}
                for m in self.members.values()}

    # -- configuration and lifecycle ----------------------------------------------------

    def check_settings(self, sink_id: str) -> None:
        for m in self.members.values():
            with _option_error(m):
                m.backend.check_settings(m.sink_id)

    def preflight(self, sink_id: str) -> None:
        for m in self.members.values():
            with _option_error(m):
                m.backend.preflight(m.sink_id)

    def claim_sink(self, sink_id: str, state_id: str, state_location: str) -> None:
        """Every target's claim, or none: each is checked (read-only) before any is made,
        so a target that belongs to another query leaves the others unclaimed."""
        self.check_claim(sink_id, state_id, state_location)
        # A backend that cannot check (no check_claim of its own) refuses only when it
        # claims: it claims first, so with one such target nothing else is bound yet.
        unchecked = [m for m in self.members.values()
                     if type(m.backend).check_claim is Backend.check_claim]
        for m in unchecked + [m for m in self.members.values() if m not in unchecked]:
            with _naming(m):
                m.backend.claim_sink(m.sink_id, state_id, state_location)

    def check_claim(self, sink_id: str, state_id: str, state_location: str) -> None:
        self._one_directory_each()
        for m in self.members.values():
            with _naming(m):
                m.backend.check_claim(m.sink_id, state_id, state_location)

    def _one_directory_each(self) -> None:
        """Two files targets in one directory, also through a link (the file's paths are
        compared when it is loaded): the second claim would be refused after the first
        was made. Said before any claim."""
        import os

        from txsink.files.backend import FilesBackend

        seen: dict[str, str] = {}
        for m in self.members.values():
            if isinstance(m.backend, FilesBackend):
                where = os.path.realpath(m.backend.base)
                if where in seen:
                    raise ConfigError(
                        f"targets[{m.name}].options.path: targets {seen[where]!r} and "
                        f"{m.name!r} both write to the directory {where}, which holds one "
                        "target's files; give each target its own 'path'",
                        field=f"targets[{m.name}].options.path", sink_id=m.sink_id)
                seen[where] = m.name

    def reset_sink(self, sink_id: str) -> list[str]:
        """Every target's reset, or none: a target that cannot delete what it wrote is
        named before anything is deleted."""
        for m in self.members.values():
            if type(m.backend).reset_sink is Backend.reset_sink:
                raise NotImplementedError(
                    f"target {m.name!r}: the {m.backend.name} backend cannot delete what a "
                    "sink wrote, so no target of the group is reset; to start over, keep the "
                    "old output and give the group a new sink_id")
        lines: list[str] = []
        for m in self.members.values():
            lines += [f"target {m.name}: {line}" for line in m.backend.reset_sink(m.sink_id)]
        return lines

    def participant_timeout_s(self) -> float | None:
        timeouts = [t for t in (m.backend.participant_timeout_s()
                                for m in self.members.values()) if t is not None]
        return min(timeouts) if timeouts else None

    def describe(self) -> str:
        return "group of " + ", ".join(f"{m.name}: {m.backend.describe()}"
                                       for m in self.members.values())

    def secret_values(self) -> list[str]:
        return [s for m in self.members.values() for s in m.backend.secret_values()]

    def safe_options(self, options: Mapping[str, str]) -> dict[str, str]:
        return {}

    def close(self) -> None:
        for m in self.members.values():
            m.backend.close()

    # -- executor side: tasks use write_group ---------------------------------------------

    def begin_transaction(self, ctx: TransactionContext) -> Transaction:
        raise PluginError("a group writes one participant per target: use write_group")

    def write(self, txn: Transaction, batch: pa.RecordBatch) -> None:
        raise PluginError("a group writes one participant per target: use write_group")

    def pre_commit(self, txn: Transaction) -> Committable:
        raise PluginError("a group writes one participant per target: use write_group")

    def discard(self, txn: Transaction) -> None:
        raise PluginError("a group writes one participant per target: use write_group")

    # -- driver side --------------------------------------------------------------------

    def commit(self, committable: Committable) -> CommitOutcome:
        return self.member(committable.target).backend.commit(committable)

    def commit_all(self, committables: Sequence[Committable]) -> list[CommitOutcome | Exception]:
        """Each target's participants in one call of its own backend, the targets at once."""
        groups = self._by_target(committables)
        results: list[CommitOutcome | Exception | None] = [None] * len(committables)

        def one(m: Member) -> None:
            idx = groups[m.name]
            try:
                answers = m.backend.commit_all([committables[i] for i in idx])
            except Exception as exc:
                answers = [exc] * len(idx)
            if len(answers) != len(idx):
                answers = [PluginError(
                    f"backend {m.backend.name!r} (target {m.name}): commit_all returned "
                    f"{len(answers)} result(s) for {len(idx)} participant(s)")] * len(idx)
            for i, a in zip(idx, answers, strict=True):
                results[i] = a

        self._each(list(groups), one)
        done: list[CommitOutcome | Exception] = []
        for r in results:
            assert r is not None
            done.append(r)
        return done

    def check_prepared(self, committables: Sequence[Committable]) -> None:
        for name, idx in self._by_target(committables).items():
            self.members[name].backend.check_prepared([committables[i] for i in idx])

    def first_commit_size(self, committables: Sequence[Committable]) -> int:
        """1, unless the first participant's target commits an epoch as one entry (a
        table format): then the whole epoch, so that target gets its participants in
        one call (the second call would hand it the rest again, as a second entry)."""
        if not committables:
            return 0
        m = self.member(committables[0].target)
        own = [c for c in committables if c.target == committables[0].target]
        return len(committables) if m.backend.first_commit_size(own) > 1 else 1

    def abort(self, committable: Committable) -> None:
        self.member(committable.target).backend.abort(committable)

    def salvage(self, committable: Committable, ctx: TransactionContext) -> Committable:
        """The participant's own target salvages it (NotImplementedError if it cannot)."""
        m = self.member(committable.target)
        return self._tag(m.name, [m.backend.salvage(committable, ctx)])[0]

    def epoch_committed(self, sink_id: str, epoch: int,
                        committables: Sequence[Committable]) -> None:
        groups = self._by_target(committables)

        def one(m: Member) -> None:
            m.backend.epoch_committed(m.sink_id, epoch,
                                      [committables[i] for i in groups.get(m.name, [])])

        self._each(list(self.members), one)

    def note_epoch_source(self, sink_id: str, epoch: int, source: str) -> None:
        self._each(list(self.members),
                   lambda m: m.backend.note_epoch_source(m.sink_id, epoch, source))

    def epoch_source(self, sink_id: str, epoch: int) -> str | None:
        """The first target's note that differs from the others, else the common one:
        one target that tells is enough (notes are written together)."""
        notes = [n for n in self._each(list(self.members),
                                       lambda m: m.backend.epoch_source(m.sink_id, epoch))
                 if n is not None]
        return next((n for n in notes if n != notes[0]), notes[0] if notes else None)

    def holds_epoch(self, sink_id: str, epoch: int) -> bool:
        """Any target shows ``epoch``: a target shows nothing without a decision."""
        return any(self.held_by(epoch).values())

    def held_by(self, epoch: int) -> dict[str, bool]:
        """Per target, whether its own markers show ``epoch`` committed."""
        return dict(zip(self.members, self._each(
            list(self.members), lambda m: m.backend.holds_epoch(m.sink_id, epoch)),
            strict=True))

    def highest_epoch(self, sink_id: str) -> int | None:
        """The lowest of the targets' highest epochs (None if one cannot tell)."""
        highs = list(self.highest_epochs().values())
        return None if any(h is None for h in highs) else min(h for h in highs if h is not None)

    def highest_epochs(self) -> dict[str, int | None]:
        """Per target, the highest epoch its own markers show committed."""
        return dict(zip(self.members, self._each(
            list(self.members), lambda m: m.backend.highest_epoch(m.sink_id)), strict=True))

    def is_committed(self, committable: Committable) -> bool | None:
        return self.member(committable.target).backend.is_committed(committable)

    def feeds(self, source: SourceTopics) -> bool:
        return any(m.backend.feeds(source) for m in self.members.values())

    def feeding(self, source: SourceTopics) -> list[str]:
        """The targets that write a topic the stream reads."""
        return [m.name for m in self.members.values() if m.backend.feeds(source)]

    def take_back(self, committable: Committable) -> bool:
        return self.member(committable.target).backend.take_back(committable)

    def list_prepared(self, sink_id: str) -> Iterable[Committable]:
        out: list[Committable] = []
        for m in self.members.values():
            out += self._tag(m.name, m.backend.list_prepared(m.sink_id))
        return out

    def open_transactions(self, sink_id: str) -> list[Mapping[str, Any]]:
        out: list[Mapping[str, Any]] = []
        for m in self.members.values():
            for row in m.backend.open_transactions(m.sink_id):
                out.append({**row, "target": m.name,
                            "summary": f"target {m.name}: {row.get('summary', '')}"})
        return out

    def abort_orphans(self, sink_id: str, protected: Collection[str],
                      up_to_epoch: int | None = None) -> list[Committable]:
        aborted: list[Committable] = []
        for m in self.members.values():
            aborted += self._tag(m.name, m.backend.abort_orphans(m.sink_id, protected,
                                                                 up_to_epoch))
        return aborted

    def decode_payload(self, version: int, payload: Mapping[str, Any]) -> Mapping[str, Any]:
        return payload


@contextlib.contextmanager
def _option_error(m: Member) -> Iterator[None]:
    """A target's refusal of its options (or its server), naming the target and the
    option's field."""
    try:
        yield
    except ConfigError as exc:
        where = f"targets[{m.name}].options" + (f".{exc.field}" if exc.field else "")
        # type(exc): a server that is down stays "server down" for a group too.
        raise type(exc)(f"target {m.name!r} ({m.backend.describe()}): {exc}",
                        field=where, sink_id=m.sink_id) from None


@contextlib.contextmanager
def _naming(m: Member) -> Iterator[None]:
    """A target's refusal (another owner, a server down) says which target it is, as
    its preflight's does; the type stays, so a server down is still "server down"."""
    try:
        yield
    except SinkOwnedError as exc:
        raise SinkOwnedError(f"target {m.name!r} ({m.backend.describe()}): {exc}",
                             field=_where(m, exc), sink_id=m.sink_id,
                             owner_state=exc.owner_state) from None
    except ConfigError as exc:
        raise type(exc)(f"target {m.name!r} ({m.backend.describe()}): {exc}",
                        field=_where(m, exc), sink_id=m.sink_id) from None


def _where(m: Member, exc: ConfigError) -> str:
    return f"targets[{m.name}].options" + (f".{exc.field}" if exc.field else "")


def route(group: TargetGroup, batch: pa.RecordBatch, epoch: int) -> list[tuple[Member,
                                                                            pa.RecordBatch]]:
    """The rows of ``batch`` each target gets.

    A batch without route columns goes whole to every target. A shaped batch (see
    :data:`~txsink.targets.ROUTE_PREFIX`) holds one struct column per target: a target
    gets the non-null values of its column, as a batch of the struct's fields. A
    target with an ``epoch_column`` gets that column too. A batch the group would
    misroute or corrupt (see :func:`~txsink.targets.check_columns`) is refused before
    any of its rows is written.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    twice = duplicate_column(batch.schema.names)
    if twice is not None:
        raise ConfigError(
            f"targets: the rows have the column {twice!r} twice (names are compared "
            "case-blind, as Spark does), which no target can hold faithfully; nothing was "
            "written. Give each column its own name (alias it in the select)",
            field="targets", sink_id=group.group_id)
    check_columns(group.group_id, [m.spec for m in group.members.values()],
                  arrow_columns(batch.schema))
    routed = any(n.startswith(ROUTE_PREFIX) for n in batch.schema.names)
    out: list[tuple[Member, pa.RecordBatch]] = []
    for m in group.members.values():
        sub = batch
        if routed:
            column_name = ROUTE_PREFIX + m.name
            if column_name not in batch.schema.names:
                raise StateError(f"group {group.group_id!r}: the rows carry no column "
                                 f"{column_name!r} for target {m.name!r}: shape the frame with "
                                 "the group's own targets", sink_id=group.group_id)
            column = batch.column(column_name)
            if column.null_count:
                column = pc.filter(column, pc.is_valid(column))
            if not isinstance(column, pa.StructArray):
                raise StateError(f"group {group.group_id!r}: column {column_name!r} is a "
                                 f"{column.type}, not a struct", sink_id=group.group_id)
            sub = pa.RecordBatch.from_struct_array(column)
        out.append((m, with_epoch(m.spec, sub, epoch)))
    return out


def with_epoch(spec: TargetSpec, batch: pa.RecordBatch, epoch: int) -> pa.RecordBatch:
    """``batch`` with the target's ``epoch_column`` added, if it has one (refused if
    the rows already carry a column of that name)."""
    import pyarrow as pa

    if not spec.epoch_column:
        return batch
    check_columns("", [spec], {n: [] for n in batch.schema.names}, only=spec.name)
    return batch.append_column(spec.epoch_column,
                               pa.repeat(pa.scalar(epoch, pa.int64()), batch.num_rows))


def arrow_columns(schema: pa.Schema) -> dict[str, list[str]]:
    """Top-level column names of ``schema`` with their struct fields (see
    :func:`~txsink.targets.check_columns`)."""
    import pyarrow as pa

    return {f.name: ([c.name for c in f.type] if pa.types.is_struct(f.type) else [])
            for f in schema}


def write_group(group: TargetGroup, epoch: int, partition: int, attempt: int,
                batches: Iterable[pa.RecordBatch], *,
                before_prepare: Callable[[], None] | None = None) -> list[Committable]:
    """One task: a participant in every target, prepared; their committables, tagged.

    Every target gets a participant even when none of the task's rows go to it, so
    every target records every epoch (what the consistent cut reads). If anything
    fails, what was opened is discarded and what was prepared is aborted (no
    decision can name it: the task did not report it), and the error is raised.
    """
    opened: list[tuple[Member, Transaction]] = []
    prepared: list[Committable] = []
    try:
        for m in group.members.values():
            ctx = TransactionContext(m.sink_id, epoch, partition, attempt)
            opened.append((m, m.backend.begin_transaction(ctx)))
        txns = {m.name: txn for m, txn in opened}
        for batch in batches:
            if not batch.num_rows:
                continue
            for m, sub in route(group, batch, epoch):
                if sub.num_rows:
                    m.backend.write(txns[m.name], sub)
        if before_prepare is not None:
            before_prepare()
        while opened:
            m, txn = opened[0]
            c = m.backend.pre_commit(txn)
            opened.pop(0)
            prepared += group._tag(m.name, [c])
    except BaseException:
        for m, txn in opened:
            try:
                m.backend.discard(txn)
            except Exception:
                log.exception("discarding %s after a failed write also failed", txn.describe())
        for c in prepared:
            try:
                group.member(c.target).backend.abort(c)
            except Exception:
                log.exception("aborting %s after a failed write failed (the orphan scan "
                              "aborts it)", c.describe())
        raise
    for c in prepared:
        log.debug("prepared %s rows=%d", c.describe(), c.rows)
    return prepared
