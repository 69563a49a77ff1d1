"""The backend contract: what a plugin implements so txsink can drive its system's 2PC.

Executor side: :meth:`Backend.begin_transaction`, :meth:`Backend.write`,
:meth:`Backend.pre_commit` (and :meth:`Backend.discard` when a task fails before
preparing). Driver side: :meth:`Backend.commit`, :meth:`Backend.abort` and orphan
handling. Backends never see Spark; the core never imports a backend.
"""

from __future__ import annotations

import abc
import enum
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from txsink.errors import ConfigError
from txsink.model import Committable, DeliveryGuarantee, TransactionContext

if TYPE_CHECKING:
    import pyarrow as pa

    from txsink.realtime.source import SourceTopics

log = logging.getLogger(__name__)


class Capability(str, enum.Enum):
    """What a backend promises; the coordinator and the conformance kit read these."""

    #: ``commit``/``abort`` work from a process other than the one that wrote.
    COMMIT_FROM_ANY_PROCESS = "commit-from-any-process"
    #: ``list_prepared`` can enumerate prepared participants of a sink id.
    LIST_PREPARED = "list-prepared"
    #: After a crash the system itself can tell committed from rolled back.
    COMMIT_MARKER = "commit-marker"
    #: Prepared participants survive a restart of the external system.
    SURVIVES_RESTART = "survives-restart"
    #: A decided participant that the system aborted on its own (a timeout) can be
    #: prepared again from the data the system still keeps (:meth:`Backend.salvage`).
    SALVAGE = "salvage"


class CommitOutcome(str, enum.Enum):
    COMMITTED = "committed"
    #: The participant had already been committed (a retry, or recovery after a crash).
    ALREADY_COMMITTED = "already-committed"


class Transaction:
    """An open participant on the executor. Backends subclass it to hold their handles."""

    def __init__(self, ctx: TransactionContext) -> None:
        self.ctx = ctx
        self.rows = 0

    def describe(self) -> str:
        return f"{self.ctx.describe()} participant={self.ctx.participant}"


