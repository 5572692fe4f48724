"""stage-masked: an input block that spans a whole masked axis is fetched block by block, its masked tail never."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import libcst as cst
import libcst.matchers as m

from ..cost_model.hardware import Chip
from ..errors import check
from ..ir.builders import fresh_name, tuple_expr
from ..ir.cst_edit import (
    add_scratch,
    append_grid_axis,
    grid_locals,
    nested_into,
    replace_many,
    semantics_edit,
    with_grid_index,
)
from ..ir.facts import CallFacts, Operand
from ..ir.kernel_ir import KernelIR
from ..ir.mask_bounds import Constraint, Mask, Reader, clamp_text, needed_text, static_value
from ..ir.matchers import (
    blockspec_parts,
    code,
    docstring_lines,
    free_names,
    helper_reading_program_id,
    is_call_to,
    spec_nodes,
    spec_site,
    used_names,
)
from ..ir.scope import Scope, statements
from .base import Pass, kernel_site

# Block sizes offered along the staged axis: lane multiples, each a divisor of the traced size below it.
BLOCKS = (256, 512, 1024)


def candidate(call: CallFacts) -> tuple[int, ...]:
    """Cheap screen from the traced facts: the inputs whose block spans a whole axis of 256 or more elements (its
    index along it fixed at 0), in a body that builds a mask from iotas and selects with it."""
    prims = set(call.body.primitives)
    if call.library_site is not None or call.body.has_dma or call.num_scalar_prefetch or "iota" not in prims:
        return ()
    if not prims & {"select_n", "select"}:
        return ()
    return tuple(op.position for op in call.inputs if _whole_dims(op))


def _whole_dims(op: Operand) -> tuple[int, ...]:
    """Block dims of `op` that span the whole array (>= 256 elements) and whose block index is always 0."""
    if not op.is_pipelined or op.index_map.affine is None:
        return ()
    return tuple(
        d
        for d, (b, n) in enumerate(zip(op.block_shape, op.shape, strict=True))
        if b == n and n >= 256 and not any(op.index_map.affine[d])
    )


@dataclass(frozen=True)
class _Load:
    """The one read of the staged ref: `name = <elementwise of ref[idx]>` at top-level statement `at`; `dims[v]` is
    the ref dim of the loaded value's dim v."""

    at: int
    name: str
    dims: tuple[int, ...]


