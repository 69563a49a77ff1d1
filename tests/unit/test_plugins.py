"""Plugin discovery through the ``txsink`` entry-point group."""

from __future__ import annotations

import importlib.metadata
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from txsink.errors import BackendNotFoundError, PluginError
from txsink.hookspecs import hookimpl
from txsink.plugins import build_plugins, get_plugins, reset_plugins
from txsink.state import DirectoryStateStore
from txsink.testing.memory import MemoryBackend


class _Dist:
    """Just enough of importlib.metadata.Distribution for EntryPoint.dist."""

    def __init__(self, name: str, version: str) -> None:
        self.metadata = {"Name": name}
        self.version = version


def entry_point(name: str, module: str, dist: str, version: str = "1.0"):  # type: ignore[no-untyped-def]
    ep = importlib.metadata.EntryPoint(name, module, "txsink")
    return ep._for(_Dist(dist, version))  # type: ignore[attr-defined,arg-type]


@pytest.fixture
def fake_modules() -> Iterator[dict[str, types.ModuleType]]:
    made: dict[str, types.ModuleType] = {}

    def add(name: str, backend_name: str) -> types.ModuleType:
        class B(MemoryBackend):
            name: ClassVar[str] = backend_name

        mod = types.ModuleType(name)

        @hookimpl
        def txsink_register_backends(registry):  # type: ignore[no-untyped-def]
            registry.add(B)

        mod.txsink_register_backends = txsink_register_backends  # type: ignore[attr-defined]
        sys.modules[name] = mod
        made[name] = mod
        return mod

    add("fake_kafka_a", "kafka")
    add("fake_kafka_b", "kafka")
    add("fake_pg", "postgres")
    yield made
    for name in made:
        sys.modules.pop(name, None)


def test_builtin_files_backend_comes_through_the_entry_point() -> None:
    reset_plugins()
    reg = get_plugins().backend_registration("files")
    assert reg.origin.distribution == "txsink"
    assert reg.origin.plugin == "files"
    stores = get_plugins().state_stores
    assert stores.get("file").origin.distribution == "txsink"
    # txsink-s3 registers its state store through the same hook, for both S3 schemes.
    assert [stores.get(s).origin.distribution for s in ("s3", "s3a")] == ["txsink-s3"] * 2


def test_third_party_backend_is_found(fake_modules: dict[str, types.ModuleType]) -> None:
    plugins = build_plugins([entry_point("pg", "fake_pg", "txsink-postgres", "2.1")])
    reg = plugins.backend_registration("postgres")
    assert (reg.origin.distribution, reg.origin.version) == ("txsink-postgres", "2.1")
    backend = plugins.create_backend("postgres", {"system": "x"})
    assert backend.name == "postgres"


@pytest.mark.promise("duplicate-backend-name-error", "backend")
def test_two_plugins_claiming_one_backend_name_both_named(
    fake_modules: dict[str, types.ModuleType],
) -> None:
    with pytest.raises(PluginError) as info:
        build_plugins([entry_point("kafka", "fake_kafka_a", "txsink-kafka"),
                       entry_point("kafka2", "fake_kafka_b", "acme-kafka-sink")])
    text = str(info.value)
    assert "'kafka'" in text
    assert "txsink-kafka" in text
    assert "acme-kafka-sink" in text


def test_plugins_can_be_disabled_by_environment(
    fake_modules: dict[str, types.ModuleType], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TXSINK_DISABLE_PLUGINS", "acme-kafka-sink")
    plugins = build_plugins([entry_point("kafka", "fake_kafka_a", "txsink-kafka"),
                             entry_point("kafka2", "fake_kafka_b", "acme-kafka-sink")])
    assert plugins.backend_registration("kafka").origin.distribution == "txsink-kafka"


@pytest.mark.promise("broken-plugin-isolated", "backend")
def test_unknown_backend_lists_installed_and_broken_ones(
    fake_modules: dict[str, types.ModuleType], caplog: pytest.LogCaptureFixture
) -> None:
    plugins = build_plugins([entry_point("pg", "fake_pg", "txsink-postgres"),
                             entry_point("s3", "no_such_module_xyz", "txsink-s3")])
    assert "failed to load" in caplog.text
    with pytest.raises(BackendNotFoundError) as info:
        plugins.backend_class("s3")
    text = str(info.value)
    assert "installed: postgres" in text
    assert "no_such_module_xyz" in text
    assert info.value.field == "backend"


def test_registering_a_non_backend_is_a_plugin_error() -> None:
    class NotABackend:
        @hookimpl
        def txsink_register_backends(self, registry):  # type: ignore[no-untyped-def]
            registry.add(dict)

    with pytest.raises(PluginError, match=r"not a txsink\.backend\.Backend subclass"):
        build_plugins([], extra_plugins=[("bad", NotABackend())])


def test_hookimpl_with_unknown_argument_is_rejected() -> None:
    class Wrong:
        @hookimpl
        def txsink_epoch_committed(self, epoch, nonsense):  # type: ignore[no-untyped-def]
            pass

    with pytest.raises(Exception, match="nonsense"):
        build_plugins([], extra_plugins=[("wrong", Wrong())])


def test_state_store_plugin_by_scheme(tmp_path: Path) -> None:
    made: list[str] = []

    class Stores:
        @hookimpl
        def txsink_register_state_stores(self, registry):  # type: ignore[no-untyped-def]
            def factory(location: str) -> DirectoryStateStore:
                made.append(location)
                return DirectoryStateStore(tmp_path / "s")

            registry.add("mem", factory)

    plugins = build_plugins([], extra_plugins=[("stores", Stores())])
    assert isinstance(plugins.state_store("mem://bucket/q1"), DirectoryStateStore)
    assert made == ["mem://bucket/q1"]
    with pytest.raises(BackendNotFoundError, match="no state store named 'hdfs'"):
        plugins.state_store("hdfs://nn/q1")
