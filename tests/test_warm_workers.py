"""Warm evaluation workers (issue 16, speed): a crash, timeout or OOM costs one worker, which is replaced; nothing
outlives the pool or its parent; a warm compile gives the very report a fresh child gives."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import ROOT, TEST_KERNELS
from test_compiler import matmul_source, needs_libtpu

from pallasopt.cost_model.compiler import CompilePool, CompileReport, compile_module
from pallasopt.executors.jobs import compile_job
from pallasopt.executors.local import LocalExecutor
from pallasopt.harness.check import CheckResult, check, check_pool
from pallasopt.harness.warm import WarmPool
from pallasopt.lifeline import worker_code

HANDLER = "warm_handlers:handle"


def _env(_folder: Path) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])
    return {**os.environ, "PYTHONPATH": path}


def _gone(pid: int, wait_s: float = 10.0) -> bool:
    """True when no process of `pid`'s group (a guard leads its own) is left."""
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return True
        with open(os.devnull):
            time.sleep(0.1)
        with __import__("contextlib").suppress(ChildProcessError):
            os.waitpid(-1, os.WNOHANG)
    return False


@pytest.fixture
def pool():
    p = WarmPool(HANDLER, _env, limit_memory=True)
    yield p
    p.close()


def test_one_worker_serves_many_requests(pool: WarmPool) -> None:
    answers = [pool.call({"op": "sleep", "s": 0}, 30) for _ in range(3)]
    assert all(reply and reply["ok"] for reply, _err, _rc in answers)
    assert len({reply["pid"] for reply, _, _ in answers if reply}) == 1 and pool.started == 1
    assert "noise on stdout goes to stderr" in answers[0][1]  # the reply line stays clean


def test_a_crash_costs_one_worker_which_is_replaced(pool: WarmPool) -> None:
    first, _, _ = pool.call({"op": "sleep", "s": 0}, 30)
    reply, _err, rc = pool.call({"op": "die"}, 30)
    assert reply is None and rc is not None and worker_code(rc) == -signal.SIGKILL
    assert first and _gone(pool_guard_of(first["pid"], default=first["pid"]))
    after, _, _ = pool.call({"op": "sleep", "s": 0}, 30)
    assert after and after["pid"] != first["pid"] and pool.started == 2


def pool_guard_of(worker_pid: int, default: int) -> int:
    """The guard (process group leader) of a worker process; the worker's pid if it is already gone."""
    try:
        return os.getpgid(worker_pid)
    except ProcessLookupError:
        return default


def test_a_timeout_kills_the_worker_and_a_fresh_one_answers_next(pool: WarmPool) -> None:
    first, _, _ = pool.call({"op": "sleep", "s": 0}, 30)
    assert first
    group = os.getpgid(first["pid"])
    t0 = time.monotonic()
    reply, _err, rc = pool.call({"op": "sleep", "s": 60}, 1.0)
    assert reply is None and rc is None and time.monotonic() - t0 < 10
    assert _gone(group)
    after, _, _ = pool.call({"op": "sleep", "s": 0}, 30)
    assert after and after["pid"] != first["pid"]


def test_an_oom_under_the_memory_limit_is_an_answer_and_sys_exit_too(pool: WarmPool) -> None:
    reply, _, _ = pool.call({"op": "oom"}, 30)
    assert reply and not reply["ok"] and reply["error_type"] == "MemoryError"
    reply, _, _ = pool.call({"op": "exit"}, 30)
    assert reply and not reply["ok"] and reply["error_type"] == "SystemExit"
    assert pool.started == 1


def test_user_modules_do_not_survive_a_request(pool: WarmPool, tmp_path: Path) -> None:
    (tmp_path / "warm_user_helper.py").write_text("X = 1\n")
    first, _, _ = pool.call({"op": "import", "folder": str(tmp_path)}, 30)
    second, _, _ = pool.call({"op": "sleep", "s": 0}, 30)
    assert first and first["modules"] == ["warm_user_helper"]
    assert second and second["modules"] == [] and second["pid"] == first["pid"]


