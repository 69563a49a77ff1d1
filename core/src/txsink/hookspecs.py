"""Every hook txsink calls, grouped by lifecycle phase.

Marker name, plugin-manager name and entry-point group are all ``txsink``. Hooks run
on the driver only; the per-row path is plain classes (:class:`~txsink.backend.Backend`),
never a hook call. Implementations may accept fewer arguments than a spec, so
arguments can be added later but never removed or renamed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from txsink.model import Committable, RecoveryReport
    from txsink.registry import BackendRegistry, SourceRegistry, StateStoreRegistry

PROJECT = "txsink"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# -- registration phase: called once when the plugin manager is built ----------------


@hookspec
def txsink_register_backends(registry: BackendRegistry) -> None:
    """Register backend classes with ``registry.add(BackendClass)``.

    Two plugins adding the same backend name is an error naming both distributions.

    :param registry: the registry to add backends to.

    .. versionadded:: 0.1
    """


@hookspec
def txsink_register_state_stores(registry: StateStoreRegistry) -> None:
    """Register pending-transaction state stores by URL scheme.

    :param registry: call ``registry.add(scheme, factory)``; ``factory(location)``
        returns a :class:`~txsink.state.StateStore`.

    .. versionadded:: 0.1
    """


@hookspec
def txsink_register_sources(registry: SourceRegistry) -> None:
    """Register Spark stream sources the plugin ships, by format name.

    A pipeline file names one in ``source.format``; ``txsink run`` and ``validate`` then
    call its ``register(spark)`` in their session before they build the source. Core
    imports no backend package: this is how it finds the Kafka backend's source
    (``txsink-kafka``). Import Spark and the source's module inside ``register``: every
    txsink process loads every plugin, Spark or not.

    :param registry: call ``registry.add(format_name, register)``; ``register(spark)``
        makes ``spark.readStream.format(format_name)`` work in that session (for a Python
        data source: ``spark.dataSource.register(SourceClass)``).

    .. versionadded:: 0.3
    """


# -- lifecycle phase: called by the coordinator on the driver -------------------------
# Observers (metrics, audit) implement these. An exception in an observer is logged
# and does not change the outcome of the epoch: a decided epoch is committed anyway.


@hookspec
def txsink_coordinator_started(
    sink_id: str, backend: str, participant_timeout_s: float | None
) -> None:
    """A coordinator took the lease of ``sink_id``'s state and is about to recover.

    :param sink_id: the sink.
    :param backend: the backend's name.
    :param participant_timeout_s: how long the target keeps a prepared participant
        before aborting it on its own (Kafka's ``transaction.timeout.ms``), or ``None``
        when it never does. Monitors compare the oldest prepared participant to it.

    .. versionadded:: 0.2
    """


@hookspec
def txsink_epoch_prepared(sink_id: str, epoch: int, committables: Sequence[Committable]) -> None:
    """All writer tasks of ``epoch`` prepared; the decision has not been written yet.

    :param sink_id: the sink.
    :param epoch: the epoch (Spark batch id).
    :param committables: one per participant, secret-free.

    .. versionadded:: 0.1
    """


@hookspec
def txsink_epoch_decided(sink_id: str, epoch: int, committables: Sequence[Committable]) -> None:
    """The commit decision for ``epoch`` is durable: the epoch will be committed.

    :param sink_id: the sink.
    :param epoch: the epoch.
    :param committables: the participants that will be committed.

    .. versionadded:: 0.1
    """


@hookspec
def txsink_epoch_committed(
    sink_id: str, epoch: int, committables: Sequence[Committable], duration_s: float
) -> None:
    """Every participant of ``epoch`` is committed and the epoch is marked COMMITTED.

    :param sink_id: the sink.
    :param epoch: the epoch.
    :param committables: the committed participants.
    :param duration_s: seconds from the decision to the COMMITTED mark.

    .. versionadded:: 0.1
    """


@hookspec
def txsink_epoch_aborted(
    sink_id: str, epoch: int, committables: Sequence[Committable], reason: str
) -> None:
    """Participants of ``epoch`` were rolled back.

    :param sink_id: the sink.
    :param epoch: the epoch.
    :param committables: the aborted participants.
    :param reason: ``"aborted"`` (Spark aborted the batch), ``"replayed"`` (the epoch
        was already committed), ``"orphan"`` (no decided epoch held them).

    .. versionadded:: 0.1
    """


@hookspec
def txsink_participant_salvaged(
    sink_id: str, epoch: int, original: Committable, replacement: Committable
) -> None:
    """The target aborted a decided participant on its own (Kafka's transaction timeout)
    and its data was prepared again as ``replacement``, now recorded in the decision in
    its place; the replacement is committed next.

    :param sink_id: the sink.
    :param epoch: the decided epoch.
    :param original: the participant the target aborted.
    :param replacement: the participant that took its place, with the same rows.

    .. versionadded:: 0.2
    """


@hookspec
def txsink_recovered(sink_id: str, report: RecoveryReport) -> None:
    """Recovery ran at start: decided epochs re-committed, orphans aborted.

    :param sink_id: the sink.
    :param report: what recovery did.

    .. versionadded:: 0.1
    """
