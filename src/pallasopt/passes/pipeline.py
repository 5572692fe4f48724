"""Running a pass pipeline with the xDSL-style callback between passes (print / diff / time / check)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import PassNotApplicable
from ..ir.kernel_ir import KernelIR
from .base import Pass


@dataclass(frozen=True)
class StepRecord:
    """What one pass did in a pipeline run."""

    spec: str
    applied: bool
    reason: str
    seconds: float
    before: KernelIR
    after: KernelIR


Callback = Callable[[StepRecord], None]


def apply_pipeline(
    ir: KernelIR, passes: Sequence[Pass], callback: Callback | None = None
) -> tuple[KernelIR, tuple[StepRecord, ...]]:
    """Apply passes in order. A pass that declines leaves the IR unchanged and is recorded with its reason."""
    records = []
    for p in passes:
        start = time.perf_counter()
        try:
            new = p.rewrite(ir)  # a rewrite that changes the problem declines (ProblemChanged)
            rec = StepRecord(p.spec(), True, "", time.perf_counter() - start, ir, new)
        except PassNotApplicable as e:
            new = ir
            rec = StepRecord(p.spec(), False, e.reason, time.perf_counter() - start, ir, ir)
        records.append(rec)
        if callback is not None:
            callback(rec)
        ir = new
    return ir, tuple(records)


def unified_diff(before: str, after: str, path: str) -> str:
    import difflib

    return "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{path}", f"b/{path}"))
