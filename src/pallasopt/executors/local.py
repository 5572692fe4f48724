"""The local executor: each job's guarded child process runs on this host, as `--jobs` has always done."""

from __future__ import annotations

import os
from typing import Any

from . import Job, Needs, Submitting


class LocalExecutor(Submitting):
    """Runs `job.fn` in the calling thread (it starts the child process and waits for it)."""

    name = "local"

    def run(self, job: Job) -> Any:
        return job.fn(**job.kwargs)

    def slots(self) -> int:
        return max(1, os.cpu_count() or 1)

    def unavailable(self, needs: Needs) -> str | None:
        return None  # this host's accelerator is probed by the tier itself (harness/timing.py)
