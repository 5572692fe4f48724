"""dma-overlap: a copy from HBM that is started and waited on at once becomes a double-buffered prefetch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..cost_model.hardware import Chip
from ..errors import check
from ..ir.dma_ring import apply_ring
from ..ir.facts import CallFacts
from ..ir.kernel_ir import KernelIR
from .base import Pass


def applicable(call: CallFacts) -> bool:
    moving = [a for a, g in enumerate(call.grid) if g > 1]
    sem = call.dimension_semantics or ()
    return (
        call.body.has_dma
        and len(moving) == 1
        and not (len(sem) > moving[0] and sem[moving[0]] in ("parallel", "core_parallel"))
    )


@dataclass(frozen=True)
class DmaOverlapPass(Pass):
    """Turn `copy = make_async_copy(hbm.at[...step...], buf, sem); copy.start(); copy.wait()` into a two-slot
    prefetch: step i waits on the copy started at step i-1 and starts the copy for step i+1, so the HBM transfer
    overlaps the compute. The VMEM buffer and semaphore get a leading dimension of 2.

    Helps kernels that copy by hand from `memory_space=pl.ANY` inputs and serialize each transfer with the compute.
    Needs a single sequential grid axis (the prefetch chain runs across steps) and the source index written in
    terms of `pl.program_id`. Checked with the TPU interpreter's race detector. Parameter: `call`. The depth-k,
    multi-axis form is `multi-buffer` (both are `ir/dma_ring.py`).
    """

    name: ClassVar[str] = "dma-overlap"
    call: int = 0

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        return tuple(cls(call=c.index) for c in ir.calls if applicable(c))

    def apply(self, ir: KernelIR) -> KernelIR:
        check(0 <= self.call < len(ir.calls), f"no pallas_call #{self.call}")
        facts = ir.calls[self.call]
        check(facts.body.has_dma, "the kernel does no manual DMA")
        check(applicable(facts), "needs exactly one grid axis with more than one step, not marked parallel")
        return ir.with_module(apply_ring(ir.module, facts, 2, "axis"), self.spec())
