"""accumulate-in-scratch: a reduction that accumulates in its output ref gets an f32 VMEM scratch accumulator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import libcst as cst
import libcst.matchers as m

from ..cost_model.hardware import Chip
from ..errors import PassNotApplicable, check
from ..ir.builders import fresh_name, rename_names
from ..ir.cst_edit import add_scratch, replace_many
from ..ir.facts import CallFacts
from ..ir.kernel_ir import KernelIR
from ..ir.matchers import (
    Located,
    find_call_node,
    kernel_function,
    keyword,
    spec_nodes,
    used_names,
)
from .base import Pass, kernel_site

FLOAT_OUTPUTS = ("float32", "bfloat16", "float16")


def accumulating_outputs(call: CallFacts) -> tuple[int, ...]:
    """Output positions revisited along exactly one reduction axis (the kernel accumulates into them)."""
    red = call.revisited_axes()
    if len(red) != 1 or call.body.has_dma:
        return ()
    return tuple(
        o.position
        for o in call.outputs
        if o.is_pipelined and o.dtype in FLOAT_OUTPUTS and red[0] not in o.index_map.axes
    )


@dataclass(frozen=True)
class AccumulateInScratchPass(Pass):
    """Move a reduction's running sum from the output block into an f32 VMEM scratch accumulator: zeroed wherever
    the kernel zeroed its output, read and written instead of the output, and stored (cast to the output dtype) once
    on the last reduction step.

    Helps narrow outputs most (bf16/f16: no per-step down-cast and round-off, an f32-accurate sum); for f32 outputs
    it keeps the output block write-only. Parameters: `call`, `output` (output position). Declines for kernels
    with manual DMA, several reduction axes, non-float outputs, or kernels written with `*args`.
    """

    name: ClassVar[str] = "accumulate-in-scratch"
    call: int = 0
    output: int = 0

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        return tuple(
            cls(call=c.index, output=o) for c in ir.calls for o in accumulating_outputs(c) if _may_read(ir, c, o)
        )

    def apply(self, ir: KernelIR) -> KernelIR:
        check(0 <= self.call < len(ir.calls), f"no pallas_call #{self.call}")
        facts = ir.calls[self.call]
        check(
            self.output in accumulating_outputs(facts),
            f"output {self.output} is not accumulated over one reduction axis",
        )
        (axis,) = facts.revisited_axes()
        out_op = facts.outputs[self.output]
        site = kernel_site(ir, facts)
        loc, node, kernel, jnp, pltpu, pl = site.loc, site.node, site.kernel, site.jnp, site.pltpu, site.pl
        params = kernel.params
        check(
            params.star_arg is cst.MaybeSentinel.DEFAULT or isinstance(params.star_arg, cst.ParamStar),
            "the kernel takes *args",
        )
        n_refs = facts.num_scalar_prefetch + len(facts.inputs) + len(facts.outputs) + len(facts.scratch)
        check(len(params.params) == n_refs, "the kernel's positional parameters do not match the refs")
        out_param = params.params[facts.num_scalar_prefetch + len(facts.inputs) + self.output].name.value
        check(
            _reads_ref(kernel, out_param),
            f"the kernel only writes {out_param} (it already accumulates elsewhere, e.g. in a scratch)",
        )
        acc = fresh_name(used_names(kernel), "acc_ref")
        specs = spec_nodes(loc, node)
        offset = len(specs) - len(facts.outputs) + self.output
        spec = specs[offset] if 0 <= offset < len(specs) else None
        shape = _block_shape_text(spec, out_op.block_shape)
        check(shape is not None, "cannot read the output BlockSpec's block shape")
        edits: dict[cst.CSTNode, cst.CSTNode] = {}
        new_kernel = _rewrite_kernel(kernel, out_param, acc, axis, pl)
        edits[kernel] = new_kernel
        scratch = cst.parse_expression(f"{pltpu}.VMEM({shape}, {jnp}.float32)")
        add_scratch(loc, node, [scratch], edits)
        new = replace_many(loc.wrapper.module, edits)
        return ir.with_module(new, self.spec())


def _block_shape_text(spec: cst.BaseExpression | None, traced: tuple[int | None, ...]) -> str | None:
    """The output block shape as source text (keeping the user's names, so later tiling stays coherent)."""
    if not isinstance(spec, cst.Call):
        return None
    positional = [a for a in spec.args if a.keyword is None]
    arg = keyword(spec, "block_shape") or (positional[0] if positional else None)
    if arg is None or not isinstance(arg.value, cst.Tuple | cst.List):
        return None
    elems = [e.value for e in arg.value.elements]
    if len(elems) != len(traced):
        return None
    kept = [cst.Module([]).code_for_node(e) for e, t in zip(elems, traced, strict=True) if t is not None]
    return "(" + ", ".join(kept) + ("," if len(kept) == 1 else "") + ")"


def _may_read(ir: KernelIR, facts: CallFacts, output: int) -> bool:
    """Whether the kernel may read output `output` (True when the kernel or its parameter cannot be found)."""
    try:
        loc = Located.of(ir.module)
        kernel = kernel_function(loc, find_call_node(loc, facts))
    except PassNotApplicable:
        return True
    if kernel is None:
        return True
    pos = facts.num_scalar_prefetch + len(facts.inputs) + output
    params = kernel.params.params
    return pos >= len(params) or _reads_ref(kernel, params[pos].name.value)


def _reads_ref(kernel: cst.FunctionDef, ref: str) -> bool:
    """Whether the kernel may read `ref`'s values: any use but `ref[...] = value` and `ref.dtype` / `ref.shape`."""
    loc = Located.of(cst.Module(body=[kernel]))
    for node in m.findall(loc.wrapper.module, m.Name(ref)):
        parent = loc.parent(node)
        if isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value in ("dtype", "shape"):
            continue
        if isinstance(parent, cst.Param):
            continue
        if isinstance(parent, cst.Subscript) and parent.value is node:
            holder = loc.parent(parent)
            if isinstance(holder, cst.AssignTarget) and holder.target is parent:
                continue
        return True
    return False


def _rewrite_kernel(kernel: cst.FunctionDef, out: str, acc: str, axis: int, pl: str) -> cst.FunctionDef:
    body = rename_names(kernel.body, {out: acc})
    assert isinstance(body, cst.IndentedBlock)
    store = cst.parse_statement(
        f"@{pl}.when({pl}.program_id({axis}) == {pl}.num_programs({axis}) - 1)\n"
        f"def _store_accumulator():\n"
        f"    {out}[...] = {acc}[...].astype({out}.dtype)\n"
    )
    store = store.with_changes(leading_lines=[cst.EmptyLine()])
    params = list(kernel.params.params)
    last = params[-1]
    new_param = cst.Param(name=cst.Name(acc))
    if isinstance(last.comma, cst.Comma):
        new_param = new_param.with_changes(comma=last.comma)
    params[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    params.append(new_param)
    return kernel.with_changes(
        params=kernel.params.with_changes(params=params),
        body=body.with_changes(body=[*body.body, store]),
    )
