"""The multi chaos sampler judges a sample only against the run it was taken in.

Under load, a sample's read of the targets outlasted its run: the run ended, its state
directory was removed, and the late sample then saw epochs "without a decision" and
failed the test after its table had said ok (the sampler was joined with a 60-second
timeout and went on judging). A sample whose run ended while it was read says nothing.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from tests.chaos.multi import MultiReport, Sampler, TargetTally


class SlowGroup:
    """A target whose read blocks until released, like a read on a loaded machine."""

    def __init__(self) -> None:
        self.reading = threading.Event()
        self.release = threading.Event()

    def rows(self, name: str, options: dict[str, str], sink_id: str) -> list[tuple[int, int]]:
        self.reading.set()
        assert self.release.wait(30)
        return [(3, 30_000)]  # epoch 3 is there: its run decided it, then ended


def test_a_sample_outlasting_its_run_does_not_judge_it(tmp_path: Path) -> None:
    report = MultiReport(seed=0, targets={"files": TargetTally("files", "files")})
    group: Any = SlowGroup()
    sampler = Sampler(group, report)
    sampler.current = ([{"name": "files", "options": {}}], "sink", tmp_path / "run")
    sampler.start()
    assert group.reading.wait(30)
    sampler.current = None  # the run ended; its state directory (never made here) is gone
    group.release.set()
    sampler.stopped.set()
    sampler.join(30)
    assert not sampler.is_alive()
    assert report.failures == []
    assert report.targets["files"].undecided_visible == 0
    assert report.samples == 0


def test_finish_waits_for_the_sample_being_read(tmp_path: Path) -> None:
    report = MultiReport(seed=0, targets={"files": TargetTally("files", "files")})
    group: Any = SlowGroup()
    sampler = Sampler(group, report)
    sampler.current = ([{"name": "files", "options": {}}], "sink", tmp_path / "run")
    sampler.start()
    assert group.reading.wait(30)
    threading.Timer(0.5, group.release.set).start()
    sampler.finish()
    assert not sampler.is_alive()
    assert report.failures == []
