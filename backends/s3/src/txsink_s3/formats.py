"""Streaming encoders: Arrow record batches in, bytes out into a part buffer.

The encoders never hold a partition: Parquet keeps at most one row group of Arrow
data (``row_group_bytes``) before encoding it, JSON Lines and CSV encode each batch
at once. The encoded bytes land in a :class:`PartBuffer`, which the backend drains
into multipart-upload parts whenever it holds ``part_size`` bytes.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from typing import IO, Any, Protocol, cast

import pyarrow as pa
from txsink.columnar import dictionary_columns
from txsink.errors import TxsinkError


class PartBuffer:
    """A write-only file object collecting encoded bytes until the backend takes a part.

    Encoders (pyarrow's ParquetWriter and CSVWriter) write into it like into a file;
    ``close`` does not drop the bytes, because the last part is taken after the
    encoder wrote its footer and closed its sink.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data)
        self._buf += view
        self._pos += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self._pos

    def flush(self) -> None:
        pass

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True

    def __len__(self) -> int:
        return len(self._buf)

    def take(self) -> bytearray:
        """Every buffered byte, emptying the buffer (the stream position keeps counting).

        Hands over the buffer itself rather than a copy: a part is the largest thing
        the backend holds, so a copy would double the peak.
        """
        data, self._buf = self._buf, bytearray()
        return data


class Encoder(Protocol):
    def write(self, batch: pa.RecordBatch) -> None: ...

    def finish(self) -> None:
        """Flush what is held and write any footer; the encoder is done afterwards."""


def _schema_error(expected: pa.Schema, got: pa.Schema) -> TxsinkError:
    return TxsinkError(
        f"record batch schema changed within one partition: expected {expected}, got {got}")


class ParquetEncoder:
    """Parquet through ``pyarrow.parquet.ParquetWriter``, one row group per ~row_group_bytes."""

    def __init__(self, out: PartBuffer, *, compression: str, row_group_bytes: int,
                 dictionary: str = "auto") -> None:
        self._out = out
        self._dictionary = dictionary
        self._compression = compression
        self._row_group_bytes = row_group_bytes
        self._writer: Any = None
        self._schema: pa.Schema | None = None
        self._pending: list[pa.RecordBatch] = []
        self._pending_bytes = 0

    def write(self, batch: pa.RecordBatch) -> None:
        if self._schema is None:
            import pyarrow.parquet as pq

            self._schema = batch.schema
            compression: Any = self._compression
            # pyarrow takes a list of column names too; its stubs only say bool.
            use_dictionary: Any = dictionary_columns(batch, self._dictionary)
            self._writer = pq.ParquetWriter(
                cast("IO[bytes]", self._out), batch.schema, compression=compression,
                use_dictionary=use_dictionary)
        elif not batch.schema.equals(self._schema):
            raise _schema_error(self._schema, batch.schema)
        self._pending.append(batch)
        self._pending_bytes += batch.nbytes
        if self._pending_bytes >= self._row_group_bytes:
            self._flush_row_group()

    def _flush_row_group(self) -> None:
        if not self._pending:
            return
        table = pa.Table.from_batches(self._pending, schema=self._schema)
        self._pending = []
        self._pending_bytes = 0
        self._writer.write_table(table, row_group_size=max(1, table.num_rows))

    def finish(self) -> None:
        if self._writer is None:
            return
        self._flush_row_group()
        self._writer.close()


class CsvEncoder:
    """CSV with a header line, through ``pyarrow.csv.CSVWriter``."""

    def __init__(self, out: PartBuffer) -> None:
        self._out = out
        self._writer: Any = None
        self._schema: pa.Schema | None = None

    def write(self, batch: pa.RecordBatch) -> None:
        if self._schema is None:
            import pyarrow.csv as pcsv

            self._schema = batch.schema
            self._writer = pcsv.CSVWriter(cast("IO[bytes]", self._out), batch.schema)
        elif not batch.schema.equals(self._schema):
            raise _schema_error(self._schema, batch.schema)
        self._writer.write_batch(batch)

    def finish(self) -> None:
        if self._writer is not None:
            self._writer.close()


def _json_default(value: object) -> object:
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"cannot write a {type(value).__name__} as JSON")


class JsonLinesEncoder:
    """One JSON object per row. Dates and times as ISO 8601, decimals as strings, bytes base64."""

    def __init__(self, out: PartBuffer) -> None:
        self._out = out

    def write(self, batch: pa.RecordBatch) -> None:
        dumps = json.JSONEncoder(default=_json_default, ensure_ascii=False,
                                 separators=(",", ":")).encode
        lines = [dumps(row) for row in batch.to_pylist()]
        if lines:
            self._out.write(("\n".join(lines) + "\n").encode("utf-8"))

    def finish(self) -> None:
        pass


def make_encoder(fmt: str, out: PartBuffer, *, compression: str, row_group_bytes: int,
                 dictionary: str = "auto") -> Encoder:
    if fmt == "parquet":
        return ParquetEncoder(out, compression=compression, row_group_bytes=row_group_bytes,
                              dictionary=dictionary)
    if fmt == "csv":
        return CsvEncoder(out)
    if fmt == "jsonl":
        return JsonLinesEncoder(out)
    raise ValueError(f"unknown format {fmt!r}")
