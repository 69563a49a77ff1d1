"""Transactional ids: which names a sink uses, and how a writer picks a pooled one.

A fresh ``transactional.id`` per participant makes every broker keep metadata for
each of them until ``transactional.id.expiration.ms`` (7 days by default): one per
epoch and partition, tens of thousands a day for a one-minute trigger. Like Flink's
``TransactionNamingStrategy.POOLING``, the ``pooled`` naming reuses a small set of
ids per write partition instead::

    <transactional.id.prefix>-<sink id>-p<partition>-t<slot>

A writer takes the lowest slot whose id has no open transaction on its coordinator
(DescribeTransactions). A prepared participant keeps its transaction open until the
driver commits or aborts it, so a slot whose transaction belongs to a decided but
not yet committed epoch is never picked, and never fenced. Once an epoch is
committed its slots are free again: a sink that commits every epoch uses one slot
per partition, plus one per attempt that overlaps another (retries, speculative
copies) or lingers as an orphan until the next orphan scan aborts it.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from txsink.errors import TxsinkError
from txsink.model import TransactionContext, participant_name

from txsink_kafka.txn_protocol import TransactionInfo, TxnCoordinatorClient

log = logging.getLogger(__name__)

#: Slots asked about per DescribeTransactions request.
PROBE_WINDOW = 4
#: The state of an id initialised by a producer that began no transaction since.
IDLE_STATE = "Empty"


def participant_id(prefix: str, ctx: TransactionContext) -> str:
    """The ``participant`` naming: one id per participant, never reused."""
    return f"{prefix}-{ctx.participant}"


def pooled_id(prefix: str, sink_id: str, partition: int, slot: int) -> str:
    return f"{prefix}-{sink_id}-p{partition}-t{slot}"


def is_pooled(prefix: str, transactional_id: str) -> bool:
    """Is ``transactional_id`` a pooled id (of any sink with this prefix)?"""
    return bool(re.match(re.escape(prefix) + r"-.+-p\d+-t\d+\Z", transactional_id))


def preflight_id(prefix: str, sink_id: str) -> str:
    """The one id the driver's preflight registers to check the transaction timeout."""
    return f"{prefix}-{sink_id}-preflight"


@dataclass(frozen=True)
class SinkIds:
    """Recognises the transactional ids one sink makes, under either naming.

    Sink ids may contain ``-``, so ``a`` and ``a-p0`` share a textual prefix; the
    fixed-format suffix after the sink id keeps the two apart.
    """

    prefix: str
    sink_id: str

    def _head(self) -> str:
        return re.escape(f"{self.prefix}-{self.sink_id}-")

    @property
    def pooled(self) -> re.Pattern[str]:
        return re.compile(self._head() + r"p(\d+)-t(\d+)\Z")

    @property
    def per_participant(self) -> re.Pattern[str]:
        return re.compile(self._head() + r"e(\d+)-p(\d+)-a(\d+)\Z")

    def owns(self, transactional_id: str) -> bool:
        return bool(self.pooled.match(transactional_id)
                    or self.per_participant.match(transactional_id)
                    or transactional_id == preflight_id(self.prefix, self.sink_id))

    def partition_of(self, transactional_id: str) -> int | None:
        m = self.pooled.match(transactional_id)
        if m:
            return int(m[1])
        m = self.per_participant.match(transactional_id)
        return int(m[2]) if m else None

    def participant_of(self, transactional_id: str) -> str | None:
        """The participant name a per-participant id encodes (pooled ids encode none)."""
        m = self.per_participant.match(transactional_id)
        if not m:
            return None
        return participant_name(self.sink_id, int(m[1]), int(m[2]), int(m[3]))


class PoolExhaustedError(TxsinkError):
    """Every pooled id of a partition holds an open transaction."""


def acquire_pooled_id(client: TxnCoordinatorClient, prefix: str, ctx: TransactionContext,
                      pool_size: int, *, avoid_idle: bool = False) -> str:
    """The lowest slot of ``ctx.partition`` whose id has no open transaction.

    ``avoid_idle`` (a producer opened ahead of need, ``producer.init.ahead``): prefer a
    slot not in state ``Empty``, which a producer initialised without beginning a
    transaction since: most likely another writer process's producer opened ahead,
    which initialising the id again would fence (a fenced orphan's slot looks the same,
    and is taken once no other is free).

    Two attempts of one partition that probe within one round trip of each other can
    pick the same free slot; the later ``init_transactions`` then fences the earlier
    attempt, whose writes fail (it cannot have prepared yet: preparing takes the
    marker write and a flush, far longer than the probe).
    """
    busy: dict[str, TransactionInfo] = {}
    idle: str | None = None
    for start in range(0, pool_size, PROBE_WINDOW):
        ids = [pooled_id(prefix, ctx.sink_id, ctx.partition, slot)
               for slot in range(start, min(pool_size, start + PROBE_WINDOW))]
        described = client.describe_transactions(ids)
        for tid in ids:
            info = described.get(tid)
            if avoid_idle and info is not None and info.state == IDLE_STATE:
                idle = idle or tid
                continue
            if info is None or not info.is_open:
                if busy:
                    log.debug("%s: pooled ids %s are open; using %s", ctx.describe(),
                              ", ".join(busy), tid)
                return tid
            busy[tid] = info
    if idle is not None:
        return idle
    raise PoolExhaustedError(
        f"{ctx.describe()}: all {pool_size} pooled transactional ids of partition "
        f"{ctx.partition} ({', '.join(busy)}) hold open transactions: prepared participants "
        "waiting for a commit, or orphans of crashed runs. `txsink status` lists them and "
        "`txsink resolve` ends them; the next query start aborts orphans. Raise "
        "'transactional.id.pool.size' if this many attempts of one partition really run "
        "at once", sink_id=ctx.sink_id, epoch=ctx.epoch, participant=ctx.participant)
