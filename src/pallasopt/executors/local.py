"""The local executor: each job's guarded child process runs on this host, as `--jobs` has always done.

Compiles and interpret-mode checks go to warm workers (`CompilePool`, `check_pool`, `harness/warm.py`): children
that import JAX (and libtpu) once and serve one candidate after another, one per job thread (so at most `--jobs` of
each), closed by `close()`. Hardware timings go to one warm worker (`timing_pool`) that keeps the accelerator open,
one timing at a time.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ..cost_model import compiler
from ..harness import check as oracle
from ..harness import timing
from ..harness.warm import WarmPool
from . import Job, Needs, Submitting

# The real functions, taken at import: a job whose function a test replaced runs that function as it is.
_COMPILE = compiler.compile_module
_CHECK = oracle.check
_TIME = timing.time_kernel


class LocalExecutor(Submitting):
    """Runs `job.fn` in the calling thread (it starts the child process, or asks a warm one, and waits for it).

    `warm=False`: every compile and check in a fresh child, as before the warm workers.
    """

    name = "local"

    def __init__(self, *, warm: bool = True) -> None:
        self.warm = warm
        self.compile_pool: compiler.CompilePool | None = None
        self.check_pool: WarmPool | None = None
        self.timing_pool: WarmPool | None = None
        self._lock = threading.Lock()
        self._chip = threading.Lock()  # one timing at a time: one process can hold the accelerator

    def run(self, job: Job) -> Any:
        if self.warm and job.kind == "compile" and job.fn is _COMPILE:
            with self._lock:
                if self.compile_pool is None:
                    self.compile_pool = compiler.CompilePool()
            return _COMPILE(**job.kwargs, pool=self.compile_pool)
        if self.warm and job.kind == "check" and job.fn is _CHECK:
            with self._lock:
                if self.check_pool is None:
                    self.check_pool = oracle.check_pool()
            return _CHECK(**job.kwargs, pool=self.check_pool)
        if job.kind == "time":
            with self._chip:
                if not (self.warm and job.fn is _TIME):
                    return job.fn(**job.kwargs)
                if self.timing_pool is None:
                    self.timing_pool = timing.timing_pool()
                return _TIME(**job.kwargs, pool=self.timing_pool)
        return job.fn(**job.kwargs)

    def slots(self) -> int:
        return max(1, os.cpu_count() or 1)

    def unavailable(self, needs: Needs) -> str | None:
        return None  # this host's accelerator is probed by the tier itself (harness/timing.py)

    def close(self) -> None:
        super().close()
        with self._lock:
            pools = (self.compile_pool, self.check_pool, self.timing_pool)
            self.compile_pool, self.check_pool, self.timing_pool = None, None, None
        for pool in pools:
            if pool is not None:
                pool.close()