def test_modules_from_the_workers_pythonpath_are_imported_once(tmp_path: Path) -> None:
    # A TPU host's JAX and libtpu sit on PYTHONPATH, outside the Python installation; importing them again in the same
    # worker aborted libtpu on every second check of a warm worker (found on a v5e host, session 33).
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "warm_pythonpath_lib.py").write_text(
        "from pathlib import Path\n"
        "log = Path(__file__).with_name('imports.log')\n"
        "log.write_text(log.read_text() + 'x' if log.exists() else 'x')\n"
    )
    kernel_dir = tmp_path / "kernel"
    kernel_dir.mkdir()
    (kernel_dir / "warm_user_helper.py").write_text("X = 1\n")

    def env(_folder: Path) -> dict[str, str]:
        return {**_env(_folder), "PYTHONPATH": os.pathsep.join([_env(_folder)["PYTHONPATH"], str(lib)])}

    p = WarmPool(HANDLER, env)
    try:
        answers = [p.call({"op": "import_lib", "path": str(kernel_dir / "k.py")}, 30) for _ in range(3)]
        sibling, _, _ = p.call({"op": "import", "folder": str(kernel_dir)}, 30)
        after, _, _ = p.call({"op": "sleep", "s": 0}, 30)
    finally:
        p.close()
    assert all(reply and reply["ok"] for reply, _, _ in answers) and p.started == 1
    assert (lib / "imports.log").read_text() == "x"  # once, though three requests imported it
    assert sibling and sibling["modules"] == ["warm_user_helper"]
    assert after and after["modules"] == []  # the kernel folder's own module is still dropped


@pytest.mark.parametrize(
    ("file", "user"),
    [
        ("/work/kernels/helper.py", True),  # the kernel's sibling
        ("/opt/scrub/jax/_src/core.py", False),  # a PYTHONPATH folder the worker started with
        ("/added/mod.py", True),  # a folder the request put on sys.path
        ("/elsewhere/mod.py", False),
        ("/usr/lib/python3.11/json/__init__.py", False),
    ],
)
def test_which_modules_a_request_owns(file: str, user: bool) -> None:
    from pallasopt.harness.warm_serve import is_user_module, protected_roots, user_folders

    roots = protected_roots(["/opt/scrub", "/work", ""], cwd="/work")
    users = user_folders({"path": "/work/kernels/k.py"}, ["/opt/scrub", "/work"], ["/opt/scrub", "/work", "/added"])
    assert is_user_module(file, users, roots) is user


def test_close_leaves_no_process(pool: WarmPool) -> None:
    pool.call({"op": "sleep", "s": 0}, 30)
    guards = pool.pids()
    assert guards and all(not _gone(g, 0.2) for g in guards)
    pool.close()
    assert all(_gone(g) for g in guards)
    with pytest.raises(RuntimeError, match="closed"):
        pool.call({"op": "sleep", "s": 0}, 30)


