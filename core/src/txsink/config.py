"""Pipeline config files: load YAML (or TOML), interpolate ``${ENV}``, validate eagerly.

A pipeline file names a source, an optional SQL transform, a txsink sink, the
checkpoint, the trigger and Spark settings. Every problem is reported as a
:class:`~txsink.errors.ConfigError` whose ``field`` is the exact path in the file
(``sink.options.path``, ``trigger.processing_time``) and whose message says what
is allowed, before Spark starts. Nothing here imports Spark.

Example::

    name: demo
    source: {type: rate, options: {rowsPerSecond: 100}}
    transform: SELECT value AS id, value % 10 AS key FROM source
    sink:
      backend: files
      sink_id: demo
      options: {path: out/demo, format: jsonl}
    checkpoint: out/demo-checkpoint
    trigger: {processing_time: 1 second}
"""

from __future__ import annotations

import difflib
import glob
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from txsink.errors import ConfigError
from txsink.model import DeliveryGuarantee, validate_sink_id
from txsink.plugins import Plugins, get_plugins
from txsink.redact import redact
from txsink.targets import GROUP_BACKEND, TargetSpec, encode_targets, parse_targets

if TYPE_CHECKING:
    from txsink.backend import Backend

#: Name of the temporary view the source is registered as, for the SQL transform.
SOURCE_VIEW = "source"

TOP_LEVEL = ("name", "mode", "source", "transform", "sink", "checkpoint", "trigger", "spark")
MODES = ("streaming", "batch")
#: ``rate``: Spark's rate source; ``files``: a directory of JSON/CSV/Parquet files;
#: ``spark``: any Spark source by ``format`` (e.g. ``kafka``), options passed through.
SOURCE_TYPES = ("rate", "files", "spark")
FILE_FORMATS = ("json", "csv", "parquet")
TRIGGERS = ("processing_time", "once", "available_now", "real_time")

_ENV_REF = re.compile(r"\$(?:\$|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\})")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|milliseconds?|s|secs?|seconds?|m|mins?"
                       r"|minutes?|h|hours?)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class SourceConfig:
    type: str
    format: str | None = None
    path: str | None = None
    schema: str | None = None
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SinkConfig:
    backend: str
    sink_id: str
    options: Mapping[str, str] = field(default_factory=dict)
    #: Option keys the backend declares secret: never printed.
    secret_options: frozenset[str] = frozenset()
    guarantee: DeliveryGuarantee = DeliveryGuarantee.EXACTLY_ONCE
    #: A group of targets (``sink.targets``); ``backend`` is then ``group``.
    targets: tuple[TargetSpec, ...] = ()
    #: Secret option keys per target.
    target_secrets: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def safe_options(self) -> dict[str, str]:
        """Options fit to print: secret ones masked, URL and ``password=`` secrets scrubbed."""
        return {k: ("***" if k in self.secret_options else redact(v))
                for k, v in self.options.items()}

    def safe_target_options(self, name: str) -> dict[str, str]:
        secret = self.target_secrets.get(name, frozenset())
        spec = next(t for t in self.targets if t.name == name)
        return {k: ("***" if k in secret else redact(v)) for k, v in spec.options.items()}


@dataclass(frozen=True)
class TriggerConfig:
    """``kind`` is ``default`` (as fast as possible), ``processing_time``, ``once``,
    ``available_now`` or ``real_time`` (Spark's Real-time Mode, docs/realtime.md);
    ``interval`` is set for ``processing_time`` and ``real_time`` (its batch length)."""

    kind: str = "default"
    interval: str | None = None

    @property
    def interval_ms(self) -> int | None:
        """The processing-time interval in milliseconds, or None for other kinds."""
        if self.kind != "processing_time" or self.interval is None:
            return None
        return duration_ms(self.interval)


_UNIT_MS = {"ms": 1, "millisecond": 1, "s": 1000, "sec": 1000, "second": 1000,
            "m": 60_000, "min": 60_000, "minute": 60_000, "h": 3_600_000, "hour": 3_600_000}


