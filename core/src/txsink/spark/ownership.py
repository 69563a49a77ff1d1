"""Before Spark starts: the targets' preflight, and the sink-ownership check.

Both run in this process so that a refusal is one line with its way out, not a
traceback from a Python worker; the same checks run again inside Spark. A refused
first run leaves no state behind, so the way out the message gives still works.
The lease a run takes is given up here too when the run ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from txsink.backend import Backend
from txsink.config import PipelineConfig
from txsink.errors import ConfigError, SinkOwnedError, TxsinkError
from txsink.plugins import Plugins
from txsink.spark._proc import owner_alive, owner_words
from txsink.spark.console import CLIENT_LOGGERS
from txsink.state import Lease, StateStore, new_owner_token

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def preflight(cfg: PipelineConfig, plugins: Plugins, connect_retry_s: float) -> str:
    """The backend's checks before Spark starts; returns its description.

    A server that is down is retried for ``connect_retry_s`` (``--connect-retry``), not
    for the running query's own, longer, bound; the retries are not printed one by
    one: the run stops with one line that says what was tried and for how long.
    """
    _refuse_changed_targets(cfg, plugins)
    retry_options: dict[str, dict[str, str]] = {}
    retry_keys = set()
    for name, backend_name in ([(t.name, t.backend) for t in cfg.sink.targets]
                               or [(cfg.sink.sink_id, cfg.sink.backend)]):
        option = plugins.backends.get(backend_name).value.connect_retry_option
        if option is not None:
            retry_options[name] = {option: f"{connect_retry_s:g}"}
            retry_keys.add(option)
    backend = cfg.create_backend(plugins, retry_options)
    quiet = _QuietRetries()
    handlers = logging.getLogger().handlers
    for handler in handlers:
        handler.addFilter(quiet)
    try:
        backend.preflight(cfg.sink.sink_id)
        return backend.describe()
    except ConfigError as exc:
        tried = (f". Before Spark starts a run waits {connect_retry_s:g}s for a server that "
                 "is down (`txsink run --connect-retry SECONDS`; the backend's option bounds "
                 "the wait of a running query)"
                 if quiet.retries or any(k in str(exc) for k in retry_keys) else "")
        raise cfg.sink_error(exc, tried) from None
    finally:
        for handler in handlers:
            handler.removeFilter(quiet)
        backend.close()


def _refuse_changed_targets(cfg: PipelineConfig, plugins: Plugins) -> None:
    """Targets other than the ones the state recorded are refused before the backends'
    preflight claims a new target's output: the refusal's way out (a new sink_id)
    must still work after it. A single sink moved under its kept state (another path,
    table, topic) is refused here too, for the same reason."""
    from txsink.targets import changed_targets, moved_target

    root = cfg.checkpoint.rstrip("/") + "/txsink"
    local = root.removeprefix("file://")
    if "://" not in local and not Path(local, "meta.json").is_file():
        return
    meta = plugins.state_store(root).read_meta()
    if meta is None or meta.sink_id != cfg.sink.sink_id:
        return
    if not cfg.sink.targets:
        if meta.backend != cfg.sink.backend or not meta.options or not cfg.sink.options:
            return  # another backend: the coordinator refuses it
        cls = plugins.backend_class(cfg.sink.backend)
        moved = moved_target({"backend": meta.backend, "options": meta.options},
                             cfg.sink.sink_id, cls.destination(cfg.sink.options),
                             cfg.sink.sink_id, backend=cls, field="sink.options")
        if moved is not None:
            raise moved
        return
    refusal = changed_targets(meta.targets, cfg.sink.targets, cfg.sink.sink_id)
    if refusal is not None:
        refusal.field = "sink.targets"
        raise refusal


class _QuietRetries(logging.Filter):
    """Counts, and keeps off the terminal, the retry lines of a server that is down
    (and its client library's own reconnect noise) while the run checks it."""

    def __init__(self) -> None:
        super().__init__()
        self.retries = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "txsink_retry", False):
            self.retries += 1
            return False
        return record.name.split(".", 1)[0] not in CLIENT_LOGGERS


def check_ownership(cfg: PipelineConfig, plugins: Plugins, store: StateStore,
                    pipeline_file: str, *, hold_as: str | None = None) -> Lease | None:
    """Bind the sink to this checkpoint's state before Spark starts, or say why not.

    The same check runs again inside Spark; here a refusal is one line with the
    way out that applies instead of a traceback from a Python worker. With ``hold_as``
    (the run's own lease owner, which its query's coordinators use too) the lease taken
    here is kept and returned: from here on the run holds the checkpoint, so ``status``
    shows it running and ``reset`` and ``resolve`` refuse while Spark starts. Without,
    it is given back.
    """
    from txsink.coordinator import Coordinator

    holder = store.lease_info()
    owner = str(holder.get("owner") or "")
    if owner and holder.get("released_at") is None and owner_alive(owner):
        raise ConfigError(
            f"checkpoint {cfg.checkpoint} is in use by another run: sink "
            f"{cfg.sink.sink_id!r} is being written by {holder_words(owner)} "
            f"(lease owner {owner}); stop it (Ctrl-C) before starting another run on this "
            "checkpoint", field="checkpoint", sink_id=cfg.sink.sink_id)
    meta_before = store.read_meta()
    backend = cfg.create_backend(plugins)
    try:
        coordinator = Coordinator(backend, store, cfg.sink.sink_id,
                                  backend_options=cfg.sink.options, plugins=plugins,
                                  owner=hold_as or new_owner_token(), scan_orphans=False)
        try:
            coordinator.start(recover=False)
        except SinkOwnedError as exc:
            if meta_before is None:
                _forget_new_state(store)
            from txsink.group import TargetGroup

            # A group: the target that refused, and a reset only if every target has one.
            backends = (list(m.backend for m in backend.members.values())
                        if isinstance(backend, TargetGroup) else [backend])
            resettable = all(type(b).reset_sink is not Backend.reset_sink for b in backends)
            target = backend.describe()
            if isinstance(backend, TargetGroup):
                target = next((f"target {m.name!r}: {m.backend.describe()}"
                               for m in backend.members.values() if m.sink_id == exc.sink_id),
                              target)
            raise _owned_hint(exc, cfg, target,
                              pipeline_file if resettable else None,
                              fresh=meta_before is None, here=store.location) from None
        except BaseException:
            # Any other refusal (a directory bound to another sink id, a server down):
            # the state this check made would keep the refused destination as the
            # sink's, and the way out the message gives would be refused as a move.
            if meta_before is None:
                _forget_new_state(store)
            raise
        if hold_as is None:
            store.release(coordinator.lease)
            return None
        _refuse_beside_a_reset(cfg, store, coordinator.lease, owner)
        return coordinator.lease
    finally:
        backend.close()


