"""What ``txsink status``, ``reset``, ``cut`` and ``resolve`` do for a real-time pipeline.

A real-time pipeline has no txsink state and no epochs: each target stores, per source
partition, the highest source offset it holds, in the same transaction as its rows (see
``docs/realtime.md``). So:

* ``status`` reads every target's stored positions and the driver's heartbeat in the
  checkpoint (whether a query holds the sink now);
* ``reset`` deletes every target's stored positions (or those of some source topics:
  a topic that was recreated) and the checkpoint, once no query holds the sink; the
  rows the targets hold stay, and it says so;
* ``cut`` and ``resolve`` have nothing to act on, and say so in one line with what to
  use instead.

No Spark here: the positions are read through the backends' real-time targets, the
checkpoint from the local file system. Nothing printed holds a secret.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from txsink.errors import ConfigError, TxsinkError
from txsink.realtime.group import MEMBERS_FILE, positions_lines, read_members
from txsink.realtime.holder import HOLDER_FILE, Holding, holding
from txsink.realtime.positions import SourcePartition, StoredPosition
from txsink.redact import redact

if TYPE_CHECKING:
    from txsink.config import PipelineConfig
    from txsink.plugins import Plugins
    from txsink.realtime.writer import RealtimeTargetSpec

#: Exit status of a command that did nothing it was asked (the CLI's ``EXIT_ERROR``).
EXIT_ERROR = 1
#: What a real-time pipeline keeps instead of epochs (cut and resolve say it).
NO_EPOCHS = ("real-time targets have no epochs and nothing in doubt: each commit is one "
             "plain transaction of rows and source positions")


def is_realtime_checkpoint(path: str) -> bool:
    """A local directory a real-time query wrote (its records, no txsink state)."""
    local = path.removeprefix("file://")
    if "://" in local or not os.path.isdir(local):
        return False
    here = Path(local)
    return ((here / MEMBERS_FILE).is_file() or (here / HOLDER_FILE).is_file()) and not (
        here / "txsink" / "meta.json").is_file()


def local_checkpoint_text(checkpoint: str, name: str) -> str | None:
    local = checkpoint.removeprefix("file://")
    if "://" in local:
        return None
    path = Path(local, name)
    return path.read_text(encoding="utf-8") if path.is_file() else None


def checkpoint_holding(checkpoint: str) -> Holding:
    """The heartbeat of the query on ``checkpoint`` (remote ones cannot be read here)."""
    if "://" in checkpoint.removeprefix("file://"):
        return Holding(False, f"unknown (the checkpoint {checkpoint} is not on this machine's "
                              "file system; the driver's heartbeat is there, in "
                              f"{HOLDER_FILE})")
    return holding(local_checkpoint_text(checkpoint, HOLDER_FILE))


def specs_of(cfg: PipelineConfig, plugins: Plugins) -> dict[str, RealtimeTargetSpec]:
    """Each target's real-time target (``""``: a single sink), checked, no I/O."""
    from txsink.realtime.config import check_realtime_target, realtime_specs

    if cfg.sink.targets:
        return realtime_specs(cfg.sink.sink_id, cfg.sink.targets, prefix="sink.targets",
                              plugins=plugins)
    return {"": check_realtime_target(plugins.backend_class(cfg.sink.backend),
                                      cfg.sink.backend, cfg.sink.sink_id, cfg.sink.options)}


def _secrets(cfg: PipelineConfig, name: str) -> list[str]:
    options = (next(t.options for t in cfg.sink.targets if t.name == name)
               if name else cfg.sink.options)
    return [str(v) for k, v in options.items() if ("password" in k or "secret" in k) and v]


def _backends(cfg: PipelineConfig) -> dict[str, str]:
    if cfg.sink.targets:
        return {t.name: t.backend for t in cfg.sink.targets}
    return {"": cfg.sink.backend}


