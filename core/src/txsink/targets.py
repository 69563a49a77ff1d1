"""The targets of a group: several systems written by one sink, one decision per epoch.

A group is one sink id with one pending-transaction state. Each target has a name,
a backend and that backend's options, and optionally its own projection
(``select``) and filter (``where``) over the rows the sink receives, so one target
gets the events and another the aggregates. Every external name a target creates is
derived from its own sink id, ``<group sink id>--<target name>``, so two targets of
one group never share a transaction id, a gid, a key prefix or a directory.

This module holds the values and their validation (no I/O, no Spark): pipeline
files, the Spark data source and ``txsink.spark.targets`` all build
:class:`TargetSpec` objects through :func:`parse_targets`, so a bad option is one
line naming the target wherever it was written.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from txsink.errors import ConfigError
from txsink.model import SINK_ID_PATTERN, DeliveryGuarantee

if TYPE_CHECKING:
    from txsink.backend import Backend
    from txsink.plugins import Plugins

#: The ``backend`` name a group's state records (no plugin registers it).
GROUP_BACKEND = "group"
#: Between the group's sink id and a target's name in the target's own sink id.
SEPARATOR = "--"
#: Target names: short, lower case, no ``-`` (so ``--`` in a derived id is unambiguous).
TARGET_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
#: A frame shaped for a group carries one struct column per target, named so; a row
#: goes to a target where that column is not null (see ``txsink.spark.targets``).
ROUTE_PREFIX = "__txsink_target_"
#: The keys a target may have, wherever it is written.
TARGET_KEYS = ("name", "backend", "options", "select", "where", "epoch_column")
_COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


@dataclass(frozen=True)
class TargetSpec:
    """One target of a group, validated. ``options`` hold secrets: never print them."""

    name: str
    backend: str
    options: Mapping[str, str] = field(default_factory=dict)
    #: SQL expressions (``total * 2 AS doubled``) the target's rows are made of; empty:
    #: every column of the sink's rows.
    select: tuple[str, ...] = ()
    #: A SQL condition: only rows for which it holds go to this target.
    where: str | None = None
    #: A column txsink adds to each of this target's rows, holding the group's epoch
    #: (for readers that stop at the consistent cut, e.g. a PostgreSQL view).
    epoch_column: str | None = None

    @property
    def shaped(self) -> bool:
        """Whether the target takes other rows or columns than the sink receives."""
        return bool(self.select or self.where)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "backend": self.backend,
                                "options": dict(self.options)}
        if self.select:
            data["select"] = list(self.select)
        if self.where:
            data["where"] = self.where
        if self.epoch_column:
            data["epoch_column"] = self.epoch_column
        return data


def target_sink_id(group_id: str, name: str) -> str:
    """The sink id a target's backend is driven with: ``<group>--<name>``."""
    return f"{group_id}{SEPARATOR}{name}"


def encode_targets(specs: Sequence[TargetSpec]) -> str:
    """The ``targets`` option of the Spark data source (JSON; secrets included: they
    go to Spark only, as every backend option does)."""
    return json.dumps([s.to_dict() for s in specs], separators=(",", ":"))


def decode_targets(text: str) -> list[Any]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"targets: not valid JSON ({exc}); build the option with "
                          "txsink.spark.targets(...)", field="targets") from None
    if not isinstance(data, list):
        raise ConfigError("targets: must be a JSON list of targets; build the option with "
                          "txsink.spark.targets(...)", field="targets")
    return data


