"""docs/cli.md lists each option of ``txsink run`` once, and every option it has."""

from __future__ import annotations

import re
from pathlib import Path

from txsink.cli import build_parser

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_every_run_option_is_documented_once() -> None:
    import argparse

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    run = sub.choices["run"]
    options = [o for action in run._actions for o in action.option_strings
               if o.startswith("--") and o != "--help"]
    assert "--metrics-port" in options
    text = DOCS.read_text()
    rows = re.findall(r"^\| `(--[a-z-]+)", text, flags=re.M)
    for option in options:
        assert rows.count(option) == 1, f"{option} is listed {rows.count(option)} times"
