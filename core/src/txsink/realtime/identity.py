"""Whether a stored position is this run's: one check for every real-time path.

A position is an offset *of* something, stored *for* somewhere. Both can be re-pointed
under the same names: a source topic deleted and recreated (or read from another
cluster) starts its offsets again under a new topic id, and a sink id reused for
another table or topic (the same checkpoint with ``table`` changed, a copy of the
pipeline on a new checkpoint) finds the positions of the old place. Taken as they are,
either skips every record as already written: a silent loss. So every stored position
records the source topic's id and the target's destination, and a position that
belongs to another topic or another place is refused here, loudly, naming the topic
or the option and the way out.

Asked on the driver before any data moves (:func:`start_identity_refusal`: single
sinks and every target of a group, through :func:`txsink.realtime.group.start_refusal`)
and again by each task's claim (:func:`claim_refusal`: a topic recreated while the
query runs). The move itself is judged by :func:`txsink.targets.moved_target`, the
check micro-batch sinks and groups use.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from txsink.errors import ConfigError
from txsink.realtime.positions import NOTHING, SourcePartition, StoredPosition
from txsink.targets import SEPARATOR, moved_target

#: Why a real-time position that moved is refused (``moved_target``'s ``why``).
_MOVED_WHY = ("A real-time sink's stored positions belong to the place its rows went: in "
              "a new place they would skip every record the old place holds, and the new "
              "place would never receive them. ")
_PROGRESS_WHY = ("The target's positions are in the old progress store: under the new "
                 "one it holds none, and every record Spark replays would be written "
                 "again. ")
_MOVED_REMEDY = ("Put {option} back as it was, or write the new place under another "
                 "sink_id; nothing was written")


def _resetting(topic: str) -> str:
    return (f"If its records are new, delete the positions of the old one: `txsink reset "
            f"PIPELINE_FILE --source-topic {topic}` (from Python: "
            f"txsink.spark.realtime.delete_positions(..., source_topics=[{topic!r}])), "
            "then start again (on a new checkpoint: Spark's holds the old topic's offsets); "
            "if it is a copy that keeps the old offsets, write it under another sink_id; "
            "nothing was written")


def same_topic_id(first: str, second: str) -> bool:
    """Whether two spellings of a Kafka topic id are one id: Kafka's Java client writes
    them in URL-safe base64 (``-``, ``_``), librdkafka in standard base64 (``+``, ``/``)."""
    def canonical(text: str) -> str:
        return text.strip().rstrip("=").replace("+", "-").replace("/", "_")

    return canonical(first) == canonical(second)


def topic_refusal(sink_id: str, source: SourcePartition, stored: StoredPosition,
                  now_id: str, *, field: str = "source") -> ConfigError:
    """The refusal for a position counted in another topic than the one read now."""
    return ConfigError(
        f"{field}: source topic {source.topic!r} is not the topic whose offsets sink "
        f"{sink_id!r} stored: its position of {source} (offset {stored.offset}) was "
        f"counted in topic id {stored.topic_id}, and {source.topic!r} now has id {now_id} "
        "(deleted and recreated, or read from another cluster). Its offsets start again, "
        "so its records would be skipped as already written. " + _resetting(source.topic),
        field=field, sink_id=sink_id)


def beyond_end_refusal(sink_id: str, source: SourcePartition, stored: StoredPosition,
                       end: int, *, field: str = "source") -> ConfigError:
    """The refusal for a position stored before topic ids were recorded that lies past
    the end of the topic read now: that topic never had such an offset."""
    return ConfigError(
        f"{field}: sink {sink_id!r} holds offset {stored.offset} of source partition "
        f"{source}, stored before txsink recorded topic ids, but {source} ends at offset "
        f"{end} now: this is not the topic those positions were counted in (deleted and "
        "recreated, or read from another cluster), and its records would be skipped as "
        "already written. " + _resetting(source.topic), field=field, sink_id=sink_id)


def moved_refusal(sink_id: str, stored: Mapping[str, str], now: Mapping[str, str], *,
                  field: str, recorder: str, why: str | None = None,
                  remedy: str | None = None) -> ConfigError | None:
    """:func:`txsink.targets.moved_target` for a real-time sink id: ``stored`` is the
    destination its positions (or its checkpoint) recorded, ``now`` this run's."""
    before, after = dict(stored), dict(now)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    if not changed:
        return None
    if all(k.startswith("progress") for k in changed):
        why = _PROGRESS_WHY  # the place is the same; its positions are elsewhere
    return moved_target({"destination": before}, sink_id, after, sink_id, field=field,
                        recorder=recorder, why=why or _MOVED_WHY,
                        remedy=(remedy or _MOVED_REMEDY).format(option=changed[0]))


def _field_of(sink_id: str) -> str:
    """Where a task's refusal points: a group target's options, or the sink's."""
    group, sep, name = sink_id.rpartition(SEPARATOR)
    return f"targets[{name}].options" if sep and group else "sink.options"


def claim_refusal(sink_id: str, destination: Mapping[str, str] | None,
                  source: SourcePartition, stored: StoredPosition) -> ConfigError | None:
    """A task's judgement of the position its claim read (``None``: it is this run's).

    A position without a topic id or a destination was stored before txsink recorded
    them: it is taken (the driver checked it against the topic's end before the run)
    and the next commit records them."""
    if destination is not None and stored.destination is not None:
        refusal = moved_refusal(sink_id, stored.destination, destination,
                                field=_field_of(sink_id), recorder="its stored positions")
        if refusal is not None:
            return refusal
    if (source.topic_id is not None and stored.topic_id is not None
            and not same_topic_id(stored.topic_id, source.topic_id)
            and stored.offset != NOTHING):
        return topic_refusal(sink_id, source, stored, source.topic_id)
    return None


def start_identity_refusal(sink_id: str, stored: Mapping[SourcePartition, StoredPosition],
                           destination: Mapping[str, str], topic_ids: Mapping[str, str],
                           ends: Callable[[str], Mapping[int, int]] | None, *,
                           field: str) -> ConfigError | None:
    """The driver's judgement, before any data moves, of every position one sink id
    holds (a single sink, or one target of a group).

    ``topic_ids``: the id of each topic the query reads now (topics that do not exist
    yet are absent). ``ends``: a topic's end offset per partition, asked only for
    positions stored before ids were recorded (``None``: not asked). ``field``: where
    a move points (``sink.options``, ``sink.targets[name].options``)."""
    for position in stored.values():
        if position.destination is not None:
            refusal = moved_refusal(sink_id, position.destination, destination,
                                    field=field, recorder="its stored positions")
            if refusal is not None:
                return refusal
    checked_ends: dict[str, Mapping[int, int]] = {}
    for source, position in sorted(stored.items()):
        now_id = topic_ids.get(source.topic)
        if now_id is None or position.offset == NOTHING:
            continue  # not read by this query, or nothing counted yet
        if position.topic_id is not None:
            if not same_topic_id(position.topic_id, now_id):
                return topic_refusal(sink_id, source, position, now_id)
            continue
        if ends is None:
            continue
        if source.topic not in checked_ends:
            checked_ends[source.topic] = ends(source.topic)
        end = checked_ends[source.topic].get(source.partition)
        if end is not None and position.offset >= end:
            return beyond_end_refusal(sink_id, source, position, end)
    return None


__all__ = ["beyond_end_refusal", "claim_refusal", "moved_refusal", "same_topic_id",
           "start_identity_refusal", "topic_refusal"]
