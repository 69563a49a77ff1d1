"""The typed facade over pluggy's plugin manager.

Built on demand by :func:`get_plugins` (never at import), it loads the ``txsink``
entry-point group, lets plugins fill the registries, and exposes one typed method
per lifecycle hook. Built-in backends come through the same entry points as any
third-party package, so our own backends exercise the plugin path.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pluggy

from txsink import hookspecs
from txsink.errors import BackendNotFoundError, PluginError
from txsink.registry import (
    BackendRegistry,
    Origin,
    Registration,
    SourceRegistry,
    StateStoreRegistry,
)

if TYPE_CHECKING:
    from txsink.backend import Backend
    from txsink.model import Committable, RecoveryReport
    from txsink.state import StateStore

log = logging.getLogger(__name__)

#: Comma-separated plugin (entry-point) names or distribution names to skip.
DISABLE_ENV = "TXSINK_DISABLE_PLUGINS"
ENTRY_POINT_GROUP = hookspecs.PROJECT


@dataclass(frozen=True)
class BrokenPlugin:
    name: str
    distribution: str | None
    error: str


@dataclass
class Plugins:
    """What the coordinator and CLI use instead of raw ``pm.hook`` calls."""

    pm: pluggy.PluginManager
    backends: BackendRegistry
    state_stores: StateStoreRegistry
    broken: list[BrokenPlugin] = field(default_factory=list)
    origins: dict[str, Origin] = field(default_factory=dict)
    sources: SourceRegistry = field(default_factory=SourceRegistry)

    # -- lookups ------------------------------------------------------------------------

    def backend_class(self, name: str) -> type[Backend]:
        try:
            return self.backends.get(name).value
        except BackendNotFoundError as exc:
            if self.broken:
                failed = "; ".join(f"{b.name} ({b.error})" for b in self.broken)
                raise BackendNotFoundError(f"{exc} - plugins that failed to load: {failed}",
                                           field="backend") from None
            raise

    def backend_registration(self, name: str) -> Registration[type[Backend]]:
        self.backend_class(name)
        return self.backends.get(name)

    def create_backend(self, name: str, options: Mapping[str, str]) -> Backend:
        return self.backend_class(name).from_options(options)

    def source(self, format_name: str) -> Registration[Callable[[Any], None]] | None:
        """What makes the Spark source ``format_name`` available in a session, when an
        installed plugin ships it (else None: Spark's own formats, a jar's)."""
        return self.sources.find(format_name)

    def state_store(self, location: str) -> StateStore:
        scheme = location.split("://", 1)[0] if "://" in location else "file"
        return self.state_stores.get(scheme).value(location)

    # -- lifecycle ----------------------------------------------------------------------

    def _notify(self, hook_name: str, **kwargs: Any) -> None:
        # Observers must not change the outcome of an epoch: log and carry on.
        caller = getattr(self.pm.hook, hook_name)
        for impl in caller.get_hookimpls():
            try:
                impl.function(*[kwargs[a] for a in impl.argnames])
            except Exception:
                log.exception("plugin %r failed in %s (ignored)", impl.plugin_name, hook_name)

    def coordinator_started(self, sink_id: str, backend: str,
                            participant_timeout_s: float | None) -> None:
        self._notify("txsink_coordinator_started", sink_id=sink_id, backend=backend,
                     participant_timeout_s=participant_timeout_s)

    def epoch_prepared(self, sink_id: str, epoch: int, committables: Sequence[Committable]) -> None:
        self._notify("txsink_epoch_prepared", sink_id=sink_id, epoch=epoch,
                     committables=committables)

    def epoch_decided(self, sink_id: str, epoch: int, committables: Sequence[Committable]) -> None:
        self._notify("txsink_epoch_decided", sink_id=sink_id, epoch=epoch,
                     committables=committables)

    def epoch_committed(
        self, sink_id: str, epoch: int, committables: Sequence[Committable], duration_s: float
    ) -> None:
        self._notify("txsink_epoch_committed", sink_id=sink_id, epoch=epoch,
                     committables=committables, duration_s=duration_s)

    def epoch_aborted(
        self, sink_id: str, epoch: int, committables: Sequence[Committable], reason: str
    ) -> None:
        self._notify("txsink_epoch_aborted", sink_id=sink_id, epoch=epoch,
                     committables=committables, reason=reason)

    def participant_salvaged(self, sink_id: str, epoch: int, original: Committable,
                             replacement: Committable) -> None:
        self._notify("txsink_participant_salvaged", sink_id=sink_id, epoch=epoch,
                     original=original, replacement=replacement)

    def recovered(self, sink_id: str, report: RecoveryReport) -> None:
        self._notify("txsink_recovered", sink_id=sink_id, report=report)


def _disabled_from_env() -> set[str]:
    raw = os.environ.get(DISABLE_ENV, "")
    return {part.strip() for part in raw.split(",") if part.strip()}


def build_plugins(
    entry_points: Iterable[importlib.metadata.EntryPoint] | None = None,
    *,
    extra_plugins: Sequence[tuple[str, object]] = (),
    disabled: Iterable[str] | None = None,
) -> Plugins:
    """Build a fresh plugin manager.

    :param entry_points: defaults to the installed ``txsink`` group; tests pass their own.
    :param extra_plugins: ``(name, plugin)`` pairs registered directly (tests, embedding).
    :param disabled: plugin or distribution names to skip; defaults to ``$TXSINK_DISABLE_PLUGINS``.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    blocked = _disabled_from_env() if disabled is None else set(disabled)
    if entry_points is None:
        entry_points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    plugins = Plugins(pm, BackendRegistry(), StateStoreRegistry())
    seen: set[str] = set()
    for ep in entry_points:
        dist = getattr(ep, "dist", None)
        dist_name = dist.metadata["Name"] if dist is not None else None
        dist_version = dist.version if dist is not None else None
        if ep.name in blocked or (dist_name is not None and dist_name in blocked):
            log.debug("plugin %r disabled by %s", ep.name, DISABLE_ENV)
            continue
        if ep.name in seen:
            raise PluginError(
                f"two entry points named {ep.name!r} in group {ENTRY_POINT_GROUP!r} "
                f"(one from {dist_name or 'an unknown distribution'}); rename one"
            )
        seen.add(ep.name)
        try:
            plugin = ep.load()
        except Exception as exc:
            # Loud, but not fatal: a broken plugin must not take down pipelines that do
            # not use it. Lookups of its backend name report it.
            log.error("txsink plugin %r from %s failed to load: %s", ep.name, dist_name, exc)
            plugins.broken.append(BrokenPlugin(ep.name, dist_name, f"{type(exc).__name__}: {exc}"))
            continue
        pm.register(plugin, name=ep.name)
        plugins.origins[ep.name] = Origin(ep.name, dist_name, dist_version)
    for name, plugin in extra_plugins:
        if name in blocked:
            continue
        pm.register(plugin, name=name)
        plugins.origins[name] = Origin(name)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"invalid txsink plugin: {exc}") from exc
    _fill(plugins, "txsink_register_backends", plugins.backends)
    _fill(plugins, "txsink_register_state_stores", plugins.state_stores)
    _fill(plugins, "txsink_register_sources", plugins.sources)
    return plugins


def _fill(plugins: Plugins, hook_name: str,
          registry: BackendRegistry | StateStoreRegistry | SourceRegistry) -> None:
    # Call each implementation separately so the registry knows who registered what.
    for impl in reversed(getattr(plugins.pm.hook, hook_name).get_hookimpls()):
        origin = plugins.origins.get(impl.plugin_name, Origin(impl.plugin_name))
        registry._bind(origin)
        try:
            impl.function(*[{"registry": registry}[a] for a in impl.argnames])
        except PluginError:
            raise
        except Exception as exc:
            raise PluginError(f"{origin} failed in {hook_name}: {exc}") from exc


_lock = threading.Lock()
_cached: Plugins | None = None


def get_plugins() -> Plugins:
    """The process-wide plugin manager, built on first use."""
    global _cached
    with _lock:
        if _cached is None:
            _cached = build_plugins()
        return _cached


def reset_plugins() -> None:
    """Forget the cached manager (tests; after installing a plugin at run time)."""
    global _cached
    with _lock:
        _cached = None
