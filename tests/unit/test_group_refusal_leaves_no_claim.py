"""A group refused before Spark starts, because one of its targets belongs to another
query, must leave no target claimed (issue 32: a refused run leaves no claimed sink
directory or state).

Found by the first-hour attack: the targets were claimed one after the other, so those
before the refused one stayed bound to the state the check then deletes. The next run of
the same file was refused by them instead, saying the pipeline's checkpoint "was deleted"
(it never existed) and pointing at `txsink reset`; a new sink_id, what the first refusal
advised, was refused too, since the directory was now another sink's. A group now asks
every target (``Backend.check_claim``, read-only) before it claims any.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from txsink.config import load_pipeline
from txsink.errors import ConfigError, ServerUnavailableError, SinkOwnedError
from txsink.files.backend import FilesBackend
from txsink.group import TargetGroup
from txsink.plugins import get_plugins
from txsink.state import DirectoryStateStore
from txsink.targets import parse_targets


def _group(tmp_path: Path, name: str, own: str, shared: str) -> Path:
    f = tmp_path / f"{name}.yaml"
    f.write_text(f"""
name: {name}
source: {{type: rate}}
sink:
  sink_id: orders
  targets:
    - {{name: archive, backend: files, options: {{path: {tmp_path / own}, format: jsonl}}}}
    - {{name: copy, backend: files, options: {{path: {tmp_path / shared}, format: jsonl}}}}
checkpoint: {tmp_path / name / 'checkpoint'}
""")
    return f


def _check(tmp_path: Path, file: Path) -> None:
    from txsink.spark.pipeline import check_ownership

    cfg = load_pipeline(str(file))
    store = DirectoryStateStore(Path(cfg.checkpoint) / "txsink")
    check_ownership(cfg, get_plugins(), store, str(file))


def test_a_refused_group_leaves_its_other_targets_unclaimed(tmp_path: Path) -> None:
    first = _group(tmp_path, "first", "first-archive", "shared")
    _check(tmp_path, first)
    second = _group(tmp_path, "second", "second-archive", "shared")
    with pytest.raises(ConfigError, match="belongs to another query") as refused:
        _check(tmp_path, second)
    assert "first/checkpoint" in str(refused.value)
    assert not (tmp_path / "second" / "checkpoint").exists()
    # Nothing of the refused run: its own target's directory holds no claim ...
    assert not (tmp_path / "second-archive" / "_txsink" / "state.json").exists()
    # ... and running it again says the same thing, not that a checkpoint was deleted.
    with pytest.raises(ConfigError) as again:
        _check(tmp_path, second)
    assert "belongs to another query" in str(again.value), str(again.value)


def _refusal(action: Callable[[], None]) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        action()
    return caught.value


def test_the_files_check_raises_what_the_claim_would_and_writes_nothing(
        tmp_path: Path) -> None:
    backend = FilesBackend.from_options({"path": str(tmp_path / "out")})
    backend.check_claim("s", "state-1", "/one")  # nothing there: nothing to refuse ...
    assert not (tmp_path / "out").exists()  # ... and nothing made
    backend.claim_sink("s", "state-1", "/one")
    backend.check_claim("s", "state-1", "/one")  # its own claim passes
    marker = (tmp_path / "out" / "_txsink" / "state.json").read_bytes()
    for sink, kind in (("s", SinkOwnedError), ("other", ConfigError)):
        checked = _refusal(lambda: backend.check_claim(sink, "state-2", "/two"))  # noqa: B023
        claimed = _refusal(lambda: backend.claim_sink(sink, "state-2", "/two"))  # noqa: B023
        assert type(checked) is type(claimed) is kind
        assert (str(checked), checked.field) == (str(claimed), claimed.field)
    assert (tmp_path / "out" / "_txsink" / "state.json").read_bytes() == marker


def test_a_target_that_is_another_sinks_directory_leaves_the_others_unclaimed(
        tmp_path: Path) -> None:
    # The second target's directory is a single sink's: refused for its sink id.
    FilesBackend.from_options({"path": str(tmp_path / "shared")}).claim_sink(
        "single", "state-0", "/elsewhere")
    file = _group(tmp_path, "grouped", "archive", "shared")
    with pytest.raises(ConfigError, match="belongs to sink 'single'"):
        _check(tmp_path, file)
    assert not (tmp_path / "archive").exists()


def test_a_target_whose_server_is_down_is_a_server_down_and_leaves_the_others_unclaimed(
        tmp_path: Path) -> None:
    """The check of a PostgreSQL target meets a closed port as its claim would: server
    down (no retries: connect_retry_s 0), and the files target before it holds no claim."""
    pytest.importorskip("psycopg", reason="the PostgreSQL backend's client is not installed")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    specs = parse_targets([
        {"name": "archive", "backend": "files", "options": {"path": str(tmp_path / "out")}},
        {"name": "totals", "backend": "postgres", "options": {
            "dsn": f"host=127.0.0.1 port={port} dbname=postgres user=nobody", "table": "t",
            "connect_retry_s": "0"}}], "g")
    group = TargetGroup.from_specs("g", specs)
    try:
        totals = group.members["totals"].backend
        claimed = _refusal(lambda: totals.claim_sink("g--totals", "state-1", "/s"))
        checked = _refusal(lambda: group.claim_sink("g", "state-1", "/s"))
    finally:
        group.close()
    assert type(checked) is type(claimed) is ServerUnavailableError
    assert checked.field == claimed.field == "dsn"
    assert str(port) in str(checked), str(checked)
    assert not (tmp_path / "out").exists()
