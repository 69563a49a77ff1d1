"""The topics a real-time query reads, as identities (backend-provided).

Positions are offsets *of* a topic, and a topic name can be re-pointed (deleted and
recreated, read from another cluster: the offsets start again). Spark's Kafka source
hands each row its topic's name only, so the name is resolved to the topic's id
(Kafka >= 2.8 gives every topic a uuid) by the backend that speaks Kafka
(``Backend.realtime_source``): core never imports a backend. The same object answers
which topics the query reads (``subscribe``, ``subscribePattern``, ``assign``), so a
target writing one of them is refused before data moves.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence


class SourceTopics(abc.ABC):
    """What a real-time query reads: built on the driver from the source's options,
    pickled to the tasks. Holds no open client (it travels), and no secret in
    :meth:`describe`."""

    @abc.abstractmethod
    def reads(self, topic: str) -> bool:
        """Whether the query reads ``topic`` now or once it exists: ``subscribe`` names
        it, ``subscribePattern`` matches it, ``assign`` names a partition of it."""

    @abc.abstractmethod
    def topics(self) -> list[str]:
        """The topics it reads now (a pattern: the topics that match it now)."""

    @abc.abstractmethod
    def topic_ids(self, topics: Sequence[str]) -> dict[str, str]:
        """The id of each of ``topics`` that exists now (absent: no such topic)."""

    @abc.abstractmethod
    def end_offsets(self, topic: str) -> dict[int, int]:
        """Each partition's end offset (the offset the next record gets)."""

    @abc.abstractmethod
    def servers(self) -> str:
        """The bootstrap servers it reads through (comma-separated)."""

    @abc.abstractmethod
    def cluster_id(self) -> str | None:
        """The id of the cluster it reads (``None``: it cannot tell now)."""

    @abc.abstractmethod
    def describe(self) -> str:
        """What it reads, without secrets."""


__all__ = ["SourceTopics"]