def duration_ms(text: str) -> int:
    """``'500 milliseconds'``, ``'5 seconds'``, ``'1.5 min'`` -> milliseconds."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"not a duration: {text!r}")
    number = float(match.group(1))
    unit = match.group(2).lower()
    if unit not in _UNIT_MS:
        unit = unit.rstrip("s")
    return round(number * _UNIT_MS[unit])


@dataclass(frozen=True)
class SparkConfig:
    master: str = "local[*]"
    app_name: str = "txsink"
    conf: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PipelineConfig:
    name: str
    mode: str
    source: SourceConfig
    sink: SinkConfig
    checkpoint: str
    transform: str | None = None
    trigger: TriggerConfig = field(default_factory=TriggerConfig)
    spark: SparkConfig = field(default_factory=SparkConfig)
    path: str | None = None

    def sink_write_options(self) -> dict[str, str]:
        """Options for ``format("txsink")`` (secrets included: they go to Spark only)."""
        if self.sink.targets:
            return {"sink_id": self.sink.sink_id, "targets": encode_targets(self.sink.targets),
                    "checkpointLocation": self.checkpoint}
        return {"backend": self.sink.backend, "sink_id": self.sink.sink_id,
                "checkpointLocation": self.checkpoint,
                "guarantee": self.sink.guarantee.value, **self.sink.options}

    def create_backend(self, plugins: Plugins | None = None,
                       extra: Mapping[str, Mapping[str, str]] | None = None) -> Backend:
        """The sink's backend (a group's: one per target). ``extra`` adds options per
        target name (for a single-target sink, under the sink id)."""
        registry = plugins if plugins is not None else get_plugins()
        extra = extra or {}
        if self.sink.targets:
            from dataclasses import replace

            from txsink.group import TargetGroup

            specs = [replace(t, options={**t.options, **extra.get(t.name, {})})
                     for t in self.sink.targets]
            return TargetGroup.from_specs(self.sink.sink_id, specs, registry)
        return registry.create_backend(self.sink.backend, {
            **self.sink.options, **extra.get(self.sink.sink_id, {})})

    def sink_error(self, exc: ConfigError, more: str = "") -> ConfigError:
        """A backend's refusal as ``run`` and ``validate`` print it: under the pipeline
        file's field (``sink.options.<key>``, a group's ``sink.targets[<name>]...``)."""
        if self.sink.targets:
            where = f"sink.{exc.field}" if exc.field else "sink.targets"
        else:
            where = f"sink.options.{exc.field}" if exc.field else "sink"
        return type(exc)(f"{where}: {exc}{more}", field=where, sink_id=self.sink.sink_id)

    def check_settings(self, plugins: Plugins | None = None) -> None:
        """The backends' checks of their settings that need no server
        (:meth:`~txsink.backend.Backend.check_settings`): ``txsink validate`` refuses what
        ``run`` would refuse in its preflight, with the same line. Real-time targets are
        built and checked by :mod:`txsink.realtime.config` instead."""
        if self.trigger.kind == "real_time":
            return
        backend = self.create_backend(plugins)
        try:
            backend.check_settings(self.sink.sink_id)
        except ConfigError as exc:
            raise self.sink_error(exc) from None
        finally:
            backend.close()

    def summary(self) -> str:
        src = self.source.type + (f" {self.source.format}" if self.source.format else "")
        if self.source.path:
            src += f" at {self.source.path}"
        opts = ", ".join(f"{k}={v}" for k, v in sorted(self.sink.safe_options().items()))
        steps = [f"source: {src}"]
        if self.transform:
            steps.append("transform: SQL")
        guarantee = ("" if self.sink.guarantee.transactional
                     else f", guarantee={self.sink.guarantee.value}")
        if self.sink.targets:
            targets = "; ".join(
                f"{t.name}: {t.backend}" + (" (shaped)" if t.shaped else "") + "".join(
                    f", {k}={v}" for k, v in sorted(self.sink.safe_target_options(
                        t.name).items()))
                for t in self.sink.targets)
            steps.append(f"sink: group sink_id={self.sink.sink_id}, {self._group_words()} "
                         f"over {len(self.sink.targets)} targets [{targets}]")
        else:
            steps.append(f"sink: {self.sink.backend} (sink_id={self.sink.sink_id}{guarantee}"
                         + (f", {opts}" if opts else "") + ")")
        return (f"pipeline {self.name!r} ({self.mode}): " + " -> ".join(steps)
                + f"; checkpoint {self.checkpoint}")


    def _group_words(self) -> str:
        if self.trigger.kind == "real_time":
            return "real-time mode, each by its own stored source positions,"
        return "one decision per epoch"

    def header_lines(self, width: int = 100) -> list[str]:
        """``txsink run``'s header: :meth:`summary`, except that a group gets one short
        line per target (its one-line summary ran to several terminal lines)."""
        if not self.sink.targets:
            return [self.summary()]
        src = self.source.type + (f" {self.source.format}" if self.source.format else "")
        if self.source.path:
            src += f" at {self.source.path}"
        lines = [f"pipeline {self.name!r} ({self.mode}): source: {src}"
                 + (" -> transform: SQL" if self.transform else "")
                 + f" -> group sink_id={self.sink.sink_id}, {self._group_words()} over "
                 f"{len(self.sink.targets)} targets; checkpoint {self.checkpoint}"]
        for t in self.sink.targets:
            opts = ", ".join(f"{k}={v}" for k, v in sorted(
                self.sink.safe_target_options(t.name).items()))
            line = f"  target {t.name}: {t.backend}" + (" (shaped)" if t.shaped else "") + (
                f" ({opts})" if opts else "")
            lines.append(line if len(line) <= width else line[:width - 3] + "...")
        return lines


# -- loading -----------------------------------------------------------------------------


#: The pipeline file formats, by suffix.
PIPELINE_SUFFIXES = (".yaml", ".yml", ".toml", ".json")


def read_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a YAML (``.yaml``/``.yml``), TOML (``.toml``) or JSON (``.json``) file into a
    mapping; any other suffix is refused (it would be read as YAML, silently)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"pipeline file {str(p)!r} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"cannot read pipeline file {str(p)!r}: {exc.strerror}") from None
    suffix = p.suffix.lower()
    if suffix not in PIPELINE_SUFFIXES:
        raise ConfigError(f"pipeline file {str(p)!r}: unknown kind of file {suffix or '(none)'!r}"
                          f"; name it {', '.join(PIPELINE_SUFFIXES[:-1])} or "
                          f"{PIPELINE_SUFFIXES[-1]} after its format")
    if suffix == ".toml":
        data = _parse_toml(text, p)
    elif suffix == ".json":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"pipeline file {str(p)!r} is not valid JSON: {exc}") from None
    else:
        data = _parse_yaml(text, p)
    if data is None:
        raise ConfigError(f"pipeline file {str(p)!r} is empty")
    if not isinstance(data, dict):
        raise ConfigError(f"pipeline file {str(p)!r} must hold a mapping (source, sink, ...), "
                          f"not a {_type_name(data)}")
    return data


def _parse_yaml(text: str, path: Path) -> Any:
    try:
        import yaml
    except ImportError:  # pragma: no cover - the yaml extra is part of the default install
        raise ConfigError("reading YAML pipeline files needs PyYAML (txsink's spark or yaml "
                          "extra): pip install pyyaml") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}: invalid YAML{where}: {problem}") from None


def _parse_toml(text: str, path: Path) -> Any:
    if sys.version_info >= (3, 11):
        import tomllib as toml
    else:  # pragma: no cover - Python 3.10
        try:
            import tomli as toml  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            raise ConfigError("reading TOML pipeline files on Python 3.10 needs tomli: "
                              "pip install tomli") from None
    try:
        return toml.loads(text)
    except toml.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None


def interpolate(value: Any, env: Mapping[str, str], path: str = "") -> Any:
    """Replace ``${NAME}`` / ``${NAME:-default}`` in every string; ``$$`` is a literal ``$``.

    A reference to an unset variable without a default is an error naming the field.
    """
    if isinstance(value, dict):
        return {k: interpolate(v, env, _join(path, str(k))) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env, f"{path}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def replace(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name, default = m.group("name"), m.group("default")
        if name in env:
            return env[name]
        if default is not None:
            return default
        raise ConfigError(f"{path}: environment variable {name} is not set (referenced as "
                          f"${{{name}}}); set it, or write ${{{name}:-default}}", field=path)

    return _ENV_REF.sub(replace, value)


def load_pipeline(
    path: str | os.PathLike[str],
    *,
    env: Mapping[str, str] | None = None,
    plugins: Plugins | None = None,
    check_backend: bool = True,
) -> PipelineConfig:
    """Read, interpolate and validate a pipeline file (no Spark, no data written)."""
    raw = read_file(path)
    data = interpolate(raw, os.environ if env is None else env)
    return parse_pipeline(data, name_default=Path(path).stem, source_path=str(path),
                          plugins=plugins, check_backend=check_backend)


def parse_pipeline(
    data: Mapping[str, Any],
    *,
    name_default: str = "pipeline",
    source_path: str | None = None,
    plugins: Plugins | None = None,
    check_backend: bool = True,
) -> PipelineConfig:
    """Validate an already interpolated mapping; see :func:`load_pipeline`."""
    _check_keys(data, TOP_LEVEL, "")
    name = _str(data, "name", "", default=name_default)
    mode = _choice(data, "mode", "", MODES, default="streaming")
    source = _source(_mapping(data, "source", "", required=True), mode)
    transform = data.get("transform")
    if transform is not None and (not isinstance(transform, str) or not transform.strip()):
        raise ConfigError(f"transform: must be a SQL query over the view {SOURCE_VIEW!r}, e.g. "
                          f"'SELECT * FROM {SOURCE_VIEW}', got {_type_name(transform)}",
                          field="transform")
    trigger = _trigger(data.get("trigger"), mode)
    if trigger.kind == "real_time":  # docs/realtime.md: exactly once by source position
        sink = _realtime_sink(_mapping(data, "sink", "", required=True), plugins,
                              check_backend)
    else:
        sink = _sink(_mapping(data, "sink", "", required=True), plugins, check_backend,
                     trigger.interval_ms)
    checkpoint = _str(data, "checkpoint", "", required=True)
    spark = _spark(_mapping(data, "spark", ""), name)
    return PipelineConfig(
        name=name, mode=mode, source=source, sink=sink,
        checkpoint=os.path.abspath(checkpoint) if "://" not in checkpoint else checkpoint,
        transform=transform.strip() if isinstance(transform, str) else None,
        trigger=trigger, spark=spark, path=source_path,
    )


def check_source_exists(cfg: PipelineConfig) -> None:
    """Refuse a local source path that does not exist, before Spark starts and before the
    sink claims anything (Spark's own error came minutes later, after the claim).
    Remote paths (``s3a://``, ...) are Spark's to check; a glob must match something,
    read as Hadoop reads it (``{a,b}`` alternatives too)."""
    path = cfg.source.path
    if cfg.source.type == "rate" or not path:
        return
    local = _local_path(path)
    if local is None:
        return
    if not any(glob.glob(p) for p in _alternatives(local)):
        here = "" if os.path.isabs(local) else f" (relative to {os.getcwd()})"
        raise ConfigError(f"source.path: {path!r} does not exist{here}; create it, or fix "
                          "the path", field="source.path")


def _local_path(path: str) -> str | None:
    """The local file system path of a source path: ``file:///x``, ``file:/x`` (Hadoop's
    own spelling) and ``file://localhost/x`` are ``/x``; None for another file system."""
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]+):", path)
    if scheme is None:
        return path
    if scheme.group(1).lower() != "file":
        return None
    rest = path[scheme.end():]
    if rest.startswith("//"):
        host, _, tail = rest[2:].partition("/")
        if host not in ("", "localhost"):
            return None
        rest = "/" + tail
    return rest


