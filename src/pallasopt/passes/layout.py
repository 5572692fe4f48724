"""layout: change how an operand sits in HBM and VMEM, wrapper and kernel body together (pre-transposed operands)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import libcst as cst
import libcst.matchers as m

from ..cost_model.hardware import Chip
from ..errors import KernelError, PassNotApplicable, check
from ..ir.builders import affine_results, index_map_expr
from ..ir.cst_edit import replace_many
from ..ir.facts import CallFacts
from ..ir.kernel_ir import KernelIR
from ..ir.matchers import (
    Located,
    blockspec_parts,
    call_site,
    code,
    find_call_node,
    is_blockspec,
    kernel_function,
    kernel_refs,
    spec_nodes,
)
from .base import Pass


def transposed_uses(kernel: cst.FunctionDef, ref: str) -> tuple[list[cst.Attribute], int]:
    """The `ref[...].T` reads of `ref` in the kernel body, and how many uses of `ref` there are in all."""
    uses = [n for n in m.findall(kernel.body, m.Name(ref))]
    reads = [
        a
        for a in m.findall(kernel.body, m.Attribute(value=m.Subscript(value=m.Name(ref)), attr=m.Name("T")))
        if isinstance(a, cst.Attribute) and code(a.value).replace(" ", "") == f"{ref}[...]"
    ]
    return reads, len(uses)


def _candidates(call: CallFacts) -> list[int]:
    """2-D blocked inputs with an affine index map (the ones this pass can re-lay out)."""
    return [
        i
        for i, o in enumerate(call.inputs)
        if o.is_pipelined and len(o.block_shape) == 2 and None not in o.block_shape and o.index_map.affine is not None
    ]


@dataclass(frozen=True)
class LayoutPass(Pass):
    """Pre-transpose an input: a kernel that reads a block only as `x_ref[...].T` gets the operand transposed once
    in the wrapper (`x.T`), its BlockSpec's block shape and index map swapped, and the `.T` dropped from the body.

    Helps when the kernel transposes the same block in many grid steps (a K or weight block re-fetched for every
    output tile): the in-kernel transposes (XLU work every step) become one XLA transpose, which the cost model
    charges as HBM traffic (cost_model/wrapper.py), so the search sees the trade. Offered only where the block is
    transposed more than once in all (grid steps x block > the array). Parameters: `call`, `operand` (input index). Declines when the body uses the ref in any
    other way, or the BlockSpec is shared with another operand.
    """

    name: ClassVar[str] = "layout"
    call: int = 0
    operand: int = 0

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        out: list[Pass] = []
        for c in ir.calls:
            if c.library_site is not None or c.num_scalar_prefetch:
                continue
            try:
                loc = Located.of(ir.module)
                kernel = kernel_function(loc, find_call_node(loc, c))
            except Exception:
                continue
            refs = kernel_refs(kernel) if kernel is not None else None
            if kernel is None or refs is None or len(refs) < len(c.inputs):
                continue
            for i in _candidates(c):
                reads, uses = transposed_uses(kernel, refs[i])
                # The body transposes the block every grid step: more elements than the whole array?
                redone = c.steps * c.inputs[i].block_elems > math.prod(c.inputs[i].shape)
                if reads and len(reads) == uses and redone:
                    out.append(cls(call=c.index, operand=i))
        return tuple(out)

    def apply(self, ir: KernelIR) -> KernelIR:
        check(0 <= self.call < len(ir.calls), f"no pallas_call #{self.call}")
        facts = ir.calls[self.call]
        check(facts.num_scalar_prefetch == 0, "the call uses scalar prefetch")
        check(self.operand in _candidates(facts), f"input {self.operand} is not a 2-D blocked input with affine map")
        op = facts.inputs[self.operand]
        assert op.index_map.affine is not None
        loc = Located.of(ir.module)
        node = find_call_node(loc, facts)
        kernel = kernel_function(loc, node)
        check(kernel is not None, "cannot find the kernel function")
        assert kernel is not None
        refs = kernel_refs(kernel)
        check(refs is not None and len(refs) >= len(facts.inputs), "the kernel's parameters do not match its refs")
        assert refs is not None
        ref = refs[self.operand]
        reads, uses = transposed_uses(kernel, ref)
        check(bool(reads) and len(reads) == uses, f"the kernel uses {ref} other than as {ref}[...].T")
        specs = spec_nodes(loc, node)
        check(len(specs) == len(facts.operands), "cannot read every BlockSpec")
        spec = specs[self.operand]
        check(is_blockspec(spec), f"input {self.operand}'s spec is not a BlockSpec(...)")
        check(sum(s is spec for s in specs) == 1, "the BlockSpec is shared with another operand")
        assert isinstance(spec, cst.Call)
        site = call_site(loc, node)
        check(site is not None, "the pallas_call is not applied to positional operands in place")
        assert site is not None
        edits: dict[cst.CSTNode, cst.CSTNode] = {r: r.value for r in reads}  # `x_ref[...].T` -> `x_ref[...]`
        edits[spec] = _swapped_spec(spec, op.index_map.affine, len(facts.grid))
        operand = site.operands[self.operand]
        simple = isinstance(operand, cst.Name | cst.Attribute | cst.Call | cst.Subscript)
        edits[operand] = cst.parse_expression(f"{code(operand)}.T" if simple else f"({code(operand)}).T")
        try:
            new = ir.with_module(replace_many(loc.wrapper.module, edits), self.spec())
        except KernelError as e:
            raise PassNotApplicable(f"the rewritten module does not trace: {e.message}") from None
        got = new.calls[self.call].inputs[self.operand]
        check(
            got.shape == op.shape[::-1] and got.block_shape == op.block_shape[::-1],
            f"the rewrite traced to shape {got.shape}, block {got.block_shape}",
        )
        return new


def _swapped_spec(spec: cst.Call, affine: tuple[tuple[int, ...], ...], n_grid: int) -> cst.Call:
    """The BlockSpec of the transposed operand: block dims and index-map results in the other order."""
    shape, _ = blockspec_parts(spec)
    check(isinstance(shape, cst.Tuple | cst.List) and len(shape.elements) == 2, "the block shape is not a 2-tuple")
    assert isinstance(shape, cst.Tuple | cst.List)
    a, b = (code(e.value) for e in shape.elements)
    _, imap = blockspec_parts(spec)
    params = [p.name.value for p in imap.params.params] if isinstance(imap, cst.Lambda) else []
    names = params if len(params) == n_grid else [f"g{i}" for i in range(n_grid)]
    results = affine_results(affine, names, {i: i for i in range(n_grid)})[::-1]
    rest = [x for x in spec.args if x.keyword is not None and x.keyword.value not in ("block_shape", "index_map")]
    new_shape = cst.parse_expression(f"({b}, {a})")
    return spec.with_changes(args=[cst.Arg(new_shape), cst.Arg(index_map_expr(names, results)), *rest])
