"""Real-time Mode: exactly-once output by source position (see ``docs/realtime.md``).

The engine side (:mod:`txsink.realtime.writer`) knows nothing about Spark; the
Spark adapter is :mod:`txsink.spark.realtime`; targets come from the backends
(``Backend.realtime_target``), and so does what identifies the source's topics
(``Backend.realtime_source``: :mod:`txsink.realtime.source`).
"""

from txsink.realtime.positions import NOTHING, SourcePartition, StoredPosition
from txsink.realtime.source import SourceTopics
from txsink.realtime.writer import (
    DEFAULT_COMMIT_INTERVAL_S,
    SESSIONS,
    GroupWriter,
    PositionOrderError,
    PositionTarget,
    PositionWriter,
    RealtimeTargetSpec,
    SessionPool,
    TargetFactory,
    WriterStats,
    older_run_refusal,
)

__all__ = ["DEFAULT_COMMIT_INTERVAL_S", "NOTHING", "SESSIONS", "GroupWriter",
           "PositionOrderError", "PositionTarget", "PositionWriter", "RealtimeTargetSpec",
           "SessionPool", "SourcePartition", "SourceTopics", "StoredPosition", "TargetFactory",
           "WriterStats", "older_run_refusal"]