def _alternatives(pattern: str) -> list[str]:
    """Hadoop's ``{a,b}`` alternatives of a glob, spelled out (Python's glob has none)."""
    depth, start = 0, 0
    for i, ch in enumerate(pattern):
        if ch == "{":
            start = i if depth == 0 else start
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0:
                parts, level, last = [], 0, start + 1
                for j in range(start + 1, i):
                    c = pattern[j]
                    level += (c == "{") - (c == "}")
                    if c == "," and level == 0:
                        parts.append(pattern[last:j])
                        last = j + 1
                parts.append(pattern[last:i])
                return [alt for part in parts
                        for alt in _alternatives(pattern[:start] + part + pattern[i + 1:])]
    return [pattern]


# -- sections ----------------------------------------------------------------------------


def _source(data: Mapping[str, Any], mode: str) -> SourceConfig:
    kind = _choice(data, "type", "source", SOURCE_TYPES, required=True)
    options = _scalars(data, "options", "source")
    if kind == "rate":
        _check_keys(data, ("type", "options"), "source")
        if mode == "batch":
            raise ConfigError("source.type: the rate source is streaming only; use "
                              "mode: streaming, or a files source for batch",
                              field="source.type")
        return SourceConfig("rate", options=options)
    if kind == "files":
        _check_keys(data, ("type", "path", "format", "schema", "options"), "source")
        return SourceConfig(
            "files",
            format=_choice(data, "format", "source", FILE_FORMATS, required=True),
            path=_str(data, "path", "source", required=True),
            schema=_str(data, "schema", "source", default=None),
            options=options,
        )
    _check_keys(data, ("type", "format", "path", "schema", "options"), "source")
    return SourceConfig(
        "spark",
        format=_str(data, "format", "source", required=True),
        path=_str(data, "path", "source", default=None),
        schema=_str(data, "schema", "source", default=None),
        options=options,
    )


