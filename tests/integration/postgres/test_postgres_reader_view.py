"""The reader view of docs/multi-target.md, as written there, against a real server.

Its SQL is taken from the page. A session sees the epochs up to the cut it set, and
no rows when it never set one, reset it, or had it discarded by a pooler's
``DISCARD ALL`` (before: ``invalid input syntax for type bigint: ""`` once a session
had set and reset the cut).
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from postgres_support import PgServer, drop_table

pytestmark = pytest.mark.integration

PAGE = Path(__file__).resolve().parents[3] / "docs" / "multi-target.md"


def recipe(name: str) -> str:
    found = re.search(rf"<!-- recipe: {name} -->\s*```sql\n(.*?)```", PAGE.read_text(), re.S)
    assert found, name
    return found.group(1)


def test_the_documented_view_reads_up_to_the_cut_and_nothing_without_one(
        pg_server: PgServer) -> None:
    run = uuid.uuid4().hex[:8]
    table, view = f"public.order_totals_{run}", f"public.order_totals_at_cut_{run}"

    def here(sql: str) -> str:
        return sql.replace("public.order_totals_at_cut", "\0").replace(
            "public.order_totals", table).replace("\0", view)

    with pg_server.connect() as conn:
        conn.execute(f"CREATE TABLE {table} (order_id bigint, customer text, total bigint, "
                     "txsink_epoch bigint)")
        try:
            conn.execute(f"INSERT INTO {table} SELECT e * 10 + i, 'c' || i, 1, e "
                         "FROM generate_series(0, 12) e, generate_series(0, 1) i")
            conn.execute(here(recipe("pg-view")))

            def read() -> dict[str, int]:
                statements = [s for s in here(recipe("pg-read")).split(";") if s.strip()]
                for statement in statements[:-1]:
                    conn.execute(statement)
                return dict(conn.execute(statements[-1]).fetchall())

            def visible() -> int:
                row = conn.execute(f"SELECT count(*) FROM {view}").fetchone()
                assert row is not None
                return int(row[0])

            assert visible() == 0  # never set
            assert read() == {"c0": 12, "c1": 12}  # the page's cut, 11: epochs 0-11
            conn.execute("RESET txsink.cut")
            assert visible() == 0
            conn.execute("SET txsink.cut = '3'")
            assert visible() == 8
            conn.execute("DISCARD ALL")  # what a pooler does between clients
            assert visible() == 0
            conn.execute("SELECT set_config('txsink.cut', '12', false)")
            assert visible() == 26
        finally:
            conn.execute(f"DROP VIEW IF EXISTS {view}")
    drop_table(pg_server, table)
