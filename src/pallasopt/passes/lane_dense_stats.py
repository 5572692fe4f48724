"""lane-dense-stats: a per-row statistic output stored as (rows, 1) blocks becomes a (1, rows) lane-major output,
the body storing the reduced vector along lanes and the wrapper reshaping the result back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import libcst as cst
import libcst.matchers as m

from ..cost_model.hardware import LANES, Chip
from ..errors import KernelError, PassNotApplicable, check
from ..ir.builders import operand_text, substitute, swapped_blockspec
from ..ir.cst_edit import replace_many
from ..ir.facts import CallFacts
from ..ir.kernel_ir import KernelIR
from ..ir.matchers import (
    Located,
    call_kernel,
    call_site,
    code,
    descendants,
    is_call_to,
    keyword,
    resolve,
    spec_site,
)
from .base import Pass

LIKE = ("zeros_like", "ones_like", "full_like", "empty_like")


def candidate(call: CallFacts, output: int) -> str | None:
    """Why output `output` of the call is not a (rows, 1) statistics output this pass rewrites (None when it is):
    a 2-D (M, 1) array in blocked (bm, 1) VMEM blocks, bm a multiple of 128 (or all of M), its block column fixed."""
    if call.library_site is not None or call.num_scalar_prefetch:
        return "the call is in a library or uses scalar prefetch"
    if not 0 <= output < len(call.outputs):
        return f"no output #{output}"
    if len(call.outputs) != 1:
        return "the call has several outputs (only a single result is reshaped back)"
    op = call.outputs[output]
    if not op.is_pipelined or len(op.shape) != 2 or op.shape[-1] != 1 or None in op.block_shape:
        return f"output {output} is not a blocked (M, 1) array"
    rows = op.block_shape[0]
    assert rows is not None
    if rows % LANES and rows != op.shape[0]:
        return f"its {rows}-row block is not a multiple of {LANES} lanes"
    affine = op.index_map.affine
    if affine is None or any(affine[-1]):
        return "its index map is not affine with a fixed block column"
    return None


def store_edits(loc: Located, kernel: cst.FunctionDef, ref: str) -> dict[cst.CSTNode, cst.CSTNode] | str:
    """The body edits for `ref` now holding a (1, rows) block: a store `ref[...] = v` (or `+=`) stores
    `v.reshape(ref.shape)`, a read `ref[...]` becomes `ref[...].T`; `ref.dtype` and `zeros_like(ref)` stored straight
    back are left. Any other use: the reason, as a string."""
    edits: dict[cst.CSTNode, cst.CSTNode] = {}
    uses = list(m.findall(kernel.body, m.Name(ref)))
    if not uses:
        return f"the kernel never uses {ref}"
    for use in uses:
        parent = loc.parent(use)
        if isinstance(parent, cst.Attribute) and parent.value is use and parent.attr.value == "dtype":
            continue
        if isinstance(parent, cst.Arg) and _stored_like(loc, parent, ref):
            continue
        if not (isinstance(parent, cst.Subscript) and code(parent).replace(" ", "") == f"{ref}[...]"):
            return f"{ref} is used as `{code(parent) if parent is not None else ref}`, not as {ref}[...]"
        holder = loc.parent(parent)
        if isinstance(holder, cst.AssignTarget):
            assign = loc.parent(holder)
            if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
                return f"a chained store to {ref}"
            value = assign.value
            like = isinstance(value, cst.Call) and any(is_call_to(value, n) for n in LIKE) and bool(value.args)
            if not (like and isinstance(value, cst.Call) and code(value.args[0].value) == ref):
                edits[value] = _reshaped(value, ref)  # (`zeros_like(ref)` already has the new shape)
        elif isinstance(holder, cst.AugAssign) and holder.target is parent:
            edits[holder.value] = _reshaped(holder.value, ref)
        else:
            edits[parent] = cst.parse_expression(f"{ref}[...].T")
    return edits


def _stored_like(loc: Located, arg: cst.Arg, ref: str) -> bool:
    """`arg` is the first argument of `zeros_like(ref)` (and kin) whose value is stored straight into `ref[...]`."""
    call = loc.parent(arg)
    if not (isinstance(call, cst.Call) and any(is_call_to(call, n) for n in LIKE) and call.args[0] is arg):
        return False
    assign = loc.parent(call)
    return (
        isinstance(assign, cst.Assign)
        and len(assign.targets) == 1
        and code(assign.targets[0].target).replace(" ", "") == f"{ref}[...]"
    )


def _reshaped(value: cst.BaseExpression, ref: str) -> cst.BaseExpression:
    return cst.parse_expression(f"{operand_text(value)}.reshape({ref}.shape)")


@dataclass(frozen=True)
class LaneDenseStatsPass(Pass):
    """Store a per-row statistic lane-major: an output stored as (bm, 1) blocks of an (M, 1) array (a row sum, max,
    mean or logsumexp kept with `keepdims=True`) writes one useful lane per 8 x 128 vreg with masked stores, and its
    HBM layout pads every row to 128 lanes. The rewrite makes the output a (1, M) array in (1, bm) blocks (index map
    results swapped), the body storing `v.reshape(o_ref.shape)` (and reading `o_ref[...].T` where it accumulates),
    and the wrapper reshaping the result back to (M, 1) (a small relayout the model charges).

    Parameters: `call`, `output` (the output index). Declines when the call has several outputs, the block is not a
    multiple of 128 rows, the map moves the block column, or the body uses the ref other than as `o_ref[...]`
    (`o_ref.dtype` and `o_ref[...] = jnp.zeros_like(o_ref)` are fine)."""

    name: ClassVar[str] = "lane-dense-stats"
    call: int = 0
    output: int = 0

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        out: list[Pass] = []
        for c in ir.calls:
            for j in range(len(c.outputs)):
                if candidate(c, j) is not None:
                    continue
                try:
                    loc = Located.of(ir.module)
                    _, kernel, refs = call_kernel(loc, c, len(c.operands))
                except PassNotApplicable:
                    continue
                if not isinstance(store_edits(loc, kernel, refs[len(c.inputs) + j]), str):
                    out.append(cls(call=c.index, output=j))
        return tuple(out)

    def apply(self, ir: KernelIR) -> KernelIR:
        check(0 <= self.call < len(ir.calls), f"no pallas_call #{self.call}")
        facts = ir.calls[self.call]
        why = candidate(facts, self.output)
        check(why is None, why or "")
        op = facts.outputs[self.output]
        assert op.index_map.affine is not None
        loc = Located.of(ir.module)
        node, kernel, refs = call_kernel(loc, facts, len(facts.operands))
        ref = refs[len(facts.inputs) + self.output]
        body = store_edits(loc, kernel, ref)
        check(not isinstance(body, str), str(body))
        assert not isinstance(body, str)
        site = call_site(loc, node)
        check(site is not None, "the pallas_call is not applied to positional operands in place")
        assert site is not None
        n_in = len(facts.inputs)
        where, spec = spec_site(loc, node, n_in + self.output, len(facts.operands), n_in)
        wrapper: dict[cst.CSTNode, cst.CSTNode] = {where: swapped_blockspec(spec, op.index_map.affine, len(facts.grid))}
        struct, new_struct = _lane_major_struct(loc, node)
        wrapper[struct] = new_struct
        inside = descendants(site.apply)
        applied = substitute(site.apply, {k: v for k, v in wrapper.items() if k in inside})
        edits = {**body, **{k: v for k, v in wrapper.items() if k not in inside}}
        edits[site.apply] = cst.parse_expression(f"{code(applied)}.reshape(-1, 1)")
        try:
            new = ir.with_module(replace_many(loc.wrapper.module, edits), self.spec())
        except KernelError as e:
            raise PassNotApplicable(f"the rewritten module does not trace: {e.message}") from None
        got = new.calls[self.call].outputs[self.output]
        rows = op.block_shape[0]
        check(
            got.shape == (1, op.shape[0]) and got.block_shape == (1, rows),
            f"the rewrite traced to shape {got.shape}, block {got.block_shape}",
        )
        return new


def _lane_major_struct(loc: Located, node: cst.Call) -> tuple[cst.CSTNode, cst.CSTNode]:
    """The out_shape `ShapeDtypeStruct((M, 1), dt)` written in the call, and the same with shape (1, M)."""
    arg = keyword(node, "out_shape")
    check(arg is not None, "the pallas_call has no out_shape keyword")
    assert arg is not None
    value = resolve(loc, node, arg.value)
    if isinstance(value, cst.List | cst.Tuple) and len(value.elements) == 1:
        value = value.elements[0].value
    check(
        isinstance(value, cst.Call) and code(value.func).endswith("ShapeDtypeStruct") and value in descendants(node),
        "the out_shape is not a ShapeDtypeStruct(...) written in the call",
    )
    assert isinstance(value, cst.Call)
    shape = value.args[0].value if value.args and value.args[0].keyword is None else None
    check(
        isinstance(shape, cst.Tuple) and len(shape.elements) == 2 and code(shape.elements[1].value) == "1",
        "the out_shape's shape is not written as (M, 1)",
    )
    assert isinstance(shape, cst.Tuple)
    new_shape = cst.parse_expression(f"(1, {code(shape.elements[0].value)})")
    return value, value.with_changes(args=[value.args[0].with_changes(value=new_shape), *value.args[1:]])
