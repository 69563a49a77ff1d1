"""The fault actions the cluster tests use: once-only rules, stall, kill-jvm."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from txsink import faults
from txsink.faults import ONCE_DIR_ENV, STALL_ENV, FaultInjector, InjectedFault, fired, parse


def test_new_actions_parse() -> None:
    assert [r.action for r in parse("a@1:kill-jvm,b:stall,c")] == ["kill-jvm", "stall", "kill"]
    with pytest.raises(ValueError, match="unknown action"):
        parse("a:explode")


def test_a_rule_fires_once_across_injectors(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ONCE_DIR_ENV, str(tmp_path))
    rules = parse("after-decide@2:raise")
    with pytest.raises(InjectedFault):
        FaultInjector(rules).hit("after-decide", 2)
    # Another process (here: another injector) meeting the same point does not fire.
    FaultInjector(rules).hit("after-decide", 2)
    FaultInjector(rules).hit("after-decide", 3)  # another epoch: not the rule's
    assert fired(tmp_path) == ["after-decide@2:raise"]


def test_without_once_dir_a_rule_fires_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ONCE_DIR_ENV, raising=False)
    injector = FaultInjector(parse("p:raise"))
    for _ in range(2):
        with pytest.raises(InjectedFault):
            injector.hit("p", 0)


def test_stall_sleeps_goes_on_and_says_it_outlived(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STALL_ENV, "0.3")
    monkeypatch.setenv(ONCE_DIR_ENV, str(tmp_path))
    slept: list[float] = []
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    FaultInjector(parse("p@1:stall")).hit("p", 1)
    assert slept == [0.3]
    # A stalled attempt that wakes up says so: Spark did not kill it for a faster copy.
    assert faults.OUTLIVED in (tmp_path / "p@1:stall").read_text()


_KILL_JVM = """
import os, sys, time
from txsink.faults import FaultInjector, parse
print(os.getpid(), flush=True)
FaultInjector(parse("p:kill-jvm")).hit("p", 0)
print("survived", flush=True)
"""


def test_kill_jvm_without_a_jvm_above_kills_the_process() -> None:
    done = subprocess.run([sys.executable, "-c", _KILL_JVM], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TXSINK_FAULTS": ""}, check=False)
    assert done.returncode == -9
    assert "survived" not in done.stdout
