"""The run loop of a batch pipeline: one write, one new epoch (or one per
target group decision), its lines printed once the write returns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from txsink.config import PipelineConfig
from txsink.spark.frames import native_targets
from txsink.spark.report import Printer, RunResult, committed_since, epoch_line
from txsink.state import EpochState, StateStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def run_batch(frame: DataFrame, cfg: PipelineConfig, store: StateStore,
              out: Printer, extra_options: dict[str, str] | None = None) -> RunResult:
    seen = {e for e, state in store.states().items() if state is EpochState.COMMITTED}
    native = native_targets(cfg, extra_options, stream=False)
    if native is not None:
        native.write(frame)
    else:
        options = {**cfg.sink_write_options(), **(extra_options or {})}
        frame.write.format("txsink").mode("append").options(**options).save()
    result = RunResult(stopped_because="batch write finished")
    for record in committed_since(store, seen):
        out(epoch_line(record, None))
        result.add(record)
    return result
