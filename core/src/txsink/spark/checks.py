"""Spark's errors about a pipeline file, as one line naming the field at fault.

Spark finds some mistakes only once it looks at the source and the SQL: an
option it cannot parse (``rowsPerSecond: twenty``), a syntax error or an
unknown column in the transform. Building the source and analysing the
transform raises them without running a query, so ``txsink validate`` and
``txsink run`` both call :func:`build_checked_frame` and report the same line.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from txsink.config import SOURCE_VIEW, PipelineConfig
from txsink.errors import ConfigError
from txsink.spark.messages import _is_spark_error, spark_message

__all__ = ["_is_spark_error", "build_checked_frame", "build_source", "check_targets",
           "frame_columns", "source_error", "spark_message", "transform_error"]

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

def _option_field(cfg: PipelineConfig, message: str) -> str:
    """Which ``source.options`` key the message is about: by name, else by its value."""
    lowered = message.lower()
    for key in cfg.source.options:
        if re.search(rf"\b{re.escape(key.lower())}\b", lowered):
            return f"source.options.{key}"
    for key, value in cfg.source.options.items():
        if value and (f'"{value}"' in message or f"'{value}'" in message):
            return f"source.options.{key}"
    return "source.options" if cfg.source.options else "source"


def source_error(cfg: PipelineConfig, exc: Exception) -> ConfigError:
    message = spark_message(exc)
    field = _option_field(cfg, message)
    if field in ("source.options", "source"):
        if cfg.source.schema and ("schema" in str(exc).lower()
                                  or "data type" in message.lower()):
            field = "source.schema"
        elif "data source" in message.lower() or "DATA_SOURCE_NOT_FOUND" in str(exc):
            field = "source.format"
    return ConfigError(f"{field}: Spark refused the source: {message}", field=field)


def transform_error(exc: Exception) -> ConfigError:
    return ConfigError(f"transform: Spark cannot run this SQL over the view {SOURCE_VIEW!r}: "
                       f"{spark_message(exc)}", field="transform")


def register_named_source(spark: SparkSession, cfg: PipelineConfig) -> None:
    """Register the Python data source the pipeline's ``source.format`` names, when an
    installed txsink plugin ships it (``txsink_register_sources``; the Kafka backend's
    ``txsink-kafka``). Other formats are Spark's own or a jar's: Spark judges them."""
    from txsink.plugins import get_plugins
    from txsink.registry import KNOWN_SOURCES

    name = cfg.source.format
    if cfg.source.type != "spark" or not name:
        return
    found = get_plugins().source(name)
    if found is None:
        if name in KNOWN_SOURCES:
            raise ConfigError(f"source.format: {name!r} is a source of the "
                              f"{KNOWN_SOURCES[name]} package, which is not installed (with "
                              "its 'spark' extra)", field="source.format")
        return
    try:
        found.value(spark)
    except ImportError as exc:
        raise ConfigError(f"source.format: {name!r} comes from {found.origin}, which cannot "
                          f"load it here: {exc} (install the package's 'spark' extra)",
                          field="source.format") from exc


def build_source(spark: SparkSession, cfg: PipelineConfig) -> DataFrame:
    src = cfg.source
    register_named_source(spark, cfg)
    reader: Any = spark.readStream if cfg.mode == "streaming" else spark.read
    reader = reader.format("rate") if src.type == "rate" else reader.format(src.format)
    if src.schema:
        reader = reader.schema(src.schema)
    reader = reader.options(**src.options)
    df: DataFrame = reader.load(src.path) if src.path else reader.load()
    return df


def build_checked_frame(spark: SparkSession, cfg: PipelineConfig, *, shaped: bool = True
                        ) -> DataFrame:
    """Build the source and analyse the transform; Spark's complaints become ConfigErrors.

    Analysis is eager in Spark, so this finds parse errors, unknown columns and
    functions, and option values the source cannot parse, without reading data. A Spark
    Connect client builds plans lazily: asking for the schema has the server analyse
    them here too.
    """
    try:
        df = build_source(spark, cfg)
        df.schema  # noqa: B018 - analysed now (Spark Connect), not at the write
    except Exception as exc:
        if not _is_spark_error(exc):
            raise
        raise source_error(cfg, exc) from None
    if cfg.transform:
        df.createOrReplaceTempView(SOURCE_VIEW)
        try:
            df = spark.sql(cfg.transform)
            df.schema  # noqa: B018 - see above
        except Exception as exc:
            if not _is_spark_error(exc):
                raise
            raise transform_error(exc) from None
    if cfg.trigger.kind == "real_time":
        if cfg.sink.targets:
            check_targets(df, cfg, shape=False)
        return df  # start_realtime shapes a group's targets (the positions kept)
    return check_targets(df, cfg, shape=shaped) if cfg.sink.targets else df


def check_targets(df: DataFrame, cfg: PipelineConfig, *, shape: bool = True) -> DataFrame:
    """Analyse each target's ``where`` and ``select`` on its own, so an unknown column is
    one line naming the target; then the frame shaped for the group's tasks (``shape``;
    without it ``df`` itself: real-time groups and groups with a table target check and
    shape each target later)."""
    from txsink.spark.group import checked_shape

    for t in cfg.sink.targets:
        here = f"sink.targets[{t.name}]"
        part = df
        steps = [("where", t.where), ("select", None)] if t.where else [("select", None)]
        for key, condition in steps:
            if key == "select" and not t.select:
                continue
            try:
                part = part.where(condition) if condition else part.selectExpr(*t.select)
            except Exception as exc:
                if not _is_spark_error(exc):
                    raise
                raise ConfigError(f"{here}.{key}: Spark cannot apply it to the rows the sink "
                                  f"receives: {spark_message(exc)}", field=f"{here}.{key}"
                                  ) from None
    if not shape:
        return df
    return checked_shape(df, cfg.sink.targets, cfg.sink.sink_id, prefix="sink.targets")


def frame_columns(df: DataFrame, cfg: PipelineConfig) -> list[str]:
    """The output columns, per target for a group (``txsink validate`` prints them)."""
    from txsink.targets import ROUTE_PREFIX

    fields = df.schema.fields
    if not cfg.sink.targets:
        return [f"{f.name} {f.dataType.simpleString()}" for f in fields]
    if not any(f.name.startswith(ROUTE_PREFIX) for f in fields):
        cols = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in fields)
        return [f"{t.name} ({cols})" for t in cfg.sink.targets]
    out = []
    for f in fields:
        name = f.name[len(ROUTE_PREFIX):]
        inner = ", ".join(f"{c.name} {c.dataType.simpleString()}"
                          for c in f.dataType.fields)  # type: ignore[attr-defined]
        epoch = next((t.epoch_column for t in cfg.sink.targets if t.name == name), None)
        out.append(f"{name} ({inner}" + (f", {epoch} bigint" if epoch else "") + ")")
    return out
