"""A password that equals a word of the committable commits, against a real server.

Before, the secrets check refused every epoch of a sink whose password was
``postgres`` (the backend's name is in every committable) or the table's name, for
ever, single sinks and groups alike. The password still never reaches the state.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from postgres_support import PgServer
from psycopg import sql
from psycopg.conninfo import make_conninfo
from txsink.coordinator import Coordinator
from txsink.group import TargetGroup, write_group
from txsink.model import TransactionContext
from txsink.plugins import get_plugins
from txsink.state import DirectoryStateStore
from txsink.targets import parse_targets
from txsink.writer import write_participant

pytestmark = pytest.mark.integration


def role_with_password(pg_server: PgServer, password: str) -> str:
    role = f"pw_{uuid.uuid4().hex[:8]}"
    with pg_server.connect() as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}").format(
            sql.Identifier(role), sql.Literal(password)))
    return role


@pytest.mark.parametrize("password", ["postgres", "table"])
def test_a_password_named_like_a_word_of_the_committable_commits(
        pg_server: PgServer, table_name: str, tmp_path: Path, password: str) -> None:
    if pg_server.password is None:
        pytest.skip("the server named by TXSINK_POSTGRES_DSN takes no password")
    secret = table_name.split(".")[1] if password == "table" else password
    role = role_with_password(pg_server, secret)
    options = {"dsn": make_conninfo(pg_server.dsn, user=role), "table": table_name,
               "password": secret}
    rows = pa.record_batch({"id": pa.array([1, 2], pa.int64()), "name": pa.array(["a", "b"]),
                            "amount": pa.array([1.0, 2.0])})
    try:
        # A single sink.
        sink = f"weak-{uuid.uuid4().hex[:6]}"
        backend = get_plugins().create_backend("postgres", options)
        try:
            backend.preflight(sink)
            coordinator = Coordinator(backend, DirectoryStateStore(tmp_path / "one"), sink)
            coordinator.start()
            coordinator.commit_epoch(0, [write_participant(
                backend, TransactionContext(sink, 0, 0), [rows])])
        finally:
            backend.close()
        # A group whose sink id holds the password too.
        group_id = f"{secret.replace('_', '-')}-{uuid.uuid4().hex[:4]}"
        items = [{"name": "totals", "backend": "postgres", "options": options},
                 {"name": "files", "backend": "files",
                  "options": {"path": str(tmp_path / "out")}}]
        group = TargetGroup.from_specs(group_id, parse_targets(items, group_id))
        try:
            group.preflight(group_id)
            coordinator = Coordinator(group, DirectoryStateStore(tmp_path / "grp"), group_id)
            coordinator.start()
            coordinator.commit_epoch(0, write_group(group, 0, 0, 0, [rows]))
        finally:
            group.close()
        assert sorted(pg_server.ids(table_name)) == [1, 1, 2, 2]
        for state in ("one", "grp"):  # the password is in no committable, no state file
            for f in (tmp_path / state).rglob("*"):
                if f.is_file():
                    text = f.read_text(errors="replace")
                    assert f"password={secret}" not in text and f":{secret}@" not in text
    finally:
        with pg_server.connect() as conn:  # what it created (txsink's schema) stays
            conn.execute(sql.SQL("REASSIGN OWNED BY {} TO CURRENT_USER").format(
                sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
