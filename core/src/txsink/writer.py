"""The executor-side loop: begin, stream batches, pre-commit. Plain Python, no Spark."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from txsink.backend import Backend
from txsink.errors import ConfigError
from txsink.model import Committable, DeliveryGuarantee, TransactionContext

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)


def write_participant(
    backend: Backend, ctx: TransactionContext, batches: Iterable[pa.RecordBatch],
    guarantee: DeliveryGuarantee = DeliveryGuarantee.EXACTLY_ONCE,
) -> Committable:
    """Write one participant and return its committable.

    Batches are consumed one at a time, so memory stays bounded by a batch (plus
    whatever the backend buffers), not by the partition. If anything fails before
    the participant is prepared, it is discarded and the error re-raised. Under a
    non-transactional ``guarantee`` the participant is committed here, in the task.
    """
    txn = backend.begin_transaction(ctx)
    try:
        for batch in batches:
            if batch.num_rows:
                _refuse_duplicate_columns(ctx, batch)
                backend.write(txn, batch)
        if guarantee.transactional:
            committable = backend.pre_commit(txn)
        else:
            committable = backend.finish_in_task(txn, guarantee)
    except BaseException:
        try:
            backend.discard(txn)
        except Exception:
            log.exception("discarding %s after a failed write also failed", txn.describe())
        raise
    log.debug("prepared %s rows=%d", committable.describe(), committable.rows)
    return committable


def _refuse_duplicate_columns(ctx: TransactionContext, batch: pa.RecordBatch) -> None:
    """Rows with two columns of one name are refused before any is written: Parquet
    would be unreadable, JSON lines and databases would keep one of the two values."""
    from txsink.targets import duplicate_column

    twice = duplicate_column(batch.schema.names)
    if twice is not None:
        raise ConfigError(
            f"sink={ctx.sink_id}: the rows have the column {twice!r} twice (names are "
            "compared case-blind, as Spark does), which no target can hold faithfully; "
            "nothing was written. Give each column its own name (alias it in the select)",
            field="columns", sink_id=ctx.sink_id)
