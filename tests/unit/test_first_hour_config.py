"""First-hour configuration errors: a typo of a backend option gets "did you mean", a
group's target is named (``sink.targets[archive]``), and ``validate`` flags a
``password_env`` naming a variable this shell does not have."""

from __future__ import annotations

from pathlib import Path

import pytest
from txsink.cli import main


def _validate(tmp_path: Path, capsys: pytest.CaptureFixture[str], sink: str) -> tuple[int, str]:
    f = tmp_path / "p.yaml"
    f.write_text(f"source: {{type: rate}}\ncheckpoint: {tmp_path}/chk\nsink: {sink}\n")
    code = main(["validate", "--no-spark", str(f)])
    return code, capsys.readouterr().err


def test_an_unknown_option_gets_did_you_mean(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _validate(tmp_path, capsys, f"{{backend: files, sink_id: s, options: "
                                            f"{{path: '{tmp_path}/o', fromat: jsonl}}}}")
    assert code == 1
    assert err.startswith("txsink: config error: sink.options.fromat: "), err
    assert "(did you mean 'format'?)" in err


def test_a_required_option_misspelt_gets_did_you_mean(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _validate(tmp_path, capsys, "{backend: postgres, sink_id: s, options: "
                                            "{dsn: 'postgresql://u@127.0.0.1:1/d', tabel: t}}")
    assert code == 1
    assert "option 'table' is required ('tabel' is given: did you mean 'table'?)" in err, err


def test_a_groups_target_is_named_not_numbered(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _validate(tmp_path, capsys, (
        f"{{sink_id: g, targets: [{{name: events, backend: files, options: "
        f"{{path: '{tmp_path}/a'}}}}, {{name: archive, backend: files, options: "
        f"{{path: '{tmp_path}/b', fromat: jsonl}}}}]}}"))
    assert code == 1
    assert "sink.targets[archive].options.fromat" in err, err
    assert "did you mean 'format'" in err


def test_validate_flags_a_password_env_that_is_not_set(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TXSINK_TEST_UNSET_PASSWORD", raising=False)
    sink = ("{backend: postgres, sink_id: s, options: {dsn: 'postgresql://u@127.0.0.1:1/d', "
            "table: t, password_env: TXSINK_TEST_UNSET_PASSWORD}}")
    code, err = _validate(tmp_path, capsys, sink)
    assert code == 1
    assert err.startswith("txsink: config error: sink.options.password_env: environment "
                          "variable 'TXSINK_TEST_UNSET_PASSWORD' is not set"), err
    # Set to nothing: flagged too (the backend refuses an empty password variable), in
    # words that say so rather than "not set".
    monkeypatch.setenv("TXSINK_TEST_UNSET_PASSWORD", "")
    code, err = _validate(tmp_path, capsys, sink)
    assert code == 1
    assert "variable 'TXSINK_TEST_UNSET_PASSWORD' is empty in this shell" in err, err
    monkeypatch.setenv("TXSINK_TEST_UNSET_PASSWORD", "x")
    code, err = _validate(tmp_path, capsys, sink)
    assert code == 0, err
