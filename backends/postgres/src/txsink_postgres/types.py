"""The Spark/Arrow to PostgreSQL type mapping, and turning Arrow columns into COPY values.

Each Arrow type has a column type used by ``create_table`` and a set of existing
column types it may be written into without loss. Binary ``COPY`` applies no casts
on the server, so the type psycopg encodes for is chosen from the *table's* column.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

_TEXT_LIKE = frozenset({"text", "varchar", "bpchar", "name", "citext"})
#: Column types (``pg_type.typname``) whose binary input psycopg can encode for.
_BINARY_DUMP = {
    "bool": "bool", "int2": "int2", "int4": "int4", "int8": "int8", "numeric": "numeric",
    "float4": "float4", "float8": "float8", "bytea": "bytea", "date": "date",
    "timestamp": "timestamp", "timestamptz": "timestamptz", "time": "time",
    "interval": "interval",
    # The binary wire format of every text-like type is the text's bytes.
    "text": "text", "varchar": "text", "bpchar": "text", "name": "text",
}


@dataclass(frozen=True)
class PgType:
    """How one Arrow type maps: the DDL type to create, and the column types accepted."""

    ddl: str
    accepted: frozenset[str]
    spark: str


def pg_type_for(t: pa.DataType) -> PgType | None:
    """The mapping for Arrow type ``t``, or ``None`` if txsink cannot write it."""
    import pyarrow as pa

    types = pa.types
    if types.is_dictionary(t):
        return pg_type_for(t.value_type)
    if types.is_boolean(t):
        return PgType("boolean", frozenset({"bool"}), "BooleanType")
    if types.is_int8(t) or types.is_uint8(t) or types.is_int16(t):
        return PgType("smallint", frozenset({"int2", "int4", "int8", "numeric"}),
                      "ByteType/ShortType")
    if types.is_int32(t) or types.is_uint16(t):
        return PgType("integer", frozenset({"int4", "int8", "numeric"}), "IntegerType")
    if types.is_int64(t) or types.is_uint32(t):
        return PgType("bigint", frozenset({"int8", "numeric"}), "LongType")
    if types.is_uint64(t):
        return PgType("numeric(20,0)", frozenset({"numeric"}), "-")
    if types.is_float16(t) or types.is_float32(t):
        return PgType("real", frozenset({"float4", "float8"}), "FloatType")
    if types.is_float64(t):
        return PgType("double precision", frozenset({"float8"}), "DoubleType")
    if types.is_decimal(t):
        return PgType(f"numeric({t.precision},{t.scale})", frozenset({"numeric"}),
                      "DecimalType")
    if types.is_string(t) or types.is_large_string(t):
        return PgType("text", _TEXT_LIKE | {"json", "jsonb", "uuid", "xml"}, "StringType")
    if types.is_binary(t) or types.is_large_binary(t) or types.is_fixed_size_binary(t):
        return PgType("bytea", frozenset({"bytea"}), "BinaryType")
    if types.is_date(t):
        return PgType("date", frozenset({"date"}), "DateType")
    if types.is_timestamp(t):
        if t.tz is not None:
            return PgType("timestamp with time zone", frozenset({"timestamptz"}),
                          "TimestampType")
        return PgType("timestamp without time zone", frozenset({"timestamp"}),
                      "TimestampNTZType")
    if types.is_time(t):
        return PgType("time without time zone", frozenset({"time"}), "-")
    if types.is_duration(t):
        return PgType("interval", frozenset({"interval"}), "DayTimeIntervalType")
    if types.is_list(t) or types.is_large_list(t) or types.is_struct(t) or types.is_map(t):
        return PgType("jsonb", frozenset({"jsonb", "json", "text"}),
                      "ArrayType/StructType/MapType")
    if types.is_null(t):
        return PgType("text", frozenset({"*"}), "NullType")
    return None


def accepts(pg: PgType, typname: str) -> bool:
    return "*" in pg.accepted or typname in pg.accepted


def binary_dump_type(typname: str) -> str | None:
    """The type psycopg encodes a value for in binary COPY, or ``None`` (use text COPY)."""
    return _BINARY_DUMP.get(typname)


def _json_default(value: object) -> object:
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    return str(value)


def column_converter(t: pa.DataType, typname: str) -> Callable[[pa.Array[Any]], Sequence[Any]]:
    """A function turning one Arrow column into Python values psycopg can encode for ``typname``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    types = pa.types
    if types.is_dictionary(t):
        inner = column_converter(t.value_type, typname)
        return lambda col: inner(col.dictionary_decode())  # type: ignore[attr-defined]
    if types.is_list(t) or types.is_large_list(t) or types.is_struct(t) or types.is_map(t):
        def to_json(col: pa.Array[Any]) -> list[str | None]:
            return [None if v is None else json.dumps(v, default=_json_default)
                    for v in col.to_pylist()]
        return to_json
    if types.is_float16(t):
        return lambda col: pc.cast(col, pa.float32()).to_pylist()
    if types.is_timestamp(t) and t.unit == "ns":
        # Python datetimes hold microseconds (as does PostgreSQL): truncate.
        target = pa.timestamp("us", tz=t.tz)
        return lambda col: pc.cast(col, target, safe=False).to_pylist()
    if types.is_duration(t) and t.unit == "ns":
        return lambda col: pc.cast(col, pa.duration("us"), safe=False).to_pylist()
    if types.is_time64(t) and t.unit == "ns":
        return lambda col: pc.cast(col, pa.time64("us"), safe=False).to_pylist()
    return lambda col: col.to_pylist()
