"""cost-estimate: attach `pl.CostEstimate` from the model so XLA schedules around the custom call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import libcst as cst

from ..cost_model.hardware import Chip, get_chip
from ..cost_model.roofline import estimate_call
from ..errors import check
from ..ir.cst_edit import replace_node, set_keyword
from ..ir.kernel_ir import KernelIR
from ..ir.matchers import Located, find_call_node, keyword, pl_alias
from .base import Pass


@dataclass(frozen=True)
class CostEstimatePass(Pass):
    """Attach `cost_estimate=pl.CostEstimate(flops=..., transcendentals=..., bytes_accessed=...)` to a pallas_call.

    XLA treats a Pallas call as opaque; with an estimate it can overlap neighbouring ops and collectives with it.
    The figures come from the traced facts at the module's default dims (flops from the kernel's matmuls,
    transcendentals from the EUP ops, bytes from the pipeline's real fetch pattern), so they describe that size.
    It does not change the kernel itself, so the search never ranks it; apply it with `pallasopt apply`.
    Parameter: `call`.
    """

    name: ClassVar[str] = "cost-estimate"
    in_search: ClassVar[bool] = False
    call: int = 0

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        return tuple(cls(call=c.index) for c in ir.calls if not c.has_cost_estimate)

    def apply(self, ir: KernelIR) -> KernelIR:
        check(0 <= self.call < len(ir.calls), f"no pallas_call #{self.call}")
        facts = ir.calls[self.call]
        check(not facts.has_cost_estimate, "the call already has a cost_estimate")
        loc = Located.of(ir.module)
        node = find_call_node(loc, facts)
        check(keyword(node, "cost_estimate") is None, "the call already passes cost_estimate=")
        est = estimate_call(facts, get_chip("v5e"))  # bytes follow the fetch pattern, which is chip-independent
        flops = facts.flops + facts.body.vpu_elems * facts.steps
        text = (
            f"{pl_alias(ir.module)}.CostEstimate(flops={flops}, "
            f"transcendentals={facts.body.transcendental_elems * facts.steps}, bytes_accessed={est.bytes})"
        )
        new = replace_node(loc.wrapper.module, node, set_keyword(node, "cost_estimate", cst.parse_expression(text)))
        return ir.with_module(new, self.spec())