def status(cfg: PipelineConfig, as_json: bool, plugins: Plugins) -> int:
    """Each target's stored positions per source partition (read only), and whether a
    query holds the sink."""
    from txsink.realtime.config import COMMIT_INTERVAL

    specs = specs_of(cfg, plugins)
    backends = _backends(cfg)
    report: dict[str, Any] = {}
    held: dict[str, dict[SourcePartition, StoredPosition]] = {}
    for name, spec in specs.items():
        entry: dict[str, Any] = {"backend": backends[name], "sink_id": spec.sink_id,
                                 "where": spec.describe()}
        try:
            held[name] = spec.stored()
            entry["positions"] = {str(k): v.offset for k, v in sorted(held[name].items())}
            entry["topic_ids"] = {str(k): v.topic_id for k, v in sorted(held[name].items())}
        except Exception as exc:  # a server away: say so, show the other targets
            text = " ".join(str(exc).split()) or type(exc).__name__
            entry["error"] = redact(text, _secrets(cfg, name))
        report[name] = entry
    members = read_members(local_checkpoint_text(cfg.checkpoint, MEMBERS_FILE))
    query = checkpoint_holding(cfg.checkpoint)
    interval = cfg.sink.options.get(COMMIT_INTERVAL, "250 milliseconds")
    if as_json:
        print(json.dumps({"sink_id": cfg.sink.sink_id, "mode": "real_time",
                          "checkpoint": cfg.checkpoint, "commit_interval": interval,
                          "held": query.held, "query": query.line,
                          "targets" if cfg.sink.targets else "target":
                              report if cfg.sink.targets else report[""],
                          "recorded_targets": None if members is None
                          else sorted(n for n in members["targets"] if n)}, indent=1))
        return 0
    what = (f"a group of {len(specs)} targets, each exactly once by its own stored positions"
            if cfg.sink.targets else "exactly once by stored source positions")
    print(f"sink {cfg.sink.sink_id!r}: real-time mode, {what} (commit every {interval}); no "
          "txsink state: the positions are it")
    print(f"query: {query.line}")
    recorded = sorted(n for n in (members or {}).get("targets", {}) if n)
    print(f"checkpoint: {cfg.checkpoint}" + (
        f" (ran with targets {', '.join(recorded)})" if recorded else ""))
    for name, entry in report.items():
        indent = "  "
        if name:
            print(f"  target {name}: {entry['backend']}, {entry['where']}, sink id "
                  f"{entry['sink_id']}")
            indent = "    "
        else:
            print(f"target: {entry['backend']}, {entry['where']}")
        if "error" in entry:
            print(f"{indent}positions: unknown ({entry['error']})")
            continue
        for line in positions_lines({s: p.offset for s, p in held[name].items()}):
            print(f"{indent}{line}")
    return 0


