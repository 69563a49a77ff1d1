"""The short soak: 500 epochs per backend through the real backend, coordinator and
directory state store (no Spark), failing if a sampled series grows past its bound.
Five hundred is past every bound a state reaches this early (100 retained records
plus their pruning slack) with six samples in the steady half, and keeps the default
run in its budget; ``tox -e soak`` goes to 20,000.

``benchmarks/soak.py`` is the measurement (its docstring has the series, the baseline
and the bounds); ``tox -e soak`` runs it long (20,000 epochs, both state stores, and
``txsink run`` on Spark). Here the four backends run at once, each in a process of its
own with its own server, one participant per epoch, sampled every 50 epochs; series
must stay flat from epoch 250 on, latency (its ratio to a baseline sink written
alongside) within 50%: the machine is shared with the rest of the suite.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import soak  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BACKENDS = ("files", "postgres", "s3", "kafka")
EPOCHS = 500
SAMPLE = 50
#: A guard against a hung run, far above what 500 Kafka epochs take under load.
TIMEOUT_S = 1500


@pytest.fixture(scope="module")
def soaks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, soak.Soak]]:
    work = tmp_path_factory.mktemp("soak")
    procs: dict[str, tuple[subprocess.Popen[bytes], Path, Path]] = {}
    try:
        for backend in BACKENDS:
            out, log = work / f"{backend}.json", work / f"{backend}.log"
            with log.open("wb") as f:
                procs[backend] = (subprocess.Popen(
                    [sys.executable, str(BENCHMARKS / "soak.py"), "--backends", backend,
                     "--states", "directory", "--epochs", str(EPOCHS), "--sample", str(SAMPLE),
                     "--participants", "1", "--steady-from", str(EPOCHS // 2), "--flat", "1.5",
                     "--json", str(out)], stdout=f, stderr=subprocess.STDOUT), out, log)
        deadline = time.monotonic() + TIMEOUT_S
        results: dict[str, soak.Soak] = {}
        for backend, (proc, out, log) in procs.items():
            try:
                proc.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"the {backend} soak did not finish within {TIMEOUT_S}s:\n"
                            + log.read_text()[-3000:])
            if not out.exists():
                pytest.fail(f"the {backend} soak exited {proc.returncode} without results:\n"
                            + log.read_text()[-3000:])
            runs = json.loads(out.read_text())["runs"]
            results[backend] = soak.Soak.from_dict(runs[0])
        print(soak.table(list(results.values())))
        yield results
    finally:
        for proc, _, _ in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_short_soak_grows_nothing(backend: str, soaks: dict[str, soak.Soak]) -> None:
    result = soaks[backend]
    verdicts = result.verdicts()
    assert len(result.samples) == EPOCHS // SAMPLE, result.error
    assert result.ok(), result.grows()
    assert verdicts["state_records"].startswith("bounded"), verdicts
    assert verdicts["open_fds"].startswith("flat"), verdicts
    assert verdicts["rss_mb"].startswith("flat"), verdicts
    assert verdicts["commit_p50_ratio"].startswith("flat"), verdicts
    kept = {"files": "output_txsink_files", "postgres": "pg_marker_rows",
            "s3": "s3_manifests", "kafka": "kafka_scan_epochs"}[backend]
    assert verdicts[kept].startswith("bounded"), verdicts
