"""A group of real-time targets: what a run may start with, judged before data moves.

Each target of a real-time group is exactly once by its own stored positions; nothing
decides across targets. What can still go wrong is a target that starts *behind* the
others where Spark will not replay: Spark resumes from its checkpoint, so a target
added to a group that has run (or whose positions were wiped, or that was removed and
is back) would never receive the records the other targets already hold. These
checks find that from two things only: every target's stored positions, and a small
record of the group's targets that txsink keeps in Spark's checkpoint directory
(:data:`MEMBERS_FILE`). No Spark here (the adapter reads the checkpoint).

A target records a position for a source partition when it *claims* it (PostgreSQL: a
progress row; Kafka: a marker at offset -1), and every target of a group claims a
source partition before any of them commits a row of it: a crash between two
targets' commits never leaves one target without a position that another holds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from txsink.errors import ConfigError
from txsink.realtime.identity import moved_refusal
from txsink.realtime.positions import NOTHING, SourcePartition
from txsink.realtime.writer import RealtimeTargetSpec

#: The group's record in Spark's checkpoint directory (Spark ignores files it does not
#: know there).
MEMBERS_FILE = "txsink-realtime.json"


@dataclass(frozen=True)
class StartPoint:
    """Where Spark starts this run: ``fresh`` when the checkpoint holds no offsets yet
    (Spark starts from the source's ``startingOffsets``), ``earliest`` when that option
    is ``earliest`` (every record the source retains is replayed)."""

    fresh: bool
    earliest: bool

    @property
    def replays_everything(self) -> bool:
        return self.fresh and self.earliest


def members_record(group_id: str, backends: Mapping[str, str],
                   specs: Mapping[str, RealtimeTargetSpec]) -> str:
    """The :data:`MEMBERS_FILE` text: each target's backend, destination and place (no
    secret). A single sink records itself as the one target named ``""``."""
    return json.dumps({"sink_id": group_id, "targets": {
        name: {"backend": backends[name], "place": spec.place(),
               "destination": spec.destination(), "sink_id": spec.sink_id}
        for name, spec in specs.items()}}, indent=1, sort_keys=True)


def target_field(prefix: str, name: str) -> str:
    """Where errors about target ``name`` point: ``sink.targets[name]``; a single sink
    (``name`` empty) is ``sink`` in a pipeline file, nothing from Python."""
    if name:
        return f"{prefix}[{name}]"
    return "sink" if prefix.startswith("sink") else ""


def options_field(prefix: str, name: str) -> str:
    here = target_field(prefix, name)
    return f"{here}.options" if here else "options"


def read_members(text: str | None) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) and isinstance(data.get("targets"), dict) else None


_WAY_OUT = ("start the group on a new checkpoint with the source option "
            "startingOffsets=earliest (every target skips the records it holds; this one "
            "receives every record the source still retains), or write it as a sink of its "
            "own; nothing was written")


def start_refusal(group_id: str, backends: Mapping[str, str],
                  specs: Mapping[str, RealtimeTargetSpec],
                  positions: Mapping[str, Mapping[SourcePartition, int]],
                  recorded: Mapping[str, Any] | None, start: StartPoint, *,
                  prefix: str = "targets") -> tuple[ConfigError | None, list[str]]:
    """The refusal of this run, if a target would miss records another target holds;
    else ``None`` and the warnings to log (a target catching up, a target removed).

    ``positions``: each target's stored positions (``NOTHING``: claimed, nothing
    committed). ``recorded``: the checkpoint's :data:`MEMBERS_FILE`, if any.
    """
    warnings: list[str] = []
    names = list(specs)
    if recorded is not None and recorded.get("sink_id") != group_id:
        recorded = None  # another sink's checkpoint: its targets are not these
    if recorded is not None and not start.fresh:
        before: Mapping[str, Any] = recorded.get("targets", {})
        for name in names:
            here = target_field(prefix, name) or "sink_id"
            was = before.get(name)
            if not isinstance(was, Mapping):
                place = specs[name].place()
                same = [n for n, t in before.items()
                        if isinstance(t, Mapping) and t.get("place") == place]
                if same:
                    return ConfigError(
                        f"{here}: target {name!r} writes where {same[0]!r} of real-time "
                        f"group {group_id!r} wrote ({place}): a target's positions belong "
                        "to its name, so under a new name it would start with none and, "
                        "replayed from the earliest offsets, write every record there "
                        f"again. Keep the name {same[0]!r}; nothing was written",
                        field=here, sink_id=group_id), warnings
                return ConfigError(
                    f"{here}: target {name!r} is new to real-time group {group_id!r} (its "
                    f"checkpoint ran with {', '.join(sorted(before)) or 'no target'}): Spark "
                    "resumes from the checkpoint, so it would never receive the records the "
                    f"other targets already hold. Remove it, or {_WAY_OUT}",
                    field=here, sink_id=group_id), warnings
            moved = _moved(group_id, name, was, backends[name], specs[name], prefix)
            if moved is not None:
                return moved, warnings
        gone = sorted(set(before) - set(names))
        if gone:
            warnings.append(f"real-time group {group_id!r}: target(s) {', '.join(gone)} left "
                            "the group; their output stops at what they hold (adding one back "
                            "later needs a new checkpoint with startingOffsets=earliest)")
    sources = sorted({s for held in positions.values() for s in held})
    for source in sources:
        held = {n: positions.get(n, {}).get(source) for n in names}
        top = max((o for o in held.values() if o is not None), default=NOTHING)
        if top == NOTHING:
            continue
        holder = next(n for n, o in held.items() if o == top)
        for name, offset in held.items():
            here = f"{prefix}[{name}]"
            what = ("no position" if offset is None or offset == NOTHING
                    else f"offset {offset}")
            if start.replays_everything:
                if offset is None or offset < top:
                    warnings.append(
                        f"real-time group {group_id!r}: target {name!r} holds {what} of "
                        f"source partition {source}, {holder!r} holds up to offset {top}: it "
                        "catches up from the earliest offset the source retains (records "
                        "retention deleted before it joined are not in it)")
                continue
            if offset is None and not start.fresh:
                return ConfigError(
                    f"{here}: target {name!r} holds no position of source partition "
                    f"{source}, which {holder!r} holds up to offset {top}: it was not part "
                    "of the group when that was written (added, or its positions were "
                    "deleted), and Spark resumes from the checkpoint, so it would never "
                    f"receive those records. Remove it, or {_WAY_OUT}. If it still holds "
                    "rows of those records (its positions were deleted, its rows kept), "
                    "delete those rows first: from the earliest offsets every retained "
                    "record is written into it again",
                    field=here, sink_id=group_id), warnings
            if start.fresh and (offset is None or offset < top):
                return ConfigError(
                    f"{here}: target {name!r} holds {what} of source partition {source}, "
                    f"{holder!r} holds up to offset {top}, and this new checkpoint does not "
                    "start from the earliest offsets: it would never receive the records in "
                    f"between. Set the source option startingOffsets=earliest (every target "
                    "skips what it holds), or remove it; nothing was written",
                    field=here, sink_id=group_id), warnings
    return None, warnings


def _moved(group_id: str, name: str, was: Mapping[str, Any], backend: str,
           spec: RealtimeTargetSpec, prefix: str) -> ConfigError | None:
    """A target whose checkpoint record names another backend or place: judged by the
    check every path shares (:func:`txsink.realtime.identity.moved_refusal`)."""
    dest = was.get("destination")
    before = ({str(k): str(v) for k, v in dest.items()} if isinstance(dest, Mapping)
              else {"place": str(was.get("place"))})
    now = spec.destination() if isinstance(dest, Mapping) else {"place": spec.place()}
    if was.get("backend") != backend:
        before, now = {"backend": str(was.get("backend"))}, {"backend": backend}
    what = f"target {name!r} of real-time group {group_id!r}" if name else "the sink"
    way_out = (_WAY_OUT if name else "write the new place under another sink_id on a new "
               "checkpoint; nothing was written")
    return moved_refusal(spec.sink_id, before, now, field=options_field(prefix, name),
                         recorder=f"the checkpoint of {what}",
                         why="Spark resumes from the checkpoint, so the new place would "
                             "start there and never receive the records before it. ",
                         remedy="Put {option} back as it was, or " + way_out)


def positions_lines(positions: Mapping[SourcePartition, int]) -> list[str]:
    """``orders-0: offset 424`` per source partition (``txsink status``)."""
    if not positions:
        return ["no position stored yet"]
    return [f"{source}: " + ("claimed, nothing committed" if offset == NOTHING
                             else f"offset {offset}")
            for source, offset in sorted(positions.items())]


__all__ = ["MEMBERS_FILE", "StartPoint", "members_record", "positions_lines", "read_members",
           "start_refusal"]
