"""Pipeline config files: loading, ${ENV} interpolation and field-path validation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from txsink.config import interpolate, load_pipeline, parse_pipeline
from txsink.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def _base(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "source": {"type": "rate", "options": {"rowsPerSecond": 10}},
        "sink": {"backend": "files", "sink_id": "s1", "options": {"path": "/tmp/x"}},
        "checkpoint": "/tmp/chk",
    }
    data.update(overrides)
    return data


def _error(data: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_pipeline(data)
    return info.value


def test_demo_pipeline_is_valid() -> None:
    cfg = load_pipeline(REPO / "examples/pipelines/demo.yaml", env={})
    assert cfg.source.type == "rate"
    assert cfg.sink.backend == "files"
    assert cfg.sink.options["path"] == "out/demo/data"  # ${TXSINK_DEMO_DIR:-out/demo}
    assert cfg.trigger.kind == "processing_time"
    assert cfg.spark.conf["spark.ui.enabled"] == "false"  # YAML boolean -> Spark string
    assert cfg.transform is not None and "FROM source" in cfg.transform
    assert Path(cfg.checkpoint).is_absolute()


def test_every_example_pipeline_parses() -> None:
    paths = sorted(p for p in (REPO / "examples/pipelines").iterdir()
                   if p.suffix in (".yaml", ".yml", ".toml"))
    assert any(p.suffix == ".toml" for p in paths)
    for path in paths:
        cfg = load_pipeline(path, env=_AnyEnv(), check_backend=False)
        assert cfg.sink.sink_id, path


class _AnyEnv(dict[str, str]):
    """Every variable is set (to a placeholder), so examples parse without secrets."""

    def __contains__(self, key: object) -> bool:
        return True

    def __getitem__(self, key: str) -> str:
        return "placeholder"


def test_env_interpolation_with_default_and_escape() -> None:
    data = {"a": "${HOST}:${PORT:-5432}", "b": ["$${NOT}", 3], "c": {"d": "x${HOST}"}}
    assert interpolate(data, {"HOST": "db"}) == {
        "a": "db:5432", "b": ["${NOT}", 3], "c": {"d": "xdb"}}


@pytest.mark.promise("env-reference-unset-error", "cli")
def test_missing_env_var_names_field(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("source: {type: rate}\ncheckpoint: /tmp/c\n"
                 "sink: {backend: files, sink_id: s, options: {path: '${OUT_DIR}/x'}}\n")
    with pytest.raises(ConfigError) as info:
        load_pipeline(f, env={})
    assert info.value.field == "sink.options.path"
    assert "OUT_DIR" in str(info.value)


def test_unknown_backend_names_field_and_installed() -> None:
    err = _error(_base(sink={"backend": "nosuch", "sink_id": "s1"}))
    assert err.field == "sink.backend"
    assert "nosuch" in str(err)
    assert "files" in str(err)  # the installed ones are listed


def test_missing_sink_id() -> None:
    err = _error(_base(sink={"backend": "files", "options": {"path": "/tmp/x"}}))
    assert err.field == "sink.sink_id"
    assert "required" in str(err)


def test_bad_sink_id() -> None:
    err = _error(_base(sink={"backend": "files", "sink_id": "a/b", "options": {"path": "/x"}}))
    assert err.field == "sink.sink_id"


@pytest.mark.parametrize(("data", "field", "words"), [
    (_base(checkpoint=5), "checkpoint", "must be a string"),
    (_base(source={"type": "rate", "options": {"rowsPerSecond": [1]}}),
     "source.options.rowsPerSecond", "string, number or boolean"),
    (_base(source={"type": "kafkaa"}), "source.type", "rate, files, spark"),
    (_base(source={"type": "files", "format": "xml", "path": "/in"}), "source.format",
     "json, csv, parquet"),
    (_base(source={"type": "files", "format": "json"}), "source.path", "required"),
    (_base(sink={"backend": "files", "sink_id": 7}), "sink.sink_id", "must be a string"),
    (_base(sink={"backend": "files", "sink_id": "s", "options": "path=/x"}), "sink.options",
     "must be a mapping"),
    (_base(trigger={"processing_time": "soon"}), "trigger.processing_time", "duration"),
    (_base(trigger={"once": True, "available_now": True}), "trigger", "exactly one"),
    (_base(trigger="5 seconds"), "trigger", "mapping"),
    (_base(transform=["SELECT 1"]), "transform", "SQL query"),
    (_base(spark={"conf": {"a": {"b": 1}}}), "spark.conf.a", "string, number or boolean"),
    (_base(mode="micro"), "mode", "streaming, batch"),
    (_base(mode="batch"), "source.type", "streaming only"),
    (_base(sinks={}), "sinks", "did you mean 'sink'"),
    ({"source": {"type": "rate"}, "sink": {"backend": "files", "sink_id": "s",
                                           "options": {"path": "/x"}}}, "checkpoint", "required"),
])
def test_bad_fields_are_named(data: dict[str, Any], field: str, words: str) -> None:
    err = _error(data)
    assert err.field == field
    assert words in str(err)
    assert str(err).startswith(field)


def test_backend_option_errors_are_prefixed() -> None:
    err = _error(_base(sink={"backend": "files", "sink_id": "s1", "options": {}}))
    assert err.field == "sink.options.path"
    err = _error(_base(sink={"backend": "files", "sink_id": "s1",
                             "options": {"path": "/x", "formt": "jsonl"}}))
    assert err.field == "sink.options.formt"


def test_processing_time_number_and_sink_options_lowercased() -> None:
    cfg = parse_pipeline(_base(
        trigger={"processing_time": 2},
        sink={"backend": "files", "sink_id": "s1", "options": {"PATH": "/x", "Format": "jsonl"}},
    ))
    assert cfg.trigger.interval == "2 seconds"
    assert cfg.sink.options == {"path": "/x", "format": "jsonl"}
    assert cfg.sink_write_options()["checkpointLocation"] == "/tmp/chk"


def test_toml_pipeline(tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    f.write_text('checkpoint = "/tmp/c"\n[source]\ntype = "files"\nformat = "csv"\n'
                 'path = "/in"\n[source.options]\nheader = true\n'
                 '[sink]\nbackend = "files"\nsink_id = "t"\n[sink.options]\npath = "/o"\n')
    cfg = load_pipeline(f, env={})
    assert cfg.source.options == {"header": "true"}
    assert cfg.name == "p"


@pytest.mark.parametrize(("text", "words"), [
    ("source: [", "invalid YAML at line"),
    ("", "is empty"),
    ("- a\n- b\n", "must hold a mapping"),
])
def test_unreadable_files(tmp_path: Path, text: str, words: str) -> None:
    f = tmp_path / "p.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=words):
        load_pipeline(f, env={})


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_pipeline("/nonexistent/pipeline.yaml")


@pytest.mark.promise("secrets-never-printed", "cli")
def test_secret_options_are_masked_in_summary() -> None:
    cfg = parse_pipeline(_base())
    assert "path=/tmp/x" in cfg.summary()
    masked = type(cfg.sink)(cfg.sink.backend, cfg.sink.sink_id, {"password": "hunter22"},
                            frozenset({"password"}))
    assert masked.safe_options() == {"password": "***"}
    inline = type(cfg.sink)("x", "s", {"dsn": "postgresql://u:hunter22@db/x",
                                       "conn": "host=db password=hunter22"})
    assert "hunter22" not in str(inline.safe_options())


@pytest.mark.parametrize(("text", "ms"), [("500 milliseconds", 500), ("250ms", 250),
                                          ("5 seconds", 5000), ("1.5 min", 90_000),
                                          ("2 hours", 7_200_000)])
def test_processing_time_in_milliseconds(text: str, ms: int) -> None:
    cfg = parse_pipeline(_base(trigger={"processing_time": text}))
    assert cfg.trigger.interval_ms == ms


def _kafka(trigger: str, **options: str) -> dict[str, Any]:
    sink_options = {"kafka.bootstrap.servers": "127.0.0.1:9", "topic": "out", **options}
    return _base(sink={"backend": "kafka", "sink_id": "k1", "options": sink_options},
                 trigger={"processing_time": trigger})


def test_trigger_reaches_the_backend_check_before_spark() -> None:
    # The Kafka timeout is checked against the file's trigger although the user never
    # repeated the interval in the sink options.
    err = _error(_kafka("2 minutes", **{"kafka.transaction.timeout.ms": "60000"}))
    assert err.field == "sink.options.kafka.transaction.timeout.ms"
    assert "60000 ms" in str(err) and "120000 ms" in str(err)
    cfg = parse_pipeline(_kafka("10 seconds", **{"kafka.transaction.timeout.ms": "600000"}))
    assert cfg.sink.options["trigger.interval.ms"] == "10000"
    assert cfg.sink_write_options()["trigger.interval.ms"] == "10000"


def test_an_explicit_trigger_option_wins() -> None:
    cfg = parse_pipeline(_kafka("10 seconds", **{"kafka.transaction.timeout.ms": "600000",
                                                  "trigger.interval.ms": "20000"}))
    assert cfg.sink.options["trigger.interval.ms"] == "20000"


def test_backends_without_timeouts_get_no_trigger_option() -> None:
    cfg = parse_pipeline(_base(trigger={"processing_time": "1 second"}))
    assert "trigger.interval.ms" not in cfg.sink.options


def test_a_misspelled_required_key_is_named() -> None:
    """``source: {tpye: rate}`` said only ``source.type: required``."""
    from txsink.config import parse_pipeline

    with pytest.raises(ConfigError) as err:
        parse_pipeline({"source": {"tpye": "rate"}, "checkpoint": "/tmp/c",
                        "sink": {"backend": "files", "sink_id": "s",
                                 "options": {"path": "/tmp/x"}}})
    assert str(err.value) == ("source.type: required ('source.tpye' is there: did you mean "
                              "'type'?)")
    assert err.value.field == "source.type"


@pytest.mark.promise("pipeline-suffix-checked", "cli")
def test_a_json_pipeline_is_read_as_json_and_another_suffix_is_refused(tmp_path: Path) -> None:
    body = ('{"source": {"type": "rate"}, "checkpoint": "/tmp/c", "sink": {"backend": '
            '"files", "sink_id": "s", "options": {"path": "/tmp/x"}}}')
    (tmp_path / "p.json").write_text(body)
    assert load_pipeline(tmp_path / "p.json", env={}).sink.sink_id == "s"
    (tmp_path / "bad.json").write_text("source: {type: rate}\n")  # YAML, named .json
    with pytest.raises(ConfigError, match="is not valid JSON"):
        load_pipeline(tmp_path / "bad.json", env={})
    (tmp_path / "p.conf").write_text(body)
    with pytest.raises(ConfigError, match=r"unknown kind of file '\.conf'"):
        load_pipeline(tmp_path / "p.conf", env={})
