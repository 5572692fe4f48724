"""The Ray executor: each job is a Ray task declaring its resources; the records come back to the driver.

Only this module imports Ray, and only when `--executor ray` asks for it. A task runs the same guarded child
process a local run starts (same time and memory limits, enforced on the worker's host). Ray retries a task whose
worker process or node dies (`retries` times); after that, or when no answer comes within the job's limits, the
job's `lost` record is returned: a failed evaluation, never a lost one. An exception raised by pallasopt's own code
on a worker is a bug and is raised here, as it would be in a local run.
"""

from __future__ import annotations

import os
from typing import Any

from ..config import RAY_LOCAL_ENV
from ..errors import EnvironmentProblem
from . import Job, Needs, Submitting

GRACE_S = 60.0  # beyond a job's own limit: the guard's kill, the reply's trip back, a retry's start-up
QUEUE_S = 3600.0  # how long a job may wait for a free slot of the cluster before it is given up


def require_ray() -> None:
    """One line naming the extra to install (exit 4) when Ray is missing; nothing is imported."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise EnvironmentProblem(
            "--executor ray needs Ray, which is not installed", hint="pip install 'pallasopt[ray]'"
        )


def import_ray() -> Any:
    require_ray()
    import ray

    return ray


def _run(fn: Any, kwargs: dict[str, Any]) -> Any:
    """Worker side: run one job (the evaluation itself happens in the child process `fn` starts)."""
    return fn(**kwargs)


class RayExecutor(Submitting):
    """Jobs as Ray tasks on the cluster at `address` (None: a local, loopback-only Ray instance for this run)."""

    name = "ray"

    def __init__(self, address: str | None = None, *, retries: int = 2, num_cpus: int | None = None) -> None:
        self.retries = retries
        self._owns = False
        if address is None:
            # Set before Ray is imported: a local instance then binds 127.0.0.1 only and sends no usage report.
            for k, v in RAY_LOCAL_ENV.items():
                os.environ.setdefault(k, v)
        ray = import_ray()
        self._ray = ray
        if not ray.is_initialized():
            if address is None:
                ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
            else:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
            self._owns = True
        self._remote = ray.remote(_run)

    def options(self, job: Job) -> dict[str, Any]:
        """The task options of `job`: its resources and Ray's retries on a dead worker (not on an exception)."""
        opts: dict[str, Any] = {
            "num_cpus": job.needs.cpus,
            "max_retries": self.retries,
            "retry_exceptions": False,
            "name": f"pallasopt-{job.kind}",
        }
        if job.needs.gpus:
            opts["num_gpus"] = job.needs.gpus
        if job.needs.resources:
            opts["resources"] = dict(job.needs.resources)
        return opts

    def run(self, job: Job) -> Any:
        ray = self._ray
        from ray import exceptions as rx

        ref = self._remote.options(**self.options(job)).remote(job.fn, dict(job.kwargs))
        wait_s = (self.retries + 1) * (job.timeout_s + GRACE_S) + QUEUE_S
        try:
            return ray.get(ref, timeout=wait_s)
        except rx.GetTimeoutError:
            ray.cancel(ref, force=True)
            return job.lost(f"no answer from the Ray cluster within {wait_s:.0f} s ({job.kind} job)")
        except rx.RayTaskError as e:  # pallasopt's own code raised on the worker: a bug, as it is locally
            raise e.as_instanceof_cause() from None
        except (rx.WorkerCrashedError, rx.NodeDiedError, rx.ObjectLostError, rx.TaskCancelledError) as e:
            what = " ".join(str(e).split())[:300]
            return job.lost(f"the Ray worker running this {job.kind} job died ({self.retries + 1} attempts): {what}")
        except rx.RayError as e:  # the cluster itself failed the task (e.g. unschedulable, runtime env)
            return job.lost(f"Ray could not run this {job.kind} job: {' '.join(str(e).split())[:300]}")

    def slots(self) -> int:
        return max(1, int(self._ray.cluster_resources().get("CPU", 1)))

    def unavailable(self, needs: Needs) -> str | None:
        have = self._ray.cluster_resources()
        wanted = {"CPU": needs.cpus, "GPU": needs.gpus, **needs.resources}
        missing = [k for k, v in wanted.items() if v and have.get(k, 0.0) < v]
        if not missing:
            return None
        return f"no node of the Ray cluster has {', '.join(missing)} (hosts declare it: ray start --resources=...)"

    def close(self) -> None:
        super().close()
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()
