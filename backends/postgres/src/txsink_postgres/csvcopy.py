"""Vectorised COPY: whole Arrow batches encoded as CSV by Arrow's C++ writer.

Per-row ``write_row`` spends most of a COPY's time turning Arrow values into
Python objects and back. For the column types whose CSV text PostgreSQL reads back
exactly (integers, floats written shortest-round-trip, decimals, text, booleans,
dates, timestamps, times, bytea as ``\\x`` hex) the batch is encoded in one call
instead. Every valid value is quoted and nulls are left empty and unquoted, which
is how PostgreSQL's CSV format tells NULL from the empty string.

Dates and timestamps before year 1, which Arrow prints in a form PostgreSQL does
not read, are refused with an error naming the column (:func:`first_unwritable`).
"""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

#: Days from 1970-01-01 back to 0001-01-01: Arrow prints earlier dates with a minus
#: sign, which PostgreSQL rejects (it wants "BC").
_MIN_DAY = (dt.date(1, 1, 1) - dt.date(1970, 1, 1)).days
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def csv_converter(t: pa.DataType) -> Callable[[pa.Array[Any]], pa.Array[Any]] | None:
    """A function normalising a column of type ``t`` for CSV, or ``None`` if not exact."""
    import pyarrow as pa
    import pyarrow.compute as pc

    types = pa.types
    if types.is_dictionary(t):
        inner = csv_converter(t.value_type)
        if inner is None:
            return None
        return lambda col: inner(col.dictionary_decode())  # type: ignore[attr-defined]
    if (types.is_integer(t) or types.is_float32(t) or types.is_float64(t)
            or types.is_decimal(t) or types.is_boolean(t) or types.is_string(t)
            or types.is_large_string(t) or types.is_date(t) or types.is_null(t)):
        return _same
    if types.is_float16(t):
        return lambda col: pc.cast(col, pa.float32())
    if types.is_timestamp(t):
        if t.unit == "ns":  # PostgreSQL keeps microseconds: truncate, as binary COPY does
            target = pa.timestamp("us", tz=t.tz)
            return lambda col: pc.cast(col, target, safe=False)
        return _same
    if types.is_time(t):
        if t.unit == "ns":
            return lambda col: pc.cast(col, pa.time64("us"), safe=False)
        return _same
    if types.is_binary(t) or types.is_large_binary(t) or types.is_fixed_size_binary(t):
        return _bytea_hex
    return None


def _same(col: pa.Array[Any]) -> pa.Array[Any]:
    return col


def _bytea_hex(col: pa.Array[Any]) -> pa.Array[Any]:
    """``\\x``-prefixed hex text of each value: one ``bytes.hex()`` over the data buffer,
    then slices of it (no per-value conversion through Python bytes objects)."""
    import pyarrow as pa

    if not pa.types.is_large_binary(col.type):
        col = col.cast(pa.large_binary())
    n = len(col)
    _, offsets_buf, data_buf = col.buffers()
    assert offsets_buf is not None
    offsets = memoryview(offsets_buf).cast("B").cast("q")[col.offset: col.offset + n + 1]
    start = offsets[0]
    hexed = "" if data_buf is None else data_buf.to_pybytes()[start: offsets[n]].hex()
    valid = col.is_valid().to_pylist()
    values = [("\\x" + hexed[2 * (offsets[i] - start): 2 * (offsets[i + 1] - start)])
              if valid[i] else None for i in range(n)]
    return pa.array(values, pa.large_string())


def first_unwritable(batch: pa.RecordBatch) -> str | None:
    """The name of a date/timestamp column holding a value before year 1, if any.

    Arrow prints such values with a minus sign PostgreSQL does not read as BC (nor
    can Python's ``datetime`` hold them for the row-by-row path), so they are refused
    with a clear error rather than stored wrong. Years past 9999 round-trip.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    for name, col in zip(batch.schema.names, batch.columns, strict=True):
        t = col.type
        if pa.types.is_dictionary(t):
            t = t.value_type
            col = col.dictionary_decode()  # type: ignore[attr-defined]
        ints: Any
        margin = 0
        if pa.types.is_date32(t):
            ints, per_day = col.cast(pa.int32()), 1
        elif pa.types.is_date64(t):
            ints, per_day = col.cast(pa.int64()), 86_400_000
        elif pa.types.is_timestamp(t):
            ints, per_day = col.cast(pa.int64()), 86_400 * _PER_SECOND[t.unit]
            # A zone's offset can move the printed date a day across year 1.
            margin = 1 if t.tz is not None else 0
        else:
            continue
        if col.null_count == len(col):
            continue
        if pc.min(ints).as_py() < (_MIN_DAY + margin) * per_day:
            return name
    return None


def encode(batch: pa.RecordBatch,
           converters: list[Callable[[pa.Array[Any]], pa.Array[Any]]]) -> bytes:
    """The batch as CSV rows (no header), every valid value quoted."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    columns = [convert(batch.column(i)) for i, convert in enumerate(converters)]
    table = pa.Table.from_arrays(columns, names=[f"c{i}" for i in range(len(columns))])
    sink = io.BytesIO()
    pacsv.write_csv(table, sink, pacsv.WriteOptions(include_header=False,
                                                    quoting_style="all_valid",
                                                    batch_size=max(1, batch.num_rows)))
    return sink.getvalue()
