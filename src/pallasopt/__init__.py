"""pallasopt: make Pallas kernels fast, automatically and verifiably.

Public API: `optimize()`, its `SearchConfig` and `Result`, `KernelIR` (`load()`), `estimate()`, `check()`, the pass registry
(`PASSES`, `parse_pipeline`) and `apply_pipeline()`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "PASSES",
    "KernelIR",
    "Result",
    "SearchConfig",
    "__version__",
    "apply_pipeline",
    "check",
    "estimate",
    "load",
    "optimize",
    "parse_pipeline",
]

if TYPE_CHECKING:
    from .config import SearchConfig
    from .harness.check import check
    from .ir.kernel_ir import KernelIR
    from .optimize import Result, optimize
    from .passes.pipeline import apply_pipeline
    from .passes.registry import PASSES, parse_pipeline


def load(path: str) -> Any:
    """Load and trace a kernel module file into a `KernelIR`."""
    from .ir.kernel_ir import KernelIR

    return KernelIR.from_file(path)


def estimate(ir: Any, target: str = "v5e") -> Any:
    """The roofline estimate of a `KernelIR` on `target` (see `cost_model.roofline.Estimate`)."""
    from .cost_model.hardware import get_chip
    from .cost_model.roofline import estimate_calls

    return estimate_calls(ir.calls, get_chip(target))


def __getattr__(name: str) -> Any:  # lazy: importing pallasopt stays cheap (no JAX until needed)
    if name in ("optimize", "Result"):
        from . import optimize as mod

        return getattr(mod, name)
    if name == "SearchConfig":
        from .config import SearchConfig

        return SearchConfig
    if name == "KernelIR":
        from .ir.kernel_ir import KernelIR

        return KernelIR
    if name == "check":
        from .harness.check import check

        return check
    if name in ("PASSES", "parse_pipeline"):
        from .passes import registry

        return getattr(registry, name)
    if name == "apply_pipeline":
        from .passes.pipeline import apply_pipeline

        return apply_pipeline
    raise AttributeError(name)
