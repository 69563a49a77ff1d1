"""The consistent cut of a group of targets: the epochs a reader may take from every target.

The targets of a group commit an epoch one after the other, so for a moment one
shows it and another does not yet. What readers can rely on: each target says,
from its own markers, the highest epoch it holds (:meth:`Backend.highest_epoch`),
and no target ever shows an epoch without a decision. The cut is the lowest of
those, also bounded below the lowest epoch the state has not finished (a decided
epoch still being committed, or a batch write still in flight): every epoch up to
the cut is in every target, and stays there. A reader that takes epochs ``<= cut``
from each target sees the same epochs everywhere.

The order of the reads is what makes it hold while writes go on: the targets are
read first, the state's unfinished epochs after them. A target can only show an
epoch after its decision was recorded, so any epoch a target showed (in part: one
partition's marker, or one target of a group) is, when the state is read after
it, either still DECIDED (and bounds the cut) or COMMITTED everywhere. Read the
other way round, a write decided between the two reads was in no bound, and the
cut named it while some of its participants or targets did not hold it yet.
Epochs reserved later are allocated above every epoch the state knows, so above
the cut.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from txsink.backend import Backend
from txsink.errors import ConfigError, StateError
from txsink.group import TargetGroup
from txsink.state import EpochState, StateStore

#: How far below the state's newest epoch the cut asks ``holds_epoch`` of a target whose
#: backend cannot say its highest epoch.
PROBE_LIMIT = 64


@dataclass(frozen=True)
class Cut:
    """The cut of one sink (a group, or a single target)."""

    sink_id: str
    #: Per target, the highest epoch its own markers show (-1: none).
    targets: Mapping[str, int]
    #: The lowest epoch the state has not finished, and its state, if any.
    unfinished: tuple[int, str] | None
    cut: int
    #: Per target, how its highest epoch was found (``markers`` or ``probed``).
    sources: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"sink_id": self.sink_id, "targets": dict(self.targets), "cut": self.cut,
                "unfinished": None if self.unfinished is None else {
                    "epoch": self.unfinished[0], "state": self.unfinished[1]}}

    def lines(self, describe: Mapping[str, str] | None = None) -> list[str]:
        out = [f"sink {self.sink_id!r}:"]
        for name, high in self.targets.items():
            what = f" ({describe[name]})" if describe and name in describe else ""
            probed = " (asked epoch by epoch)" if self.sources.get(name) == "probed" else ""
            out.append(f"  {name}{what}: highest epoch committed {high}{probed}"
                       if high >= 0 else f"  {name}{what}: no epoch committed yet")
        if self.unfinished is not None:
            out.append(f"  state: epoch {self.unfinished[0]} is {self.unfinished[1]}, not "
                       "finished in every target yet")
        out.append(f"cut: {self.cut}" + (f" (every target holds every epoch up to {self.cut})"
                                          if self.cut >= 0 else " (no epoch is in every "
                                          "target yet)"))
        return out


def consistent_cut(backend: Backend, store: StateStore, sink_id: str) -> Cut:
    """Ask every target and the state for the cut (no change anywhere)."""
    meta = store.read_meta()
    if meta is None:
        raise StateError(f"no txsink state at {store.location}: has sink {sink_id!r} run?",
                         sink_id=sink_id)
    if meta.sink_id != sink_id:
        raise ConfigError(f"the txsink state at {store.location} belongs to sink "
                          f"{meta.sink_id!r}, not {sink_id!r}", field="sink_id")
    if isinstance(backend, TargetGroup):
        from txsink.targets import moved_target

        for name, target in meta.targets.items():
            member = backend.members.get(name)
            if member is None:
                continue
            refusal = moved_target(
                target, name, type(member.backend).destination(member.spec.options),
                sink_id, here="this file has", backend=type(member.backend),
                remedy="The cut is only true of the recorded places: put it back as the "
                       "state recorded it to read the cut; nothing was changed")
            if refusal is not None:
                raise refusal
    top = max([meta.committed_watermark, *store.states()])
    members: dict[str, tuple[Backend, str]] = (
        {m.name: (m.backend, m.sink_id) for m in backend.members.values()}
        if isinstance(backend, TargetGroup) else {sink_id: (backend, sink_id)})
    highs: dict[str, int] = {}
    sources: dict[str, str] = {}
    for name, (b, sid) in members.items():
        high = b.highest_epoch(sid)
        sources[name] = "markers"
        if high is None:
            sources[name] = "probed"
            high = next((e for e in range(top, max(-1, top - PROBE_LIMIT), -1)
                         if b.holds_epoch(sid, e)), -1)
        highs[name] = high
    # After the targets (see the module docstring): what is unfinished now bounds
    # everything the targets were seen to hold.
    states = store.states()
    # An epoch a forced resolve gave up with some partitions kept is unfinished too:
    # its replay writes the other partitions under the same number.
    latest = store.read_meta() or meta
    partial = {*latest.kept, *latest.kept_targets}
    unfinished = min([*((e, s.value) for e, s in states.items()
                        if s is not EpochState.COMMITTED),
                      *((e, "given up in part, awaiting its replay") for e in partial)],
                     default=None)
    cut = min(highs.values())
    if unfinished is not None:
        cut = min(cut, unfinished[0] - 1)
    return Cut(sink_id, highs, unfinished, cut, sources)


def pipeline_cut(path: str | os.PathLike[str]) -> Cut:
    """The cut of the pipeline file at ``path`` (``txsink cut PIPELINE``)."""
    from txsink.config import load_pipeline
    from txsink.plugins import get_plugins

    cfg = load_pipeline(path)
    plugins = get_plugins()
    backend = cfg.create_backend(plugins)
    try:
        store = plugins.state_store(f"{cfg.checkpoint.rstrip('/')}/txsink")
        return consistent_cut(backend, store, cfg.sink.sink_id)
    finally:
        backend.close()
