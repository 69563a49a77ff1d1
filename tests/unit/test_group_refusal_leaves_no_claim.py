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

import shutil
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from txsink.backend import Backend
from txsink.config import load_pipeline
from txsink.errors import ConfigError, ServerUnavailableError, SinkOwnedError
from txsink.files.backend import FilesBackend
from txsink.group import Member, TargetGroup
from txsink.hookspecs import hookimpl
from txsink.plugins import BackendRegistry, build_plugins, get_plugins
from txsink.state import DirectoryStateStore
from txsink.targets import TargetSpec, parse_targets


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
    assert (claimed.field, checked.field) == ("dsn", "targets[totals].options.dsn")
    assert str(checked) == f"target 'totals' ({totals.describe()}): {claimed}"
    assert str(port) in str(checked), str(checked)
    assert not (tmp_path / "out").exists()


def test_the_way_out_of_a_refusal_by_another_sinks_directory_works(tmp_path: Path) -> None:
    """The refusal says "give each sink its own 'path'"; doing so must run, not be
    refused as a move of the target (the refused run's new state had kept the refused
    path as the target's destination). The same for a single sink."""
    FilesBackend.from_options({"path": str(tmp_path / "shared")}).claim_sink(
        "single", "state-0", "/elsewhere")
    file = _group(tmp_path, "grouped", "archive", "shared")
    with pytest.raises(ConfigError, match="belongs to sink 'single'"):
        _check(tmp_path, file)
    assert not (tmp_path / "grouped" / "checkpoint").exists()
    _check(tmp_path, _group(tmp_path, "grouped", "archive", "own"))
    assert (tmp_path / "own" / "_txsink" / "state.json").exists()

    single = tmp_path / "single.yaml"
    for out in ("shared", "mine"):
        single.write_text(f"""
name: single
source: {{type: rate}}
sink: {{sink_id: solo, backend: files, options: {{path: {tmp_path / out}}}}}
checkpoint: {tmp_path / 'single' / 'checkpoint'}
""")
        if out == "shared":
            with pytest.raises(ConfigError, match="belongs to sink 'single'"):
                _check(tmp_path, single)
        else:
            _check(tmp_path, single)
    assert (tmp_path / "mine" / "_txsink" / "state.json").exists()


def test_two_targets_in_one_directory_are_refused_before_any_claim(tmp_path: Path) -> None:
    """Each target has its own sink id and a files directory holds one: the second
    claim was refused after the first was made, leaving the directory bound to a state
    that was then deleted, and the next run told its checkpoint "was deleted"."""
    (tmp_path / "a").mkdir()
    file = _group(tmp_path, "twice", "same", "a/../same")
    for _ in range(2):  # the same refusal each time, at load: nothing is touched
        with pytest.raises(ConfigError, match="'archive' and 'copy' both write to the "
                           "directory") as refused:
            _check(tmp_path, file)
        assert refused.value.field == "sink.targets[copy].options.path"
    assert not (tmp_path / "same").exists()
    assert not (tmp_path / "twice").exists()
    with pytest.raises(ConfigError, match="both write to the directory"):  # from Python
        parse_targets([{"name": n, "backend": "files", "options": {"path": path}}
                       for n, path in (("a", str(tmp_path / "x")),
                                       ("b", f"file://{tmp_path}/x/"))], "g")


def test_a_refused_new_state_keeps_no_destination_from_python(tmp_path: Path) -> None:
    """The Python API's path (TargetSet.write, txsink.spark.epoch, the data source):
    the coordinator's first start, refused by a target, wrote the new state's meta
    first, so the way out (another path) was then refused as a move of the target."""
    from txsink.coordinator import Coordinator
    from txsink.spark.group import recorded_targets_refusal

    FilesBackend.from_options({"path": str(tmp_path / "shared")}).claim_sink(
        "single", "state-0", "/elsewhere")

    def specs(copy: str) -> tuple[TargetSpec, ...]:
        return parse_targets([
            {"name": "a", "backend": "files", "options": {"path": str(tmp_path / "a")}},
            {"name": "b", "backend": "files", "options": {"path": str(tmp_path / copy)}}], "g")

    state = str(tmp_path / "state")
    group = TargetGroup.from_specs("g", specs("shared"))
    try:
        with pytest.raises(ConfigError, match="belongs to sink 'single'"):
            Coordinator(group, get_plugins().state_store(state), "g",
                        owner="test").start(recover=True, batch=True)
    finally:
        group.close()
    assert not (tmp_path / "state" / "meta.json").exists()
    assert not (tmp_path / "a").exists()
    assert recorded_targets_refusal(state, "g", specs("own")) is None


class _Unchecked(FilesBackend):
    """A plugin's backend without check_claim whose claim refuses (another owner)."""

    check_claim = Backend.check_claim

    def claim_sink(self, sink_id: str, state_id: str, state_location: str) -> None:
        raise SinkOwnedError("owned by another query", field="sink_id", sink_id=sink_id,
                             owner_state="/other")


def test_a_target_that_cannot_check_is_claimed_first(tmp_path: Path) -> None:
    """A backend without check_claim refuses only when it claims; listed after a files
    target, the files directory was claimed first and stayed bound to the refused
    run's state. Such a target is now claimed before the checked ones."""
    specs = parse_targets([
        {"name": name, "backend": "files", "options": {"path": str(tmp_path / name)}}
        for name in ("archive", "plugin")], "g")
    members = [Member(specs[0], FilesBackend.from_options(specs[0].options), "g--archive"),
               Member(specs[1], _Unchecked.from_options(specs[1].options), "g--plugin")]
    group = TargetGroup("g", members)
    with pytest.raises(SinkOwnedError):
        group.claim_sink("g", "state-1", "/s")
    assert not (tmp_path / "archive").exists()


