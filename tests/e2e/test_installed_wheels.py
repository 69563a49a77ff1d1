"""The README's install instructions: the built wheels work without the workspace.

``uv build --all-packages`` builds every distribution; they are installed into a
fresh virtual environment (``txsink[spark]`` plus the three backends), and from a
directory outside the repository ``txsink backends`` lists all four backends and
the demo pipeline runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.spark_harness import kill_group, read_files_output

pytestmark = [pytest.mark.spark, pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("TXSINK_EXAMPLE_TESTS") != "1",
                                 reason="builds every wheel, installs PySpark into a fresh "
                                 "venv and runs Spark (minutes): runs in `tox -e "
                                 "examples`, or with TXSINK_EXAMPLE_TESTS=1")]

REPO = Path(__file__).resolve().parents[2]


def _uv() -> str:
    found = shutil.which("uv")
    if found is None:
        pytest.skip("uv is not on PATH: the install test builds and installs with uv")
    return found


def _clean_env(**extra: str) -> dict[str, str]:
    """No trace of the workspace's environment: the venv must stand on its own."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "UV_PROJECT_ENVIRONMENT", "PYTHONHOME")
           and not k.startswith("TXSINK_")}
    env.update(extra)
    return env


def test_built_wheels_install_and_run_the_demo(tmp_path: Path) -> None:
    uv = _uv()
    dist = tmp_path / "dist"
    subprocess.run([uv, "build", "--all-packages", "--wheel", "-o", str(dist)], cwd=REPO,
                   check=True, capture_output=True, timeout=600)
    wheels = {p.name.split("-")[0]: p for p in dist.glob("*.whl")}
    assert set(wheels) == {"txsink", "txsink_kafka", "txsink_postgres", "txsink_s3",
                           "txsink_delta", "txsink_iceberg"}, wheels

    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "--python", sys.executable, str(venv)], check=True,
                   capture_output=True, timeout=120, env=_clean_env())
    python = venv / "bin" / "python"
    # What the README says: txsink with the spark extra, plus the backends.
    subprocess.run([uv, "pip", "install", "--python", str(python),
                    f"{wheels['txsink']}[spark]", str(wheels["txsink_kafka"]),
                    str(wheels["txsink_postgres"]), str(wheels["txsink_s3"]),
                    str(wheels["txsink_delta"]), str(wheels["txsink_iceberg"])],
                   check=True, capture_output=True, timeout=900, env=_clean_env())

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    txsink = str(venv / "bin" / "txsink")
    proc = subprocess.run([txsink, "backends"], cwd=outside, capture_output=True, text=True,
                          timeout=120, env=_clean_env(), check=False)
    assert proc.returncode == 0, proc.stderr
    for backend, package in [("files", "txsink"), ("kafka", "txsink-kafka"),
                             ("postgres", "txsink-postgres"), ("s3", "txsink-s3"),
                             ("delta", "txsink-delta"), ("iceberg", "txsink-iceberg")]:
        assert f"{backend} (package {package} 0.1.0)" in proc.stdout, proc.stdout
    assert "broken plugin" not in proc.stdout
    # The code comes from the venv, not from the repository.
    where = subprocess.run([str(python), "-c", "import txsink; print(txsink.__file__)"],
                           cwd=outside, capture_output=True, text=True, check=True,
                           env=_clean_env())
    assert where.stdout.startswith(str(venv)), where.stdout

    pipeline = outside / "demo.yaml"
    shutil.copy(REPO / "examples/pipelines/demo.yaml", pipeline)
    run = subprocess.Popen(
        [txsink, "run", str(pipeline), "--max-batches", "2"], cwd=outside,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env=_clean_env(PYSPARK_PYTHON=str(python), SPARK_LOCAL_IP="127.0.0.1",
                       TXSINK_DEMO_DIR=str(outside / "out")))
    try:
        stdout, stderr = run.communicate(timeout=300)
    finally:
        kill_group(run.pid)
    assert run.returncode == 0, stdout + stderr[-3000:]
    assert "done (--max-batches 2 reached)" in stdout
    assert stderr == "", stderr
    rows = read_files_output(outside / "out" / "data")
    ids = sorted(r["id"] for r in rows)
    assert ids and ids == list(range(len(ids)))
