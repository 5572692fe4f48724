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
    from .cost_model.compiler import compile_module, libtpu_available
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
    ref = compile_module(ir.source, ir.path, "reference", dict(ir.dims), chip.name, timeout_s=300)
    out["reference (XLA)"] = {
        "ok": ref.ok,
        "target": chip.name,
        "error": ref.error,
        "estimated_s": ref.estimated_s,
        "dims": dict(ir.dims),
        "steps_scale": 1.0,
        "time_s": ref.estimated_s,
    }
    return [est], out
