"""Meta-tests: every hook is documented in docs/plugins.md and exercised by a test."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from txsink import hookspecs

ROOT = Path(__file__).resolve().parents[2]
HOOKS = sorted(n for n, f in vars(hookspecs).items()
               if n.startswith("txsink_") and inspect.isfunction(f))


def test_there_are_hooks() -> None:
    assert "txsink_register_backends" in HOOKS
    assert len(HOOKS) >= 7


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_is_documented_with_its_signature(hook: str) -> None:
    docs = (ROOT / "docs" / "plugins.md").read_text()
    params = ", ".join(inspect.signature(getattr(hookspecs, hook)).parameters)
    assert f"`{hook}({params})`" in docs


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_has_a_docstring(hook: str) -> None:
    doc = inspect.getdoc(getattr(hookspecs, hook)) or ""
    assert "versionadded" in doc
    for param in inspect.signature(getattr(hookspecs, hook)).parameters:
        assert f":param {param}:" in doc


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_is_exercised_by_a_test(hook: str) -> None:
    # Registration hooks are implemented by name; observer hooks through the
    # recorder plugin in tests/unit/conftest.py, whose calls the tests assert.
    sources = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py")
                        if p.name != "test_hook_docs.py")
    assert f"def {hook}(" in sources
