"""lane-dense: re-block an elementwise kernel whose minor dim is not a multiple of 128 as (rows, 128) lane-dense
blocks, reshaping its operands and outputs in the wrapper; the kernel body is unchanged."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import libcst as cst

from ..cost_model.hardware import LANES, Chip
from ..cost_model.wrapper import CALLS, ELEMENTWISE, inner_jaxprs
from ..errors import KernelError, PassNotApplicable, check
from ..ir.builders import operand_text, substitute
from ..ir.cst_edit import replace_many, semantics_edit, set_keyword
from ..ir.facts import CallFacts, dtype_bytes
from ..ir.kernel_ir import KernelIR, kernel_jaxpr
from ..ir.matchers import (
    Located,
    call_site,
    code,
    descendants,
    find_call_node,
    grid_spec_keyword,
    is_blockspec,
    keyword,
    module_alias,
    pl_alias,
    resolve,
    spec_nodes,
)
from .base import Pass

MAX_STEPS = 65_536  # grids enumerated to check that the blocks tile the arrays exactly once
# Elementwise work a lane-dense re-blocking leaves unchanged: the wrapper's elementwise set without its broadcasts
# (a broadcast is allowed only from a single element, checked below), plus ref reads and writes of whole blocks.
BODY_OPS = (ELEMENTWISE - {"broadcast_in_dim"}) | {"copy", "copy_p", "stop_gradient"}


def _size(v: Any) -> int:
    return math.prod(getattr(v.aval, "shape", ()))


def elementwise_problem(jaxpr: Any, block: tuple[int, ...], refs: frozenset[Any] | None = None) -> str | None:
    """Why the kernel body `jaxpr` is not elementwise over blocks of shape `block` (None when it is): every ref is
    read and written whole (`x_ref[...]`), every value is a single element or a whole block, and every operation is
    elementwise (no iota, program id, reduction, dot, transpose, reshape, or broadcast of more than one element)."""
    refs = frozenset(jaxpr.invars) if refs is None else refs
    for c in getattr(jaxpr, "constvars", ()):
        if _size(c) != 1:
            return f"the body closes over a {tuple(c.aval.shape)} constant"
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        for v in eqn.outvars:
            shape = tuple(getattr(v.aval, "shape", ()))
            if _size(v) != 1 and shape != block:
                return f"`{name}` makes a {shape} value (not the {block} block or a single element)"
        if name in ("get", "swap"):
            ref = eqn.invars[0]
            value = eqn.outvars[0]
            if ref not in refs or tuple(value.aval.shape) != block:
                return f"`{name}` does not read or write a whole block ref (`x_ref[...]`)"
        elif name == "broadcast_in_dim":
            if _size(eqn.invars[0]) != 1:
                return f"a broadcast of a {tuple(eqn.invars[0].aval.shape)} value"
        elif name in CALLS:
            for inner in inner_jaxprs(eqn):
                why = elementwise_problem(inner, block, frozenset())
                if why is not None:
                    return why
        elif name not in BODY_OPS:
            return f"the body uses `{name}`, which is not elementwise"
    return None


def _sublanes(call: CallFacts) -> int:
    """Rows a lane-dense block must be a multiple of: the packed sublane tile of the narrowest dtype (8 for 32-bit,
    16 for 16-bit, 32 for 8-bit)."""
    return max(8 * 4 // min(4, dtype_bytes(o.dtype)) for o in call.operands)


def screen(call: CallFacts) -> str | None:
    """Why the traced facts rule the call out (None when they do not): every operand a blocked VMEM operand with the
    same array shape, block shape and index map; the minor dim not a multiple of 128; the blocks tiling the arrays
    exactly once; no scratch, scalar prefetch, manual DMA or library call."""
    if call.library_site is not None:
        return "the pallas_call is in a library"
    if call.num_scalar_prefetch or call.scratch or call.body.has_dma or call.dynamic_axes:
        return "the call uses scalar prefetch, scratch, manual DMA or a run-time grid"
    ops = call.operands
    if not ops or not call.outputs or not all(o.is_pipelined for o in ops):
        return "not every operand is a blocked VMEM operand"
    first = ops[0]
    if any(o.shape != first.shape or o.block_shape != first.block_shape for o in ops):
        return "the operands do not all have the same shape and block shape (a broadcast operand?)"
    if any(o.index_map.affine is None or o.index_map.affine != first.index_map.affine for o in ops):
        return "the operands' index maps are not the same affine map"
    d = first.shape[-1] if first.shape else 1
    if d % LANES == 0:
        return f"the minor dim ({d}) is already a multiple of {LANES}"
    block = tuple(1 if b is None else b for b in first.block_shape)
    if block[-1] != d or any(s % b for s, b in zip(first.shape, block, strict=True)):
        return f"the block {first.block_shape} does not tile the {first.shape} array with whole rows"
    if math.prod(first.shape) % LANES or math.prod(block) % LANES:
        return f"a block or the array is not a whole number of {LANES}-lane rows"
    blocks = math.prod(s // b for s, b in zip(first.shape, block, strict=True))
    if call.steps != blocks or call.steps > MAX_STEPS:
        return f"{call.steps} grid steps for {blocks} blocks"
    seen = {first.index_map.block_index(idx) for idx in itertools.product(*(range(g) for g in call.grid))}
    if len(seen) != blocks:
        return "the grid visits some block more than once"
    return None


def _kernel_block(call: CallFacts) -> tuple[int, ...]:
    return tuple(b for b in call.operands[0].block_shape if b is not None)


def _rows(call: CallFacts) -> tuple[int, int]:
    """(rows of the lane-dense array, rows of a block of the same bytes)."""
    op = call.operands[0]
    return math.prod(op.shape) // LANES, op.block_elems // LANES


@dataclass(frozen=True)
class LaneDensePass(Pass):
    """Lane-dense re-blocking of an elementwise kernel: when every operand and output of a pallas_call is an
    (..., d) array blocked the same way with d not a multiple of 128 (64-wide heads, 32-wide feature maps) and the
    body is elementwise (read from its jaxpr: whole-block reads and writes, elementwise ops, broadcasts of single
    elements only), the wrapper reshapes every operand to (size / 128, 128), the call runs a 1-D grid of
    (`rows`, 128) blocks, and the outputs are reshaped back. The body is unchanged; stores become full 128-lane
    vectors instead of masked partial stores, and vector work stops wasting lanes.

    On TPU a reshape that changes the minor dim is a relayout copy, so the wrapper pays one HBM read and write per
    operand (cost_model/wrapper.py charges it); the trade pays when the body's vector work, not HBM, bounds the
    kernel. Parameters: `call`; `rows`, the lane-dense block's rows (0: the same elements per block as before; a
    multiple of the operands' sublane tile). Declines any other body (iota, program ids, reductions, dots, reshapes,
    transposes, broadcasts along an axis), operands that differ in shape, block or index map, scratch, scalar
    prefetch, manual DMA, and grids that do not tile the arrays exactly once.
    """

    name: ClassVar[str] = "lane-dense"
    call: int = 0
    rows: int = 0

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        out: list[Pass] = []
        for c in ir.calls:
            if screen(c) is not None or elementwise_problem(kernel_jaxpr(ir, c.index), _kernel_block(c)):
                continue
            total, same = _rows(c)
            tile = _sublanes(c)
            base = -(-same // tile) * tile
            sizes = sorted({r for r in (base, 2 * base, 4 * base) if r <= total and total % r == 0})
            out.extend(cls(call=c.index, rows=r) for r in sizes)
        return tuple(out)

    def apply(self, ir: KernelIR) -> KernelIR:
        check(0 <= self.call < len(ir.calls), f"no pallas_call #{self.call}")
        facts = ir.calls[self.call]
        why = screen(facts)
        check(why is None, why or "")
        total, same = _rows(facts)
        rows = self.rows or same
        tile = _sublanes(facts)
        check(rows % tile == 0 or rows == total, f"{rows} rows is not a multiple of the sublane tile ({tile})")
        check(rows <= total, f"{rows} rows exceed the array's {total} lane-dense rows")
        why = elementwise_problem(kernel_jaxpr(ir, self.call), _kernel_block(facts))
        check(why is None, f"the body is not elementwise: {why}")
        loc = Located.of(ir.module)
        node = find_call_node(loc, facts)
        new_module = replace_many(loc.wrapper.module, _edits(loc, node, facts, rows))
        try:
            new = ir.with_module(new_module, self.spec())
        except KernelError as e:
            raise PassNotApplicable(f"the rewritten module does not trace: {e.message}") from None
        got = new.calls[self.call]
        check(
            all(o.shape == (total, LANES) and o.block_shape == (rows, LANES) for o in got.operands),
            f"the rewrite traced to blocks {[o.block_shape for o in got.operands]}",
        )
        return new


def _edits(loc: Located, node: cst.Call, facts: CallFacts, rows: int) -> dict[cst.CSTNode, cst.CSTNode]:
    """The wrapper edits: operands reshaped to (-1, 128), a 1-D grid of (rows, 128) blocks, out_shape in lane-dense
    rows, `dimension_semantics` made ("parallel",), and the outputs reshaped back to the first operand's shape."""
    site = call_site(loc, node)
    check(site is not None, "the pallas_call is not applied to positional operands in place")
    assert site is not None
    check(len(site.operands) == len(facts.inputs), "the call site's operands do not match the traced inputs")
    names = [o for o in site.operands if isinstance(o, cst.Name)]
    check(bool(names), "no operand is a plain name to take the shape from")
    x = names[0].value
    specs = spec_nodes(loc, node)
    spec = next((s for s in specs if is_blockspec(s)), None)
    check(spec is not None or not specs, "cannot read the BlockSpecs")
    pl = pl_alias(loc.wrapper.module)
    block_fn = code(spec.func) if isinstance(spec, cst.Call) else f"{pl}.BlockSpec"
    one = f"{block_fn}(({rows}, {LANES}), lambda i: (i, 0))"

    shape_arg = keyword(node, "out_shape")
    check(shape_arg is not None, "the pallas_call has no out_shape keyword")
    assert shape_arg is not None
    resolved = resolve(loc, node, shape_arg.value)
    container = isinstance(resolved, cst.List | cst.Tuple)
    structs = [e.value for e in resolved.elements] if isinstance(resolved, cst.List | cst.Tuple) else [resolved]
    check(len(structs) == len(facts.outputs), "cannot read every out_shape")
    new_structs = [_dense_struct(loc, node, s, x) for s in structs]
    if container:
        closer = "," if len(new_structs) == 1 and isinstance(resolved, cst.Tuple) else ""
        opener, end = ("(", ")") if isinstance(resolved, cst.Tuple) else ("[", "]")
        out_shape = f"{opener}{', '.join(new_structs)}{closer}{end}"
        out_specs = f"{opener}{', '.join([one] * len(new_structs))}{closer}{end}"
    else:
        out_shape, out_specs = new_structs[0], one

    holder, _ = grid_spec_keyword(loc, node, "grid")
    new_holder = holder
    for key, text in (
        ("grid", f"({pl}.cdiv({x}.size // {LANES}, {rows}),)"),
        ("in_specs", f"[{', '.join([one] * len(facts.inputs))}]"),
        ("out_specs", out_specs),
    ):
        new_holder = set_keyword(new_holder, key, cst.parse_expression(text))
    # ("parallel",) where the call sets semantics at all; the edits inside the call go into the new call below (the
    # keyword edits keep the other arguments' nodes), the others (a local CompilerParams) stay edits of the module.
    inside = descendants(node)
    parallel = {} if facts.dimension_semantics is None else semantics_edit(loc, node, facts, lambda _: ("parallel",))
    assert node not in parallel  # traced semantics: the call has compiler_params, so the edit is inside them
    within = {k: v for k, v in parallel.items() if k in inside}
    edits = {k: v for k, v in parallel.items() if k not in inside}
    if holder is node:
        new_call = substitute(new_holder, within)
    elif holder in inside:
        new_call = substitute(node, {holder: new_holder, **within})
    else:
        edits[holder] = new_holder
        new_call = substitute(node, within)
    new_call = set_keyword(new_call, "out_shape", cst.parse_expression(out_shape))

    args = [a.with_changes(value=_reshaped(a.value)) for a in site.apply.args]
    if site.apply.func is node:
        applied = site.apply.with_changes(func=new_call, args=args)
    else:
        edits[node] = new_call
        applied = site.apply.with_changes(args=args)
    if isinstance(resolved, cst.Tuple):
        back = f"tuple(o.reshape({x}.shape) for o in {code(applied)})"
    elif container:
        back = f"[o.reshape({x}.shape) for o in {code(applied)}]"
    else:
        back = f"{code(applied)}.reshape({x}.shape)"
    edits[site.apply] = cst.parse_expression(back)
    return edits


