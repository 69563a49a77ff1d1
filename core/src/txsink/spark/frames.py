"""The frame a run writes, and which data path writes it.

txsink's data source (``format("txsink")``) takes the frame shaped by the sink;
Spark's own Parquet writer (the native path, :class:`~txsink.spark.group.TargetSet`)
takes it as the transform made it and applies each target's select/where itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from txsink.config import PipelineConfig
from txsink.model import DeliveryGuarantee
from txsink.spark.group import TargetSet
from txsink.targets import TargetSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def build_frame(spark: SparkSession, cfg: PipelineConfig, *, shaped: bool = True
                ) -> DataFrame:
    """Source plus transform; Spark's complaints about either name the field at fault.
    ``shaped=False``: a group's frame as the transform made it (checked all the same),
    for the native path, which applies each target's select/where itself."""
    from txsink.spark.checks import build_checked_frame

    return build_checked_frame(spark, cfg, shaped=shaped)


def pipeline_frame(spark: SparkSession, cfg: PipelineConfig,
                   extra_options: Mapping[str, str] | None) -> DataFrame:
    """The frame ``txsink run`` writes: shaped for txsink's data source, or, for a group
    on the native path (:class:`TargetSet`, which applies each target's select/where in
    its own job), as the transform made it. Seen: shaped, the native path applied a
    target's ``select`` to the shaped columns and the first batch failed
    (UNRESOLVED_COLUMN)."""
    native = bool(cfg.sink.targets) and native_targets(
        cfg, extra_options, stream=cfg.mode != "batch") is not None
    return build_frame(spark, cfg, shaped=not native)


def sink_targets(cfg: PipelineConfig) -> TargetSet:
    """The pipeline's sink as a :class:`TargetSet` (a group, or one sink)."""
    if cfg.sink.targets:
        return TargetSet(cfg.sink.sink_id, cfg.sink.targets,
                         checkpoint_location=cfg.checkpoint)
    spec = TargetSpec(cfg.sink.sink_id, cfg.sink.backend, dict(cfg.sink.options))
    return TargetSet(cfg.sink.sink_id, [spec], checkpoint_location=cfg.checkpoint,
                     single=True)


def native_targets(cfg: PipelineConfig, extra_options: Mapping[str, str] | None, *,
                   stream: bool) -> TargetSet | None:
    """The sink as a :class:`TargetSet` when Spark's own Parquet writer writes it (a
    table format, or files in Parquet; the native data path, ``TargetSet.write`` /
    ``write_stream``): a group with such a target, or such a single sink with the
    exactly-once guarantee. Not under Spark Connect (``extra_options`` carry the lease
    owner there), and not for a stream whose state a stream already wrote through
    txsink's data source: those pipelines keep the data source path."""
    if extra_options:
        return None
    if not cfg.sink.targets and cfg.sink.guarantee is not DeliveryGuarantee.EXACTLY_ONCE:
        return None
    group = sink_targets(cfg)
    if not group.native():
        return None
    if stream and not group.native_stream():
        return None
    return group
