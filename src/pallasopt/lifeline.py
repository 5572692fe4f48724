"""Child processes that cannot outlive pallasopt, cannot kill it, and end by themselves after a deadline.

Every child pallasopt starts to run user code (checks, timing, tracing, deviceless compiles) goes through
`child_command`: ``python -c BOOT PARENT_PID DEADLINE_S MODULE``. The booted process is a small *guard* that

- asks Linux to SIGKILL it when pallasopt dies (``prctl(PR_SET_PDEATHSIG)``), even by ``kill -9``;
- arms ``alarm(DEADLINE_S)``: it dies by SIGALRM at its deadline even if pallasopt is gone or hung;
- forks the *worker*, which runs ``python -m MODULE`` (stdin/stdout/stderr inherited) and is SIGKILLed in turn when
  the guard dies. User code therefore runs two levels below pallasopt: ``os.kill(os.getppid(), 9)`` hits the guard,
  not pallasopt;
- exits with the worker's exit code, or ``128 + N`` when the worker died of signal N. A guard that itself died of a
  signal (a negative return code in the parent) was killed from outside: by its deadline (SIGALRM), or by the code
  it ran (`GUARD_KILLED`).

The parent side keeps a registry of live children: `kill_all_children` (called on SIGTERM, SIGINT and at exit by
`install_handlers`) kills each child's process group. This module imports nothing from pallasopt, so the guard
starts fast and forks before anything heavy (JAX, threads) is loaded.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

BOOT = "import sys; from pallasopt.lifeline import boot; boot(sys.argv[1:])"
DEADLINE_GRACE_S = 30.0  # a child's own deadline is its parent's timeout plus this
SIGNALED = 128  # guard exit code = SIGNALED + N when the worker died of signal N
PR_SET_PDEATHSIG = 1

_children: set[subprocess.Popen[Any]] = set()
_children_lock = threading.RLock()  # re-entrant: a signal handler in the main thread may take it again


def child_command(python: str, module: str, deadline_s: float) -> list[str]:
    """The argv that runs ``python -m module`` under a guard bound to this process, ending itself after
    `deadline_s` seconds."""
    return [python, "-c", BOOT, str(os.getpid()), f"{max(deadline_s, 1.0):.0f}", module]


def describe_exit(returncode: int) -> str:
    """Why a guarded child ended, in words, from the guard's return code."""
    if returncode < 0:
        sig = -returncode
        if sig == signal.SIGALRM:
            return "it ran past its own deadline"
        return f"the process that ran it was killed ({signame(sig)}): by the code it ran, or from outside"
    if returncode > SIGNALED:
        return f"killed by {signame(returncode - SIGNALED)}"
    return f"exit code {returncode}"


def signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def worker_code(returncode: int) -> int:
    """The guard's return code in `subprocess` terms (``-N`` for a worker killed by signal N)."""
    return -(returncode - SIGNALED) if returncode > SIGNALED else returncode


def guard_killed(returncode: int | None) -> bool:
    """The guard died of a signal other than its own deadline: the code it ran killed its parent (or someone did)."""
    return returncode is not None and returncode < 0 and -returncode != signal.SIGALRM


# ----------------------------------------------------------------------------------------------------- child side


def bind_to_parent(parent_pid: int) -> None:
    """Die with SIGKILL when `parent_pid` (our parent) exits; exit now if it already has."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the request above took effect
        os._exit(SIGNALED + signal.SIGKILL)


def boot(argv: Sequence[str]) -> None:
    """The guard: bind to the parent, arm the deadline, fork the worker and wait for it (see the module doc)."""
    parent_pid, deadline_s, module = int(argv[0]), int(argv[1]), argv[2]
    bind_to_parent(parent_pid)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(max(deadline_s, 1))
    guard = os.getpid()
    pid = os.fork()
    if pid == 0:
        signal.alarm(0)  # alarms are per process: the worker's life is bounded by the guard's
        bind_to_parent(guard)
        import runpy

        sys.argv = [module]
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            _flush_and_exit(code)
        except BaseException:
            import traceback

            traceback.print_exc()
            _flush_and_exit(1)
        _flush_and_exit(0)
    for fd in (0, 1):  # the worker holds the pipes; the guard only waits
        with contextlib.suppress(OSError):
            os.close(fd)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        os._exit(SIGNALED + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _flush_and_exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


# ---------------------------------------------------------------------------------------------------- parent side


@contextlib.contextmanager
def spawned(argv: list[str], env: Mapping[str, str] | None = None, **kwargs: Any) -> Iterator[subprocess.Popen[Any]]:
    """`subprocess.Popen` in a new session, registered for `kill_all_children` while the block runs; its process
    group is killed if the block leaves it running (an exception, an interrupt)."""
    with _children_lock:
        proc: subprocess.Popen[Any] = subprocess.Popen(
            argv, env=dict(env) if env is not None else None, start_new_session=True, **kwargs
        )
        _children.add(proc)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            kill_group(proc)
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)
        with _children_lock:
            _children.discard(proc)


def kill_group(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL a child's process group (it leads its own session), or the child alone if that fails."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(OSError):
            proc.kill()


def kill_all_children() -> int:
    """Kill every live child started through `spawned`; returns how many there were."""
    with _children_lock:
        live = list(_children)
    for proc in live:
        kill_group(proc)
    return len(live)


_installed: list[bool] = []


def install_handlers() -> None:
    """On SIGTERM and SIGINT, and at exit, kill the children first (once per process, from the main thread)."""
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    _installed.append(True)
    atexit.register(kill_all_children)

    def on_term(signum: int, _frame: Any) -> None:
        kill_all_children()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def on_int(_signum: int, _frame: Any) -> None:
        kill_all_children()  # the threads waiting on them return at once, so Ctrl-C ends the run promptly
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, on_int)


def deadline_for(timeout_s: float) -> float:
    """A child's own deadline for a parent timeout of `timeout_s`."""
    return math.ceil(timeout_s + DEADLINE_GRACE_S)