def parse_targets(
    items: object,
    group_id: str,
    *,
    prefix: str = "targets",
    plugins: Plugins | None = None,
    check_backend: bool = True,
    guarantee: DeliveryGuarantee = DeliveryGuarantee.EXACTLY_ONCE,
    trigger_ms: int | None = None,
) -> tuple[TargetSpec, ...]:
    """Validate a list of target mappings (no I/O); errors name ``prefix[name].field``.

    Options are lower-cased (Spark's rule), completed with what the backend asks for
    as a target of a group (:meth:`~txsink.backend.Backend.target_options`) and from
    the trigger interval, and checked by the backend's ``from_options``.
    """
    if not isinstance(items, (list, tuple)) or not items:
        raise ConfigError(f"{prefix}: must be a non-empty list of targets, each with name, "
                          "backend and options", field=prefix)
    if not guarantee.transactional:
        raise ConfigError(
            f"guarantee: a group of targets commits every target of an epoch or none, which "
            f"needs exactly_once; {guarantee.value!r} would let each target show rows on its "
            "own. Remove 'guarantee', or write the targets as separate sinks",
            field="guarantee")
    specs: list[TargetSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        spec = _parse_one(item, i, group_id, prefix, plugins, check_backend, trigger_ms)
        if spec.name in seen:
            raise ConfigError(f"{prefix}[{spec.name}].name: two targets are named "
                              f"{spec.name!r}; give each its own name",
                              field=f"{prefix}[{spec.name}].name")
        seen.add(spec.name)
        specs.append(spec)
    _one_directory_each(specs, prefix)
    return tuple(specs)


def _one_directory_each(specs: Sequence[TargetSpec], prefix: str) -> None:
    """Refuse two files targets in one directory (compared after resolving ``..``).

    A files directory holds one sink id's output and every target has its own sink
    id: the second target's claim would be refused after the first one's was made,
    leaving that directory bound to a state the refused run never used.
    """
    seen: dict[str, str] = {}
    for spec in specs:
        path = str(spec.options.get("path") or "").removeprefix("file://")
        if spec.backend != "files" or not path:
            continue
        where = os.path.normpath(os.path.abspath(path))
        if where in seen:
            raise ConfigError(
                f"{prefix}[{spec.name}].options.path: targets {seen[where]!r} and "
                f"{spec.name!r} both write to the directory {where}, which holds one "
                "target's files; give each target its own 'path'",
                field=f"{prefix}[{spec.name}].options.path")
        seen[where] = spec.name


def _parse_one(item: object, index: int, group_id: str, prefix: str, plugins: Plugins | None,
               check_backend: bool, trigger_ms: int | None) -> TargetSpec:
    here = f"{prefix}[{index}]"
    if not isinstance(item, Mapping):
        raise ConfigError(f"{here}: must be a mapping with name, backend and options",
                          field=here)
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{here}.name: required: a short name for the target (lower case "
                          "letters, digits, _), e.g. 'events'", field=f"{here}.name")
    if not TARGET_NAME.match(name):
        raise ConfigError(f"{here}.name: {name[:40]!r} is not a valid target name: use 1-32 "
                          "characters from a-z 0-9 _ starting with a letter (it becomes part "
                          "of the target's sink id)", field=f"{here}.name")
    here = f"{prefix}[{name}]"
    for key in item:
        if key not in TARGET_KEYS:
            close = difflib.get_close_matches(str(key), TARGET_KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{here}.{key}: unknown field{hint}; allowed here: "
                              f"{', '.join(TARGET_KEYS)}", field=f"{here}.{key}")
    sink_id = target_sink_id(group_id, name)
    if not SINK_ID_PATTERN.match(sink_id):
        raise ConfigError(
            f"{here}.name: the target's sink id {sink_id!r} would be longer than 64 "
            "characters; shorten the group's sink_id or the target's name",
            field=f"{here}.name")
    backend = item.get("backend")
    if not isinstance(backend, str) or not backend:
        raise ConfigError(f"{here}.backend: required, e.g. 'kafka'; `txsink backends` lists "
                          "the installed ones", field=f"{here}.backend")
    if backend == GROUP_BACKEND:
        raise ConfigError(f"{here}.backend: a target cannot be a group itself",
                          field=f"{here}.backend")
    options = _options(item.get("options"), f"{here}.options")
    select = _select(item.get("select"), f"{here}.select")
    where = item.get("where")
    if where is not None and (not isinstance(where, str) or not where.strip()):
        raise ConfigError(f"{here}.where: must be a SQL condition over the sink's columns, "
                          "e.g. 'amount > 0'", field=f"{here}.where")
    epoch_column = item.get("epoch_column")
    if epoch_column is not None and (not isinstance(epoch_column, str)
                                     or not _COLUMN.match(epoch_column)):
        raise ConfigError(f"{here}.epoch_column: must be a column name (letters, digits, _), "
                          f"e.g. 'txsink_epoch'; got {epoch_column!r}",
                          field=f"{here}.epoch_column")
    if check_backend:
        from txsink.plugins import get_plugins

        registry = plugins if plugins is not None else get_plugins()
        try:
            cls = registry.backend_class(backend)
        except ConfigError as exc:
            raise ConfigError(f"{here}.backend: {exc}", field=f"{here}.backend") from None
        derived = {k.lower(): v for k, v in cls.target_options().items()}
        if trigger_ms is not None:
            derived.update({k.lower(): v for k, v in cls.trigger_options(trigger_ms).items()})
        options = {**derived, **options}
        try:
            cls.from_options(options).close()
        except ConfigError as exc:
            inner = exc.field or ""
            where_ = f"{here}.options.{inner}" if inner else f"{here}.options"
            raise ConfigError(f"{where_}: {exc}", field=where_) from None
    return TargetSpec(name, backend, options, select,
                      where.strip() if isinstance(where, str) else None, epoch_column)


def _options(value: object, here: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{here}: must be a mapping of option name to value", field=here)
    out: dict[str, str] = {}
    for k, v in value.items():
        if isinstance(v, bool):
            out[str(k).lower()] = "true" if v else "false"
        elif isinstance(v, (int, float, str)):
            out[str(k).lower()] = str(v)
        else:
            raise ConfigError(f"{here}.{k}: must be a string, number or boolean",
                              field=f"{here}.{k}")
    return out


def _select(value: object, here: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if (not isinstance(value, (list, tuple)) or not value
            or not all(isinstance(v, str) and v.strip() for v in value)):
        raise ConfigError(f"{here}: must be a list of SQL expressions over the sink's "
                          "columns, e.g. ['order_id', 'qty * price AS total']", field=here)
    return tuple(v.strip() for v in value)


def recorded_destination(target: Mapping[str, Any]) -> dict[str, str] | None:
    """The destination the state recorded for one target (None: a state written before
    destinations were recorded; the caller derives it from the recorded options)."""
    dest = target.get("destination")
    return {str(k): str(v) for k, v in dest.items()} if isinstance(dest, Mapping) else None


def moved_target(recorded: Mapping[str, Any], name: str, now: Mapping[str, str],
                 group_id: str, *, here: str = "this run has", remedy: str | None = None,
                 backend: type[Backend] | None = None,
                 field: str | None = None, recorder: str = "the state",
                 why: str | None = None) -> ConfigError | None:
    """The refusal for target ``name`` whose destination ``now`` is not the one the
    state recorded (None when it is).

    A target's destination is part of its identity: the epochs the state decided are in
    the old place, where recovery, the cut and ``txsink reset`` must find them. A state
    written before destinations were recorded is compared by the destination of the
    options it recorded, on the keys both sides name. ``field`` (``sink.options``)
    names a single sink's options instead of a group's target. Real-time sinks ask it
    too, of what their stored positions and their checkpoint recorded (``recorder``),
    with their own reason (``why``): one check for every data path.
    """
    before = recorded_destination(recorded)
    if before is None:
        from txsink.plugins import get_plugins

        options = recorded.get("options")
        if not isinstance(options, Mapping):
            return None
        cls = backend or get_plugins().backend_class(str(recorded.get("backend")))
        derived = cls.destination({str(k): str(v) for k, v in options.items()})
        keys = [k for k in now if k in derived]
        before = {k: derived[k] for k in keys}
        now = {k: now[k] for k in keys}
    changed = [k for k in sorted(set(before) | set(now)) if before.get(k) != now.get(k)]
    if not changed:
        return None
    option = changed[0]
    where = f"{field or f'sink.targets[{name}]'}.{option}"
    what = f"sink {group_id!r}" if field else f"target {name!r} of sink {group_id!r}"
    return ConfigError(
        f"{where}: {what} moved: {recorder} recorded {option} "
        f"{before.get(option, '')!r}, {here} {now.get(option, '')!r}. " + (why or (
            "A target's destination is part of its identity: the epochs decided so far "
            "are in the old place, where recovery and the cut read them. ")) + (remedy or (
            f"Put {option} back as it was, or write to the new place under a new sink_id "
            "with a new checkpoint; nothing was written or claimed")),
        field=where, sink_id=group_id)


def changed_targets(recorded: Mapping[str, Mapping[str, Any]], specs: Sequence[TargetSpec],
                    group_id: str, *, here: str = "this run has",
                    remedy: str | None = None) -> ConfigError | None:
    """The refusal for a run whose targets are not the ones the state recorded (None
    when they are, or when the state recorded none yet).

    A group's targets cannot change: recovery must reach every target an epoch was
    decided in. Callers ask *before* any side effect (a claim, a directory, a reset),
    so the refusal's way out still works afterwards.
    """
    before = {n: str(t.get("backend")) for n, t in recorded.items()}
    given = {s.name: s.backend for s in specs}
    if not recorded:
        return None
    if before == given:
        from txsink.plugins import get_plugins

        plugins = get_plugins()
        for spec in specs:
            cls = plugins.backend_class(spec.backend)
            refusal = moved_target(recorded[spec.name], spec.name,
                                   cls.destination(spec.options), group_id, here=here,
                                   remedy=remedy, backend=cls)
            if refusal is not None:
                return refusal
        return None

    def words(targets: Mapping[str, str]) -> str:
        return ", ".join(f"{n} ({b})" for n, b in targets.items())

    gone = [n for n in before if n not in given]
    new = [n for n in given if n not in before]
    moved = [n for n in given if n in before and before[n] != given[n]]
    diff = "; ".join(part for part in (
        f"missing here: {', '.join(gone)}" if gone else "",
        f"new here: {', '.join(new)}" if new else "",
        f"other backend: {', '.join(moved)}" if moved else "") if part)
    return ConfigError(
        f"sink {group_id!r}: its targets were {words(before)}, {here} "
        f"{words(given)} ({diff}). A group's targets cannot change: recovery must reach every "
        "target an epoch was decided in. " + (remedy or (
            "Run with the targets as they were, or write the new set of targets under a new "
            "sink_id with a new checkpoint; nothing was written or claimed")),
        field="targets", sink_id=group_id)


def duplicate_column(names: Iterable[str]) -> str | None:
    """The first column name given twice (compared case-blind, Spark's default), if any.

    A row with two columns of one name cannot be written faithfully: Parquet files hold
    both and are then unreadable ("Multiple matches for FieldRef"), JSON lines and
    databases keep one of the two values.
    """
    seen: set[str] = set()
    for name in names:
        if name.lower() in seen:
            return name
        seen.add(name.lower())
    return None


def check_columns(group_id: str, specs: Sequence[TargetSpec],
                  columns: Mapping[str, Sequence[str]], *, prefix: str = "targets",
                  only: str | None = None) -> None:
    """Refuse, before any row is written, a frame the group would misroute or corrupt.

    ``columns`` maps the frame's top-level column names to their struct fields (empty
    for other types). A frame shaped for the group (:data:`ROUTE_PREFIX` columns)
    must hold exactly one route column per target; an unshaped frame goes whole to
    every target, which is only right when no target has ``select``/``where`` (else
    every row and every column, secrets included, would reach every target). A
    target's ``epoch_column`` must not name a column its rows already carry (Parquet
    would get it twice, JSON lines would lose the rows' own value). ``only``: the
    frame is one target's own rows (a grouped write), already selected.
    """
    def refuse(message: str, field: str) -> ConfigError:
        return ConfigError(f"{field}: {message}", field=field, sink_id=group_id or None)

    per_target: dict[str, Sequence[str]] = {}
    routes = [c for c in columns if c.startswith(ROUTE_PREFIX)]
    if only is not None:
        per_target = {only: list(columns)}
    elif routes:
        want = {ROUTE_PREFIX + s.name for s in specs}
        if set(columns) != want:
            names = sorted(c[len(ROUTE_PREFIX):] if c.startswith(ROUTE_PREFIX) else c
                           for c in set(columns) ^ want)
            raise refuse(
                f"the frame is shaped for other targets than this group's ({', '.join(names)} "
                f"differ from {', '.join(s.name for s in specs)}); nothing was written. Shape "
                "it with this group's own targets (TargetSet.write / write_stream do)",
                prefix)
        per_target = {s.name: columns[ROUTE_PREFIX + s.name] for s in specs}
    else:
        shaped = [s.name for s in specs if s.shaped]
        if shaped:
            raise refuse(
                f"target(s) {', '.join(shaped)} have select/where, but the frame was not "
                "shaped by the group, so every row and column would go to every target; "
                "nothing was written. Write through txsink.spark.targets(...).write(df) or "
                ".write_stream(df) (they apply each target's select/where), or pass "
                "TargetSet.shape(df) to the data source", prefix)
        per_target = {s.name: list(columns) for s in specs}
    for s in specs:
        twice = duplicate_column(per_target.get(s.name, ()))
        if twice is not None:
            raise refuse(
                f"the rows of target {s.name!r} have the column {twice!r} twice (names are "
                "compared case-blind, as Spark does); Parquet would hold the name twice "
                "(unreadable), JSON lines and databases would keep only one of the values; "
                "nothing was written. Give each column of the target's select its own name",
                f"{prefix}[{s.name}]" + (".select" if s.select else ""))
        if not s.epoch_column or s.name not in per_target:
            continue
        clash = [c for c in per_target[s.name] if c.lower() == s.epoch_column.lower()]
        if clash:
            raise refuse(
                f"the rows of target {s.name!r} already have a column {clash[0]!r}, and "
                f"txsink would add its epoch column {s.epoch_column!r} beside it (Parquet "
                "would hold the name twice, JSON lines would lose the rows' own value); "
                "nothing was written. Name the epoch column differently, or drop or rename "
                "the rows' column in the target's select",
                f"{prefix}[{s.name}].epoch_column")