@dataclass(frozen=True)
class StageMaskedPass(Pass):
    """Fetch an input block that spans a whole axis in `block`-wide pieces along that axis, skipping the pieces the
    kernel's mask throws away. The kernel reads the block once, as `v = ref[idx]` (elementwise after it: a cast, a
    scale), and the next use of `v` is `jnp.where(cond, v, fill)`, `cond` comparing `program_id * block + iota`
    indices (a causal `cols <= rows`, a window). The grid gains a last axis over the pieces: the input's index map
    takes it, clamped into the range of pieces the mask needs for the current block of the other axes, so a step
    outside the range repeats the index and the pipeline fetches nothing; each needed piece is copied into a VMEM
    scratch of the old block's shape, and the kernel's old body runs on that scratch on the last step of the new
    axis (so the outputs are written once, as before). Pieces never fetched hold stale data, which the `where`
    replaces before anything reads them.

    Meant for memory-bound kernels that read a whole masked row: fused_33 (causal softmax over (4, 16, 2048, 2048)
    bf16 scores) reads 62-72% of the scores it read before. Costs a VMEM copy of every fetched piece and more grid
    steps, and the body's work moves onto the last piece's step, where it no longer overlaps the fetches: on a TPU
    v5e fused_33 ran 1.826 -> 2.101 ms (`block=256`) and 1.959 ms (512) where the compiler tier said 1.680 -> 1.537
    (bench/results/hw-v5e-2026-12-06f). The search offers it only where the chip times candidates. The piece is
    `block` when it divides the axis at run time, else the whole axis (one piece: the old kernel), so every size the
    original ran at still runs. Declines a kernel whose masked value is used before the mask, a mask on another
    value, scalar prefetch, manual DMA, a helper function reading program ids, index maps that are not lambdas.
    Parameters: `call`, `operand` (input position), `block`.
    """

    name: ClassVar[str] = "stage-masked"
    # A [C] gain that was a chip loss on the one bench kernel it fits (see above): the deviceless tiers cannot rank
    # it, so the search offers it when it times candidates on the target chip, or when named; `apply` always can.
    search_needs_hardware: ClassVar[bool] = True
    call: int = 0
    operand: int = 0
    block: int = 512

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        out: list[Pass] = []
        for c in ir.calls:
            for position in candidate(c):
                op = c.inputs[position]
                sizes = {op.shape[d] for d in _whole_dims(op)}
                out += [
                    cls(call=c.index, operand=position, block=b)
                    for b in BLOCKS
                    if any(n % b == 0 and b < n for n in sizes)
                ]
        return tuple(out)

    def apply(self, ir: KernelIR) -> KernelIR:
        check(0 <= self.call < len(ir.calls), f"no pallas_call #{self.call}")
        check(self.block > 0 and self.block % 128 == 0, "the block must be a positive multiple of 128")
        facts = ir.calls[self.call]
        check(
            self.operand in candidate(facts),
            f"input {self.operand} has no block spanning a whole axis in a kernel with an iota mask"
            " (no scalar prefetch, no manual DMA)",
        )
        op = facts.inputs[self.operand]
        ks = kernel_site(ir, facts, " (the clamped index map needs jnp.minimum)")
        loc, node, kernel, jnp, pltpu, pl = ks.loc, ks.node, ks.kernel, ks.jnp, ks.pltpu, ks.pl
        helper = helper_reading_program_id(loc.wrapper.module, kernel)
        check(helper is None, f"the kernel calls `{helper}`, which reads program ids outside the kernel")
        refs = [p.name.value for p in kernel.params.params]
        n_refs = len(facts.inputs) + len(facts.outputs) + len(facts.scratch)
        check(
            len(refs) == n_refs and kernel.params.star_arg is cst.MaybeSentinel.DEFAULT,
            "the kernel's positional parameters do not match the refs",
        )
        ref = refs[self.operand]
        ref_dims = tuple(d for d, b in enumerate(op.block_shape) if b is not None)  # kernel ref dim -> block dim
        body = statements(kernel)
        scope = Scope.of(body)
        load = _load(body, ref, len(ref_dims))
        namespace = vars(ir.workload.module) if ir.workload is not None else {}
        whole = {v for v, r in enumerate(load.dims) if ref_dims[r] in _whole_dims(op)}
        value_dim, mask = _mask(body, load, scope, whole)
        ref_dim = load.dims[value_dim]
        dim = ref_dims[ref_dim]
        axis = len(facts.grid)
        specs = spec_nodes(loc, node)
        shape_texts = _shape_texts(specs, refs, facts)
        site, spec = spec_site(loc, node, self.operand, len(specs), len(facts.inputs))
        shape, lam = blockspec_parts(spec)
        check(isinstance(shape, cst.Tuple | cst.List), f"input {self.operand}'s block shape is not a literal tuple")
        check(isinstance(lam, cst.Lambda), f"input {self.operand}'s index map is not a lambda")
        assert isinstance(shape, cst.Tuple | cst.List) and isinstance(lam, cst.Lambda)
        full = code(shape.elements[dim].value)
        piece = f"({self.block} if {full} % {self.block} == 0 else {full})"
        grid_ext = f"{full} // {piece}"

        # the index map: sees the mask through the ref shapes' BlockSpec texts, the piece as its wrapper-side text
        idx_mask = _pieces(_substituted(mask, shape_texts), value_dim, axis, piece)
        free = _text_names(idx_mask) - set(namespace) - {piece}
        free -= {n.value for n in m.findall(shape, m.Name()) if isinstance(n, cst.Name)}
        check(not free, f"the mask reads {sorted(free)}, which the index map cannot see (make them module constants)")
        params = [p.name.value for p in lam.params.params]
        check(len(params) == axis, f"input {self.operand}'s index map does not take the {axis} grid indices")
        j = fresh_name(set(params) | used_names(lam) | used_names(shape), "j")
        clamped = clamp_text(j, idx_mask, axis, _signs(piece, namespace), lambda a: ([*params, j])[a], pl, jnp)
        check(clamped is not None, "cannot solve the mask for a range of pieces along the staged axis")
        check(isinstance(lam.body, cst.Tuple), f"input {self.operand}'s index map does not return a literal tuple")
        assert isinstance(lam.body, cst.Tuple) and clamped is not None
        items = [code(e.value) for e in lam.body.elements]
        check(len(items) == len(op.block_shape) and items[dim] == "0", "the staged axis' block index is not 0")
        items[dim] = clamped
        new_shape = [code(e.value) for e in shape.elements]
        new_shape[dim] = piece
        staged_spec = cst.parse_expression(
            f"{code(spec.func)}({code(tuple_expr(new_shape))}, lambda {', '.join([*params, j])}: "
            f"{code(tuple_expr(items))})"
        )

        edits: dict[cst.CSTNode, cst.CSTNode] = {site: staged_spec}
        for k, other in enumerate(specs):
            if k == self.operand:
                continue
            _, other_lam = blockspec_parts(other)
            if other_lam is None:
                continue
            check(isinstance(other_lam, cst.Lambda), f"operand {k}'s index map is not a lambda")
            assert isinstance(other_lam, cst.Lambda)
            if other_lam not in edits:
                edits[other_lam] = with_grid_index(other_lam, "_piece")[0]
        append_grid_axis(loc, node, grid_ext, edits)
        edits.update(semantics_edit(loc, node, facts, lambda cur: (*cur, "arbitrary") if cur else cur))
        scratch_shape = [code(shape.elements[d].value) for d in ref_dims]
        add_scratch(
            loc,
            node,
            [cst.parse_expression(f"{pltpu}.VMEM({code(tuple_expr(scratch_shape))}, {jnp}.{op.dtype})")],
            edits,
        )
        edits = nested_into(loc, edits)
        edits[kernel] = _kernel(kernel, body, self.operand, ref_dim, len(ref_dims), mask, value_dim, axis, pl)
        return ir.with_module(replace_many(loc.wrapper.module, edits), self.spec())


