"""The txsink exception hierarchy.

Every error txsink raises on purpose is a :class:`TxsinkError`, so callers (and the
CLI) can tell a reported condition from a bug. Errors carry structured attributes
(sink id, epoch, participant) and never a secret: messages are built from
committables and option *names*, which are secret-free by construction.
"""

from __future__ import annotations


class TxsinkError(Exception):
    """Root of every error txsink raises deliberately."""

    def __init__(
        self,
        message: str,
        *,
        sink_id: str | None = None,
        epoch: int | None = None,
        participant: str | None = None,
    ) -> None:
        super().__init__(message)
        self.sink_id = sink_id
        self.epoch = epoch
        self.participant = participant


class ConfigError(TxsinkError):
    """Bad configuration, found before any data is written.

    ``field`` names the offending option or config path (e.g. ``sink.options.path``).
    """

    def __init__(self, message: str, *, field: str | None = None, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.field = field


class ServerUnavailableError(ConfigError):
    """A server the sink needs did not answer within the bound the message states: it is
    down or unreachable, not misconfigured (the CLI says "server down"). A ConfigError
    still, so that every check before Spark starts stops on it the same way."""


class BackendNotFoundError(ConfigError):
    """No installed plugin provides the requested backend (or state store)."""


class SinkOwnedError(ConfigError):
    """The sink id is bound to another query's pending-transaction state.

    ``owner_state`` is that state's location as the target system recorded it, so
    the CLI can tell a running second query from a state deleted with its checkpoint.
    """

    def __init__(self, message: str, *, owner_state: str | None = None, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.owner_state = owner_state


class PluginError(TxsinkError):
    """A plugin is broken: it failed to load, or clashes with another plugin."""


class CommitError(TxsinkError):
    """A participant of a decided epoch could not be committed.

    The epoch stays DECIDED in the pending-transaction state, so a restart (or
    ``txsink resolve``) will commit it again; nothing is dropped.
    """


class RetriableCommitError(CommitError):
    """The commit may succeed later (server unreachable, coordinator moving)."""


class FatalCommitError(CommitError):
    """The commit cannot succeed; an operator must look at the participant."""


class ParticipantLostError(FatalCommitError):
    """A decided participant is gone and the backend cannot prove it was committed."""


class FencedError(TxsinkError):
    """Another coordinator took over this sink id; this one must stop writing."""


class StateError(TxsinkError):
    """The pending-transaction state is unreadable or inconsistent."""


class CheckpointChangedError(StateError):
    """The engine's checkpoint is not the one this state was written with.

    A deleted or replaced Spark checkpoint numbers batches from 0 again; taken for
    replays, its new batches would be dropped. Nothing of the refused batch is written.
    """
