"""multi-buffer: manual HBM copies (a page, an expert's rows, a group's block) fetched k - 1 steps ahead of use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..cost_model.hardware import Chip
from ..errors import check
from ..ir.dma_ring import SCOPES, apply_ring
from ..ir.facts import CallFacts
from ..ir.kernel_ir import KernelIR
from .base import Pass

DEPTHS = (2, 3, 4)


def scopes(call: CallFacts) -> tuple[str, ...]:
    """The ring scopes the grid allows: `axis` when its innermost moving axis is sequential, `grid` too when every
    moving axis is and there are several."""
    if not (call.body.has_dma and call.body.dma_serialized):
        return ()
    sem = call.dimension_semantics or ()
    moving = [a for a, g in enumerate(call.grid) if g > 1]
    seq = [a for a in moving if not (len(sem) > a and sem[a] in ("parallel", "core_parallel"))]
    if not moving or moving[-1] not in seq:
        return ()
    return ("axis", "grid") if len(moving) > 1 and seq == moving else ("axis",)


@dataclass(frozen=True)
class MultiBufferPass(Pass):
    """Serve manual HBM copies that are started and waited on at once (`c = make_async_copy(src_hbm.at[idx], buf,
    sem); c.start(); c.wait()`, one or several, `idx` from `pl.program_id` and scalar-prefetch tables such as a page
    table) from a ring of `depth` VMEM slots: step t waits on its slot and starts the copy of step t + depth - 1,
    whose index is recomputed for that step; the first step fills depth - 1 slots. Buffer and semaphore scratch get
    a leading dimension of `depth`.

    Helps gathers of small blocks (paged KV caches, expert rows, ragged groups) whose per-copy latency a single
    prefetch cannot hide. `scope=axis` restarts the ring on each row of the innermost moving axis (outer axes may be
    parallel); `scope=grid` runs it over the whole grid, so the next row's first copies are in flight before the
    current row ends (all moving axes sequential). Declines when the index reads a ref other than a scalar-prefetch
    table or an HBM input, or the copies are not a plain start-then-wait block. Checked with the TPU interpreter's
    race detector. Parameters: `call`, `depth` (2..4), `scope` (axis, grid).
    """

    name: ClassVar[str] = "multi-buffer"
    call: int = 0
    depth: int = 3
    scope: str = "axis"

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        return tuple(cls(call=c.index, depth=d, scope=s) for c in ir.calls for s in scopes(c) for d in DEPTHS)

    def apply(self, ir: KernelIR) -> KernelIR:
        check(0 <= self.call < len(ir.calls), f"no pallas_call #{self.call}")
        check(self.depth in DEPTHS, f"depth must be one of {DEPTHS}")
        check(self.scope in SCOPES, f"scope must be one of {', '.join(SCOPES)}")
        facts = ir.calls[self.call]
        return ir.with_module(apply_ring(ir.module, facts, self.depth, self.scope), self.spec())
