"""smem-partials: an output written one element per grid step is held whole in SMEM, each step storing its element."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import libcst as cst
import libcst.matchers as m

from ..cost_model.hardware import Chip
from ..errors import check
from ..ir.cst_edit import replace_many
from ..ir.facts import CallFacts
from ..ir.fusion import unit_row
from ..ir.kernel_ir import KernelIR
from ..ir.matchers import (
    Located,
    code,
    find_call_node,
    jnp_alias,
    own_kernel,
    pl_alias,
    pltpu_alias,
    spec_nodes,
)
from .base import Pass

# At most this much of the scalar memory for one output (SMEM is 1 MiB per TensorCore on v4 and later, jax's
# `smem_capacity_bytes`; scalar-prefetch tables and Mosaic's own use share it).
MAX_BYTES = 64 * 1024
WORD_DTYPES = ("float32", "int32", "uint32")  # SMEM holds 32-bit words


def partial_outputs(call: CallFacts) -> tuple[int, ...] | str:
    """Operand indices of the outputs this pass can move (else why none can): one element per grid step, the block
    index the grid indices themselves, 32-bit, small enough for SMEM, steps in order on one core."""
    if call.library_site is not None or call.num_scalar_prefetch or call.body.has_dma:
        return "a library kernel, scalar prefetch or manual DMA"
    if call.dimension_semantics and "parallel" in call.dimension_semantics:
        return "a parallel grid axis (megacore cores would each write back the whole SMEM output)"
    out = []
    aliased = {o for _i, o in call.input_output_aliases}
    for k, o in enumerate(call.operands):
        if o.role != "out" or not o.is_pipelined or o.position in aliased or o.index_map.affine is None:
            continue
        if any(b != 1 for b in o.block_shape) or o.dtype not in WORD_DTYPES or o.array_bytes > MAX_BYTES:
            continue
        axes = [unit_row(row) for row in o.index_map.affine]
        if any(not isinstance(a, int) or isinstance(a, bool) for a in axes) or len(set(axes)) != len(axes):
            continue
        if any(o.shape[d] != call.grid[a] for d, a in enumerate(axes)):  # type: ignore[index]
            continue
        out.append(k)
    return tuple(out) or "no output is written one element per grid step at the step's own index"


@dataclass(frozen=True)
class SmemPartialsPass(Pass):
    """Hold an output written one element per grid step whole in SMEM, each step storing its element.

    LLM-written reductions often give each grid step a (1, 1) output block for its partial sum (a loss summed per
    tile, a per-row max), finished by the wrapper. Such a block breaks TPU's block rule (the last two block dims
    must be multiples of (8, 128) or whole), so the kernel does not compile; in SMEM a (1, 1) block breaks it too. The
    output's BlockSpec becomes `pl.BlockSpec(memory_space=pltpu.SMEM)` (the whole array, resident, written back
    once), and each store into it, `o_ref[...] = v` (v a one-element array) or `o_ref[0, 0] = s`, stores the scalar
    at the step's element: `o_ref[pl.program_id(a), pl.program_id(b)] = jnp.reshape(v, ())`. Declines an output
    read in the body or used other than stored into, a block index other than the grid indices (stride 1, one axis
    per dim, the array exactly one element per step), a dtype SMEM does not hold as a word (32-bit only), more than
    MAX_BYTES, a parallel grid axis, aliasing, scalar prefetch or manual DMA.
    """

    name: ClassVar[str] = "smem-partials"
    call: int = 0
    output: int = 0  # the operand index (inputs first, then outputs)

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        if chip.is_gpu:
            return ()
        out: list[Pass] = []
        for c in ir.calls:
            ks = partial_outputs(c)
            if not isinstance(ks, str):
                out.extend(cls(call=c.index, output=k) for k in ks)
        return tuple(out)

    def apply(self, ir: KernelIR) -> KernelIR:
        check(0 <= self.call < len(ir.calls), f"no pallas_call #{self.call}")
        facts = ir.calls[self.call]
        ks = partial_outputs(facts)
        check(not isinstance(ks, str), str(ks))
        check(self.output in ks, f"operand {self.output} is not an output written one element per grid step")
        o = facts.operands[self.output]
        assert o.index_map.affine is not None
        axes = [unit_row(row) for row in o.index_map.affine]
        loc = Located.of(ir.module)
        module = loc.wrapper.module
        tpu, jnp, pl = pltpu_alias(module), jnp_alias(module), pl_alias(module)
        check(tpu is not None and jnp is not None, "the module does not import jax.experimental.pallas.tpu and jax")
        node = find_call_node(loc, facts)
        specs = spec_nodes(loc, node)
        check(len(specs) == len(facts.operands), "cannot read every BlockSpec")
        spec = specs[self.output]
        check(isinstance(spec, cst.Call), "the output's BlockSpec is not written as a call")
        assert isinstance(spec, cst.Call) and jnp is not None
        check(sum(s is spec for s in specs) == 1, "the output's BlockSpec is shared with another operand")
        kernel, refs = own_kernel(loc, ir.calls, facts, node)
        ref = refs[self.output]
        index = ", ".join(f"{pl}.program_id({a})" for a in axes)
        edits: dict[cst.CSTNode, cst.CSTNode] = {
            spec: cst.parse_expression(f"{pl}.BlockSpec(memory_space={tpu}.SMEM)"),
            **_store_edits(kernel, ref, len(o.shape), index, jnp),
        }
        new = ir.with_module(replace_many(module, edits), self.spec())
        got = new.calls[self.call].operands[self.output]
        check(got.memory_space == "smem" and got.block_shape == o.shape, f"the output traced to {got.memory_space}")
        return new


def _store_edits(kernel: cst.FunctionDef, ref: str, rank: int, index: str, jnp: str) -> dict[cst.CSTNode, cst.CSTNode]:
    """Each store into `ref` rewritten to the step's element; declines any other use of `ref`."""
    edits: dict[cst.CSTNode, cst.CSTNode] = {}
    stores = [
        a
        for a in m.findall(kernel.body, m.Assign(targets=[m.AssignTarget(target=m.Subscript(value=m.Name(ref)))]))
        if isinstance(a, cst.Assign)
    ]
    check(stores, f"the body never stores into {ref}")
    for a in stores:
        target = a.targets[0].target
        assert isinstance(target, cst.Subscript)
        elems = [e.slice for e in target.slice]
        whole = len(elems) == 1 and isinstance(elems[0], cst.Index) and isinstance(elems[0].value, cst.Ellipsis)
        zeros = len(elems) == rank and all(
            isinstance(e, cst.Index) and isinstance(e.value, cst.Integer) and e.value.value == "0" for e in elems
        )
        check(whole or zeros, f"{code(target)} stores other than the whole block or its element 0")
        value = f"{jnp}.reshape({code(a.value)}, ())" if whole else code(a.value)
        edits[a] = a.with_changes(
            targets=[a.targets[0].with_changes(target=cst.parse_expression(f"{ref}[{index}]"))],
            value=cst.parse_expression(value),
        )
    uses = m.findall(kernel.body, m.Name(ref))
    check(len(uses) == len(stores), f"the body uses {ref} other than storing into it (read, passed on, .shape)")
    return edits
