"""No "Bytecode compiled ..." line before every command: ``compile-bytecode = true`` in
``[tool.uv]`` made uv 0.13 recompile the whole environment on each ``uv run`` (1-2 s)
and say so. The set-up command compiles once instead; the bytecode stays."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not installed")
@pytest.mark.skipif(Path(sys.prefix).resolve() != (ROOT / ".venv").resolve(),
                    reason="runs from the project's own environment (`uv run pytest`) only: "
                           "elsewhere `uv run` would build that environment first")
def test_uv_run_prints_nothing_of_its_own_and_the_bytecode_stays() -> None:
    done = subprocess.run(["uv", "run", "--offline", "python", "-c", "print('ok')"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ok\n"
    assert "Bytecode compiled" not in done.stderr
    import pyspark

    cached = Path(pyspark.__file__).parent / "__pycache__"
    assert any(cached.glob("__init__.cpython-*.pyc")), "the set-up compiled no bytecode"