def _substituted(mask: Mask, texts: dict[str, str]) -> Mask:
    """`mask` with every `<ref>.shape[k]` inside its constant, coefficient and extent texts replaced by `texts`."""

    class Sub(cst.CSTTransformer):
        def leave_Subscript(self, original: cst.Subscript, updated: cst.Subscript) -> cst.BaseExpression:
            new = texts.get(code(original.with_changes(lpar=[], rpar=[])))
            return _atom(cst.parse_expression(new)) if new is not None else updated

    def sub(t: str | None) -> str | None:
        if t is None:
            return None
        e = cst.parse_expression(t).visit(Sub())
        assert isinstance(e, cst.BaseExpression)
        return code(_bare(e) if _atomic(e) else e)

    if mask.leaf is not None:
        f = mask.leaf.form
        form = replace(
            f,
            iotas=tuple((d, s, sub(e)) for d, s, e in f.iotas),
            pids=tuple((a, s, sub(c) or c) for a, s, c in f.pids),
            consts=tuple((s, sub(t) or t) for s, t in f.consts),
        )
        return replace(mask, leaf=Constraint(form))
    return replace(mask, parts=tuple(_substituted(p, texts) for p in mask.parts))


def _atomic(e: cst.BaseExpression) -> bool:
    return isinstance(e, cst.Name | cst.Integer | cst.Attribute | cst.Subscript | cst.Call)


