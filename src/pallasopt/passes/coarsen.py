"""coarsen: a grid axis that walks its operands one row per step runs `by` rows per step, the kernel body looping
over them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import libcst as cst
import libcst.matchers as m

from ..cost_model.hardware import Chip
from ..errors import check
from ..ir.builders import fresh_name
from ..ir.cst_edit import replace_many
from ..ir.facts import CallFacts
from ..ir.fusion import unit_row
from ..ir.kernel_ir import KernelIR
from ..ir.matchers import (
    PROGRAM_ID,
    Located,
    blockspec_parts,
    code,
    descendants,
    find_call_node,
    grid_spec_keyword,
    helper_reading_program_id,
    jnp_alias,
    module_names,
    own_kernel,
    pl_alias,
    resolve,
    spec_nodes,
    used_names,
)
from .base import Pass

FACTORS = (2, 4, 8)  # rows per step offered; the body is unrolled that many times, so the choices stay small


@dataclass(frozen=True)
class CoarsenPass(Pass):
    """Run `by` consecutive steps of grid axis `axis` of pallas_call `call` in one step.

    For kernels written one row per step (a block of size 1 along some dim, the body indexing it with a literal 0 and
    reading `pl.program_id(axis)` for the row): every step pays the pipeline's fixed cost (DMA issue and wait, the
    step's bookkeeping; about 0.35 us on v5e) for very little work. The rewrite divides the axis's extent by `by`,
    makes each block that axis walks `by` rows deep, and wraps the body in `for r in range(o_ref.shape[d])` (the
    block's rows, read off a walked ref so that a later `tile` of that block keeps the loop in step), with the literal
    0 of those refs' indexing replaced by `r` and `pl.program_id(axis)` by `pl.program_id(axis) * o_ref.shape[d] + r`
    (so rows run in the old order). Needs the extent divisible by `by` at the traced dims; where it is not at another size the
    original divided, the run's multi-size check says so. Declines when a ref the axis walks is used other than
    indexed with a literal 0 in that dim (read whole, sliced, passed on) or its `.shape` in that dim is read, for a
    body with `return`, a kernel shared with another call or a helper reading program_id, non-affine maps, manual
    DMA, scalar prefetch, squeezed (`None`) block dims or blocks not written as literal tuples.
    """

    name: ClassVar[str] = "coarsen"
    call: int = 0
    axis: int = 0
    by: int = 2

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        out: list[Pass] = []
        for c in ir.calls:
            if c.library_site is not None or c.num_scalar_prefetch or c.body.has_dma or c.dynamic_axes:
                continue
            for a, extent in enumerate(c.grid):
                if isinstance(walked_dims(c, a), str):
                    continue
                out.extend(cls(call=c.index, axis=a, by=r) for r in FACTORS if extent % r == 0 and extent > r)
        return tuple(out)

    def apply(self, ir: KernelIR) -> KernelIR:
        check(0 <= self.call < len(ir.calls), f"no pallas_call #{self.call}")
        facts = ir.calls[self.call]
        check(0 <= self.axis < len(facts.grid), f"pallas_call #{self.call} has no grid axis {self.axis}")
        check(self.by >= 2, "by must be at least 2")
        check(facts.library_site is None, "the call is inside a library function")
        check(facts.num_scalar_prefetch == 0, "the call uses scalar prefetch")
        check(not facts.body.has_dma and not facts.body.has_semaphore, "the kernel does manual DMA")
        check(not facts.dynamic_axes, "the call has a grid extent known only at run time")
        walked = walked_dims(facts, self.axis)
        check(not isinstance(walked, str), str(walked))
        assert not isinstance(walked, str)
        extent = facts.grid[self.axis]
        check(extent % self.by == 0, f"grid axis {self.axis} has {extent} steps, not a multiple of {self.by}")
        loc = Located.of(ir.module)
        node = find_call_node(loc, facts)
        kernel, refs = own_kernel(loc, ir.calls, facts, node)
        helper = helper_reading_program_id(loc.wrapper.module, kernel)  # it would read the new step's index
        check(helper is None, f"the kernel's helper {helper} uses program_id")
        module = loc.wrapper.module
        row = fresh_name(used_names(kernel) | module_names(module), "r")
        dims = {refs[k]: d for k, d in walked}
        ranks = {refs[k]: len(facts.operands[k].shape) for k, _ in walked}
        looped_kernel = looped(kernel, dims, self.axis, row, pl_alias(module), ranks, jnp_alias(module))
        edits: dict[cst.CSTNode, cst.CSTNode] = {kernel: looped_kernel}
        edits.update(_grid_edit(loc, node, self.axis, self.by))
        edits.update(_block_edits(loc, node, facts, walked, self.by))
        new = ir.with_module(replace_many(module, edits), self.spec())
        got = new.calls[self.call]
        want = tuple(g // self.by if a == self.axis else g for a, g in enumerate(facts.grid))
        check(got.grid == want, f"the rewrite traced to grid {got.grid}, not {want}")
        for k, d in walked:
            block = got.operands[k].block_shape
            check(block[d] == self.by, f"{got.operands[k].name}'s block traced to {block}")
        return new


def walked_dims(c: CallFacts, axis: int) -> tuple[tuple[int, int], ...] | str:
    """(operand, dim) for every operand grid `axis` walks, each in one dim with stride 1 and a one-row block; else
    why not (a string)."""
    out: list[tuple[int, int]] = []
    for k, o in enumerate(c.operands):
        if not o.is_pipelined or o.index_map.affine is None:
            return f"{o.name} is not a blocked VMEM operand with an affine index map"
        dims = [d for d, row in enumerate(o.index_map.affine) if row[axis] != 0]
        if not dims:
            continue
        if len(dims) != 1 or unit_row(o.index_map.affine[dims[0]]) != axis:
            return f"{o.name}'s index map walks axis {axis} other than in one dim with stride 1"
        if o.block_shape[dims[0]] != 1:
            return f"{o.name}'s block is {o.block_shape[dims[0]]} along axis {axis}, not one row"
        out.append((k, dims[0]))
    return tuple(out) if out else f"no operand walks axis {axis}"


def looped(
    kernel: cst.FunctionDef,
    dims: Mapping[str, int],
    axis: int,
    row: str,
    pl: str,
    ranks: Mapping[str, int],
    jnp: str | None,
) -> cst.FunctionDef:
    """The kernel with its body in `for row in range(ref.shape[d])` (a walked ref's rows per block): each ref in
    `dims` indexed at `row` instead of a literal 0 in its dim, `program_id(axis)` the old step's index (declines any
    other use of those refs). A store of one element into a walked ref (`o_ref[0, 0] = v`: every one of its `ranks`
    dims indexed), which Mosaic does not lower ("Cannot store scalars to VMEM"), becomes a store of a one-element
    block (`o_ref[pl.ds(row, 1), pl.ds(0, 1)] = jnp.full((1, 1), v, o_ref.dtype)`; with `jnp`, the module's name for
    jax.numpy)."""
    returns = [r for r in m.findall(kernel.body, m.Return()) if not _in_nested_def(kernel, r)]
    check(not returns, "the kernel body returns early")
    _check_ref_uses(kernel, dims)
    body = kernel.body
    check(isinstance(body, cst.IndentedBlock), "the kernel body is on one line")
    assert isinstance(body, cst.IndentedBlock)
    stmts = list(body.body)
    doc = stmts[:1] if stmts and m.matches(stmts[0], m.SimpleStatementLine([m.Expr(m.SimpleString())])) else []
    # The row count read off a walked ref's block, not the literal `by`: a later pass that re-tiles that block
    # (`tile` sees `by` in the grid and specs as a block knob) leaves the loop and the step's first row in step.
    ref, d = list(dims.items())[-1]  # the last walked ref: an output where one is walked
    rows = f"{ref}.shape[{d}]"
    inner = cst.IndentedBlock(body=stmts[len(doc) :]).visit(_Rows(dims, axis, rows, row, pl, ranks, jnp))
    assert isinstance(inner, cst.IndentedBlock)
    loop = cst.For(target=cst.Name(row), iter=cst.parse_expression(f"range({rows})"), body=inner)
    return kernel.with_changes(body=body.with_changes(body=[*doc, loop]))


def _in_nested_def(kernel: cst.FunctionDef, node: cst.CSTNode) -> bool:
    return any(node in descendants(fn) for fn in m.findall(kernel.body, m.FunctionDef() | m.Lambda()))


def _check_ref_uses(kernel: cst.FunctionDef, dims: Mapping[str, int]) -> None:
    """Every use of a walked ref is `ref[..., 0 at its dim, ...]`, `ref.dtype` or `ref.shape[k]` with k not its dim."""
    allowed: set[int] = set()
    for sub in m.findall(kernel.body, m.Subscript(value=m.Name())):
        assert isinstance(sub, cst.Subscript) and isinstance(sub.value, cst.Name)
        d = dims.get(sub.value.value)
        if d is not None:
            _row_index(sub, d)  # declines anything but a literal 0 there
            allowed.add(id(sub.value))
    for attr in m.findall(kernel.body, m.Attribute(value=m.Name(), attr=m.Name("dtype") | m.Name("ndim"))):
        assert isinstance(attr, cst.Attribute)
        allowed.add(id(attr.value))
    for sub in m.findall(kernel.body, m.Subscript(value=m.Attribute(value=m.Name(), attr=m.Name("shape")))):
        assert isinstance(sub, cst.Subscript) and isinstance(sub.value, cst.Attribute)
        ref = sub.value.value
        assert isinstance(ref, cst.Name)
        d = dims.get(ref.value)
        k = sub.slice[0].slice if len(sub.slice) == 1 else None
        if d is not None and isinstance(k, cst.Index) and isinstance(k.value, cst.Integer):
            check(
                int(k.value.evaluated_value) != d, f"the body reads {ref.value}.shape[{d}], which grows with the rows"
            )
            allowed.add(id(ref))
    for name in m.findall(kernel.body, m.Name()):
        assert isinstance(name, cst.Name)
        check(
            name.value not in dims or id(name) in allowed,
            f"the body uses {name.value} other than indexed at a literal row (read whole, sliced or passed on)",
        )


def _row_index(sub: cst.Subscript, d: int) -> cst.Index:
    """The index at dim `d` of `ref[...]`, which must be the literal 0 (no `...` before it)."""
    elems = list(sub.slice)
    name = code(sub.value)
    check(len(elems) > d, f"{name} is indexed in fewer dims than its row dim {d}")
    for e in elems[: d + 1]:
        check(not (isinstance(e.slice, cst.Index) and isinstance(e.slice.value, cst.Ellipsis)), f"{name}[...] is read")
    index = elems[d].slice
    ok = isinstance(index, cst.Index) and isinstance(index.value, cst.Integer) and index.value.value == "0"
    check(ok, f"{name} is indexed at {code(index)} in its row dim {d}, not at a literal 0")
    assert isinstance(index, cst.Index)
    return index


class _Rows(cst.CSTTransformer):
    """Row `row` of the walked refs, and the old step's index for `program_id(axis)`."""

    def __init__(
        self,
        dims: Mapping[str, int],
        axis: int,
        rows: str,
        row: str,
        pl: str,
        ranks: Mapping[str, int],
        jnp: str | None,
    ) -> None:
        super().__init__()
        self.dims, self.axis, self.rows, self.row, self.pl = dims, axis, rows, row, pl
        self.ranks, self.jnp = ranks, jnp

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        """`ref[i, j] = v` (one element of a walked ref) -> `ref[pl.ds(i, 1), pl.ds(j, 1)] = jnp.full((1, 1), v,
        ref.dtype)`: a one-element block store, which Mosaic lowers where the scalar store does not."""
        if len(updated.targets) != 1 or self.jnp is None:
            return updated
        target = updated.targets[0].target
        if not isinstance(target, cst.Subscript) or not isinstance(target.value, cst.Name):
            return updated
        name = target.value.value
        elems = list(target.slice)
        scalar = all(isinstance(e.slice, cst.Index) and not isinstance(e.slice.value, cst.Ellipsis) for e in elems)
        if name not in self.dims or not scalar or len(elems) != self.ranks.get(name):
            return updated
        blocks = [
            e.with_changes(slice=cst.Index(cst.parse_expression(f"{self.pl}.ds({code(e.slice)}, 1)"))) for e in elems
        ]
        ones = "(" + ", ".join(["1"] * len(elems)) + ("," if len(elems) == 1 else "") + ")"
        value = cst.parse_expression(f"{self.jnp}.full({ones}, {code(updated.value)}, {name}.dtype)")
        return updated.with_changes(
            targets=[updated.targets[0].with_changes(target=target.with_changes(slice=blocks))], value=value
        )

    def leave_Subscript(self, original: cst.Subscript, updated: cst.Subscript) -> cst.BaseExpression:
        if not isinstance(original.value, cst.Name) or original.value.value not in self.dims:
            return updated
        d = self.dims[original.value.value]
        elems = list(updated.slice)
        index = elems[d].slice
        assert isinstance(index, cst.Index)
        elems[d] = elems[d].with_changes(slice=index.with_changes(value=cst.Name(self.row)))
        return updated.with_changes(slice=elems)

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if not m.matches(original, PROGRAM_ID):
            return updated
        arg = original.args[0].value if original.args else None
        check(isinstance(arg, cst.Integer), "a program_id / num_programs axis is not a literal")
        assert isinstance(arg, cst.Integer)
        if int(arg.evaluated_value) != self.axis:
            return updated
        if "num_programs" in code(original.func):
            return cst.parse_expression(f"({code(updated)} * {self.rows})")
        return cst.parse_expression(f"({code(updated)} * {self.rows} + {self.row})")


def _grid_edit(loc: Located, node: cst.Call, axis: int, by: int) -> dict[cst.CSTNode, cst.CSTNode]:
    """The grid's extent along `axis` divided by `by` (`H` -> `H // by`)."""
    _holder, arg = grid_spec_keyword(loc, node, "grid")
    check(arg is not None, "the pallas_call has no grid= pallasopt can find")
    assert arg is not None
    grid = resolve(loc, node, arg.value)
    check(isinstance(grid, cst.Tuple), "the grid is not written as a tuple")
    assert isinstance(grid, cst.Tuple)
    elem = grid.elements[axis].value
    atomic = isinstance(elem, cst.Name | cst.Integer | cst.Attribute | cst.Call | cst.Subscript)
    text = code(elem) if atomic else f"({code(elem)})"
    return {elem: cst.parse_expression(f"{text} // {by}")}


def _block_edits(
    loc: Located, node: cst.Call, facts: CallFacts, walked: tuple[tuple[int, int], ...], by: int
) -> dict[cst.CSTNode, cst.CSTNode]:
    """Each walked operand's literal one-row block dim becomes `by` (a spec shared with an operand the axis does not
    walk the same way is declined)."""
    specs = spec_nodes(loc, node)
    check(len(specs) == len(facts.operands), "cannot read every BlockSpec")
    rows = dict(walked)
    edits: dict[cst.CSTNode, cst.CSTNode] = {}
    for k, d in walked:
        spec = specs[k]
        sharing = [j for j, s in enumerate(specs) if s is spec]
        check(all(rows.get(j) == d for j in sharing), f"{facts.operands[k].name}'s BlockSpec is shared with another")
        shape, _ = blockspec_parts(spec)
        ok = isinstance(shape, cst.Tuple) and len(shape.elements) == len(facts.operands[k].shape)
        check(ok, f"{facts.operands[k].name}'s block shape is not a literal tuple")
        assert isinstance(shape, cst.Tuple)
        elem = shape.elements[d].value
        check(
            isinstance(elem, cst.Integer) and elem.value == "1",
            f"{facts.operands[k].name}'s block is written {code(elem)} along the axis, not a literal 1",
        )
        edits[elem] = cst.Integer(str(by))
    return edits
