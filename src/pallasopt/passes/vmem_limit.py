"""vmem-limit: raise the scoped VMEM limit so bigger blocks fit (the chip has far more VMEM than the default)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import libcst as cst

from ..cost_model.hardware import Chip
from ..cost_model.roofline import vmem_footprint
from ..errors import check
from ..ir.cst_edit import set_compiler_param
from ..ir.facts import CallFacts
from ..ir.kernel_ir import KernelIR
from .base import Pass

STEPS_MIB = (32, 64, 96)


def smallest_step(need: int, limit: int, chip: Chip) -> int | None:
    """The smallest of `STEPS_MIB` above the call's scoped `limit` that holds `need` bytes of blocks with 10% to
    spare, on a chip with that much VMEM (None: none does)."""
    fits = [m for m in STEPS_MIB if m * 2**20 > limit and need <= m * 2**20 * 0.9 <= chip.vmem_bytes * 0.9]
    return fits[0] if fits else None


def needed_step(call: CallFacts, chip: Chip) -> int | None:
    """For a pass that makes a call's blocks grow and sets the limit in the same move (a step that does not compile
    is no step for a search to build on): 0 when the call's blocks fit the scoped VMEM it runs under with 10% to
    spare (or on a GPU), else `smallest_step` for them (None: no limit the chip allows holds them)."""
    limit = call.vmem_limit_bytes or chip.default_scoped_vmem_bytes
    need = vmem_footprint(call, chip)
    if chip.is_gpu or need <= limit * 0.9:
        return 0
    return smallest_step(need, limit, chip)


@dataclass(frozen=True)
class VmemLimitPass(Pass):
    """Set `vmem_limit_bytes` of one pallas_call to `mib` MiB.

    Helps when the blocks' footprint (buffers x block bytes + scratch) exceeds the default scoped limit (16 MiB on
    v5e, 32 MiB on v6e) but fits the chip's VMEM: the compiler otherwise rejects the kernel, and the tile pass only
    offers blocks that fit the current limit. Parameters: `call`, `mib` (the new limit in MiB).
    """

    name: ClassVar[str] = "vmem-limit"
    call: int = 0
    mib: int = 64

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        if chip.is_gpu:
            return ()
        out: list[Pass] = []
        for c in ir.calls:
            current = c.vmem_limit_bytes or chip.default_scoped_vmem_bytes
            need = vmem_footprint(c, chip)
            for mib in STEPS_MIB:
                limit = mib * 2**20
                if limit > current and limit <= chip.vmem_bytes * 0.9 and (need > current * 0.5 or mib == STEPS_MIB[0]):
                    out.append(cls(call=c.index, mib=mib))
        return tuple(out)

    def apply(self, ir: KernelIR) -> KernelIR:
        check(0 <= self.call < len(ir.calls), f"no pallas_call #{self.call}")
        check(self.mib > 0, "mib must be positive")
        facts = ir.calls[self.call]
        check(facts.vmem_limit_bytes != self.mib * 2**20, f"vmem_limit_bytes is already {self.mib} MiB")
        value = cst.parse_expression(f"{self.mib} * 1024 * 1024")
        return ir.with_module(set_compiler_param(ir.module, facts, "vmem_limit_bytes", value), self.spec())