def _bare(e: cst.BaseExpression) -> cst.BaseExpression:
    return e.with_changes(lpar=[], rpar=[])


def _atom(e: cst.BaseExpression) -> cst.BaseExpression:
    """`e` without redundant parentheses when it is atomic, else parenthesized."""
    if _atomic(e):
        return _bare(e)
    return e if e.lpar else e.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _text_names(mask: Mask) -> set[str]:
    """The names the mask's constant and coefficient texts read (after substitutions)."""
    texts = [t for c in mask.constraints() for t in (*(t for _, t in c.form.consts), *(k for _, _, k in c.form.pids))]
    return set().union(set(), *(free_names(cst.parse_expression(t)) for t in texts))


def _shape_texts(specs: list[cst.BaseExpression | None], refs: list[str], facts: CallFacts) -> dict[str, str]:
    """`<ref>.shape[k]` -> the text of that dim in the ref's BlockSpec (what an index map can see of it)."""
    out: dict[str, str] = {}
    operands = [*facts.inputs, *facts.outputs]
    for k, spec in enumerate(specs[: len(operands)]):
        shape, _ = blockspec_parts(spec)
        if not isinstance(shape, cst.Tuple | cst.List):
            continue
        kept = [e.value for e, b in zip(shape.elements, operands[k].block_shape, strict=False) if b is not None]
        for d, e in enumerate(kept):
            out[f"{refs[k]}.shape[{d}]"] = code(e)
    return out


def _signs(piece: str, namespace: dict[str, Any]) -> Any:
    """The sign of a coefficient text: the piece (positive by construction), else its module-level value's."""

    def sign(text: str) -> int | None:
        if text.strip() in (piece, f"({piece})"):
            return 1
        v = static_value(text, namespace)
        return (v > 0) - (v < 0) if isinstance(v, int) else None

    return sign


def _elementwise_of(expr: cst.BaseExpression, ref: str) -> cst.Subscript | None:
    """The one `ref[...]` read in `expr` when `expr` is elementwise in it: every call around the read is an
    `.astype(...)` (arithmetic with names, numbers and calls that do not read it, e.g. `math.sqrt(D)`, is fine);
    else None."""
    reads = [s for s in m.findall(expr, m.Subscript(value=m.Name(ref))) if isinstance(s, cst.Subscript)]
    if len(reads) != 1:
        return None
    read = reads[0]
    for call in m.findall(expr, m.Call()):
        assert isinstance(call, cst.Call)
        around = any(n is read for n in m.findall(call, m.Subscript(value=m.Name(ref))))
        if around and not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "astype"):
            return None
    return read


def _load(body: list[cst.BaseStatement], ref: str, n_dims: int) -> _Load:
    """The statement that reads the staged ref (see `_Load`); declines any other use but `ref.shape` / `ref.dtype`."""
    whole = cst.IndentedBlock(body=body)
    uses = len(m.findall(whole, m.Name(ref)))
    check(uses > 0, f"the kernel never reads `{ref}`")
    loads = []
    for i, s in enumerate(body):
        if not (isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1 and isinstance(s.body[0], cst.Assign)):
            continue
        a = s.body[0]
        if len(a.targets) == 1 and isinstance(a.targets[0].target, cst.Name):
            read = _elementwise_of(a.value, ref)
            if read is not None:
                loads.append((i, a.targets[0].target.value, read))
    check(len(loads) == 1, f"`{ref}` is not read once, as `v = {ref}[...]` (elementwise after it) at the top level")
    at, name, read = loads[0]
    attrs = m.Attribute(value=m.Name(ref), attr=m.Name("shape") | m.Name("dtype"))
    check(
        uses == 1 + len(m.findall(whole, attrs)),
        f"`{ref}` is used other than by one read and its .shape / .dtype (written, or passed on)",
    )
    return _Load(at, name, _value_dims(read, ref, n_dims))


