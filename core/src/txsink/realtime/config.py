"""Checks of a pipeline file's ``sink`` when its trigger is ``real_time``.

Checked against the backend's real-time target instead of its micro-batch options
(no prepared transactions, a progress store): one target or a group of them
(``sink.targets``, each exactly once by its own stored positions), and
``commit_interval`` as the one txsink option besides the backends'. Parsing stays in
:mod:`txsink.config`; this module only judges (it imports nothing of it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from txsink.errors import ConfigError
from txsink.model import DeliveryGuarantee
from txsink.targets import SEPARATOR, TargetSpec, parse_targets, target_sink_id

if TYPE_CHECKING:
    from txsink.plugins import Plugins
    from txsink.realtime.writer import RealtimeTargetSpec

#: The sink option that sets how often a writer commits (a duration).
COMMIT_INTERVAL = "commit_interval"


def check_realtime_sink(data: Mapping[str, Any], guarantee: DeliveryGuarantee) -> None:
    """What real-time mode refuses in the ``sink`` section itself."""
    if guarantee is not DeliveryGuarantee.EXACTLY_ONCE:
        raise ConfigError("sink.guarantee: real-time mode is exactly once only; remove "
                          "sink.guarantee (Spark's own Kafka sink is the at-least-once one)",
                          field="sink.guarantee")
    if "targets" in data:
        for key in ("backend",):
            if key in data:
                raise ConfigError(f"sink.{key}: a sink with targets names a backend per "
                                  "target (sink.targets[...].backend); remove sink.backend",
                                  field=f"sink.{key}")
        options = data.get("options")
        if isinstance(options, Mapping):
            other = sorted(str(k) for k in options if str(k).lower() != COMMIT_INTERVAL)
            if other:
                raise ConfigError(
                    f"sink.options.{other[0]}: a real-time group's sink.options hold only "
                    f"{COMMIT_INTERVAL} (one commit timer for every target); give a "
                    "target's own options in sink.targets[...].options",
                    field=f"sink.options.{other[0]}")


def check_single_sink_id(sink_id: str, field: str = "sink.sink_id") -> None:
    """A single real-time sink's id must not hold ``--``: a group's target keeps its
    positions under ``<group sink id>--<name>``, and a single sink named like one would
    share them (each would skip the records the other wrote)."""
    if SEPARATOR in sink_id:
        raise ConfigError(f"{field}: {sink_id!r} holds {SEPARATOR!r}, which names a real-time "
                          "group's targets (<sink id>--<name>); a single sink with such an "
                          "id would share that target's stored positions and skip its "
                          "records. Use another sink_id", field=field, sink_id=sink_id)


def check_realtime_target(backend_cls: type[Any], backend: str, sink_id: str,
                          options: Mapping[str, str], *, here: str = "sink"
                          ) -> RealtimeTargetSpec:
    """Build the backend's real-time target from ``options`` (no I/O): its errors,
    named ``<here>.options.<field>``, come before anything runs."""
    factory = getattr(backend_cls, "realtime_target", None)
    if factory is None:
        raise ConfigError(f"{here}.backend: {backend!r} has no real-time target (kafka and "
                          "postgres have one); use micro-batches for it",
                          field=f"{here}.backend")
    try:
        spec: RealtimeTargetSpec = factory(
            sink_id, {k: v for k, v in options.items() if k != COMMIT_INTERVAL})
    except ConfigError as exc:
        inner = exc.field or ""
        where = f"{here}.options.{inner}" if inner else f"{here}.options"
        raise ConfigError(f"{where}: {exc}", field=where) from None
    return spec


def parse_realtime_targets(items: object, group_id: str, *, prefix: str = "targets",
                           plugins: Plugins | None = None, check_backend: bool = True
                           ) -> tuple[TargetSpec, ...]:
    """A real-time group's targets, validated with no I/O; errors name
    ``<prefix>[name].field``.

    The shape is a micro-batch group's (name, backend, options, select, where), checked
    against each backend's real-time target instead of its micro-batch options.
    Refused: duplicate names, ``epoch_column`` (real-time mode has no epochs), a backend
    without a real-time path, and two targets writing the same place (every record
    would land there twice).
    """
    specs = parse_targets(items, group_id, prefix=prefix, plugins=plugins,
                          check_backend=False)
    for spec in specs:
        here = f"{prefix}[{spec.name}]"
        if spec.epoch_column:
            raise ConfigError(f"{here}.epoch_column: real-time mode has no epochs (each "
                              "target keeps its own source positions); remove it",
                              field=f"{here}.epoch_column")
        if COMMIT_INTERVAL in spec.options:
            where = "sink.options" if prefix.startswith("sink.") else "start_realtime's"
            raise ConfigError(f"{here}.options.{COMMIT_INTERVAL}: one commit timer drives "
                              f"every target of the group; set it in {where} "
                              f"{COMMIT_INTERVAL}", field=f"{here}.options.{COMMIT_INTERVAL}")
    if check_backend:
        built = realtime_specs(group_id, specs, prefix=prefix, plugins=plugins)
        names = list(built)
        for i, first in enumerate(names):
            for second in names[i + 1:]:
                if built[first].same_place(built[second]):
                    raise ConfigError(
                        f"{prefix}[{second}].options: targets {first!r} and {second!r} "
                        f"write the same place ({built[second].place()}); each would add "
                        "every record there, so it would hold each one twice. Give each "
                        "target its own table or topic", field=f"{prefix}[{second}].options")
    return specs


def realtime_specs(group_id: str, specs: Sequence[TargetSpec], *, prefix: str = "targets",
                   plugins: Plugins | None = None) -> dict[str, RealtimeTargetSpec]:
    """Each target's real-time target (no I/O), under its own sink id
    ``<group>--<name>`` (so its positions are its own)."""
    from txsink.plugins import get_plugins

    registry = plugins if plugins is not None else get_plugins()
    out: dict[str, RealtimeTargetSpec] = {}
    for spec in specs:
        here = f"{prefix}[{spec.name}]"
        try:
            cls = registry.backend_class(spec.backend)
        except ConfigError as exc:
            raise ConfigError(f"{here}.backend: {exc}", field=f"{here}.backend") from None
        out[spec.name] = check_realtime_target(cls, spec.backend,
                                               target_sink_id(group_id, spec.name),
                                               spec.options, here=here)
    return out
