"""User code kept out of pallasopt's process, children that die with it, and their own deadlines (issue 17, 9-10).

End to end through the `pallasopt` console script in a subprocess, on the 8x128 `add_one` module of
test_bad_input.py with one defect each; the lifeline tests run a tiny module of their own (no JAX).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from test_bad_input import GOOD

import pallasopt

SRC = Path(pallasopt.__file__).resolve().parents[1]
PALLASOPT = str(Path(sys.executable).parent / "pallasopt")
AT_IMPORT = "BM = 8\n"  # line 5 of GOOD: a defect inserted before it starts at line 5


def at_import(code: str) -> str:
    return GOOD.replace(AT_IMPORT, code + AT_IMPORT, 1)


def in_entry(code: str) -> str:
    """`code` (one statement) as the first line of the entry `add_one`, line 13."""
    return GOOD.replace("def add_one(x):\n", f"def add_one(x):\n    {code}\n", 1)


KERNELS = {
    "sleeps": at_import("import time\ntime.sleep(1000)\n"),
    "exits": at_import("import os\nos._exit(0)\n"),
    "kills_parent": at_import("import os\nos.kill(os.getppid(), 9)\n"),
    "hogs_memory": at_import("import numpy as np\nBIG = np.ones(5 * 10**9)\n"),
    "sleeps_in_trace": in_entry("__import__('time').sleep(1000)"),
    # The entry runs normally when traced, and sleeps once it runs (in the check's child): a check that hangs.
    "hangs_in_check": in_entry("jax.debug.callback(lambda: __import__('time').sleep(600))"),
}


@pytest.fixture
def k(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name, text in KERNELS.items():
        p = tmp_path / f"{name}.py"
        p.write_text(text)
        out[name] = p
    return out


CHECK_CHILDREN = ("pallasopt.harness.worker", "pallasopt.harness.warm_serve")


def cli_env() -> dict[str, str]:
    """The console script running this checkout's code (children inherit it)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p)}