def _integer_index(e: cst.BaseSlice) -> bool:
    return isinstance(e, cst.Index) and isinstance(e.value, cst.Integer)


def _value_dims(read: cst.Subscript, ref: str, n_dims: int) -> tuple[int, ...]:
    """The ref dims the value `ref[idx]` keeps: leading integer indices drop dims, then `...` or whole slices."""
    elems = [e.slice for e in read.slice]
    lead = 0
    while lead < len(elems) and _integer_index(elems[lead]):
        lead += 1
    rest = elems[lead:]
    ok = all(
        (isinstance(e, cst.Index) and isinstance(e.value, cst.Ellipsis))
        or (isinstance(e, cst.Slice) and e.lower is None and e.upper is None and e.step is None)
        for e in rest
    )
    check(ok and len(elems) <= n_dims, f"`{ref}` is read with an index pallasopt does not follow: `{code(read)}`")
    return tuple(range(lead, n_dims))


def _iota_ranks(expr: cst.BaseExpression, env: Any, depth: int = 0) -> set[int | None]:
    """The ranks of the iota shapes `expr` builds from (through locals), None for a shape that is not a literal."""
    out: set[int | None] = set()
    if depth > 20:
        return {None}
    for n in m.findall(expr, m.Name()):
        if isinstance(n, cst.Name) and n.value in env:
            out |= _iota_ranks(env[n.value], env, depth + 1)
    for c in m.findall(expr, m.Call()):
        if isinstance(c, cst.Call) and is_call_to(c, "broadcasted_iota") and len(c.args) >= 2:
            shape = c.args[1].value
            while isinstance(shape, cst.Name) and shape.value in env:
                shape = env[shape.value]
            out.add(len(shape.elements) if isinstance(shape, cst.Tuple | cst.List) else None)
    return out


def _mask(body: list[cst.BaseStatement], load: _Load, scope: Scope, whole: set[int]) -> tuple[int, Mask]:
    """The value dim to stage (an iota of the mask walks it; the block spans its ref dim whole: `whole`, value dims)
    and the mask: the first use of the loaded value after its read is `w = jnp.where(cond, v, fill)` at the top
    level, and `v` is not used after it unless `w` is `v` rebound (every later read sees the masked value)."""
    v = load.name
    where_at = next((i for i in range(load.at + 1, len(body)) if m.findall(body[i], m.Name(v))), None)
    check(where_at is not None, f"the loaded `{v}` is never used")
    assert where_at is not None
    s = body[where_at]
    ok = isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1 and isinstance(s.body[0], cst.Assign)
    check(ok, f"the first use of `{v}` is not an assignment `w = jnp.where(cond, {v}, fill)`")
    assert isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], cst.Assign)
    assign = s.body[0]
    w = assign.value
    check(
        isinstance(w, cst.Call) and is_call_to(w, "where") and len(w.args) == 3,
        f"the first use of `{v}` is not `jnp.where(cond, {v}, fill)`",
    )
    assert isinstance(w, cst.Call)
    x = w.args[1].value
    check(isinstance(x, cst.Name) and x.value == v, f"`{v}` is not the where's second argument itself")
    cond = w.args[0].value
    check(not m.findall(cond, m.Name(v)) and not m.findall(w.args[2].value, m.Name(v)), f"the mask reads `{v}`")
    target = assign.targets[0].target if len(assign.targets) == 1 else None
    check(isinstance(target, cst.Name), "the masked value is not assigned to one name")
    assert isinstance(target, cst.Name)
    if target.value != v:
        check(not any(m.findall(t, m.Name(v)) for t in body[where_at + 1 :]), f"`{v}` is used unmasked after the mask")
    rank = len(load.dims)
    ranks = _iota_ranks(cond, scope.values)
    check(ranks == {rank}, f"the mask's iotas are not literal shapes of the masked value's rank {rank}")
    mask = Reader(scope.values, is_call_to).mask(cond)
    check(mask is not None, "the where's condition does not compare program_id * block + iota indices")
    assert mask is not None
    walked = {d for c in mask.constraints() for d, _, _ in c.form.iotas if d in whole}
    check(len(walked) == 1, "the mask's iotas do not walk exactly one axis the block spans whole")
    return walked.pop(), mask


