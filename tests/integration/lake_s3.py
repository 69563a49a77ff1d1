"""A pipeline into a Delta or Iceberg table on the session's S3 server, killed after its
decision and restarted (the table helpers are :mod:`tests.lake_tables`)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.integration.conftest import S3Server
from tests.lake_tables import make, marked, orphans, s3_options, table_ids
from tests.timeouts import scaled

ROOT = Path(__file__).resolve().parents[2]


# -- a pipeline killed after its decision, restarted ---------------------------------------

CRASH_EPOCHS, CRASH_PARTITIONS = 2, 2


def _crash_run(spec: dict[str, Any], tmp_path: Path, run: int, faults: str = ""
               ) -> subprocess.CompletedProcess[str]:
    spec_file = tmp_path / f"spec-{run}.json"
    spec_file.write_text(json.dumps({**spec, "run": run}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXSINK_FAULTS")}
    if faults:
        env["TXSINK_FAULTS"] = faults
    return subprocess.run([sys.executable, "-m", "tests.integration.lake_s3_crash",
                           str(spec_file)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=scaled(120), check=False)


def killed_after_decide_then_restarted(kind: str, s3: S3Server, tmp_path: Path) -> None:
    """The coordinator is SIGKILLed once epoch 1's decision is durable and before any of
    it is committed; the restarted run commits it from the decision. The table then holds
    every row once (count and checksum), one entry per epoch, and no file under txsink's
    folder that the table does not name (the killed run's twins and the replay's files
    are gone)."""
    from txsink.faults import AFTER_DECIDE

    from tests.integration.lake_s3_crash import rows

    options = s3_options(kind, s3, tmp_path, table="db.orders")
    spec = {"backend": kind, "options": options, "sink_id": f"crash-{kind}",
            "state": str(tmp_path / "state"), "epochs": CRASH_EPOCHS,
            "partitions": CRASH_PARTITIONS}
    crashed = _crash_run(spec, tmp_path, 0, faults=f"{AFTER_DECIDE}@1:kill")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    backend = make(kind, options)
    assert not backend.holds_epoch(spec["sink_id"], 1)  # decided, not committed
    assert orphans(backend)  # epoch 1's files, named by no table entry yet
    restarted = _crash_run(spec, tmp_path, 1)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    want = sorted(i for e in range(CRASH_EPOCHS) for p in range(CRASH_PARTITIONS)
                  for i in rows(e, p))
    got = table_ids(backend)
    assert len(got) == len(want)
    assert hashlib.sha256(repr(got).encode()).digest() == hashlib.sha256(
        repr(want).encode()).digest()
    for e in range(CRASH_EPOCHS):
        assert backend.holds_epoch(spec["sink_id"], e)
    assert orphans(backend) == []
    assert [epoch for _, epoch in marked(backend, spec["sink_id"])] == list(range(CRASH_EPOCHS))