def pallasopt_cli(args: list[str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PALLASOPT, *args], cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


LOAD_FAILURES = [
    ("sleeps", ["analyze"], "sleeps.py:6: importing the module did not finish in 8 s", "--load-timeout"),
    ("sleeps_in_trace", ["analyze"], "sleeps_in_trace.py:13: tracing the entry 'add_one' did not finish in 8 s", ""),
    ("exits", ["run", "--no-compile"], "exits.py:6: importing the module ended the process (os._exit(0))", "guard"),
    ("kills_parent", ["run", "--no-compile"], "kills_parent.py:6: importing the module killed its parent process", ""),
    ("kills_parent", ["apply", "-p", "dimension-semantics"], "kills_parent.py:6: importing the module killed its", ""),
    ("hogs_memory", ["analyze"], "hogs_memory.py:6: importing the module failed: MemoryError", "import on its own"),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "command", "what", "fix"), LOAD_FAILURES, ids=[f"{c[0]}-{c[1][0]}" for c in LOAD_FAILURES]
)
def test_module_that_hangs_exits_or_kills_its_parent_is_a_one_line_error(k, tmp_path, name, command, what, fix):
    args = [command[0], str(k[name]), *command[1:]] + (["--load-timeout", "8"] if "sleeps" in name else [])
    if command[0] == "run":
        args += ["--db", str(tmp_path / "k.db"), "-o", str(tmp_path / "out.py")]
    r = pallasopt_cli(args, tmp_path, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 3 and len(lines) == 1, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert lines[0].startswith(f"pallasopt: error: {tmp_path / what}") and fix in lines[0], lines[0]
    assert not (tmp_path / "out.py").exists()


@pytest.mark.slow
def test_check_survives_a_module_that_kills_its_parent(k, tmp_path):
    r = pallasopt_cli(["check", str(k["kills_parent"])], tmp_path, timeout=120)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert (
        "crash: evaluation process died (the process that ran it was killed (SIGKILL): by the code it ran" in r.stdout
    )


# ------------------------------------------------------------------------------------------- children and parents


def parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def running(pid: int) -> bool:
    """Alive and not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def descendants(root: int) -> set[int]:
    parents = {int(p.name): parent_of(int(p.name)) for p in Path("/proc").iterdir() if p.name.isdigit()}
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier and pid not in found}
        found |= frontier
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def wait_for(cond: Callable[[], object], timeout: float, step: float = 0.2) -> object:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(step)
    return cond()


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to list a process's children")
def test_kill_9_of_run_leaves_no_child_running(k, tmp_path):
    args = ["run", str(k["hangs_in_check"]), "--no-compile", "--db", str(tmp_path / "k.db"), "-o", str(tmp_path / "o")]
    proc = subprocess.Popen(
        [PALLASOPT, *args], cwd=tmp_path, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        # The check runs in a fresh child (`harness.worker`) or a warm one (`harness.warm_serve`).
        workers = wait_for(
            lambda: [p for p in descendants(proc.pid) if any(m in cmdline(p) for m in CHECK_CHILDREN)], timeout=150
        )
        assert workers and proc.poll() is None, "the input kernel's check never started"
        time.sleep(2)  # let the check reach the sleeping callback
        children = descendants(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    gone = wait_for(lambda: not [p for p in children if running(p)], timeout=10)
    left = [cmdline(p) for p in children if running(p)]
    for pid in children:  # never leave a hanging check behind, even when the test fails
        if running(pid):
            os.kill(pid, signal.SIGKILL)
    assert gone, f"still running 10 s after kill -9 of pallasopt: {left}"


# ------------------------------------------------------------------------------------------------------ lifeline


def guarded(tmp_path: Path, body: str, deadline_s: float = 60) -> tuple[subprocess.Popen[bytes], Path]:
    """Run `body` as module `usercode` under a lifeline guard bound to this process; its pid goes to a file."""
    from pallasopt.lifeline import child_command

    pid_file = tmp_path / "worker.pid"
    (tmp_path / "usercode.py").write_text(
        f"import os, signal, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\n{body}\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(SRC), str(tmp_path)))}
    proc = subprocess.Popen(child_command(sys.executable, "usercode", deadline_s), env=env, start_new_session=True)
    return proc, pid_file


def worker_pid(pid_file: Path) -> int:
    assert wait_for(pid_file.exists, timeout=30), "the worker never started"
    return int(wait_for(pid_file.read_text, timeout=5) or 0)


def test_a_child_ends_itself_at_its_deadline(tmp_path):
    from pallasopt.lifeline import describe_exit

    proc, pid_file = guarded(tmp_path, "time.sleep(60)", deadline_s=2)
    worker = worker_pid(pid_file)
    start = time.monotonic()
    code = proc.wait(timeout=30)
    assert code == -signal.SIGALRM and time.monotonic() - start < 10
    assert "its own deadline" in describe_exit(code)
    assert wait_for(lambda: not running(worker), timeout=5), "the worker outlived its guard"


def test_code_that_kills_its_parent_kills_only_the_guard(tmp_path):
    from pallasopt.lifeline import guard_killed

    proc, pid_file = guarded(tmp_path, "os.kill(os.getppid(), signal.SIGKILL)\ntime.sleep(60)")
    worker = worker_pid(pid_file)
    code = proc.wait(timeout=30)
    assert code == -signal.SIGKILL and guard_killed(code)  # and this test process is still here
    assert wait_for(lambda: not running(worker), timeout=5), "the worker outlived its guard"


@pytest.mark.parametrize(
    ("body", "code", "words"),
    [("os._exit(7)", 7, "exit code 7"), ("os.kill(os.getpid(), signal.SIGSEGV)", 128 + 11, "killed by SIGSEGV")],
)
def test_the_guard_relays_how_the_worker_ended(tmp_path, body, code, words):
    from pallasopt.lifeline import describe_exit, guard_killed

    proc, _ = guarded(tmp_path, body)
    got = proc.wait(timeout=30)
    assert got == code and describe_exit(got) == words and not guard_killed(got)


def test_a_guard_whose_parent_is_gone_exits_at_once(tmp_path):
    from pallasopt.lifeline import SIGNALED, child_command

    argv = child_command(sys.executable, "usercode", 60)
    argv[3] = "1"  # "started by" a process that is not our parent
    (tmp_path / "usercode.py").write_text("import time\ntime.sleep(60)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(SRC), str(tmp_path)))}
    assert subprocess.run(argv, env=env, timeout=30, check=False).returncode == SIGNALED + signal.SIGKILL


def test_the_stage_named_is_the_one_the_fatal_call_came_from():
    from pallasopt.harness.preflight import failure

    events = ["stage import", "kill 6 4242 9", "stage trace"]  # the child ran on briefly after killing its parent
    err = failure("m.py", "add_one", 10, "crash", -signal.SIGKILL, events, "", "")
    assert str(err) == (
        "m.py:6: importing the module killed its parent process (SIGKILL) "
        "(the module must not signal other processes; pallasopt ran it in a separate, guarded process)"
    )
    stack = 'Thread 0x1 (most recent call first):\n  File "/x/jax.py", line 9 in f\n  File "m.py", line 14 in add_one\n'
    err = failure("m.py", "add_one", 10, "crash", 1, ["stage import", "stage trace"], stack, "")
    assert str(err).startswith("m.py:14: tracing the entry 'add_one' did not finish in 10 s (")
