"""What pallasopt writes and where (issue 17, item 11): refused before any work, written with the expected mode.

Also the usage checks on timeouts and a damaged kernel database. In-process through `pallasopt.cli.main`; no case
runs a search (each is refused before it starts).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_bad_input import GOOD, error_line

from pallasopt.cli import main


@pytest.fixture
def good(tmp_path: Path) -> Path:
    p = tmp_path / "good.py"
    p.write_text(GOOD)
    return p


@contextlib.contextmanager
def read_only_folder(folder: Path) -> Iterator[None]:
    """A folder nobody can create files in: `chattr +i` (root ignores permission bits), else mode 0555."""
    folder.mkdir(exist_ok=True)
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(folder)], check=False).returncode:
        pytest.skip("running as root without a working `chattr +i`: no way to make a folder read-only here")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_run_refuses_an_existing_output_without_force(capsys, good, tmp_path) -> None:
    other = tmp_path / "notes.py"
    other.write_text("my notes\n")
    argv = ["run", str(good), "--no-compile", "--depth", "1", "--beam", "1", "--db", str(tmp_path / "k.db")]
    line = error_line(capsys, 2, [*argv, "-o", str(other)])
    assert line == f"{other} exists (pass --force to overwrite it, or choose another -o)"
    assert other.read_text() == "my notes\n" and not (tmp_path / "k.db").exists()  # refused before any work


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "{good}", "--no-compile", "-o", "{ro}/out.py"],
        ["run", "{good}", "--no-compile", "-o", "{ro}/sub/out.py"],
        ["run", "{ro_good}", "--no-compile", "--db", "{tmp}/k.db"],  # the default FILE_STEM.opt.py beside it
        ["run", "{good}", "--no-compile", "-o", "{tmp}/out.py", "--report", "{ro}/report"],
        ["apply", "{good}", "-p", "dimension-semantics", "-o", "{ro}/out.py"],
    ],
    ids=["run-o", "run-o-subfolder", "run-default-output", "run-report", "apply-o"],
)
def test_an_unwritable_output_folder_is_refused_before_any_work(capsys, good, tmp_path, argv) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "good.py").write_text(GOOD)
    names = {"good": str(good), "ro": str(ro), "ro_good": str(ro / "good.py"), "tmp": str(tmp_path)}
    argv = [a.format(**names) for a in argv]
    if "--db" not in argv and argv[0] == "run":
        argv += ["--db", str(tmp_path / "k.db")]
    with read_only_folder(ro):
        line = error_line(capsys, 2, argv)
    assert line.startswith("cannot write ") and f": the folder {ro} is not writable (" in line, line
    assert line.endswith("or make the folder writable)"), line
    assert not (tmp_path / "k.db").exists()


def test_report_without_matplotlib_is_refused_before_any_work(capsys, good, tmp_path, monkeypatch) -> None:
    # A TPU host with a partial install ran a 4-minute search and then died in the report's plot (session 33).
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    argv = ["run", str(good), "--no-compile", "--db", str(tmp_path / "k.db"), "--report", str(tmp_path / "rep")]
    line = error_line(capsys, 4, argv)
    assert line == "--report needs matplotlib, which is not installed (pip install matplotlib, or drop --report)", line
    assert not (tmp_path / "k.db").exists() and not (tmp_path / "rep").exists()


def test_a_new_output_gets_the_usual_mode_and_a_replaced_one_keeps_its_own(capsys, good, tmp_path) -> None:
    from pallasopt.optimize import write_atomic

    old = os.umask(0o022)
    try:
        assert main(["apply", str(good), "-p", "dimension-semantics", "-o", str(tmp_path / "new.py")]) == 0
        kept = tmp_path / "kept.py"
        kept.write_text("old\n")
        kept.chmod(0o640)
        write_atomic(kept, "new\n")
        fresh = tmp_path / "sub" / "fresh.py"
        write_atomic(fresh, "x\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.py").stat().st_mode) == 0o644
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640 and kept.read_text() == "new\n"
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o644


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["check", "{good}", "--timeout", "0"], "--timeout"),
        (["check", "{good}", "--timeout", "-5"], "--timeout"),
        (["check", "{good}", "--timeout", "nan"], "--timeout"),
        (["analyze", "{good}", "--load-timeout", "0"], "--load-timeout"),
        (["run", "{good}", "--no-compile", "--load-timeout", "-1", "--db", "{tmp}/k.db"], "--load-timeout"),
    ],
)
def test_a_timeout_that_is_not_positive_is_a_usage_error(capsys, good, tmp_path, argv, option) -> None:
    line = error_line(capsys, 2, [a.format(good=good, tmp=tmp_path) for a in argv])
    assert line.startswith(f"{option} must be a positive number of seconds, got "), line


def damaged_db(path: Path, damage: str) -> Path:
    """A kernel database with one run in it, then `damage` (an SQL statement) done to it behind pallasopt's back."""
    from pallasopt.db.store import KernelDB

    with KernelDB.open(path) as db:
        run = db.start_run(db.workload("abc", "x.py", {"M": 8}, "v5e", {}), {"beam": 1})
        db.finish_run(run, {"speedup": 1.0})
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute(damage)
        conn.commit()
    return path


DAMAGE = {
    "table-dropped": ("DROP TABLE runs", "is corrupted (table runs is missing)"),
    "json-cut": ("UPDATE runs SET config_json = '{\"beam\": 1'", "is corrupted (a RunRow holds a value that does not"),
    "json-overwritten": ("UPDATE workloads SET dims_json = 'x'", "is corrupted (a WorkloadRow holds a value that"),
}


CASES = [(d, "db-show") for d in DAMAGE] + [("table-dropped", "run")]  # run reads only its own kernel's rows


@pytest.mark.parametrize(("damage", "command"), CASES, ids=[f"{d}-{c}" for d, c in CASES])
def test_a_damaged_database_is_reported_as_corrupted(capsys, good, tmp_path, damage, command) -> None:
    sql, what = DAMAGE[damage]
    db = damaged_db(tmp_path / "k.db", sql)
    if command == "db-show":
        argv = ["db", "show", str(db)]
    else:
        argv = ["run", str(good), "--no-compile", "--db", str(db), "-o", str(tmp_path / "out.py")]
    line = error_line(capsys, 5, argv)
    assert line.startswith(f"{db}: {what}"), line
    assert line.endswith("(move the file aside and run again to start a new one)"), line