class _Keeper(FilesBackend):
    """A plugin's backend that records an owner but cannot delete what it wrote."""

    name = "keeper"
    reset_sink = Backend.reset_sink


class _KeeperPlugin:
    @hookimpl
    def txsink_register_backends(self, registry: BackendRegistry) -> None:
        registry.add(_Keeper)


def test_a_deleted_checkpoints_hint_names_the_target_and_a_reset_that_works(
        tmp_path: Path) -> None:
    """The hint after a deleted checkpoint offered `txsink reset FILE` for any group
    (the group has a reset), which a target that cannot delete its output then refused;
    and it named the whole group, not the target that refused."""
    plugins = build_plugins(extra_plugins=[("keeper", _KeeperPlugin())])
    file = tmp_path / "g.yaml"
    file.write_text(f"""
name: g
source: {{type: rate}}
sink:
  sink_id: orders
  targets:
    - {{name: archive, backend: files, options: {{path: {tmp_path / 'archive'}}}}}
    - {{name: kept, backend: keeper, options: {{path: {tmp_path / 'kept'}}}}}
checkpoint: {tmp_path / 'checkpoint'}
""")

    def check() -> None:
        from txsink.spark.pipeline import check_ownership

        cfg = load_pipeline(str(file), plugins=plugins)
        store = DirectoryStateStore(Path(cfg.checkpoint) / "txsink")
        check_ownership(cfg, plugins, store, str(file))

    check()
    shutil.rmtree(tmp_path / "checkpoint")
    with pytest.raises(ConfigError, match="no longer exists") as refused:
        check()
    message = str(refused.value)
    assert f"(target 'archive': files parquet at {tmp_path / 'archive'})" in message, message
    assert "txsink reset" in message and f"txsink reset {file}" not in message, message


@pytest.mark.promise("reset-refuses-others-output", "cli")
def test_reset_of_a_refused_group_deletes_no_other_querys_output(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A group refused because a target is another live query's (same sink id and
    target name) has no state; `txsink reset` of its file deleted that query's
    committed files and owner record. It is refused while that query's state exists,
    and goes on once that state is gone (what reset is for). A target that is another
    sink id's directory is refused before any target is reset (the group's reset had
    deleted the targets before it)."""
    from txsink.cli import main

    _check(tmp_path, _group(tmp_path, "first", "first-archive", "shared"))
    (tmp_path / "shared" / "part-0000000000-00000.jsonl").write_text('{"id": 1}\n')
    second = _group(tmp_path, "second", "second-archive", "shared")
    assert main(["reset", str(second), "--yes"]) == 1
    err = capsys.readouterr().err
    assert "target 'copy'" in err and "still exists" in err and "nothing deleted" in err, err
    assert (tmp_path / "shared" / "part-0000000000-00000.jsonl").exists()
    assert (tmp_path / "shared" / "_txsink" / "state.json").exists()

    FilesBackend.from_options({"path": str(tmp_path / "single")}).claim_sink(
        "single", "state-0", "/elsewhere")
    (tmp_path / "third-archive").mkdir()
    (tmp_path / "third-archive" / "part-0000000000-00000.jsonl").write_text("{}\n")
    FilesBackend.from_options({"path": str(tmp_path / "third-archive")}).claim_sink(
        "orders--archive", "state-3", str(tmp_path / "third" / "checkpoint" / "txsink"))
    third = _group(tmp_path, "third", "third-archive", "single")
    assert main(["reset", str(third), "--yes"]) == 1
    assert "belongs to sink 'single'" in capsys.readouterr().err
    assert (tmp_path / "third-archive" / "part-0000000000-00000.jsonl").exists()

    shutil.rmtree(tmp_path / "first" / "checkpoint")  # the owner's state is gone now
    assert main(["reset", str(second), "--yes"]) == 0
    assert not (tmp_path / "shared").exists()


def test_two_targets_in_one_directory_through_a_link_claim_nothing(tmp_path: Path) -> None:
    """The paths differ (a symbolic link), so loading the file lets them through; the
    directory is one: the group's check says so before either target is claimed."""
    (tmp_path / "same").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "same")
    file = _group(tmp_path, "linked", "same", "link")
    with pytest.raises(ConfigError, match="'archive' and 'copy' both write to the directory"):
        _check(tmp_path, file)
    assert list((tmp_path / "same").iterdir()) == []
    assert not (tmp_path / "linked" / "checkpoint").exists()


@pytest.mark.promise("reset-all-or-none", "cli")
def test_reset_of_a_group_with_a_table_target_deletes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A group's reset checks that every target can delete its output before it deletes
    any: it looked for the default reset_sink, and Delta and Iceberg overrode it only
    to refuse, so the files target before the table was deleted, then the reset said
    "nothing deleted"."""
    pytest.importorskip("deltalake", reason="the Delta backend is not installed")
    from txsink.cli import main

    file = tmp_path / "g.yaml"
    file.write_text(f"""
name: g
source: {{type: rate}}
sink:
  sink_id: orders
  targets:
    - {{name: archive, backend: files, options: {{path: {tmp_path / 'archive'}}}}}
    - {{name: table, backend: delta, options: {{path: {tmp_path / 'table'}}}}}
checkpoint: {tmp_path / 'checkpoint'}
""")
    _check(tmp_path, file)
    kept = tmp_path / "archive" / "part-0000000000-00000.parquet"
    kept.write_bytes(b"rows")
    assert main(["reset", str(file), "--yes"]) == 1
    err = capsys.readouterr().err
    assert "target 'table'" in err and "nothing deleted" in err, err
    assert kept.exists()
    assert (tmp_path / "checkpoint" / "txsink" / "meta.json").exists()
