"""The docs site builds with --strict, and documents every CLI command and config field."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from txsink.cli import build_parser
from txsink.config import FILE_FORMATS, SOURCE_TYPES, TOP_LEVEL, TRIGGERS

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def test_mkdocs_builds_strict(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.skip("mkdocs is not installed (it is in the dev group)")
    result = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "cli" / "index.html").is_file()


def test_every_cli_command_and_option_is_documented() -> None:
    text = (DOCS / "cli.md").read_text()
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        assert f"## `txsink {name}" in text, name
        for action in command._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help":
                    assert f"`{flag}" in text, f"{name} {flag}"


def test_every_config_field_is_documented() -> None:
    text = (DOCS / "config.md").read_text()
    for name in TOP_LEVEL:
        assert f"### `{name}`" in text, name
    for word in (*SOURCE_TYPES, *FILE_FORMATS, *TRIGGERS):
        assert f"`{word}`" in text, word


def test_nothing_in_the_repo_refers_to_notes_outside_it() -> None:
    """Design notes kept outside the repository are not there for a reader of a clone."""
    git = shutil.which("git")
    if git is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    files = subprocess.run([git, "ls-files"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    outside = ("DESIGN.md", "STYLE.md", "/work/shared")
    found = []
    for name in files:
        path = REPO / name
        if path.suffix not in (".py", ".md", ".toml", ".ini", ".yaml", ".yml", ".cfg"):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        found += [f"{name}: {word}" for word in outside if word in text]
    this = Path(__file__).relative_to(REPO).as_posix()
    assert [f for f in found if not f.startswith(this)] == []