def _pieces(mask: Mask, dim: int, axis: int, piece: str) -> Mask:
    """`mask` with each iota over value dim `dim` written `program_id(axis) * piece + iota` (the iota's extent
    `piece`): the same index, split into pieces along a new grid axis."""
    if mask.leaf is not None:
        f = mask.leaf.form
        iotas = tuple((d, s, piece if d == dim else e) for d, s, e in f.iotas)
        pids = f.pids + tuple((axis, s, piece) for d, s, _ in f.iotas if d == dim)
        return replace(mask, leaf=Constraint(replace(f, iotas=iotas, pids=pids)))
    return replace(mask, parts=tuple(_pieces(p, dim, axis, piece) for p in mask.parts))


def _kernel(
    kernel: cst.FunctionDef,
    body: list[cst.BaseStatement],
    position: int,
    ref_dim: int,
    n_dims: int,
    mask: Mask,
    value_dim: int,
    axis: int,
    pl: str,
) -> cst.FunctionDef:
    """The kernel staging the pieces into the scratch (the old ref's name, now its last parameter) and running the
    old body on the last piece (`body`: the kernel's statements; `value_dim`: the dim of the masked value staged in
    pieces). Program ids are read at the top (interpret mode cannot lower them in a `pl.when`)."""
    params = list(kernel.params.params)
    ref = params[position].name.value
    taken = used_names(kernel)
    blk, j, tk, stage, last = (fresh_name(taken, f) for f in (f"{ref}_piece", "piece", "piece_len", "_stage", "_body"))
    grid = grid_locals([kernel], taken, also={a for c in mask.constraints() for a, _, _ in c.form.pids}, counts=True)
    names = grid.pids

    first = docstring_lines(body)
    doc, body = body[:first], body[first:]
    check(
        not any(m.findall(st, m.Return()) for st in body if not isinstance(st, cst.FunctionDef)),
        "the kernel returns early",
    )
    old = [grid.use(st) for st in body]
    needed = needed_text(_pieces(_substituted(mask, {}), value_dim, axis, tk), lambda a: j if a == axis else names[a])
    idx = ", ".join(
        f"{pl}.ds({pl}.multiple_of({j} * {tk}, {tk}), {tk})" if d == ref_dim else ":" for d in range(n_dims)
    )
    head = [*grid.bind(pl), f"{j} = {pl}.program_id({axis})", f"{tk} = {blk}.shape[{ref_dim}]"]
    text = "\n".join(head) + (
        f"\n\n@{pl}.when({needed})\ndef {stage}():\n    {ref}[{idx}] = {blk}[...]\n\n"
        f"@{pl}.when({j} == {pl}.num_programs({axis}) - 1)\ndef {last}():\n    pass\n"
    )
    new = list(cst.parse_module(text).body)
    blank = [cst.EmptyLine(indent=False)]
    new[-2] = new[-2].with_changes(leading_lines=blank)
    when = new[-1]
    assert isinstance(when, cst.FunctionDef)
    new[-1] = when.with_changes(body=when.body.with_changes(body=old), leading_lines=blank)
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    params[position] = params[position].with_changes(name=cst.Name(blk))
    params[-1] = params[-1].with_changes(comma=comma)
    params.append(cst.Param(cst.Name(ref)))
    return kernel.with_changes(
        params=kernel.params.with_changes(params=params),
        body=kernel.body.with_changes(body=[*doc, *new]),
    )