def test_workers_die_with_their_parent_even_by_sigkill(tmp_path: Path) -> None:
    # The parent starts a worker from a job thread that then ends (as the search's threads do), prints the guard's
    # pid and is killed with SIGKILL: the worker must not survive it.
    script = textwrap.dedent(
        f"""
        import sys, threading, time
        sys.path[:0] = [{str(ROOT / "src")!r}, {str(ROOT / "tests")!r}]
        from test_warm_workers import _env
        from pallasopt.harness.warm import WarmPool
        pool = WarmPool("warm_handlers:handle", _env)
        t = threading.Thread(target=lambda: pool.call({{"op": "sleep", "s": 0}}, 30))
        t.start(); t.join()
        time.sleep(0.5)
        print(pool.pids()[0], flush=True)
        time.sleep(600)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert proc.stdout is not None
        guard = int(proc.stdout.readline())
        assert not _gone(guard, 0.5), "the worker died with the thread that started it"
    finally:
        proc.kill()
        proc.wait()
    assert _gone(guard)


# ---- real compiles: the warm path gives the fresh child's report --------------------------------------------------


def _same(fresh: CompileReport, warm: CompileReport) -> None:
    assert dataclasses.replace(warm, compile_s=0.0) == dataclasses.replace(fresh, compile_s=0.0)


KERNELS = [  # (source, entry, dims, target)
    (matmul_source(128, "float32"), "matmul", {"M": 512, "N": 512, "K": 512}, "v5e"),
    (matmul_source(512, "bfloat16"), "matmul", {"M": 1024, "N": 1024, "K": 1024}, "v5e"),
    (matmul_source(128, "float32"), "reference", {"M": 512, "N": 512, "K": 512}, "v6e"),
    (matmul_source(1024, "float32"), "matmul", {"M": 2048, "N": 2048, "K": 2048}, "v5e"),  # VMEM overflow
    ("import jax\ndef f(:\n    pass\n", "f", {}, "v5e"),  # syntax error
    (matmul_source(128, "float32"), "matmul", {"M": 512, "N": 512, "K": 512}, "v4"),  # no profile on v4
]


@pytest.mark.slow
@needs_libtpu
def test_warm_compiles_give_the_fresh_childs_reports() -> None:
    """Reason for ~60-90 s: six compiles in fresh children and the same six in two warm workers (profile on/off)."""
    pool = CompilePool()
    try:
        for source, entry, dims, target in KERNELS:
            fresh = compile_module(source, "kernels/mm.py", entry, dims, target, steps_scale=2.0)
            warm = compile_module(source, "kernels/mm.py", entry, dims, target, steps_scale=2.0, pool=pool)
            _same(fresh, warm)
        assert pool.started() == 2  # one worker with the profile flag, one without (v4), each reused
        workers = pool.workers()
    finally:
        pool.close()
    assert all(_gone(g) for g in workers)


CRASHER = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"


@pytest.mark.slow
@needs_libtpu
def test_a_compile_that_kills_its_worker_gets_the_fresh_childs_record_and_the_next_compiles() -> None:
    """Reason for ~40 s: the crash is compiled fresh and warm, each twice (libtpu is retried without the profile)."""
    fresh = compile_module(CRASHER, "kernels/crash.py", "f", {}, "v5e")
    pool = CompilePool()
    try:
        warm = compile_module(CRASHER, "kernels/crash.py", "f", {}, "v5e", pool=pool)
        assert warm.error_kind == fresh.error_kind == "crash" and warm.error == fresh.error
        ok = compile_module(matmul_source(), "kernels/mm.py", "matmul", {}, "v5e", pool=pool)
        assert ok.ok and ok.estimated_cycles and pool.started() == 2
        # A module that takes 30 s to import (a warm worker compiles the small matmul in ~0.2 s: no timeout short
        # enough to test would catch it).
        slow = "import time\ntime.sleep(30)\n" + matmul_source()
        timed_out = compile_module(slow, "kernels/mm.py", "matmul", {}, "v5e", pool=pool, timeout_s=2)
        assert timed_out.error_kind == "timeout" and not pool.workers()  # the one worker was killed
    finally:
        pool.close()


def test_the_local_executor_times_in_one_warm_worker_one_timing_at_a_time() -> None:
    """A fresh child per chip timing cost 24-29 s on a v5e host (session 33): timings now go to one warm worker that
    keeps the accelerator, under a lock (a second process could not open the chip). Here (no accelerator) both
    answer the worker's refusal; the warm answer is the fresh child's, and two timings reuse one worker."""
    import concurrent.futures

    from pallasopt.cost_model.hardware import CHIPS
    from pallasopt.executors.jobs import time_job

    source = (ROOT / "examples" / "matmul.py").read_text()
    job = time_job(source, "examples/matmul.py", CHIPS["v5e"])
    fresh = LocalExecutor(warm=False).run(job)
    ex = LocalExecutor()
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as threads:
            answers = list(threads.map(ex.run, [job, job]))
        assert ex.timing_pool is not None and ex.timing_pool.started == 1  # the lock: never two at once
        workers = ex.timing_pool.pids()
    finally:
        ex.close()
    assert (
        fresh
        == answers[0]
        == answers[1]
        == {"ok": False, "message": "no accelerator: hardware timing is not done on the CPU"}
    )
    assert workers and all(_gone(pool_guard_of(w, default=w)) for w in workers)


@needs_libtpu
def test_the_local_executor_compiles_warm_and_closes_its_workers() -> None:
    ex = LocalExecutor()
    job = compile_job(matmul_source(), "kernels/mm.py", "matmul", {}, "v5e", steps_scale=1.0, timeout_s=120)
    first, second = ex.run(job), ex.run(job)
    assert first.ok and dataclasses.replace(first, compile_s=0) == dataclasses.replace(second, compile_s=0)
    assert ex.compile_pool is not None and ex.compile_pool.started() == 1
    workers = ex.compile_pool.workers()
    ex.close()
    assert workers and all(_gone(g) for g in workers)


# ---- interpret-mode checks: the warm path gives the fresh child's verdicts ----------------------------------------

CHECKED = [  # a wrong kernel right after a right one and the other way round: nothing may carry over
    ROOT / "examples" / "matmul.py",
    TEST_KERNELS / "wrong_result.py",
    TEST_KERNELS / "dma_race.py",
    TEST_KERNELS / "dma_copy_scale.py",
    TEST_KERNELS / "unwritten_block.py",
    ROOT / "examples" / "matmul.py",
]


def _verdict(r: CheckResult) -> CheckResult:
    return dataclasses.replace(r, wall_s=0.0)


@pytest.mark.slow
def test_warm_checks_give_the_fresh_childs_verdicts() -> None:
    """Reason for ~2 min: six interpret-mode checks in fresh children and the same six in one warm worker."""
    pool = check_pool()
    try:
        for path in CHECKED:
            fresh = check(path.read_text(), str(path))
            warm = check(path.read_text(), str(path), pool=pool)
            assert _verdict(warm) == _verdict(fresh), path.name
        assert [check(p.read_text(), str(p), pool=pool).status for p in CHECKED[:2]] == ["pass", "mismatch"]
        assert pool.started == 1
    finally:
        pool.close()


@pytest.mark.slow
def test_a_check_that_crashes_or_hangs_costs_one_worker() -> None:
    wrong = (TEST_KERNELS / "wrong_result.py").read_text()
    crash = wrong.replace("def reference(x):\n", "def reference(x):\n    import os\n    os._exit(9)\n")
    hang = wrong.replace("def reference(x):\n", "def reference(x):\n    import time\n    time.sleep(60)\n")
    pool = check_pool()
    try:
        fresh = check(crash, "crash.py")
        warm = check(crash, "crash.py", pool=pool)
        assert warm.status == fresh.status == "crash" and warm.message.split(":")[0] == fresh.message.split(":")[0]
        timed_out = check(hang, "hang.py", timeout_s=8, pool=pool)
        assert timed_out.status == "timeout" and timed_out.wall_s < 20
        after = check(wrong, "wrong_result.py", pool=pool)
        assert after.status == "mismatch" and pool.started == 3
    finally:
        pool.close()


def test_a_pool_never_closed_leaves_no_folder_behind() -> None:
    """A process that ends without closing its pool (a test, a script, a run stopped early) left one
    `pallasopt-warm-*` folder in the temp dir per pool (31 of them here in one day); removed at exit now."""
    code = "from pallasopt.harness.warm import worker_pool; p = worker_pool(None, 5); print(p._root)"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    root = Path(out.stdout.strip())
    assert root.name.startswith("pallasopt-warm-")
    assert not root.exists()