class Backend(abc.ABC):
    """One configured output of one kind (files, Kafka, PostgreSQL, S3, ...).

    Instances are built from string options by :meth:`from_options`, which must
    validate everything it can without I/O; :meth:`preflight` does the I/O checks
    (server reachable, table present) on the driver before any task writes.
    Instances are pickled to executors, so keep clients out of ``__init__``: open
    them lazily and drop them in ``__getstate__`` if needed.
    """

    #: The name users select the backend by (``backend: files``).
    name: ClassVar[str]
    capabilities: ClassVar[frozenset[Capability]] = frozenset()
    #: Option keys whose values are secrets: never logged, stored or echoed.
    secret_options: ClassVar[frozenset[str]] = frozenset()
    #: Options that tune how the backend writes, not where the output goes (timeouts,
    #: batch sizes, ...): the default :meth:`destination` leaves them out, so changing
    #: them under a kept state is not taken for a move.
    tuning_options: ClassVar[frozenset[str]] = frozenset()
    #: Version of this backend's committable payload; bump it when the layout changes.
    payload_version: ClassVar[int] = 1
    #: The option (seconds) bounding how long the backend waits for a server that is
    #: down or restarting. ``txsink run`` sets it to its ``--connect-retry`` for the
    #: check before Spark starts, so a server that is down is one short line there,
    #: while the running query keeps the option's own, longer, bound.
    connect_retry_option: ClassVar[str | None] = None
    #: Delivery guarantees this backend offers. A backend adds ``at_least_once`` and
    #: ``none`` once its :meth:`finish_in_task` is right for them (the default, prepare
    #: then commit in the task, is right for every backend whose commit may run in the
    #: writing process).
    guarantees: ClassVar[frozenset[DeliveryGuarantee]] = frozenset(
        {DeliveryGuarantee.EXACTLY_ONCE})

    #: Spark's own Parquet writer may write this backend's files (the native data path:
    #: ``TargetSet.write_stream`` / ``write``, grouped epochs and pipeline files): the
    #: backend then implements :meth:`native_staging` and :meth:`committable_for_directory`.
    native_parquet: ClassVar[bool] = False

    @classmethod
    def native_parquet_for(cls, options: Mapping[str, str]) -> bool:
        """Whether the native data path writes a target with these ``options`` (a
        backend may take it for some formats only). Default: :attr:`native_parquet`."""
        return cls.native_parquet

    def native_staging(self, ctx: TransactionContext) -> tuple[str, str]:
        """Where Spark's Parquet writer puts participant ``ctx``'s files: a fresh
        directory no reader lists, as (absolute path or URI for Spark, directory name);
        the name is what :meth:`committable_for_directory` is given afterwards."""
        raise NotImplementedError(f"backend {self.name!r} has no native data path")

    def native_write_options(self) -> dict[str, str]:
        """Options for Spark's Parquet writer (e.g. the compression) in the native path."""
        return {}

    def committable_for_directory(self, ctx: TransactionContext, dirname: str) -> Committable:
        """The committable of a participant whose Parquet files Spark's own writer put
        into the directory :meth:`native_staging` named (the native data path). It
        makes them durable and records what a commit checks (names, sizes)."""
        raise NotImplementedError(f"backend {self.name!r} has no native data path")

    def feeds(self, source: SourceTopics) -> bool:
        """Whether this target writes a topic the stream reads (``source``: the topics
        of the query's Kafka source): every record written would be read again and
        written again, without end. Default: False (a target that writes no topic)."""
        return False

    def native_frame(self, df: Any) -> Any:
        """The Spark frame ``df`` as Spark's Parquet writer should write it for this target
        on the native path (Iceberg: each column's field id as column metadata, which
        Spark writes into its files). Default: as it is."""
        return df

    def committables_for_directory(self, ctx: TransactionContext,
                                   dirname: str) -> list[Committable]:
        """The participants Spark's own writer prepared for ``ctx`` (the native data path):
        what :meth:`committable_for_directory` returns, for a backend whose every file
        Spark wrote is a participant of its own (S3: one pending multipart upload per
        task, named like the task's participant of txsink's own writer). Empty when the
        tasks wrote no rows. Default: ``[committable_for_directory(ctx, dirname)]``."""
        return [self.committable_for_directory(ctx, dirname)]

    def native_session_conf(self, spark: Any) -> dict[str, str]:
        """Spark SQL settings the native data path sets on the session ``spark`` around
        this target's write, and restores afterwards (S3: the commit protocol that leaves
        Spark's uploads pending). Checks the session first and raises
        :class:`~txsink.errors.ConfigError`, before anything is written, when it cannot
        write the target (a jar or a filesystem missing). Default: none."""
        return {}

    def discard_staging(self, ctx: TransactionContext, dirname: str, *,  # noqa: B027
                        still_ours: Callable[[], bool] | None = None) -> None:
        """Delete what Spark's writer staged for participant ``ctx`` in ``dirname`` before
        it became a participant (the write failed, or the gate refused what it found):
        no committable names it yet. ``still_ours``: whether the write's epoch is still
        reserved by its run; a backend that cannot tell its write's staging from another
        run's of the same epoch asks it after finding what to delete, and deletes only
        its own if not. Default: nothing to delete."""

    @classmethod
    def check_guarantee(cls, guarantee: DeliveryGuarantee) -> None:
        """Raise :class:`~txsink.errors.ConfigError` if ``guarantee`` is not offered."""
        if guarantee not in cls.guarantees:
            offered = ", ".join(sorted(g.value for g in cls.guarantees))
            raise ConfigError(
                f"backend {cls.name!r} does not offer guarantee {guarantee.value!r} (it "
                f"offers: {offered})", field="guarantee")

    # -- configuration ------------------------------------------------------------------

    @classmethod
    @abc.abstractmethod
    def from_options(cls, options: Mapping[str, str]) -> Backend:
        """Parse and validate options (no I/O). Raise :class:`~txsink.errors.ConfigError`."""

    @classmethod
    def trigger_options(cls, interval_ms: int) -> Mapping[str, str]:
        """Options this backend derives from the query's trigger interval.

        Pipeline files know the trigger; a backend whose transactions time out
        (Kafka's ``transaction.timeout.ms``) returns the option that lets
        :meth:`from_options` check the timeout against it before Spark starts.
        Options the user set win over these.
        """
        return {}

    @classmethod
    def target_options(cls) -> Mapping[str, str]:
        """Options this backend wants when it is one target of a group of targets.

        A group's readers stop at the consistent cut, so a backend whose records can
        carry the epoch (Kafka's ``txsink-epoch`` header) turns that on here. Options
        the user set win over these. Default: none.
        """
        return {}

    def check_settings(self, sink_id: str) -> None:  # noqa: B027 - optional hook
        """Checks of the options that need no server but more than parsing them: a
        client library's own check of the settings it is handed (librdkafka's of
        ``kafka.*``). ``txsink validate`` runs them; call them from :meth:`preflight`
        too, so ``validate`` and ``run`` refuse the same options with the same line."""

    def preflight(self, sink_id: str) -> None:  # noqa: B027 - optional hook
        """Driver-side checks that need I/O, run before any data is written."""

    def claim_sink(self, sink_id: str, state_id: str, state_location: str) -> None:  # noqa: B027
        """Bind ``sink_id`` to one pending-transaction state, where the system allows it.

        Called by the coordinator on the driver before recovery. Two queries sharing
        a sink id would abort each other's prepared participants as orphans, so a
        backend that can record an owner raises :class:`~txsink.errors.ConfigError`
        when ``sink_id`` is already bound to another ``state_id``. Must be idempotent.
        """

    def check_claim(self, sink_id: str, state_id: str, state_location: str) -> None:  # noqa: B027
        """Raise exactly what :meth:`claim_sink` would raise for this claim, recording
        nothing (read-only).

        A group of targets asks every target first and claims only when all would
        accept: a claim cannot be taken back, so a target refusing after others had
        claimed would leave them bound to a state that was never used. A new state is
        checked before it is recorded, so a refused first run keeps no destination.
        The default does nothing (a backend that cannot tell); its refusal then comes
        from :meth:`claim_sink` (a group claims such targets first).
        """

    def reset_sink(self, sink_id: str) -> list[str]:
        """Delete everything ``sink_id`` wrote and its owner record (``txsink reset``).

        Lets a user start a pipeline over after deleting its checkpoint. Returns one
        secret-free line per thing removed. Backends whose output cannot be taken back
        (records in a shared Kafka topic) keep the default, which refuses.
        """
        raise NotImplementedError(
            f"the {self.name} backend cannot delete what a sink wrote; to start over, keep "
            "the old output and give the pipeline a new sink_id")

    def participant_timeout_s(self) -> float | None:
        """How long the target keeps a prepared participant before aborting it itself.

        ``None`` (the default) when prepared participants wait forever (PostgreSQL
        prepared transactions, S3 uploads without a lifecycle rule). Kafka returns its
        ``transaction.timeout.ms``: a decided epoch not committed within it is lost,
        so metrics and ``txsink status`` show the oldest prepared participant against it.
        """
        return None

    def describe(self) -> str:
        """A one-line, secret-free description for logs and ``txsink status``."""
        return self.name

    def secret_values(self) -> list[str]:
        """Secret values this instance holds, so the core can prove none leaks."""
        return []

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release clients. Called on the driver and after each task."""

    # -- executor side ------------------------------------------------------------------

    @abc.abstractmethod
    def begin_transaction(self, ctx: TransactionContext) -> Transaction:
        """Open the participant identified by ``ctx``."""

    @abc.abstractmethod
    def write(self, txn: Transaction, batch: pa.RecordBatch) -> None:
        """Append one Arrow record batch. Stream it out: never hold a whole partition."""

    @abc.abstractmethod
    def pre_commit(self, txn: Transaction) -> Committable:
        """Make the data durable but invisible and return its committable."""

    @abc.abstractmethod
    def discard(self, txn: Transaction) -> None:
        """Throw away a transaction that was never prepared (the task failed)."""

    def finish_in_task(self, txn: Transaction, guarantee: DeliveryGuarantee) -> Committable:
        """End ``txn`` with its data visible, in the task, for the non-transactional
        guarantees (``at_least_once``, ``none``); return what was written, for the record.

        The default prepares and commits right away. Backends override it with their
        cheaper path (an ordinary commit, a rename, a completed upload), and may skip
        durability waits for ``none``.
        """
        committable = self.pre_commit(txn)
        self.commit(committable)
        return committable

    # -- driver side (any process) ------------------------------------------------------

    @abc.abstractmethod
    def commit(self, committable: Committable) -> CommitOutcome:
        """Make a prepared participant visible. Must be idempotent.

        Raise :class:`~txsink.errors.RetriableCommitError` when a later try may work,
        :class:`~txsink.errors.ParticipantLostError` when the participant is gone and
        the system cannot show it was committed.
        """

    def commit_all(
        self, committables: Sequence[Committable]
    ) -> list[CommitOutcome | Exception]:
        """Commit several prepared participants of one decided epoch.

        Returns one result per committable, in order: its :class:`CommitOutcome`, or
        the exception its commit raised (with :meth:`commit`'s meaning; the coordinator
        retries the retriable ones). The coordinator hands every participant of an
        epoch it has left to commit to one call, so a backend can share what separate
        commits would repeat: directory fsyncs, lookups, round trips run in parallel.
        Each participant must still be committed idempotently on its own. Default:
        :meth:`commit` one by one.
        """
        results: list[CommitOutcome | Exception] = []
        for c in committables:
            try:
                results.append(self.commit(c))
            except Exception as exc:  # handed to the coordinator, which retries
                results.append(exc)
        return results

    def first_commit_size(self, committables: Sequence[Committable]) -> int:
        """How many of a decided epoch's participants (from the front) the coordinator
        commits in its first :meth:`commit_all` call; the rest follow in a second call.

        Default 1: the first participant alone, so a crash can leave (and the fault
        points can test) an epoch committed in part. A backend whose commit of an epoch
        is one entry in the target (a table format's log entry or snapshot) returns
        ``len(committables)``, so the epoch is committed in one call and one entry.
        """
        return min(1, len(committables))

    def salvage(self, committable: Committable, ctx: TransactionContext) -> Committable:
        """Prepare again, as the new participant ``ctx``, exactly the data of a decided
        participant that the target aborted on its own; return the new committable.

        Called on the driver after :meth:`commit` raised
        :class:`~txsink.errors.ParticipantLostError` for ``committable`` (Kafka aborts a
        prepared transaction after ``transaction.timeout.ms``, but keeps its records in
        the log until retention removes them). The replacement is prepared, not
        committed: the coordinator records it in the decision in place of
        ``committable`` first, then commits it, so a crash at any point leaves either
        the original (salvaged again at the next start, the unrecorded replacement
        aborted as an orphan) or the recorded replacement. ``ctx`` has the epoch and
        partition of ``committable`` and a fresh attempt number. Must take nothing but
        the original's data, and must refuse if the original was committed after all.
        Raise :class:`~txsink.errors.ParticipantLostError`, saying why, when the data is
        gone. Default: the loss stands (:class:`NotImplementedError`).
        """
        raise NotImplementedError(f"backend {self.name!r} cannot salvage participants")

    @abc.abstractmethod
    def abort(self, committable: Committable) -> None:
        """Roll back a prepared participant. Aborting a missing participant succeeds."""

    def check_prepared(self, committables: Sequence[Committable]) -> None:  # noqa: B027
        """Before an epoch is decided: raise :class:`~txsink.errors.FatalCommitError` when
        the target could never commit these participants (a table whose schema the files
        do not match). Refused here, nothing of the epoch becomes visible in any target
        of a group; refused at commit, the others would hold it and this one never."""

    def epoch_committed(  # noqa: B027 - optional hook
        self, sink_id: str, epoch: int, committables: Sequence[Committable]
    ) -> None:
        """Every participant of ``epoch`` is committed: publish a per-epoch marker if any.

        Called on the driver before the epoch is marked COMMITTED, so a crash in
        between makes recovery call it again: it must be idempotent. If it raises,
        the epoch stays DECIDED and the next start retries it. Default: nothing.
        """

    def holds_epoch(self, sink_id: str, epoch: int) -> bool:
        """Whether the target itself shows ``epoch`` of ``sink_id`` as committed.

        Asked on the driver before an epoch the pending-transaction state does not
        know is decided: after the state (or the whole checkpoint) was restored from
        an older backup, Spark replays epochs the target already holds, and only the
        target can tell. Answer from the system's own commit markers (marker rows,
        manifests, final files); return False when the system cannot tell. Must not
        count prepared, uncommitted participants. Default: False.
        """
        return False

    def note_epoch_source(self, sink_id: str, epoch: int,  # noqa: B027 - optional hook
                          source: str) -> None:
        """Keep ``source`` beside ``epoch``'s data, for :meth:`epoch_source`.

        ``source`` is a digest of the source offsets of the micro-batch ``epoch`` holds.
        Called on the driver before the epoch is decided, and again if it is decided
        again; the last call wins. A state kept inside Spark's checkpoint goes back with
        it when the checkpoint is restored from an older copy, and then only the target
        can tell whether a batch Spark runs under a number it holds is a replay of it or
        other records planned anew. Default: nothing (the target cannot tell).
        """

    def epoch_source(self, sink_id: str, epoch: int) -> str | None:
        """What :meth:`note_epoch_source` kept for ``epoch``; None when nothing (or the
        system keeps nothing). Default: None."""
        return None

    def highest_epoch(self, sink_id: str) -> int | None:
        """The highest epoch of ``sink_id`` the target's own markers show committed.

        What the consistent cut of a group of targets is made of (``txsink cut``): -1
        when the target shows no epoch, None when the system cannot tell (the cut then
        asks :meth:`holds_epoch` for the epochs the state knows). Like
        :meth:`holds_epoch` it must not count prepared, uncommitted participants; an
        epoch with only some participants committed may count (the cut is also bounded
        by the epochs the state has not finished). Default: None.
        """
        return None

    def is_committed(self, committable: Committable) -> bool | None:
        """Whether the target shows ``committable`` committed, without changing anything.

        Asked by ``txsink resolve --abort --force`` before it gives up a decided epoch:
        a participant already committed stays visible whatever txsink does, so the
        resolve keeps it (and a replay of the epoch does not write its partition again)
        and says so. None when the system cannot tell (a participant committed in part
        answers None too). Default: None.
        """
        return None

    def take_back(self, committable: Committable) -> bool:
        """Roll back a decided participant that ``is_committed`` did not show committed,
        for ``txsink resolve --abort --force``; True if nothing of it stays visible.

        A commit stopped part way may have made some of a participant visible (a native
        participant's files, published one by one): a backend that can undo that does
        it here. Never called for a participant an epoch still commits. Default:
        :meth:`abort`, then whether the target now shows nothing of it."""
        self.abort(committable)
        return self.is_committed(committable) is False

    def list_prepared(self, sink_id: str) -> Iterable[Committable]:
        """Every prepared (not committed, not aborted) participant of ``sink_id``.

        Backends that cannot list declare no :attr:`Capability.LIST_PREPARED` and
        override :meth:`abort_orphans` instead.
        """
        raise NotImplementedError(f"backend {self.name!r} cannot list prepared participants")

    def open_transactions(self, sink_id: str) -> list[Mapping[str, Any]]:
        """The sink's transactions open in the external system now, for ``txsink status``.

        Where the system can say more than :meth:`list_prepared` (how old each is
        against its timeout, whether it holds readers back), each entry has at least
        ``name`` (the system's own name for it) and ``summary`` (one secret-free line),
        plus JSON-serializable details. Default: nothing to report.
        """
        return []

    def abort_orphans(
        self,
        sink_id: str,
        protected: Collection[str],
        up_to_epoch: int | None = None,
    ) -> list[Committable]:
        """Abort prepared participants of ``sink_id`` that no decided epoch holds.

        ``protected`` holds participant names of decided epochs: never abort those.
        Only participants of epochs ``<= up_to_epoch`` are touched when it is given,
        so writers of a later epoch that are still running are left alone.
        """
        aborted: list[Committable] = []
        for c in self.list_prepared(sink_id):
            # The epoch bound first: asking ``protected`` about a participant of a later
            # epoch (a replay being written) may refuse, and it is not this scan's.
            if up_to_epoch is not None and c.epoch > up_to_epoch:
                continue
            if c.participant in protected:
                continue
            self.abort(c)
            aborted.append(c)
        return aborted

    # -- committable payloads -----------------------------------------------------------

    def decode_payload(self, version: int, payload: Mapping[str, Any]) -> Mapping[str, Any]:
        """Upgrade a payload written by an older release; reject unknown versions."""
        if version != self.payload_version:
            from txsink.errors import StateError

            raise StateError(
                f"backend {self.name!r} cannot read committable payload version {version} "
                f"(this release writes version {self.payload_version})"
            )
        return payload

    def safe_options(self, options: Mapping[str, str]) -> dict[str, str]:
        """``options`` without secret ones, fit to be written into the state."""
        return {k: v for k, v in options.items() if k not in self.secret_options}

    @classmethod
    def destination(cls, options: Mapping[str, str]) -> dict[str, str]:
        """The secret-free options that say where the output goes (no I/O).

        A target's destination is part of its identity: the state records it, and a run,
        reset or cut whose target has another destination under the same name is refused
        (the epochs the state decided sit in the old place). Called with the options as
        given and with the ones the state recorded (:meth:`safe_options`), so the result
        must be the same for both. The default is conservative: every option except
        secrets and :attr:`tuning_options`, so a backend that says nothing is refused on
        any other change rather than moved silently; backends override it with the few
        options that name the place.
        """
        return {k: str(v) for k, v in options.items()
                if k not in cls.secret_options and k not in cls.tuning_options}
