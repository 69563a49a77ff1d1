"""Whether a real-time query holds a sink: the driver's heartbeat in its checkpoint.

A real-time pipeline has no txsink state and no lease; its sessions are claimed per
source partition inside the tasks. What an operator needs before ``txsink reset``, and
what ``txsink status`` shows, is whether a query is running on the checkpoint now. The
driver that started the query rewrites :data:`HOLDER_FILE` in Spark's checkpoint
directory every :data:`BEAT_S` seconds while the query is active, and marks it released
when the query ends. A driver killed stops beating: after :data:`STALE_AFTER_S` the
record says so instead of "held". No secret is in it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

#: The heartbeat record, beside the group's ``txsink-realtime.json``.
HOLDER_FILE = "txsink-realtime-holder.json"
#: How often the driver rewrites it.
BEAT_S = 5.0
#: A record not rewritten for this long belongs to a driver that is gone.
STALE_AFTER_S = 3 * BEAT_S


def holder_record(*, sink_id: str, query_id: str, run_id: str, host: str, pid: int,
                  started: float, beat: float, released: float | None = None,
                  ended: str | None = None) -> str:
    data: dict[str, Any] = {"sink_id": sink_id, "query_id": query_id, "run_id": run_id,
                            "host": host, "pid": pid, "started": started, "beat": beat,
                            "beat_s": BEAT_S}
    if released is not None:
        data["released"] = released
        data["ended"] = ended or "stopped"
    return json.dumps(data, sort_keys=True)


@dataclass(frozen=True)
class Holding:
    """What the record says now: ``held`` and one line of words."""

    held: bool
    line: str
    record: dict[str, Any] | None = None


def _ago(seconds: float) -> str:
    return f"{seconds:.0f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"


def holding(text: str | None, now: float | None = None) -> Holding:
    """Read a :data:`HOLDER_FILE` text (``None``: no file)."""
    if not text:
        return Holding(False, "no real-time query has run on this checkpoint")
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("beat"), (int, float)):
        return Holding(False, "unknown (the heartbeat record does not parse)")
    now = time.time() if now is None else now
    who = (f"query {data.get('query_id')} (driver pid {data.get('pid')} on host "
           f"{data.get('host')})")
    if isinstance(data.get("released"), (int, float)):
        return Holding(False, f"no query holds it: the last one, {who}, "
                              f"{data.get('ended', 'stopped')} {_ago(now - data['released'])}",
                       data)
    age = now - float(data["beat"])
    stale = float(data.get("beat_s") or BEAT_S) * 3
    if age > stale:
        return Holding(False, f"no query holds it: the last one, {who}, stopped beating "
                              f"{_ago(age)} without saying it ended (its driver died or was "
                              "killed)", data)
    return Holding(True, f"held by a running {who}, heartbeat {_ago(max(age, 0.0))}", data)


__all__ = ["BEAT_S", "HOLDER_FILE", "STALE_AFTER_S", "Holding", "holder_record", "holding"]
