"""The command line: analyze / check / passes, exit codes and one-line errors."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, TEST_KERNELS

from pallasopt.cli import main


def test_analyze_json(capsys) -> None:
    assert main(["analyze", str(ROOT / "examples" / "matmul.py"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["entry"] == "matmul" and out["calls"][0]["grid"] == [16, 16, 16]


def test_analyze_table(capsys) -> None:
    assert main(["analyze", str(ROOT / "examples" / "softmax.py")]) == 0
    out = capsys.readouterr().out
    assert "grid=(1024,)" in out and "8x2048" in out


def test_check_pass_and_fail_exit_codes(capsys) -> None:
    assert main(["check", str(ROOT / "examples" / "softmax.py")]) == 0
    assert "PASS" in capsys.readouterr().out
    assert main(["check", str(TEST_KERNELS / "wrong_result.py"), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["status"] == "mismatch"


@pytest.mark.parametrize(
    ("argv", "code", "needle"),
    [
        (["analyze", "missing.py"], 3, "missing.py: no such file"),
        (["check", str(ROOT / "examples"), "--seeds", "1,2"], 3, "is a folder"),
        (["check", str(ROOT / "examples" / "softmax.py"), "--seeds", "1"], 2, "at least two"),
    ],
)
def test_user_errors_are_one_line(capsys, argv, code, needle) -> None:
    assert main(argv) == code
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_syntax_error_exit_code(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f(:\n    pass\n")
    assert main(["check", str(bad)]) == 3
    assert f"{bad}:1: syntax error" in capsys.readouterr().err


def test_passes_lists(capsys) -> None:
    assert main(["passes", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert isinstance(rows, list)
    assert len({r["name"] for r in rows}) == len(rows)
    assert not any("  " in r["summary"] for r in rows)  # one line each, indentation folded


def test_passes_text_keeps_brackets(capsys) -> None:
    """A summary's `ref[pl.ds(...)]` is text, not rich markup (it was swallowed as a style tag)."""
    assert main(["passes"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "k_ref[pl.ds(j * C, C), :]" in out
