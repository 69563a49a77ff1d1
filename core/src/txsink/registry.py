"""Registries that plugins fill through the registration hooks.

A registry remembers which distribution registered each name, so a clash is
reported with both culprits and a failed lookup lists what is installed.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from txsink.errors import BackendNotFoundError, PluginError

if TYPE_CHECKING:
    from txsink.backend import Backend
    from txsink.state import StateStore

T = TypeVar("T")

#: Backends this project ships as separate packages, for the "not installed" hint.
KNOWN_BACKENDS = ("kafka", "postgres", "s3")


@dataclass(frozen=True)
class Origin:
    """Where a registration came from: plugin name and its distribution."""

    plugin: str
    distribution: str | None = None
    version: str | None = None

    def __str__(self) -> str:
        if self.distribution:
            return f"{self.distribution} {self.version or ''} (plugin {self.plugin!r})".replace(
                "  ", " "
            )
        return f"plugin {self.plugin!r}"


@dataclass(frozen=True)
class Registration(Generic[T]):
    name: str
    value: T
    origin: Origin


class _Registry(Generic[T]):
    kind = "entry"

    def __init__(self) -> None:
        self._entries: dict[str, Registration[T]] = {}
        self._origin = Origin("<unknown>")

    def _bind(self, origin: Origin) -> None:
        self._origin = origin

    def _add(self, name: str, value: T) -> None:
        if not isinstance(name, str) or not name:
            raise PluginError(f"{self._origin} registered a {self.kind} with no name")
        existing = self._entries.get(name)
        if existing is not None:
            raise PluginError(
                f"two plugins provide the {self.kind} {name!r}: {existing.origin} and "
                f"{self._origin}; uninstall one, or disable one with "
                f"TXSINK_DISABLE_PLUGINS={self._origin.plugin}"
            )
        self._entries[name] = Registration(name, value, self._origin)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def registrations(self) -> list[Registration[T]]:
        return [self._entries[n] for n in self.names()]

    def get(self, name: str) -> Registration[T]:
        try:
            return self._entries[name]
        except KeyError:
            installed = ", ".join(self.names()) or "none"
            close = difflib.get_close_matches(name, self.names(), n=1, cutoff=0.6)
            if close:
                hint = f"did you mean {close[0]!r}?"
            elif self.kind == "backend" and name in KNOWN_BACKENDS:
                hint = (f"the {name} backend comes in the package txsink-{name}: install it "
                        "next to txsink")
            else:
                hint = (f"install the package that provides it (`txsink {self.kind}s` "
                        "lists what is installed)" if self.kind == "backend" else
                        "install the package that provides it")
            raise BackendNotFoundError(
                f"no {self.kind} named {name!r} is installed (installed: {installed}); {hint}",
                field="backend" if self.kind == "backend" else None,
            ) from None


class BackendRegistry(_Registry["type[Backend]"]):
    """Handed to :func:`~txsink.hookspecs.txsink_register_backends`."""

    kind = "backend"

    def add(self, backend_class: type[Backend]) -> None:
        from txsink.backend import Backend

        if not (isinstance(backend_class, type) and issubclass(backend_class, Backend)):
            raise PluginError(
                f"{self._origin} registered {backend_class!r}, which is not a "
                "txsink.backend.Backend subclass"
            )
        name = getattr(backend_class, "name", None)
        if not isinstance(name, str):
            raise PluginError(f"{self._origin}: {backend_class.__qualname__} has no 'name'")
        self._add(name, backend_class)


StateStoreFactory = Callable[[str], "StateStore"]


class StateStoreRegistry(_Registry[StateStoreFactory]):
    """Handed to :func:`~txsink.hookspecs.txsink_register_state_stores`."""

    kind = "state store"

    def add(self, scheme: str, factory: StateStoreFactory) -> None:
        self._add(scheme, factory)


#: Makes a source format available in a Spark session (``spark.dataSource.register`` of
#: a Python data source). Typed loosely: core does not import pyspark here.
SourceRegistrar = Callable[[Any], None]

#: Source formats this project ships in separate packages, for the "not installed" hint.
KNOWN_SOURCES = {"txsink-kafka": "txsink-kafka"}


class SourceRegistry(_Registry[SourceRegistrar]):
    """Handed to :func:`~txsink.hookspecs.txsink_register_sources`: the Spark stream
    sources plugins ship, by the format name a pipeline file's ``source.format`` gives."""

    kind = "source"

    def add(self, format_name: str, register: SourceRegistrar) -> None:
        if not callable(register):
            raise PluginError(f"{self._origin} registered source {format_name!r} with "
                              f"{register!r}, which is not callable")
        self._add(format_name, register)

    def find(self, format_name: str) -> Registration[SourceRegistrar] | None:
        """The registration of ``format_name``, or None (Spark's own formats, a jar's)."""
        return self._entries.get(format_name)
