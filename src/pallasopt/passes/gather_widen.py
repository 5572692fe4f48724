"""gather-widen: a BlockSpec gather through a scalar-prefetched table fetches k table entries per grid step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import libcst as cst

from ..cost_model.hardware import Chip
from ..errors import PassNotApplicable, check
from ..ir.cst_edit import ensure_pltpu, replace_many
from ..ir.facts import CallFacts, Operand
from ..ir.kernel_ir import KernelIR
from ..ir.matchers import (
    Located,
    call_site,
    code,
    enclosing_function,
    find_call_node,
    grid_spec_keyword,
    keyword,
    module_names,
    resolve,
)
from .base import Pass

WIDTHS = (2, 4, 8, 16, 32)  # table entries per grid step offered
MAX_REFS = 80  # inputs after widening: Mosaic passes every ref as a kernel argument

# The module-level helpers the rewrite calls (added once per module). `{pltpu}` is the module's alias for
# jax.experimental.pallas.tpu. The kernel wrapper copies the k fetched blocks of each gathered input side by side
# into one VMEM buffer and runs the original kernel on it, so the body is left as it is.
HELPERS = '''

def _gather_widen_steps(n, k):
    """The widened grid axis: n table entries, k per step (gather-widen)."""
    if n % k:
        raise ValueError(
            f"gather-widen{{{{k={{k}}}}}}: this kernel was rewritten to fetch {{k}} table entries per grid step and "
            f"this size has {{n}}, not a multiple of {{k}}; run the original kernel (or a smaller k) at this size"
        )
    return n // k


def _gather_widen_specs(spec, axis, k):
    """k copies of `spec`: copy j reads the block the original read at step k * i + j of grid axis `axis`."""
    import dataclasses

    def shifted(j):
        def index_map(*idx):
            idx = list(idx)
            idx[axis] = idx[axis] * k + j
            return spec.index_map(*idx)

        return dataclasses.replace(spec, index_map=index_map)

    return [shifted(j) for j in range(k)]


def _gather_widen_buffer(spec, array, k, cdim):
    """The VMEM buffer the k blocks of one gathered input are copied into, side by side along block dim `cdim`."""
    shape = [d for d in spec.block_shape if d is not None]
    shape[cdim] *= k
    return {pltpu}.VMEM(tuple(shape), array.dtype)


def _gather_widen_kernel(kernel, n_prefetch, n_in, gathered, k, *refs):
    """Run `kernel` with each gathered input (position -> block dim) as one buffer holding its k blocks."""
    bufs = refs[len(refs) - len(gathered) :]
    head, rest = refs[:n_prefetch], refs[n_prefetch : len(refs) - len(gathered)]
    ins, i = [], 0
    for pos in range(n_in):
        if pos in gathered:
            buf, cdim = bufs[list(gathered).index(pos)], gathered[pos]
            for j, r in enumerate(rest[i : i + k]):
                n = r.shape[cdim]
                buf[(slice(None),) * cdim + (slice(j * n, (j + 1) * n),)] = r[...]
            ins.append(buf)
            i += k
        else:
            ins.append(rest[i])
            i += 1
    kernel(*head, *ins, *rest[i:])
'''


@dataclass(frozen=True)
class _Gather:
    """What the rewrite needs to know about one call."""

    axis: int  # the grid axis whose index goes through the table
    inputs: tuple[Operand, ...]  # the gathered inputs
    cdims: tuple[int, ...]  # per gathered input: the kernel block dim its k blocks are laid side by side along


def _squeezed_dim(o: Operand, axis: int) -> int | None:
    """The array dim of `o` that is squeezed out of the block and indexed through the table by grid axis `axis`."""
    dims = [d for d, b in enumerate(o.block_shape) if b is None and axis in o.index_map.depends_on[d]]
    return dims[0] if len(dims) == 1 else None


def analyse(call: CallFacts) -> _Gather | str:
    """The gather of `call`, or why it has none this pass can widen."""
    if call.library_site is not None:
        return "a library's kernel: only the values this file passes to it can change"
    if call.num_scalar_prefetch == 0:
        return "no scalar-prefetch operands (no table-driven gather)"
    if call.body.has_dma:
        return "the kernel does manual DMA (dma-overlap / multi-buffer handle that)"
    if call.input_output_aliases:
        return "the call aliases inputs to outputs (the widened operand list would move their positions)"
    gathered = [o for o in call.inputs if o.is_pipelined and o.index_map.data_dependent]
    if not gathered:
        return "no blocked input has a data-dependent index map"
    axes = {a for o in gathered for d, b in enumerate(o.block_shape) if b is None for a in o.index_map.depends_on[d]}
    reduction = [a for a in sorted(axes) if call.grid[a] > 1 and all(a not in o.index_map.axes for o in call.outputs)]
    if len(reduction) != 1:
        return "no single grid axis, reduced over (no output moves along it), indexes the gathered blocks"
    axis = reduction[0]
    cdims = []
    for o in gathered:
        d = _squeezed_dim(o, axis)
        if d is None:
            return f"{o.name}: no one squeezed block dim is indexed through the table by grid axis {axis}"
        after = [e for e in range(d + 1, len(o.block_shape)) if o.block_shape[e] is not None]
        if not after:
            return f"{o.name}: no block dim after the gathered one to lay the fetched blocks side by side along"
        cdims.append(sum(1 for e in range(after[0]) if o.block_shape[e] is not None))
    others = [o for o in call.inputs if o not in gathered and axis in o.index_map.axes]
    if others:
        return f"{others[0].name} also moves along grid axis {axis} without the table"
    return _Gather(axis, tuple(gathered), tuple(cdims))


@dataclass(frozen=True)
class GatherWidenPass(Pass):
    """Fetch `k` table entries per grid step where a kernel gathers one block per step through a scalar-prefetched
    table (paged attention's page table, `pt[b, p]` in a K/V index map). Each gathered input is passed `k` times
    with index maps reading entries `k * p + j`, so the Pallas pipeline issues k DMAs per step, all double-buffered
    (the next step's k pages arrive while this one computes); a wrapper copies the k blocks side by side into one
    VMEM buffer and runs the original kernel body on it. The grid axis shrinks k-fold: fewer, larger steps where
    per-step overhead dominated (65,536 steps of one 16-token page each in the bench's paged decode).

    The body sees a block k times longer along the dim after the gathered one. Where it turns `pl.program_id(axis)`
    into positions, the kernel parameter bound to that block extent (`page_size=page_size` for a
    `(None, None, page_size, D)` block) is scaled by k; without one the pass declines. The table axis must have a
    multiple of k entries at every size: the rewritten wrapper raises a clear error at sizes where it does not.
    Parameters: `call`, `k`. The gather's manual-DMA form (JAX's paged_attention, `pages_per_compute_block`) is
    the library kernel's own knob.
    """

    name: ClassVar[str] = "gather-widen"
    call: int = 0
    k: int = 8

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        out: list[Pass] = []
        for c in ir.calls:
            g = analyse(c)
            if isinstance(g, str):
                continue
            n = c.grid[g.axis]
            for k in WIDTHS:
                if k < n and n % k == 0 and len(c.inputs) + (k - 1) * len(g.inputs) <= MAX_REFS:
                    out.append(cls(call=c.index, k=k))
        return tuple(out)

    def apply(self, ir: KernelIR) -> KernelIR:
        check(0 <= self.call < len(ir.calls), f"no pallas_call #{self.call}")
        check(self.k >= 2, "k must be at least 2")
        facts = ir.calls[self.call]
        g = analyse(facts)
        check(not isinstance(g, str), str(g))
        assert not isinstance(g, str)
        n = facts.grid[g.axis]
        check(n % self.k == 0, f"grid axis {g.axis} has {n} steps, not a multiple of {self.k}")
        module = with_scratch_keyword(ir.module, facts)
        loc = Located.of(module)
        node = find_call_node(loc, facts)
        edits: dict[cst.CSTNode, cst.CSTNode] = {}
        _widen_grid(loc, node, g.axis, self.k, edits)
        specs = _widen_specs(loc, node, facts, g, self.k, edits)
        operands = _widen_operands(loc, node, facts, g, self.k, edits)
        extent = block_extent(loc, node, g, specs)
        _add_buffers(loc, node, facts, g, self.k, specs, operands, extent, edits)
        _wrap_kernel(loc, node, facts, g, self.k, extent, edits)
        out, pltpu = ensure_pltpu(replace_many(module, edits))  # the import last: the edits find nodes by line
        if "_gather_widen_kernel" not in module_names(out):
            out = _add_helpers(out, pltpu)
        return ir.with_module(out, self.spec())


def _widen_grid(loc: Located, node: cst.Call, axis: int, k: int, edits: dict[cst.CSTNode, cst.CSTNode]) -> None:
    _, arg = grid_spec_keyword(loc, node, "grid")
    check(arg is not None and isinstance(arg.value, cst.Tuple), "the grid is not a tuple written at the call")
    assert arg is not None and isinstance(arg.value, cst.Tuple)
    elts = list(arg.value.elements)
    check(len(elts) > axis, "the grid tuple does not list every axis")
    extent = elts[axis].value
    widened = cst.parse_expression(f"_gather_widen_steps({code(extent)}, {k})")
    edits[extent] = widened


def _spec_elements(loc: Located, node: cst.Call) -> list[cst.Element]:
    _, arg = grid_spec_keyword(loc, node, "in_specs")
    check(arg is not None and isinstance(arg.value, cst.List | cst.Tuple), "in_specs is not a list at the call")
    assert arg is not None and isinstance(arg.value, cst.List | cst.Tuple)
    elts = [e for e in arg.value.elements if isinstance(e, cst.Element)]
    check(len(elts) == len(arg.value.elements), "in_specs has a starred entry")
    return elts


def _widen_specs(
    loc: Located, node: cst.Call, facts: CallFacts, g: _Gather, k: int, edits: dict[cst.CSTNode, cst.CSTNode]
) -> dict[int, cst.BaseExpression]:
    """Each gathered input's spec entry becomes `*_gather_widen_specs(spec, axis, k)`; position -> spec expression."""
    elts = _spec_elements(loc, node)
    check(len(elts) == len(facts.inputs), "in_specs does not list one spec per input")
    out: dict[int, cst.BaseExpression] = {}
    for o in g.inputs:
        e = elts[o.position]
        out[o.position] = e.value
        star = cst.parse_expression(f"[*_gather_widen_specs({code(e.value)}, {g.axis}, {k})]")
        assert isinstance(star, cst.List)
        edits[e] = star.elements[0].with_changes(comma=e.comma)
    return out


def _widen_operands(
    loc: Located, node: cst.Call, facts: CallFacts, g: _Gather, k: int, edits: dict[cst.CSTNode, cst.CSTNode]
) -> dict[int, cst.BaseExpression]:
    """Each gathered operand `x` of the application becomes `*[x] * k`; position -> operand expression."""
    site = call_site(loc, node)
    check(site is not None, "the pallas_call is not applied to positional operands where it is built")
    assert site is not None
    nsp = facts.num_scalar_prefetch
    check(len(site.operands) == nsp + len(facts.inputs), "the call's operands do not match its specs")
    out: dict[int, cst.BaseExpression] = {}
    for o in g.inputs:
        arg = site.apply.args[nsp + o.position]
        out[o.position] = arg.value
        edits[arg] = arg.with_changes(star="*", value=cst.parse_expression(f"[{code(arg.value)}] * {k}"))
    return out


def _add_buffers(
    loc: Located,
    node: cst.Call,
    facts: CallFacts,
    g: _Gather,
    k: int,
    specs: dict[int, cst.BaseExpression],
    operands: dict[int, cst.BaseExpression],
    extent: str | None,
    edits: dict[cst.CSTNode, cst.CSTNode],
) -> None:
    """One VMEM buffer per gathered input after the call's own scratch (the wrapper finds them last); the call's
    own scratch entries sized by the block `extent` are scaled with it."""
    _, arg = grid_spec_keyword(loc, node, "scratch_shapes")
    check(arg is not None, "the call has no scratch_shapes (added before the edits)")
    assert arg is not None
    new = [
        f"_gather_widen_buffer({code(specs[o.position])}, {code(operands[o.position])}, {k}, {cd})"
        for o, cd in zip(g.inputs, g.cdims, strict=True)
    ]
    value = arg.value if extent is None else _scale_tuples(arg.value, extent, k)
    if isinstance(value, cst.List | cst.Tuple):
        old = [code(e.value) for e in value.elements]
        check(all(not isinstance(e, cst.StarredElement) for e in value.elements), "scratch_shapes has a starred entry")
    else:
        old = [f"*{_operand(code(value))}"]
    edits[arg.value] = cst.parse_expression(f"[{', '.join([*old, *new])}]")


def _scale_tuples(expr: cst.BaseExpression, extent: str, k: int) -> cst.BaseExpression:
    """`expr` with every tuple entry that reads exactly `extent` multiplied by k: scratch shaped like the gathered
    block (a per-page f32 copy) grows with it."""

    class Scale(cst.CSTTransformer):
        def leave_Element(self, original: cst.Element, updated: cst.Element) -> cst.Element:
            if code(updated.value) == extent:
                return updated.with_changes(value=cst.parse_expression(f"{_operand(extent)} * {k}"))
            return updated

    out = expr.visit(Scale())
    assert isinstance(out, cst.BaseExpression)
    return out


def with_scratch_keyword(module: cst.Module, facts: CallFacts) -> cst.Module:
    """`module` with an empty `scratch_shapes=[]` where the call (or its grid spec) has none, on the same line."""
    loc = Located.of(module)
    node = find_call_node(loc, facts)
    holder, arg = grid_spec_keyword(loc, node, "scratch_shapes")
    if arg is not None:
        return module
    check(bool(holder.args), "the call holding the grid has no arguments")
    item = cst.parse_expression("f(scratch_shapes=[])")
    assert isinstance(item, cst.Call)
    *rest, last = holder.args
    trailing = last.comma if isinstance(last.comma, cst.Comma) else cst.MaybeSentinel.DEFAULT
    args = [
        *rest,
        last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
        item.args[0].with_changes(comma=trailing),
    ]
    return replace_many(module, {holder: holder.with_changes(args=args)})


def _kernel_arg(node: cst.Call) -> cst.Arg:
    if node.args and node.args[0].keyword is None:
        return node.args[0]
    arg = keyword(node, "kernel")
    check(arg is not None, "cannot find the pallas_call's kernel argument")
    assert arg is not None
    return arg


def _wrap_kernel(
    loc: Located,
    node: cst.Call,
    facts: CallFacts,
    g: _Gather,
    k: int,
    extent: str | None,
    edits: dict[cst.CSTNode, cst.CSTNode],
) -> None:
    """The kernel argument becomes a lambda running `_gather_widen_kernel` around it, with the block-extent
    parameter scaled by k when the body turns the widened axis's program_id into positions."""
    arg = _kernel_arg(node)
    kernel = arg.value
    if g.axis in facts.body.program_id_axes:
        check(extent is not None, "the gathered inputs' block extents along the widened dim are not one expression")
        assert extent is not None
        kernel = _scaled_extent(loc, node, g, k, kernel, extent, edits)
    gathered = ", ".join(f"{o.position}: {cd}" for o, cd in zip(g.inputs, g.cdims, strict=True))
    text = (
        f"lambda *refs: _gather_widen_kernel({code(kernel)}, {facts.num_scalar_prefetch}, {len(facts.inputs)}, "
        f"{{{gathered}}}, {k}, *refs)"
    )
    edits[arg.value] = cst.parse_expression(text)


def _extent_text(loc: Located, node: cst.Call, o: Operand, cdim: int, spec: cst.BaseExpression) -> str:
    """The source text of the block extent gathered input `o` is widened along."""
    call = resolve(loc, node, spec)
    check(isinstance(call, cst.Call) and bool(call.args), f"{o.name}'s spec is not a BlockSpec(...) call")
    assert isinstance(call, cst.Call)
    shape = call.args[0].value if call.args[0].keyword is None else None
    shape = resolve(loc, node, shape) if shape is not None else None
    check(isinstance(shape, cst.Tuple), f"{o.name}'s block shape is not a tuple written in the file")
    assert isinstance(shape, cst.Tuple)
    kept = [e for e in shape.elements if not (isinstance(e.value, cst.Name) and e.value.value == "None")]
    check(len(kept) > cdim, f"{o.name}'s block shape does not match its traced block")
    return code(kept[cdim].value)


def block_extent(loc: Located, node: cst.Call, g: _Gather, specs: dict[int, cst.BaseExpression]) -> str | None:
    """The source text of the block extent every gathered input is widened along (None: not one expression)."""
    try:
        names = {_extent_text(loc, node, o, cd, specs[o.position]) for o, cd in zip(g.inputs, g.cdims, strict=True)}
    except PassNotApplicable:
        return None
    return names.pop() if len(names) == 1 else None


def _factors(text: str) -> set[str]:
    """`text` and, when it is a product, the source text of each factor."""
    out = {text}
    todo = [cst.parse_expression(text)]
    while todo:
        e = todo.pop()
        if isinstance(e, cst.BinaryOperation) and isinstance(e.operator, cst.Multiply):
            todo += [e.left, e.right]
        else:
            out.add(code(e))
    return out


def _scaled_extent(
    loc: Located,
    node: cst.Call,
    g: _Gather,
    k: int,
    kernel: cst.BaseExpression,
    extent: str,
    edits: dict[cst.CSTNode, cst.CSTNode],
) -> cst.BaseExpression:
    """The kernel expression with the keyword bound to the block extent, or to one factor of it, scaled by k
    (`page_size=page_size` for a `page_size * two_hkv` extent); declines when there is not exactly one."""
    factors = _factors(extent)
    partial = resolve(loc, node, kernel)
    found: list[cst.Arg] = []
    if isinstance(partial, cst.Call):
        found = [a for a in partial.args if a.keyword is not None and code(a.value) in factors]
    check(
        len(found) == 1,
        f"the body turns pl.program_id({g.axis}) into positions and no kernel parameter is bound to the block "
        f"extent {extent!r} to scale by k={k}",
    )
    assert isinstance(partial, cst.Call)
    scaled = partial.with_changes(
        args=[
            a.with_changes(value=cst.parse_expression(f"{_operand(code(a.value))} * {k}")) if a is found[0] else a
            for a in partial.args
        ]
    )
    if partial is kernel:
        return scaled
    check(
        enclosing_function(loc, partial) is enclosing_function(loc, node),
        "the kernel's partial is bound outside the function that calls pallas_call",
    )
    edits[partial] = scaled
    return kernel


def _operand(text: str) -> str:
    """`text` as the left operand of a product (parenthesized unless it is a name or attribute)."""
    return text if text.replace(".", "").replace("_", "").isalnum() else f"({text})"


def _add_helpers(module: cst.Module, pltpu: str) -> cst.Module:
    """The helpers, inserted after the module's top-level imports."""
    body = list(module.body)
    at = 0
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.SimpleStatementLine) and any(
            isinstance(x, cst.Import | cst.ImportFrom) for x in stmt.body
        ):
            at = i + 1
    helpers = list(cst.parse_module(HELPERS.format(pltpu=pltpu)).body)
    helpers[0] = helpers[0].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
    return module.with_changes(body=[*body[:at], *helpers, *body[at:]])
