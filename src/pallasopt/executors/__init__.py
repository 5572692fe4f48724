"""Where evaluation jobs run: guarded local child processes (the default) or the tasks of a Ray cluster.

A `Job` is one compile, check or timing request: a module-level pallasopt function that runs the evaluation in a
guarded child process (time and memory limits, `harness/subproc.py`) and returns its result record
(`CompileReport`, `CheckResult`, a timing dict), plus the resources it needs. An executor runs it where those
resources are and always answers with a record of the same type: a worker that dies is retried, then recorded as
failed (`Job.lost`), never dropped. Records come back to the driver, where the caller (`search/cached.py`) writes
each in its own transaction: the kernel database never leaves the driver.

Nothing in this module imports Ray; `make_executor("ray")` loads `ray_cluster`, which does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class Needs:
    """What one job asks of the host it runs on (Ray schedules by it; the local executor has only this host)."""

    cpus: float = 1.0
    gpus: float = 0.0
    resources: Mapping[str, float] = field(default_factory=dict)  # custom ones, e.g. {"TPU": 1, "v5e": 1}

    def describe(self) -> str:
        parts = [f"CPU {self.cpus:g}"] + [f"GPU {self.gpus:g}"] * bool(self.gpus)
        return ", ".join(parts + [f"{k} {v:g}" for k, v in sorted(self.resources.items())])


@dataclass(frozen=True)
class Job:
    """One evaluation: ``fn(**kwargs)`` on a host with `needs`, its child stopped after `timeout_s`.

    `fn` must be importable by name on every host (a module-level function of pallasopt, or of a test module);
    `lost(message)` builds the failed record of `fn`'s type for a job whose worker died or never answered.
    """

    kind: str  # "compile" | "check" | "time" (or a test's own)
    fn: Callable[..., Any]
    kwargs: Mapping[str, Any]
    timeout_s: float
    lost: Callable[[str], Any]
    needs: Needs = Needs()


class Executor(Protocol):
    """Runs jobs; `run` blocks the calling thread (the search runs `jobs` threads) and never loses a job."""

    name: str

    def run(self, job: Job) -> Any: ...

    def submit(self, job: Job) -> Future[Any]: ...

    def slots(self) -> int: ...  # how many jobs can run at once (CPUs of the cluster)

    def unavailable(self, needs: Needs) -> str | None: ...  # why no host has `needs` (None: some host has)

    def close(self) -> None: ...


class Submitting:
    """`submit` for executors whose `run` blocks: a thread per slot waits on each job."""

    _pool: ThreadPoolExecutor | None = None

    def run(self, job: Job) -> Any:
        raise NotImplementedError

    def slots(self) -> int:
        raise NotImplementedError

    def submit(self, job: Job) -> Future[Any]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max(1, self.slots()), thread_name_prefix="pallasopt-job")
        return self._pool.submit(self.run, job)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def make_executor(kind: str = "local", address: str | None = None, *, retries: int = 2) -> Executor:
    """The executor named `kind`; for "ray", connected to `address` (None: a local Ray instance, started here and
    shut down by `close()`). Ray missing: `EnvironmentProblem` (exit 4) naming the extra to install."""
    from ..errors import UsageError

    if kind == "local":
        if address:
            raise UsageError("--ray-address needs --executor ray")
        from .local import LocalExecutor

        return LocalExecutor()
    if kind == "ray":
        from .ray_cluster import RayExecutor

        return RayExecutor(address, retries=retries)
    raise UsageError(f"unknown executor {kind!r}", hint=f"choose one of: {', '.join(EXECUTORS)}")