def holder_words(owner: str) -> str:
    """A live lease holder, for a refusal: a ``txsink run`` may still be starting Spark."""
    words = owner_words(owner)
    if ":run:" in owner:
        return f"{words} (starting Spark, or running its query)"
    if ":reset:" in owner:
        return f"{words}, which is deleting this pipeline's output and checkpoint"
    return "a running query" if words in ("a Spark driver", "a coordinator") else words


def _refuse_beside_a_reset(cfg: PipelineConfig, store: StateStore, lease: Lease,
                          looked_at: str) -> None:
    """A ``txsink reset`` that took the lease between this run's look (``looked_at``
    held it then) and its own take is deleting the output and checkpoint under it: give
    the lease back and stop, before anything is read from a state that is going away.
    (A reset that held the lease at the look and released it has stopped.)"""
    fenced = [str(o) for o in store.lease_info().get("fenced", [])]
    if (fenced and fenced[-1] != looked_at and ":reset:" in fenced[-1]
            and owner_alive(fenced[-1])):
        with contextlib.suppress(TxsinkError, OSError):
            store.release(lease)
        raise ConfigError(
            f"checkpoint {cfg.checkpoint}: {owner_words(fenced[-1])} is deleting this "
            "pipeline's output and checkpoint; nothing was started. Run again once it "
            "ended", field="checkpoint", sink_id=cfg.sink.sink_id)


def _forget_new_state(store: StateStore) -> None:
    """Remove the empty state this check created, so the next try sees the same thing."""
    root = Path(store.location)
    if store.records() or not any((root / name).is_file()
                                  for name in ("meta.json", "lease.json")):
        return  # not a state this check made
    shutil.rmtree(root, ignore_errors=True)
    with contextlib.suppress(OSError):  # the checkpoint dir, if nothing else is in it
        root.parent.rmdir()


def _owned_hint(exc: SinkOwnedError, cfg: PipelineConfig, target: str,
                pipeline_file: str | None, *, fresh: bool, here: str) -> ConfigError:
    owner = exc.owner_state or "?"
    sink = cfg.sink.sink_id
    # The owner's state is gone, or it was at this very location and this run found
    # no state there: the checkpoint was deleted (and the check just made a new one).
    gone = (fresh and os.path.abspath(owner) == os.path.abspath(here)) or (
        "://" not in owner and not Path(owner, "meta.json").exists())
    if gone and pipeline_file is not None:
        message = (f"sink {sink!r} ({target}) was written by an earlier run whose txsink "
                   f"state {owner} no longer exists (its checkpoint was deleted). To start "
                   f"over, deleting that output: txsink reset {pipeline_file}. To keep it: "
                   "give this pipeline a new sink_id and output location")
    elif gone:
        message = (f"sink {sink!r} ({target}) was written by an earlier run whose txsink "
                   f"state {owner} no longer exists (its checkpoint was deleted). "
                   f"`txsink reset` cannot delete what it wrote "
                   f"({'a target of the group' if cfg.sink.targets else cfg.sink.backend} "
                   f"keeps its output): give this pipeline a new sink_id to start over "
                   f"({exc})")
    else:
        message = (f"sink {sink!r} ({target}) belongs to another query, whose txsink state "
                   f"is {owner}; a sink id belongs to one query: give this pipeline its own "
                   "sink_id and output location (or stop using the other query's checkpoint)")
    return ConfigError(message, field="sink.sink_id", sink_id=sink)


def jvm_owner(spark: SparkSession) -> str | None:
    """The owner token the sink's code in this session's driver JVM derives when its
    environment names none (a JVM this process launched before the run set one)."""
    from txsink.spark._proc import jvm_owner_token

    proc = getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None)
    return jvm_owner_token(proc.pid) if proc is not None else None


def release_lease(store: StateStore, owner: str) -> None:
    """Give the lease up at the end of a run, if this run's driver still holds it."""
    info = store.lease_info()
    if info.get("owner") == owner and info.get("released_at") is None:
        from txsink.state import Lease

        with contextlib.suppress(TxsinkError, OSError):
            store.release(Lease(owner, int(info["generation"])))
