"""single-buffer: `pipeline_mode=pl.Buffered(1)` for blocks whose index never changes (fetched once)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import libcst as cst

from ..cost_model.hardware import Chip
from ..errors import check
from ..ir.cst_edit import replace_node, set_keyword
from ..ir.facts import CallFacts
from ..ir.kernel_ir import KernelIR
from ..ir.matchers import Located, find_call_node, pl_alias, spec_nodes
from .base import Pass


def constant_operands(call: CallFacts) -> tuple[int, ...]:
    """Pipelined operands whose block index is the same on every grid step (e.g. a weight or bias vector)."""
    return tuple(
        i
        for i, o in enumerate(call.operands)
        if o.is_pipelined
        and o.role == "in"
        and not o.index_map.axes
        and not o.index_map.data_dependent
        and (o.buffer_count or 2) > 1
        and call.steps > 1
    )


@dataclass(frozen=True)
class SingleBufferPass(Pass):
    """Give an input whose block never moves a single VMEM buffer (`pl.Buffered(1)`).

    The default double buffer is wasted on a block fetched once (weights, norms' scale vectors, a whole K/V kept
    resident): single buffering halves its VMEM, leaving room for bigger tiles elsewhere. Parameters: `call`,
    `operand` (input index in the pallas_call's operand order). Declines for a BlockSpec object shared with operands
    whose blocks do move.
    """

    name: ClassVar[str] = "single-buffer"
    call: int = 0
    operand: int = 0

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        return tuple(cls(call=c.index, operand=i) for c in ir.calls for i in constant_operands(c))

    def apply(self, ir: KernelIR) -> KernelIR:
        check(0 <= self.call < len(ir.calls), f"no pallas_call #{self.call}")
        facts = ir.calls[self.call]
        check(
            self.operand in constant_operands(facts),
            f"operand {self.operand}'s block moves or is already single-buffered",
        )
        loc = Located.of(ir.module)
        node = find_call_node(loc, facts)
        specs = spec_nodes(loc, node)
        offset = facts.num_scalar_prefetch if len(specs) == len(facts.operands) - facts.num_scalar_prefetch else 0
        idx = self.operand - offset
        check(0 <= idx < len(specs) and isinstance(specs[idx], cst.Call), "cannot find this operand's BlockSpec(...)")
        spec = specs[idx]
        assert isinstance(spec, cst.Call)
        sharing = [i + offset for i, s in enumerate(specs) if s is spec]
        check(
            all(i in constant_operands(facts) for i in sharing),
            "the BlockSpec is shared with operands whose blocks move",
        )
        value = cst.parse_expression(f"{pl_alias(ir.module)}.Buffered(1)")
        module = replace_node(loc.wrapper.module, spec, set_keyword(spec, "pipeline_mode", value))
        return ir.with_module(module, self.spec())
