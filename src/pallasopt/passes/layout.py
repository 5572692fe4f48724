"""layout: change how an operand sits in HBM and VMEM, wrapper and kernel body together (pre-transposed operands)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import libcst as cst
import libcst.matchers as m

from ..cost_model.hardware import Chip
from ..errors import KernelError, PassNotApplicable, check
from ..ir.builders import operand_text, swapped_blockspec
from ..ir.cst_edit import replace_many
from ..ir.facts import CallFacts
from ..ir.kernel_ir import KernelIR
from ..ir.matchers import (
    Located,
    bound_in_nested,
    call_kernel,
    call_site,
    code,
    find_call_node,
    kernel_function,
    kernel_refs,
    keyword,
    resolve_local,
    spec_site,
)
from .base import Pass

NT = "(((1,), (1,)), ((), ()))"  # dot_general dimension numbers of a @ b.T
NN = "(((1,), (0,)), ((), ()))"  # ... and of a @ b


def _is_nt(loc: Located, at: cst.CSTNode, dims: cst.BaseExpression | None) -> bool:
    """`dims` is the literal NT dimension numbers, or a name last assigned them (in the kernel or the module)."""
    seen = 0
    while isinstance(dims, cst.Name) and seen < 3:
        found = resolve_local(loc, at, dims.value)
        if found is None:
            assigned = [
                a.value
                for a in m.findall(loc.wrapper.module, m.Assign(targets=[m.AssignTarget(target=m.Name(dims.value))]))
                if isinstance(a, cst.Assign)
            ]
            found = assigned[0] if len(assigned) == 1 else None
        dims, seen = found, seen + 1
    return dims is not None and code(dims).replace(" ", "") == NT.replace(" ", "")


def _nt_rhs(loc: Located, node: cst.BaseExpression) -> cst.BaseExpression | None:
    """The dimension-numbers argument of the NT `dot_general` whose right operand is `node` (else None)."""
    arg = loc.parent(node)
    call = loc.parent(arg) if isinstance(arg, cst.Arg) else None
    if not isinstance(call, cst.Call) or not code(call.func).endswith("dot_general"):
        return None
    positional = [a for a in call.args if a.keyword is None]
    if len(positional) < 2 or positional[1] is not arg:
        return None
    dims = positional[2].value if len(positional) > 2 else None
    kw = keyword(call, "dimension_numbers")
    dims = kw.value if kw is not None else dims
    return dims if dims is not None and _is_nt(loc, call, dims) else None


def _transposed_use(loc: Located, node: cst.BaseExpression, edits: dict[cst.CSTNode, cst.CSTNode]) -> bool:
    """Record the edit that reads `node` (a block value) untransposed: `v.T` -> `v`, an NT dot_general -> NN."""
    parent = loc.parent(node)
    if isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value == "T":
        edits[parent] = node
        return True
    dims = _nt_rhs(loc, node)
    if dims is not None:
        edits[dims] = cst.parse_expression(NN)
        return True
    return False


def transposed_uses(loc: Located, kernel: cst.FunctionDef, ref: str) -> dict[cst.CSTNode, cst.CSTNode] | None:
    """The body edits that make the kernel read `ref`'s block pre-transposed, when every use of `ref` is a
    transposed read: `ref[...].T`, `ref[...]` as the right operand of an NT `dot_general`, or `k = ref[...]` whose
    every use is `k.T` or such an operand (None otherwise)."""
    uses = list(m.findall(kernel.body, m.Name(ref)))
    edits: dict[cst.CSTNode, cst.CSTNode] = {}
    for use in uses:
        read = loc.parent(use)
        if not (isinstance(read, cst.Subscript) and code(read).replace(" ", "") == f"{ref}[...]"):
            return None
        if _transposed_use(loc, read, edits):
            continue
        assign = loc.parent(read)
        if not (
            isinstance(assign, cst.Assign)
            and len(assign.targets) == 1
            and isinstance(assign.targets[0].target, cst.Name)
        ):
            return None
        local = assign.targets[0].target.value
        targets = [t for t in m.findall(kernel.body, m.AssignTarget(target=m.Name(local)))]
        reads = [n for n in m.findall(kernel.body, m.Name(local)) if n is not assign.targets[0].target]
        if len(targets) != 1 or bound_in_nested(kernel, local) or not reads:
            return None
        if not all(isinstance(r, cst.Name) and _transposed_use(loc, r, edits) for r in reads):
            return None
    return edits if uses else None


def _candidates(call: CallFacts) -> list[int]:
    """Blocked inputs whose kernel block is 2-D (leading block dims squeezed) with an affine index map."""
    return [
        i
        for i, o in enumerate(call.inputs)
        if o.is_pipelined
        and len(o.block_shape) >= 2
        and None not in o.block_shape[-2:]
        and all(b is None for b in o.block_shape[:-2])
        and o.index_map.affine is not None
    ]


def _swap(xs: tuple) -> tuple:  # type: ignore[type-arg]
    return (*xs[:-2], xs[-1], xs[-2])


@dataclass(frozen=True)
class LayoutPass(Pass):
    """Pre-transpose an input: a kernel that reads a block only transposed (`x_ref[...].T`, `x_ref[...]` as the
    right operand of an NT `lax.dot_general` (contracting its minor dim), or a local `k = k_ref[...]` used only as
    `k.T` or such an operand) gets the operand's last two dims swapped once in the wrapper (`x.T`,
    `x.swapaxes(-1, -2)`), its BlockSpec's last two block dims and index-map results swapped, and the body reading
    the block as it now is (`.T` dropped, NT dimension numbers made NN).

    Helps when the kernel transposes the same block in many grid steps (a K or weight block re-fetched for every
    output tile): the in-kernel transposes (XLU work every step) become one XLA transpose, which the cost model
    charges as HBM traffic (cost_model/wrapper.py), so the search sees the trade. Offered only where the block is
    transposed more than once in all (grid steps x block > the array). Parameters: `call`, `operand` (input
    index). Declines when the body uses the ref in any other way or its block has unsqueezed leading dims.
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
                # The body transposes the block every grid step: more elements than the whole array?
                redone = c.steps * c.inputs[i].block_elems > math.prod(c.inputs[i].shape)
                if redone and transposed_uses(loc, kernel, refs[i]) is not None:
                    out.append(cls(call=c.index, operand=i))
        return tuple(out)

    def apply(self, ir: KernelIR) -> KernelIR:
        check(0 <= self.call < len(ir.calls), f"no pallas_call #{self.call}")
        facts = ir.calls[self.call]
        check(facts.num_scalar_prefetch == 0, "the call uses scalar prefetch")
        check(
            self.operand in _candidates(facts),
            f"input {self.operand} is not a blocked input with a 2-D kernel block and an affine map",
        )
        op = facts.inputs[self.operand]
        assert op.index_map.affine is not None
        loc = Located.of(ir.module)
        node, kernel, refs = call_kernel(loc, facts, len(facts.inputs))
        ref = refs[self.operand]
        body_edits = transposed_uses(loc, kernel, ref)
        check(body_edits is not None, f"the kernel uses {ref} other than as a transposed read of {ref}[...]")
        assert body_edits is not None
        site = call_site(loc, node)
        check(site is not None, "the pallas_call is not applied to positional operands in place")
        assert site is not None
        edits = dict(body_edits)
        where, spec = spec_site(loc, node, self.operand, len(facts.operands))
        edits[where] = swapped_blockspec(spec, op.index_map.affine, len(facts.grid))
        operand = site.operands[self.operand]
        text = operand_text(operand)
        edits[operand] = cst.parse_expression(f"{text}.T" if len(op.shape) == 2 else f"{text}.swapaxes(-1, -2)")
        try:
            new = ir.with_module(replace_many(loc.wrapper.module, edits), self.spec())
        except KernelError as e:
            raise PassNotApplicable(f"the rewritten module does not trace: {e.message}") from None
        got = new.calls[self.call].inputs[self.operand]
        check(
            got.shape == _swap(op.shape) and got.block_shape == _swap(op.block_shape),
            f"the rewrite traced to shape {got.shape}, block {got.block_shape}",
        )
        return new