def _sink(data: Mapping[str, Any], plugins: Plugins | None, check_backend: bool,
          trigger_ms: int | None = None) -> SinkConfig:
    _check_keys(data, ("backend", "sink_id", "guarantee", "options", "targets"), "sink")
    if "targets" in data:
        return _group_sink(data, plugins, check_backend, trigger_ms)
    backend = _str(data, "backend", "sink", required=True)
    sink_id = _sink_id(data)
    guarantee = DeliveryGuarantee.parse(data.get("guarantee", "exactly_once"),
                                        field_name="sink.guarantee")
    # Spark lower-cases option keys: validate what the backend will really receive.
    options = {k.lower(): v for k, v in _scalars(data, "options", "sink").items()}
    secret: frozenset[str] = frozenset()
    if check_backend:
        registry = plugins if plugins is not None else get_plugins()
        try:
            cls = registry.backend_class(backend)
        except ConfigError as exc:
            raise ConfigError(f"sink.backend: {exc}", field="sink.backend") from None
        secret = frozenset(cls.secret_options)
        try:
            cls.check_guarantee(guarantee)
        except ConfigError as exc:
            raise ConfigError(f"sink.guarantee: {exc}", field="sink.guarantee") from None
        if trigger_ms is not None:
            # The trigger lives in the pipeline file, not in the sink options: hand the
            # backend what it needs to check its timeouts against it (user settings win).
            derived = {k.lower(): v for k, v in cls.trigger_options(trigger_ms).items()}
            options = {**derived, **options}
        try:
            cls.from_options(options).close()
        except ConfigError as exc:
            inner = exc.field or ""
            where = f"sink.options.{inner}" if inner else "sink.options"
            raise ConfigError(f"{where}: {exc}", field=where) from None
    return SinkConfig(backend, sink_id, options, secret, guarantee)


