"""Parquet encoding choices shared by the backends that write Parquet (files, S3).

Kept in the core so every backend that writes Parquet picks dictionary columns the
same way, and third-party backends can too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

#: ``auto`` dictionary-encodes a column only if its first batch repeats values this much.
DICTIONARY_MAX_DISTINCT_RATIO = 0.5
#: First batches smaller than this say too little about cardinality: encode all.
DICTIONARY_SAMPLE_ROWS = 1000
#: Values of the ``dictionary`` options: ``auto`` (by cardinality), ``all``, ``none``.
DICTIONARY_MODES = ("auto", "all", "none")


def dictionary_columns(batch: pa.RecordBatch, mode: str) -> bool | list[str]:
    """Which columns to dictionary-encode: ``use_dictionary`` for ``ParquetWriter``.

    Dictionary encoding of a column of (nearly) unique values is wasted work: the
    writer builds the dictionary, gives up at the page limit and re-encodes plainly.
    Profiled on the benchmark data it made encoding ~2.5x slower and files larger.
    ``auto`` keeps it for columns whose first batch is at most half distinct.
    """
    import pyarrow as pa

    if mode in ("all", "none"):
        return mode == "all"
    if batch.num_rows < DICTIONARY_SAMPLE_ROWS or any(
            pa.types.is_nested(f.type) for f in batch.schema):
        return True
    import pyarrow.compute as pc

    chosen = []
    for i, field in enumerate(batch.schema):
        distinct = pc.count_distinct(batch.column(i), mode="all").as_py()
        if distinct <= DICTIONARY_MAX_DISTINCT_RATIO * batch.num_rows:
            chosen.append(field.name)
    return chosen
