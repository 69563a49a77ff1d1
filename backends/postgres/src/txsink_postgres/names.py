"""Names txsink derives or parses for PostgreSQL: transaction gids and table names.

Gids are deterministic (sink id, epoch, partition, attempt) so that any process can
find, commit or roll back a participant, and so that orphans of a sink can be listed
from ``pg_prepared_xacts`` by prefix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from txsink.errors import ConfigError
from txsink.model import TransactionContext, parse_participant

#: Every gid txsink creates starts with this, so other prepared transactions are ignored.
GID_PREFIX = "txsink:"
#: PostgreSQL's limit for a prepared transaction's identifier (GIDSIZE - 1), in bytes.
GID_MAX_BYTES = 200
_GID_CHARS = re.compile(r"^[A-Za-z0-9_:-]+$")


def make_gid(ctx: TransactionContext) -> str:
    """The gid of the participant ``ctx``: ``txsink:<sink>-e<epoch>-p<partition>-a<attempt>``."""
    gid = GID_PREFIX + ctx.participant
    if not _GID_CHARS.match(gid):
        raise ConfigError(f"transaction id {gid[:80]!r} has characters PostgreSQL gids "
                          "should not carry; use a sink id of A-Z a-z 0-9 _ -",
                          field="sink_id", sink_id=ctx.sink_id)
    if len(gid.encode()) > GID_MAX_BYTES:
        raise ConfigError(f"transaction id for {ctx.describe()} is {len(gid.encode())} bytes; "
                          f"PostgreSQL allows {GID_MAX_BYTES}: use a shorter sink id",
                          field="sink_id", sink_id=ctx.sink_id)
    return gid


def parse_gid(gid: str) -> TransactionContext | None:
    """Inverse of :func:`make_gid`; ``None`` for gids txsink did not make."""
    if not gid.startswith(GID_PREFIX):
        return None
    return parse_participant(gid[len(GID_PREFIX):])


def like_prefix(sink_id: str) -> str:
    """A ``LIKE`` pattern (escape character ``\\``) for every gid of ``sink_id``.

    ``_`` is a LIKE wildcard and may occur in sink ids, so it is escaped. The
    pattern can also match a longer sink id (``a`` matches ``a-e1``'s gids):
    callers parse each gid and compare the sink id exactly.
    """
    escaped = (GID_PREFIX + sink_id + "-e").replace("\\", "\\\\")
    escaped = escaped.replace("%", "\\%").replace("_", "\\_")
    return escaped + "%"


_PART = r'(?:"(?:[^"]|"")+"|[^".]+)'
_QUALIFIED = re.compile(rf"^(?P<first>{_PART})(?:\.(?P<second>{_PART}))?$")


def _unquote(part: str) -> str:
    if part.startswith('"'):
        return part[1:-1].replace('""', '"')
    return part


@dataclass(frozen=True)
class TableName:
    """A schema-qualified table name, kept as two identifiers (quoted only via psycopg.sql)."""

    schema: str
    table: str

    @classmethod
    def parse(cls, text: str, *, field: str = "table", default_schema: str = "public"
              ) -> TableName:
        """Parse ``schema.table`` or ``table``; parts may be double-quoted (``"My.Schema".t``)."""
        m = _QUALIFIED.match(text.strip())
        if not m:
            raise ConfigError(
                f"postgres backend: option '{field}' {text!r} is not a table name; use "
                "schema.table (double-quote parts that contain dots or quotes)",
                field=field)
        if m["second"] is None:
            return cls(default_schema, _unquote(m["first"]))
        return cls(_unquote(m["first"]), _unquote(m["second"]))

    def __str__(self) -> str:
        def show(part: str) -> str:
            return part if re.match(r"^[a-z_][a-z0-9_]*$", part) else \
                '"' + part.replace('"', '""') + '"'
        return f"{show(self.schema)}.{show(self.table)}"
