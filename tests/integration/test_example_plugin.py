"""The third-party example backend installs from its folder, is discovered through the
entry point, and passes the conformance kit — with no change to core."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "sqlite-backend"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH: it installs the example package into a target dir")
    target = tmp_path_factory.mktemp("site")
    done = subprocess.run([uv, "pip", "install", "--quiet", "--no-deps", "--python",
                           sys.executable, "--target", str(target), str(EXAMPLE)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    env = dict(os.environ, PYTHONPATH=str(target))
    env.pop("TXSINK_DISABLE_PLUGINS", None)
    return env


@pytest.mark.slow
def test_installed_example_is_listed_with_its_distribution(installed: dict[str, str]) -> None:
    code = ("from txsink.plugins import get_plugins\n"
            "r = get_plugins().backend_registration('sqlite')\n"
            "print(r.origin.distribution, r.origin.version, r.value.__module__)")
    done = subprocess.run([sys.executable, "-c", code], env=installed, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["txsink-sqlite", "0.1.0", "txsink_sqlite.backend"]


@pytest.mark.slow
def test_installed_example_passes_the_conformance_kit(installed: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-n", "0", str(EXAMPLE / "tests")], cwd=ROOT, env=installed,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "13 passed" in done.stdout


def test_example_is_not_part_of_the_workspace() -> None:
    """It must prove the plugin path from outside: core may not know about it."""
    workspace = (ROOT / "pyproject.toml").read_text()
    assert "txsink-sqlite" not in workspace
    core = "\n".join(p.read_text() for p in (ROOT / "core").rglob("*.py"))
    assert "txsink_sqlite" not in core
