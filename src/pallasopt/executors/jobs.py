"""The three evaluation jobs of the tier funnel, as `Job` values any executor can run.

Each wraps the function the local tiers have always called (`compile_module`, `harness.check.check`,
`harness.timing.time_kernel`), so a job run on a Ray worker gives the very record a local child gives. The function
is looked up when the job is built (a test that replaces one in its module replaces it in the jobs too).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..cost_model import compiler
from ..cost_model.compiler import CompileReport
from ..cost_model.hardware import Chip
from ..harness import check as oracle
from ..harness import timing
from ..harness.check import CheckResult
from . import Job, Needs

CPU_JOB = Needs(cpus=1.0)


def hardware_needs(chip: Chip) -> Needs:
    """A timing job runs only on a host that has the target chip: Ray's own accelerator resource ("TPU", or a GPU)
    and a custom resource named after the chip (`ray start --resources='{"v5e": 4}'` on each v5e host)."""
    if chip.is_gpu:
        return Needs(cpus=1.0, gpus=1.0, resources={chip.name: 1.0})
    return Needs(cpus=1.0, resources={"TPU": 1.0, chip.name: 1.0})


def compile_job(
    source: str,
    path: str,
    entry: str,
    dims: Mapping[str, int],
    target: str,
    *,
    steps_scale: float,
    timeout_s: float,
    call_scales: Sequence[float] = (),
    profile: bool = True,
    kernels_only: bool = False,
) -> Job:
    """A deviceless compile of `entry` at `dims`; `profile=False` skips libtpu's static cycle profile (a verdict on
    lowering and VMEM only, in seconds even at a module's full size); `kernels_only` compiles its pallas_calls alone
    (`compiler.compile_module`)."""
    kwargs = {
        "source": source,
        "path": path,
        "entry": entry,
        "dims": dict(dims),
        "target": target,
        "steps_scale": steps_scale,
        "call_scales": tuple(call_scales),
        "timeout_s": timeout_s,
        "dump_profile": profile,
        **({"kernels_only": True} if kernels_only else {}),
    }
    return Job("compile", compiler.compile_module, kwargs, timeout_s, _CompileLost(target, steps_scale), CPU_JOB)


def check_job(
    source: str, path: str, seeds: Sequence[int], *, timeout_s: float, dims: Mapping[str, int] | None = None
) -> Job:
    """The oracle on `source` (at `dims`: the module's own check dims when None)."""
    kwargs: dict[str, Any] = {"source": source, "path": path, "seeds": tuple(seeds), "timeout_s": timeout_s}
    if dims is not None:
        kwargs["dims"] = dict(dims)
    return Job("check", oracle.check, kwargs, timeout_s, _check_lost, CPU_JOB)


TIMING_TIMEOUT_S = 600.0  # time_kernel's own limit


def time_job(source: str, path: str, chip: Chip, timeout_s: float = TIMING_TIMEOUT_S) -> Job:
    kwargs = {"source": source, "path": path, "timeout_s": timeout_s}
    return Job("time", timing.time_kernel, kwargs, timeout_s, _time_lost, hardware_needs(chip))


class _CompileLost:
    """The failed `CompileReport` of a compile whose worker died (a picklable callable, not a closure)."""

    def __init__(self, target: str, steps_scale: float) -> None:
        self.target, self.steps_scale = target, steps_scale

    def __call__(self, message: str) -> CompileReport:
        return CompileReport(
            ok=False, target=self.target, error=message, error_kind="crash", steps_scale=self.steps_scale
        )


def _check_lost(message: str) -> CheckResult:
    return CheckResult(ok=False, status="crash", message=message)


def _time_lost(message: str) -> dict[str, Any]:
    return {"ok": False, "message": message}
