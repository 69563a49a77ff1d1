"""Real-time Mode: exactly-once output by source position (see ``docs/realtime.md``).

The engine side (:mod:`txsink.realtime.writer`) knows nothing about Spark; the
Spark adapter is :mod:`txsink.spark.realtime`; targets come from the backends
(``Backend.realtime_target``).
"""

from txsink.realtime.writer import (
    DEFAULT_COMMIT_INTERVAL_S,
    NOTHING,
    SESSIONS,
    PositionOrderError,
    PositionTarget,
    PositionWriter,
    RealtimeTargetSpec,
    SessionPool,
    SourcePartition,
    TargetFactory,
    WriterStats,
)

__all__ = ["DEFAULT_COMMIT_INTERVAL_S", "NOTHING", "SESSIONS", "PositionOrderError",
           "PositionTarget", "PositionWriter", "RealtimeTargetSpec", "SessionPool",
           "SourcePartition", "TargetFactory", "WriterStats"]
