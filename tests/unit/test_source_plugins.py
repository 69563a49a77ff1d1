"""Spark sources come from plugins (``txsink_register_sources``): core imports no backend.

Before: ``txsink.spark.checks`` imported ``txsink_kafka.source`` to register the Kafka
backend's ``txsink-kafka`` source, so core reached up into a backend. Now the backend
registers the source through the hook, as a third party would, and a pipeline file
naming its format gets it registered in the session.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from txsink.config import parse_pipeline
from txsink.errors import ConfigError, PluginError
from txsink.hookspecs import hookimpl
from txsink.plugins import build_plugins, get_plugins, reset_plugins


class _Sources:
    def __init__(self, name: str, calls: list[Any]) -> None:
        self.name = name
        self.calls = calls

    @hookimpl
    def txsink_register_sources(self, registry):  # type: ignore[no-untyped-def]
        registry.add(self.name, self.calls.append)


class _Spark:
    """Stands for a session: ``register`` is handed it."""


def _cfg(tmp_path: Path, fmt: str) -> Any:
    return parse_pipeline({"source": {"type": "spark", "format": fmt},
                           "checkpoint": str(tmp_path / "chk"),
                           "sink": {"backend": "files", "sink_id": "s",
                                    "options": {"path": str(tmp_path / "out")}}})


def test_a_plugins_source_is_found_by_format_and_named_with_its_origin() -> None:
    calls: list[Any] = []
    plugins = build_plugins([], extra_plugins=[("mine", _Sources("my-format", calls))])
    found = plugins.source("my-format")
    assert found is not None and "mine" in str(found.origin)
    found.value("session")
    assert calls == ["session"]
    assert plugins.source("parquet") is None  # Spark's own: not a plugin's


def test_two_plugins_registering_one_source_are_both_named() -> None:
    with pytest.raises(PluginError) as caught:
        build_plugins([], extra_plugins=[("one", _Sources("dup", [])),
                                         ("two", _Sources("dup", []))])
    said = str(caught.value)
    assert "two plugins provide the source 'dup'" in said
    assert "plugin 'one'" in said and "plugin 'two'" in said


def test_a_source_that_is_not_callable_is_a_plugin_error() -> None:
    class Bad:
        @hookimpl
        def txsink_register_sources(self, registry):  # type: ignore[no-untyped-def]
            registry.add("bad", "txsink_x.source:register")

    with pytest.raises(PluginError, match=r"'bad'.*not callable"):
        build_plugins([], extra_plugins=[("bad", Bad())])


def test_the_kafka_backend_registers_its_source_through_the_entry_point() -> None:
    pytest.importorskip("txsink_kafka", reason="the Kafka backend is not installed")
    found = get_plugins().source("txsink-kafka")
    assert found is not None
    assert found.origin.distribution == "txsink-kafka"


def test_a_pipeline_naming_a_plugins_source_has_it_registered_in_the_session(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pyspark", reason="txsink.spark needs PySpark")
    import txsink.plugins
    from txsink.spark.checks import register_named_source

    calls: list[Any] = []
    plugins = build_plugins(extra_plugins=[("mine", _Sources("my-format", calls))])
    monkeypatch.setattr(txsink.plugins, "_cached", plugins)
    spark = _Spark()
    register_named_source(spark, _cfg(tmp_path, "my-format"))  # type: ignore[arg-type]
    assert calls == [spark]
    register_named_source(spark, _cfg(tmp_path, "parquet"))  # type: ignore[arg-type]
    assert calls == [spark]  # Spark's own format: nothing to register


def test_the_kafka_source_without_its_package_names_the_package(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pyspark", reason="txsink.spark needs PySpark")
    from txsink.spark.checks import register_named_source

    monkeypatch.setenv("TXSINK_DISABLE_PLUGINS", "txsink-kafka")
    reset_plugins()
    try:
        with pytest.raises(ConfigError, match="'txsink-kafka' is a source of the "
                           "txsink-kafka package, which is not installed") as caught:
            register_named_source(_Spark(), _cfg(tmp_path, "txsink-kafka"))  # type: ignore[arg-type]
        assert caught.value.field == "source.format"
    finally:
        monkeypatch.delenv("TXSINK_DISABLE_PLUGINS")
        reset_plugins()