def reset(cfg: PipelineConfig, file: str, plugins: Plugins, *, yes: bool, force: bool,
          source_topics: Sequence[str] | None) -> int:
    """Delete every target's stored positions (of ``source_topics`` only, if given) and
    the checkpoint. Refused while a query holds the sink; the rows stay."""
    checkpoint = cfg.checkpoint
    if "://" in checkpoint.removeprefix("file://"):
        raise ConfigError(f"checkpoint: txsink reset deletes local checkpoints only; delete "
                          f"{checkpoint} yourself first, then the positions from Python "
                          "(txsink.spark.realtime.delete_positions); nothing deleted",
                          field="checkpoint")
    query = checkpoint_holding(checkpoint)
    if query.held and not force:
        raise ConfigError(f"sink {cfg.sink.sink_id!r}: {query.line}: stop it first (Ctrl-C "
                          "or SIGTERM to `txsink run`, query.stop() from Python); its tasks "
                          "would write again over what this deletes. --force deletes anyway, "
                          "once you know that driver is gone; nothing deleted",
                          field="sink.sink_id", sink_id=cfg.sink.sink_id)
    specs = specs_of(cfg, plugins)
    topics = list(source_topics) if source_topics else None
    held: dict[str, dict[SourcePartition, StoredPosition]] = {}
    for name, spec in specs.items():
        try:
            held[name] = spec.stored()
        except TxsinkError as exc:
            where = f"sink.targets[{name}]" if name else "sink"
            raise TxsinkError(f"{where}: cannot read the stored positions: "
                              f"{redact(str(exc), _secrets(cfg, name))}; nothing deleted",
                              sink_id=cfg.sink.sink_id) from None
    chk = Path(checkpoint.removeprefix("file://"))
    print(f"txsink reset deletes, for real-time pipeline {cfg.name!r}:")
    for name, spec in specs.items():
        mine = sorted(s for s in held[name] if topics is None or s.topic in topics)
        label = f"target {name}" if name else "target"
        what = (", ".join(f"{s} offset {held[name][s].offset}" for s in mine)
                if mine else "none stored")
        scope = f" of source topic(s) {', '.join(topics)}" if topics else ""
        print(f"  {label} ({spec.place()}): the stored positions{scope} of sink id "
              f"{spec.sink_id}: {what}")
    print(f"  the checkpoint {chk} (Spark's offsets and txsink's records of the run)")
    print("The rows the targets hold stay. The next run reads the source from its "
          "startingOffsets" + (
              ": every record of the reset topic(s) it reads is written, and every target "
              "skips what it holds of the others (set startingOffsets: earliest, or it "
              "skips the records before the start)" if topics else
              " and writes every record it reads again: to start over, empty the tables "
              "and topics now, before the next run (TRUNCATE, a new topic), or they hold "
              "those records twice"))
    if not yes:
        if not sys.stdin.isatty():
            raise ConfigError("not at a terminal to ask for confirmation: pass --yes",
                              field="--yes")
        answer = input(f"type the sink id ({cfg.sink.sink_id}) to confirm: ")
        if answer.strip() != cfg.sink.sink_id:
            print("nothing deleted")
            return EXIT_ERROR
    for name, spec in specs.items():
        label = f"target {name}: " if name else ""
        for line in spec.delete_positions(topics):
            print(f"deleted {label}{line}")
    if chk.exists():
        shutil.rmtree(chk)
        print(f"deleted checkpoint {chk}")
    print(f"sink {cfg.sink.sink_id!r} starts over at the next `txsink run {file}`")
    return 0


def refuse_cut(cfg: PipelineConfig, file: str) -> None:
    raise ConfigError(f"trigger.real_time: `txsink cut` does not apply to a real-time "
                      f"pipeline: {NO_EPOCHS}, so there is no cut to read; `txsink status "
                      f"{file}` shows how far each target is per source partition; nothing "
                      "was done", field="trigger.real_time")


def refuse_resolve(argument: str, file: str | None) -> None:
    what = f"`txsink status {file}`" if file else "`txsink status PIPELINE_FILE`"
    raise ConfigError(f"`txsink resolve` does not apply to a real-time pipeline "
                      f"({argument}): {NO_EPOCHS}, so there is nothing to commit or abort; "
                      f"{what} shows each target's positions, `txsink reset` deletes them; "
                      "nothing was done", field="checkpoint")


def refuse_status_of_checkpoint(argument: str) -> None:
    query = checkpoint_holding(argument)
    raise ConfigError(f"{argument} is a real-time pipeline's checkpoint ({query.line}): its "
                      "positions are in the targets, whose options are in the pipeline file; "
                      "run `txsink status PIPELINE_FILE`", field="checkpoint")


def realtime_file(argument: str) -> PipelineConfig | None:
    """The pipeline file ``argument`` names, if it runs in Real-time Mode."""
    path = Path(argument)
    if path.suffix.lower() not in (".yaml", ".yml", ".toml", ".json") or not path.is_file():
        return None
    from txsink.config import load_pipeline

    cfg = load_pipeline(argument)
    return cfg if cfg.trigger.kind == "real_time" else None


__all__ = ["EXIT_ERROR", "NO_EPOCHS", "checkpoint_holding", "is_realtime_checkpoint",
           "realtime_file", "refuse_cut", "refuse_resolve", "refuse_status_of_checkpoint",
           "reset", "specs_of", "status"]
