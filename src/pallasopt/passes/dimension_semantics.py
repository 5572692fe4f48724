"""dimension-semantics: mark grid axes "parallel" where no output block is revisited and no state is carried."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..cost_model.hardware import Chip
from ..errors import check
from ..ir.cst_edit import edit_call_params, semantics_edit
from ..ir.facts import CallFacts
from ..ir.kernel_ir import KernelIR
from .base import Pass


def infer_semantics(call: CallFacts) -> tuple[str, ...]:
    """An axis is "parallel" when every output block follows it (each step writes its own blocks) and the kernel
    carries no state along it (no `pl.when(program_id(axis) == ...)` init/finalize); else "arbitrary"."""
    out = []
    for axis in range(len(call.grid)):
        writes_own = all(axis in o.index_map.axes for o in call.outputs)
        carried = axis in call.body.conditional_axes
        manual = call.body.has_dma or call.body.has_semaphore  # cross-step prefetch chains are sequential
        out.append("parallel" if writes_own and not carried and not manual else "arbitrary")
    return tuple(out)


@dataclass(frozen=True)
class DimensionSemanticsPass(Pass):
    """Set `dimension_semantics` from the traced index maps: "parallel" axes split across the 2 TensorCores of
    megacore chips (v4, v5p) and tell the compiler steps are independent; reductions stay "arbitrary".

    Parameter: `call` (which pallas_call). Declines when the semantics are already what the facts imply, or when an
    axis the user marked "parallel" would be unsafe (it says so rather than changing it silently). A search offers it
    only for chips with two TensorCores (v4, v5p, v7x): on one TensorCore (v5e, v6e) and on GPUs the semantics
    change nothing the tiers can see (libtpu's schedule for v5e comes out equal to the parent's), so its children
    would cost compiles and gain nothing; `apply -p dimension-semantics` still applies it on any target.
    """

    name: ClassVar[str] = "dimension-semantics"
    call: int = 0

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        if chip.is_gpu or chip.tensorcores_per_chip < 2:
            return ()
        return tuple(
            cls(call=c.index) for c in ir.calls if (c.dimension_semantics or ()) != infer_semantics(c) and c.grid
        )

    def apply(self, ir: KernelIR) -> KernelIR:
        check(0 <= self.call < len(ir.calls), f"no pallas_call #{self.call}")
        facts = ir.calls[self.call]
        check(facts.grid, "the call has no grid")
        wanted = infer_semantics(facts)
        current = facts.dimension_semantics
        check(current != wanted, "the dimension semantics are already what the index maps imply")
        if current is not None:
            unsafe = [
                a for a, (c, w) in enumerate(zip(current, wanted, strict=False)) if c == "parallel" and w != "parallel"
            ]
            check(not unsafe, f"axes {unsafe} are marked parallel but revisit outputs or carry state; fix by hand")
        module = edit_call_params(
            ir.module, facts, lambda loc, node: semantics_edit(loc, node, facts, lambda _: wanted)
        )
        return ir.with_module(module, self.spec())