def _realtime_sink(data: Mapping[str, Any], plugins: Plugins | None,
                   check_backend: bool) -> SinkConfig:
    """``sink`` for ``trigger: {real_time: ...}``: one backend's real-time target."""
    from txsink.realtime.config import (
        COMMIT_INTERVAL,
        check_realtime_sink,
        check_realtime_target,
        check_single_sink_id,
    )

    guarantee = DeliveryGuarantee.parse(data.get("guarantee", "exactly_once"),
                                        field_name="sink.guarantee")
    _check_keys(data, ("backend", "sink_id", "guarantee", "options", "targets"), "sink")
    check_realtime_sink(data, guarantee)
    sink_id = _sink_id(data)
    options = {k.lower(): v for k, v in _scalars(data, "options", "sink").items()}
    interval = options.get(COMMIT_INTERVAL)
    if interval is not None and (not _DURATION.match(interval) or duration_ms(interval) <= 0):
        raise ConfigError(f"sink.options.{COMMIT_INTERVAL}: must be a positive duration such "
                          f"as '250 milliseconds', got {interval!r}",
                          field=f"sink.options.{COMMIT_INTERVAL}")
    if "targets" in data:  # a group: each target exactly once by its own positions
        from txsink.realtime.config import parse_realtime_targets

        specs = parse_realtime_targets(data["targets"], sink_id, prefix="sink.targets",
                                       plugins=plugins, check_backend=check_backend)
        secrets: dict[str, frozenset[str]] = {}
        if check_backend:
            registry = plugins if plugins is not None else get_plugins()
            secrets = {t.name: frozenset(registry.backend_class(t.backend).secret_options)
                       | {"password"} for t in specs}
        return SinkConfig(GROUP_BACKEND, sink_id, options, frozenset(), guarantee, specs,
                          secrets)
    backend = _str(data, "backend", "sink", required=True)
    check_single_sink_id(sink_id)
    secret: frozenset[str] = frozenset()
    if check_backend:
        registry = plugins if plugins is not None else get_plugins()
        try:
            cls = registry.backend_class(backend)
        except ConfigError as exc:
            raise ConfigError(f"sink.backend: {exc}", field="sink.backend") from None
        secret = frozenset(cls.secret_options) | {"password"}
        check_realtime_target(cls, backend, sink_id, options)
    return SinkConfig(backend, sink_id, options, secret, guarantee)


