"""grid-order: permute the grid axes of a pallas_call (grid, index maps, program_id uses and semantics together)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import ClassVar

import libcst as cst
import libcst.matchers as m

from ..cost_model.hardware import Chip
from ..cost_model.roofline import estimate_call
from ..errors import check
from ..ir.cst_edit import replace_many, semantics_edit
from ..ir.kernel_ir import KernelIR
from ..ir.matchers import (
    PROGRAM_ID,
    Located,
    find_call_node,
    grid_spec_keyword,
    helper_reading_program_id,
    kernel_body,
    keyword,
    resolve_local,
    spec_nodes,
)
from ..ir.pipelining import order_keeps_outputs_consecutive
from .base import Pass


@dataclass(frozen=True)
class GridOrderPass(Pass):
    """Reorder the grid axes of one pallas_call; `order` lists the old axes from outermost to innermost.

    The pipeline re-fetches a block only when its index changes between consecutive steps, so the axis order decides
    how often each operand is read from HBM (e.g. keep a large operand's block fixed across the inner axis).
    Rewrites the grid, every index map (lambda parameters reordered, or wrapped), `pl.program_id`/`pl.num_programs`
    in the kernel and the dimension semantics. Only orders that keep reduction axes innermost are valid.
    """

    name: ClassVar[str] = "grid-order"
    call: int = 0
    order: tuple[int, ...] = ()

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        out: list[Pass] = []
        for c in ir.calls:
            n = len(c.grid)
            if n < 2 or n > 5 or c.body.has_dma or c.num_scalar_prefetch:
                continue
            base = estimate_call(c, chip).bytes
            scored = []
            for perm in itertools.permutations(range(n)):
                if perm == tuple(range(n)) or not order_keeps_outputs_consecutive(c, perm):
                    continue
                traffic = estimate_call(c, chip, order=perm).bytes
                if traffic < base:
                    scored.append((traffic, perm))
            scored.sort()
            out.extend(cls(call=c.index, order=perm) for _, perm in scored)  # fewest bytes first: strategies truncate
        return tuple(out)

    def apply(self, ir: KernelIR) -> KernelIR:
        check(0 <= self.call < len(ir.calls), f"no pallas_call #{self.call}")
        facts = ir.calls[self.call]
        n = len(facts.grid)
        perm = self.order
        check(sorted(perm) == list(range(n)), f"order must be a permutation of 0..{n - 1}")
        check(perm != tuple(range(n)), "the order is already this")
        check(
            order_keeps_outputs_consecutive(facts, perm),
            "this order would revisit output blocks non-consecutively (reductions go innermost)",
        )
        check(not facts.body.has_dma, "kernels with manual DMA chains are not reordered")
        inv = {old: new for new, old in enumerate(perm)}
        loc = Located.of(ir.module)
        node = find_call_node(loc, facts)
        edits: dict[cst.CSTNode, cst.CSTNode] = {}
        _permute_grid(loc, node, perm, edits)
        for spec in {id(s): s for s in spec_nodes(loc, node) if isinstance(s, cst.Call)}.values():
            _permute_index_map(spec, perm, inv, n, edits)
        _renumber_program_ids(loc, node, inv, edits)
        if facts.dimension_semantics is not None:
            check(len(facts.dimension_semantics) == len(perm), "dimension_semantics length differs from the grid")
            edits.update(semantics_edit(loc, node, facts, lambda sem: tuple(sem[a] for a in perm)))
        new = ir.with_module(replace_many(loc.wrapper.module, edits), self.spec())
        for before, after in zip(ir.calls, new.calls, strict=True):
            if before.index != self.call:
                check(
                    before.grid == after.grid
                    and [o.index_map.depends_on for o in before.operands]
                    == [o.index_map.depends_on for o in after.operands],
                    f"the rewrite also changed pallas_call #{after.index} (they share code); not reordered",
                )
        got = new.calls[self.call]
        check(got.grid == tuple(facts.grid[a] for a in perm), f"the rewrite traced to grid {got.grid}")
        if facts.dimension_semantics is not None:
            want_sem = tuple(facts.dimension_semantics[a] for a in perm)
            check(got.dimension_semantics == want_sem, f"the dimension semantics traced to {got.dimension_semantics}")
        for o_old, o_new in zip(facts.operands, got.operands, strict=True):
            want = tuple(tuple(sorted(inv[a] for a in d)) for d in o_old.index_map.depends_on)
            check(o_new.index_map.depends_on == want, f"{o_old.name}'s index map did not follow the new order")
        return new


def _permute_grid(loc: Located, call: cst.Call, perm: tuple[int, ...], edits: dict[cst.CSTNode, cst.CSTNode]) -> None:
    holder, arg = grid_spec_keyword(loc, call, "grid")
    check(arg is not None, "the pallas_call has no grid= pallasopt can find")
    assert arg is not None
    grid = arg.value
    while isinstance(grid, cst.Name):
        grid = resolve_local(loc, holder, grid.value)  # type: ignore[assignment]
    check(isinstance(grid, cst.Tuple), "the grid is not written as a tuple")
    assert isinstance(grid, cst.Tuple)
    elems = list(grid.elements)
    check(len(elems) == len(perm), "the grid tuple's length does not match the traced grid")
    new_elems = [elems[old].with_changes(comma=elems[new].comma) for new, old in enumerate(perm)]
    edits[grid] = grid.with_changes(elements=new_elems)


def _permute_index_map(
    spec: cst.Call, perm: tuple[int, ...], inv: dict[int, int], n: int, edits: dict[cst.CSTNode, cst.CSTNode]
) -> None:
    positional = [a for a in spec.args if a.keyword is None]
    im = keyword(spec, "index_map") or (positional[1] if len(positional) >= 2 else None)
    if im is None:
        return  # memory_space-only specs have no index map
    fn = im.value
    if isinstance(fn, cst.Lambda) and len(fn.params.params) >= n and fn.params.star_arg is cst.MaybeSentinel.DEFAULT:
        params = list(fn.params.params)
        grid_params = [params[old].with_changes(comma=params[new].comma) for new, old in enumerate(perm)]
        edits[fn] = fn.with_changes(params=fn.params.with_changes(params=grid_params + params[n:]))
        return
    names = ", ".join(f"_g{i}" for i in range(n))
    call_args = ", ".join(f"_g{inv[a]}" for a in range(n))
    wrapper = cst.parse_expression(f"lambda {names}, *_rest: ({cst.Module([]).code_for_node(fn)})({call_args}, *_rest)")
    edits[fn] = wrapper


def _renumber_program_ids(
    loc: Located, call: cst.Call, inv: dict[int, int], edits: dict[cst.CSTNode, cst.CSTNode]
) -> None:
    kernel = kernel_body(loc, call)
    check(kernel is not None, "cannot find the kernel function to renumber its program_id uses")
    assert kernel is not None
    helper = helper_reading_program_id(loc.wrapper.module, kernel)
    check(helper is None, f"the kernel's helper {helper} uses program_id; not reordered")
    for use in m.findall(kernel, PROGRAM_ID):
        assert isinstance(use, cst.Call)
        arg = use.args[0].value if use.args else None
        check(isinstance(arg, cst.Integer), "a program_id/num_programs axis is not a literal")
        assert isinstance(arg, cst.Integer)
        edits[arg] = arg.with_changes(value=str(inv[int(arg.evaluated_value)]))
