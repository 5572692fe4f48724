"""`pallasopt analyze --target/--compile`: the model's estimate and the compiler's verdict side by side."""

from __future__ import annotations

from typing import Any

from .cost_model.roofline import Estimate, estimate_calls
from .errors import EnvironmentProblem
from .ir.kernel_ir import KernelIR
from .optimize import resolve_target


def analyze_ir(ir: KernelIR, target: str, *, compile: bool = False) -> tuple[list[Estimate], dict[str, Any] | None]:
    chip = resolve_target(target)
    est = estimate_calls(ir.calls, chip)
    if not compile:
        return [est], None
    from .bench.estimate import CompilerEstimator
    from .cost_model.compiler import libtpu_available
    from .search.tiers import Tiers

    if not libtpu_available():
        raise EnvironmentProblem("--compile needs libtpu, which is not installed", hint="pip install 'pallasopt[tpu]'")
    tier = Tiers(chip).compiler(ir)
    out: dict[str, Any] = {}
    if tier is not None:
        rep = dict(tier.data.get("report", {}))
        out["kernel"] = {
            **rep,
            "dims": tier.data.get("dims"),
            "steps_scale": tier.data.get("steps_scale"),
            "time_s": tier.time_s,
            "message": tier.message,
        }
    ref = CompilerEstimator(chip, None, timeout_s=300)(ir, "reference")
    out["reference (XLA)"] = {
        "ok": ref.error is None and ref.time_s is not None,
        "target": chip.name,
        "error": ref.error,
        "time_s": ref.time_s,
        "method": ref.method,
    }
    return [est], out