def _sink_id(data: Mapping[str, Any]) -> str:
    if "sink_id" not in data or data["sink_id"] in (None, ""):
        raise ConfigError("sink.sink_id: required: a globally unique name for this output, "
                          "e.g. 'orders-to-parquet' (it becomes part of transaction ids, "
                          "object keys and file names)", field="sink.sink_id")
    if not isinstance(data["sink_id"], str):
        raise ConfigError(f"sink.sink_id: must be a string, got {_type_name(data['sink_id'])}",
                          field="sink.sink_id")
    try:
        return validate_sink_id(data["sink_id"], field_name="sink.sink_id")
    except ConfigError as exc:
        raise ConfigError(str(exc), field="sink.sink_id") from None


def _group_sink(data: Mapping[str, Any], plugins: Plugins | None, check_backend: bool,
                trigger_ms: int | None) -> SinkConfig:
    """``sink.targets``: a group of targets, one decision per epoch over all of them."""
    for key in ("backend", "options"):
        if key in data:
            raise ConfigError(f"sink.{key}: a sink with targets names a backend and options "
                              "per target (sink.targets[...].backend, .options); remove "
                              f"sink.{key}", field=f"sink.{key}")
    sink_id = _sink_id(data)
    guarantee = DeliveryGuarantee.parse(data.get("guarantee", "exactly_once"),
                                        field_name="sink.guarantee")
    try:
        specs = parse_targets(data["targets"], sink_id, prefix="sink.targets", plugins=plugins,
                              check_backend=check_backend, guarantee=guarantee,
                              trigger_ms=trigger_ms)
    except ConfigError as exc:
        field_ = exc.field if (exc.field or "").startswith("sink.") else f"sink.{exc.field}"
        message = str(exc) if str(exc).startswith("sink.") else f"sink.{exc}"
        raise ConfigError(message, field=field_) from None
    secrets: dict[str, frozenset[str]] = {}
    if check_backend:
        registry = plugins if plugins is not None else get_plugins()
        secrets = {t.name: frozenset(registry.backend_class(t.backend).secret_options)
                   for t in specs}
    return SinkConfig(GROUP_BACKEND, sink_id, {}, frozenset(), guarantee, specs, secrets)