def _reshaped(operand: cst.BaseExpression) -> cst.BaseExpression:
    return cst.parse_expression(f"{operand_text(operand)}.reshape(-1, {LANES})")


def _dense_struct(loc: Located, node: cst.Call, struct: cst.BaseExpression | None, x: str) -> str:
    """`ShapeDtypeStruct((x.size // 128, 128), dtype)` for an output described by `struct`."""
    check(struct is not None, "cannot read an out_shape")
    assert struct is not None
    if isinstance(struct, cst.Call) and code(struct.func).endswith("ShapeDtypeStruct"):
        positional = [a.value for a in struct.args if a.keyword is None]
        kw = keyword(struct, "dtype")
        dtype = kw.value if kw is not None else (positional[1] if len(positional) > 1 else None)
        check(dtype is not None, "an out_shape has no dtype")
        assert dtype is not None
        if struct in descendants(node):  # written at the call: its dtype expression reads names in scope there
            return f"{code(struct.func)}(({x}.size // {LANES}, {LANES}), {code(dtype)})"
        return f"{code(struct.func)}(({x}.size // {LANES}, {LANES}), ({code(struct)}).dtype)"
    jax = module_alias(loc.wrapper.module, "jax")
    check(jax is not None, "an out_shape is not a ShapeDtypeStruct(...) and `jax` is not imported")
    return f"{jax}.ShapeDtypeStruct(({x}.size // {LANES}, {LANES}), ({code(struct)}).dtype)"
