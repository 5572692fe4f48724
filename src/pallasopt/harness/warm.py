"""Warm evaluation workers: a child that imports JAX (and libtpu) once and serves many requests over a pipe.

A fresh child per compile or check pays ~2 s of JAX + libtpu start-up each time; a `WarmPool` keeps up to as many
workers as there are callers at once (the search's `--jobs` threads) and hands each request to an idle one. Each
worker is a guarded child (`lifeline`: it dies with this process, by itself after `LIFETIME_S`, and when idle for
`IDLE_S`), started by `python -m pallasopt.harness.warm_serve` (the child side and its protocol).

A request that times out, or whose worker dies (a crash, an abort, an OOM kill, code that kills its own process),
costs only that worker: it is killed with its process group and dropped, the caller gets ``(None, stderr, rc)`` as
from a fresh child (`rc` None on timeout), and the next request starts a fresh worker. `close()` kills every worker;
the pool's owner (the local executor) closes it at the end of a run.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..config import child_env, read_env
from ..lifeline import DEADLINE_GRACE_S, child_command, deadline_for, describe_exit, kill_group, spawned
from .subproc import ChildResult

LIFETIME_S = 4 * 3600  # the guard's own deadline: a worker is retired before a request could run past it
IDLE_S = 900  # a worker with no request for this long ends itself (its parent may be hung)
START_TIMEOUT_S = 120.0  # time to import the handler and answer the hello
CLOSE_GRACE_S = 5.0  # an idle worker asked to end at `close` is killed if it has not after this long
STDERR_TAIL = 64 * 1024  # bytes of a request's stderr kept for the crash message

# (reply or None, the request's stderr, the guard's returncode (`lifeline.describe_exit`; `worker_code` turns it
# into `subprocess` terms) or None when it was killed on timeout)
Answer = tuple[dict[str, Any] | None, str, int | None]
_EOF = b"\0eof"  # `_read_line`'s answer when the worker's stdout closed (a reply line never holds a NUL byte)


_SPAWNER: list[ThreadPoolExecutor] = []
_SPAWNER_LOCK = threading.Lock()


def _spawner() -> ThreadPoolExecutor:
    with _SPAWNER_LOCK:
        if not _SPAWNER:
            _SPAWNER.append(ThreadPoolExecutor(1, thread_name_prefix="pallasopt-warm-spawn"))
        return _SPAWNER[0]


class WarmWorker:
    """One warm child. `call` is not thread-safe: the pool gives a worker to one caller at a time."""

    def __init__(
        self, handler: str, env: Mapping[str, str], folder: Path, *, limit_memory: bool = False, python: str = ""
    ) -> None:
        self.folder = folder
        self.stderr_path = folder / "stderr.log"
        self.started = time.monotonic()
        self.requests = 0
        argv = child_command(python or sys.executable, "pallasopt.harness.warm_serve", LIFETIME_S)
        self._err = open(self.stderr_path, "ab")  # noqa: SIM115 (kept open for the child's life)
        self._ctx = spawned(argv, env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, bufsize=0)
        # Started from a thread that lives as long as this process: the guard's PR_SET_PDEATHSIG fires when the
        # *thread* that started it ends, and the search's job threads end after each batch.
        self.proc = _spawner().submit(self._ctx.__enter__).result()
        self._buf = b""
        hello = {"handler": handler, "idle_s": IDLE_S, "limit_memory": limit_memory}
        reply, err, _rc = self._exchange(hello, START_TIMEOUT_S)
        if not reply or not reply.get("ready"):
            self.close()
            raise RuntimeError(f"warm worker did not start: {err.strip()[-600:] or 'no answer'}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def fits(self, timeout_s: float) -> bool:
        """True when a request of `timeout_s` ends before the guard's own deadline."""
        age = time.monotonic() - self.started
        return self.alive() and age + deadline_for(timeout_s) + DEADLINE_GRACE_S < LIFETIME_S

    def call(self, request: Mapping[str, Any], timeout_s: float) -> Answer:
        """Send one request; the worker is dead after any answer whose reply is None."""
        self.requests += 1
        payload = dict(request, deadline_s=deadline_for(timeout_s))
        return self._exchange(payload, timeout_s)

    def _exchange(self, payload: Mapping[str, Any], timeout_s: float) -> Answer:
        with contextlib.suppress(OSError):
            os.truncate(self.stderr_path, 0)  # the child appends: what follows is this request's
        end = time.monotonic() + timeout_s
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write((json.dumps(payload) + "\n").encode())
        except OSError:  # it died before (or while) reading: a crash
            return None, self._stderr(), self._reap()
        line = self._read_line(end)
        if line is None:  # timed out: kill it
            self.close()
            return None, self._stderr(), None
        if line is _EOF:  # the worker is gone (or its pipe was closed by `close`)
            return None, self._stderr(), self._reap()
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            self.close()
            return None, self._stderr(), self._reap()
        return reply, self._stderr(), 0

    def _read_line(self, end: float) -> bytes | None:
        """The next line; None when `end` passed first, `_EOF` when the worker's stdout closed."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = end - time.monotonic()
            if left <= 0:
                return None
            try:
                ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            except (OSError, ValueError):  # closed under us (the pool was closed)
                return _EOF
            if not ready:
                continue
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:  # closed under us (the pool was closed)
                return _EOF
            if not chunk:  # EOF: the worker is gone
                return _EOF
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def _stderr(self) -> str:
        try:
            with open(self.stderr_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - STDERR_TAIL))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _reap(self) -> int | None:
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.close()
            code = self.proc.wait()
        self.close()
        return code

    def close(self, grace_s: float = 0.0) -> None:
        """End the worker and release its pipes; idempotent. With `grace_s`, an idle worker is first asked to end
        (its stdin closed: it leaves its loop and the guard reaps it, so its CPU time is accounted to this process
        like a fresh child's); whatever still runs after that is killed with its process group."""
        if grace_s > 0 and self.proc.poll() is None:
            with contextlib.suppress(Exception):
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
                self.proc.wait(timeout=grace_s)
        if self.proc.poll() is None:
            kill_group(self.proc)
        with contextlib.suppress(Exception):
            self._ctx.__exit__(None, None, None)
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(Exception):
                if stream is not None:
                    stream.close()
        with contextlib.suppress(Exception):
            self._err.close()


class WarmPool:
    """Warm workers of one handler, one per concurrent caller; `env_for(folder)` is a new worker's environment
    (`folder` is its own scratch folder, e.g. for libtpu's profile dumps)."""

    def __init__(
        self,
        handler: str,
        env_for: Callable[[Path], Mapping[str, str]],
        *,
        limit_memory: bool = False,
        max_requests: int = 200,
        python: str = "",
    ) -> None:
        self.handler = handler
        self.python = python  # the interpreter (default: this one)
        self.env_for = env_for
        self.limit_memory = limit_memory
        self.max_requests = max_requests  # a worker is replaced after this many (bounds leaks in JAX's caches)
        self._idle: list[WarmWorker] = []
        self._busy: set[WarmWorker] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._root = Path(tempfile.mkdtemp(prefix="pallasopt-warm-"))
        # a pool nobody closed (a process ending without close) still leaves no folder in the temp dir
        atexit.register(shutil.rmtree, self._root, ignore_errors=True)
        self.started = 0  # workers started so far (tests read it)

    def acquire(self, timeout_s: float) -> WarmWorker:
        """An idle worker that can serve a request of `timeout_s`, or a new one."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the warm pool is closed")
            while self._idle:
                w = self._idle.pop()
                if w.fits(timeout_s) and w.requests < self.max_requests:
                    self._busy.add(w)
                    return w
                w.close()
            self.started += 1
            folder = self._root / f"w{self.started}"
        folder.mkdir(parents=True, exist_ok=True)
        w = WarmWorker(self.handler, self.env_for(folder), folder, limit_memory=self.limit_memory, python=self.python)
        with self._lock:
            if self._closed:
                w.close()
                raise RuntimeError("the warm pool is closed")
            self._busy.add(w)
        return w

    def release(self, w: WarmWorker) -> None:
        """Give `w` back: kept if alive, else dropped (the next request starts a fresh one)."""
        with self._lock:
            self._busy.discard(w)
            if w.alive() and not self._closed:
                self._idle.append(w)
                return
        w.close()

    def call(self, request: Mapping[str, Any], timeout_s: float) -> Answer:
        w = self.acquire(timeout_s)
        try:
            return w.call(request, timeout_s)
        finally:
            self.release(w)

    def pids(self) -> list[int]:
        with self._lock:
            return [w.pid for w in [*self._idle, *self._busy]]

    def close(self) -> None:
        """End every worker: idle ones are asked to end (killed after `CLOSE_GRACE_S`), busy ones are killed (their
        caller gets a crash answer); then remove the scratch folders."""
        with self._lock:
            self._closed = True
            idle, busy = list(self._idle), list(self._busy)
            self._idle.clear()
        for w in busy:
            w.close()
        for w in idle:
            w.close(grace_s=CLOSE_GRACE_S)
        shutil.rmtree(self._root, ignore_errors=True)


def ask(pool: WarmPool, request: Mapping[str, Any], timeout_s: float) -> ChildResult:
    """`run_child`'s answer (`subproc.ChildResult`), from a warm worker of `pool`."""
    start = time.perf_counter()
    reply, err, code = pool.call(request, timeout_s)
    wall = time.perf_counter() - start
    if reply is not None:
        return ChildResult(reply, "ok", "", wall, 0)
    if code is None:
        return ChildResult(None, "timeout", f"timed out after {timeout_s:.0f} s", wall, None)
    tail = "\n".join(err.strip().splitlines()[-5:])
    message = f"evaluation process died ({describe_exit(code)})" + (f": {tail}" if tail else "")
    return ChildResult(None, "crash", message, wall, code)


def worker_pool(extra_env: Mapping[str, str] | None, max_requests: int) -> WarmPool:
    """Warm workers of `harness.worker.handle` (checks, timings) with the fresh worker child's environment
    (`config.child_env(extra_env)`), memory limit and interpreter; each replaced after `max_requests`."""
    return WarmPool(
        "pallasopt.harness.worker:handle",
        lambda _folder: child_env(extra_env),
        limit_memory=True,
        max_requests=max_requests,
        python=read_env().python or "",
    )