def _trigger(value: Any, mode: str) -> TriggerConfig:
    if value is None:
        return TriggerConfig()
    if not isinstance(value, dict):
        raise ConfigError(
            "trigger: must be a mapping with one of "
            f"{', '.join(TRIGGERS)}, e.g. {{processing_time: 5 seconds}}; got "
            f"{_type_name(value)}", field="trigger")
    _check_keys(value, TRIGGERS, "trigger")
    set_keys = [k for k in TRIGGERS if value.get(k) not in (None, False)]
    if len(set_keys) != 1:
        raise ConfigError(f"trigger: set exactly one of {', '.join(TRIGGERS)} (got "
                          f"{', '.join(set_keys) or 'none'})", field="trigger")
    kind = set_keys[0]
    if mode == "batch":
        raise ConfigError("trigger: only streaming pipelines have a trigger; remove it for "
                          "mode: batch", field="trigger")
    if kind in ("processing_time", "real_time"):
        interval = value[kind]
        if isinstance(interval, (int, float)) and not isinstance(interval, bool):
            interval = f"{interval} seconds"
        if not isinstance(interval, str) or not _DURATION.match(interval):
            raise ConfigError(
                f"trigger.{kind}: must be a duration such as '500 milliseconds', "
                f"'5 seconds' or '1 minute', or a number of seconds; got {interval!r}",
                field=f"trigger.{kind}")
        return TriggerConfig(kind, interval.strip())
    if value[kind] is not True:
        raise ConfigError(f"trigger.{kind}: must be true, got {value[kind]!r}",
                          field=f"trigger.{kind}")
    return TriggerConfig(kind)


def _spark(data: Mapping[str, Any], name: str) -> SparkConfig:
    _check_keys(data, ("master", "app_name", "conf"), "spark")
    return SparkConfig(
        master=_str(data, "master", "spark", default="local[*]"),
        app_name=_str(data, "app_name", "spark", default=f"txsink-{name}"),
        conf=_scalars(data, "conf", "spark"),
    )


# -- small validators --------------------------------------------------------------------


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _type_name(value: Any) -> str:
    return {dict: "a mapping", list: "a list", bool: "a boolean", int: "a number",
            float: "a number", str: "a string", type(None): "nothing"}.get(
        type(value), type(value).__name__)


def _check_keys(data: Mapping[str, Any], allowed: tuple[str, ...], prefix: str) -> None:
    for key in data:
        if key not in allowed:
            where = _join(prefix, str(key))
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{where}: unknown field{hint}; allowed here: "
                              f"{', '.join(allowed)}", field=where)


def _missing(data: Mapping[str, Any], key: str, where: str) -> ConfigError:
    """``where: required``, naming a key beside it that looks like a misspelling of it."""
    close = [k for k in data if isinstance(k, str) and k != key
             and difflib.get_close_matches(k, [key], n=1)]
    hint = f" ({_join(where.rpartition('.')[0], close[0])!r} is there: did you mean " \
        f"{key!r}?)" if close else ""
    return ConfigError(f"{where}: required{hint}", field=where)


def _mapping(data: Mapping[str, Any], key: str, prefix: str, *,
             required: bool = False) -> dict[str, Any]:
    where = _join(prefix, key)
    value = data.get(key)
    if value is None:
        if required:
            raise _missing(data, key, where)
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: must be a mapping, got {_type_name(value)}", field=where)
    return value


def _str(data: Mapping[str, Any], key: str, prefix: str, *, required: bool = False,
         default: Any = "") -> Any:
    where = _join(prefix, key)
    value = data.get(key)
    if value is None or value == "":
        if required:
            raise _missing(data, key, where)
        return default
    if not isinstance(value, str):
        raise ConfigError(f"{where}: must be a string, got {_type_name(value)} {value!r}",
                          field=where)
    return value


def _choice(data: Mapping[str, Any], key: str, prefix: str, allowed: tuple[str, ...], *,
            required: bool = False, default: str | None = None) -> str:
    where = _join(prefix, key)
    value = _str(data, key, prefix, required=required, default=default)
    if value not in allowed:
        raise ConfigError(f"{where}: must be one of {', '.join(allowed)}; got {value!r}",
                          field=where)
    assert isinstance(value, str)
    return value


def _scalars(data: Mapping[str, Any], key: str, prefix: str) -> dict[str, str]:
    """A mapping of option name -> string; numbers and booleans are converted as Spark does."""
    out: dict[str, str] = {}
    where = _join(prefix, key)
    for k, v in _mapping(data, key, prefix).items():
        here = f"{where}.{k}"
        if isinstance(v, bool):
            out[str(k)] = "true" if v else "false"
        elif isinstance(v, (int, float, str)):
            out[str(k)] = str(v)
        else:
            raise ConfigError(f"{here}: must be a string, number or boolean, got "
                              f"{_type_name(v)}", field=here)
    return out
