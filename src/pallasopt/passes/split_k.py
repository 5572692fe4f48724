"""split-k: a kernel whose blocks hold a dot's whole contraction gets a grid axis over pieces of it, summed in f32."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import libcst as cst
import libcst.matchers as m

from ..cost_model.hardware import Chip
from ..errors import KernelError, PassNotApplicable, check
from ..ir.body import subjaxprs
from ..ir.builders import fresh_name, parse_statements
from ..ir.cst_edit import (
    add_scratch,
    append_grid_axis,
    grid_locals,
    nested_into,
    replace_many,
    semantics_edit,
    set_compiler_param,
    set_keyword,
    split_specs_on_new_axis,
)
from ..ir.facts import CallFacts
from ..ir.kernel_ir import KernelIR, kernel_jaxpr
from ..ir.matchers import (
    Located,
    blockspec_parts,
    code,
    is_call_to,
    own_kernel,
    pallas_call_nodes,
    spec_nodes,
    used_names,
)
from .base import Pass, kernel_site
from .vmem_limit import needed_step

# Contraction elements per step `choices` offers: multiples of 128 (the lane width: the piece is the minor dim of
# `x @ w.T`'s operands) that split the contraction into several steps at the traced dims and at CHECK_DIMS, so
# the oracle runs the summed form at the module's small dims.
PIECES = (128, 256, 512, 1024, 2048, 4096)
# What may stand between a ref's whole read and the dot: dims permuted or kept in order.
CHAIN = ("transpose", "convert_element_type", "copy", "copy_p")
DOT_FUNCS = ("dot", "matmul", "dot_general", "einsum")


@dataclass(frozen=True)
class Side:
    """One dot operand: the kernel ref (operand position) it is read whole from, and per operand dim the ref dim."""

    position: int
    ref_dims: tuple[int, ...]
    contracted: int  # the ref dim the dot contracts


@dataclass(frozen=True)
class Plan:
    """The kernel's one dot, read from its traced body: its two sides, the contraction length, what the dot
    returns (per output dim the side and ref dim it comes from, and its dtype)."""

    sides: tuple[Side, Side]
    k: int
    out_dims: tuple[tuple[int, int], ...]  # (side, ref dim) per dot output dim
    dtype: str


def candidate(call: CallFacts) -> bool:
    """Cheap screen from the traced facts: a kernel of this module with a dot, no manual DMA or scalar prefetch."""
    return (
        call.library_site is None
        and not call.body.has_dma
        and call.num_scalar_prefetch == 0
        and "dot_general" in call.body.primitives
    )


def plan(ir: KernelIR, facts: CallFacts, dims: dict[str, int] | None = None) -> Plan:
    """The `Plan` of call `facts` traced at `dims`; declines (with the reason) where the body is not one dot whose
    two operands are whole reads of input refs (through transposes and casts only) used nowhere else."""
    jaxpr: Any = kernel_jaxpr(ir, facts.index, dims)
    dots = [e for e in jaxpr.eqns if e.primitive.name == "dot_general"]
    nested = [x for e in jaxpr.eqns for x in _inner_eqns(e) if x.primitive.name == "dot_general"]
    check(not nested, "a dot inside a loop or branch of the kernel: split-k takes one dot in its straight-line body")
    check(len(dots) == 1, f"{len(dots)} dots in the kernel: split-k takes a kernel with one")
    (dot,) = dots
    (lc, rc), (lb, rb) = dot.params["dimension_numbers"]
    check(len(lc) == 1 and len(rc) == 1, "the dot contracts more than one dim")
    uses = _use_counts(jaxpr)
    refs = list(jaxpr.invars)
    n_in = len(facts.inputs)
    sides: list[Side] = []
    ks: set[int] = set()
    for operand, contracted in zip(dot.invars, (lc[0], rc[0]), strict=True):
        ref, dim_map = _whole_read(jaxpr, operand, uses)
        pos = refs.index(ref) - facts.num_scalar_prefetch
        check(0 <= pos < n_in, "a dot operand is read from an output or scratch ref, not an input")
        sides.append(Side(pos, dim_map, dim_map[contracted]))
        ks.add(tuple(getattr(ref.aval, "inner_aval", ref.aval).shape)[dim_map[contracted]])
    check(sides[0].position != sides[1].position, "both dot operands are read from the same ref")
    for s in sides:  # the facts are the module's traced at its own dims: whole blocks there
        op = facts.inputs[s.position]
        bdim = op.block_dim_of(s.contracted)
        aff = op.index_map.affine
        check(
            op.block_shape[bdim] == op.shape[bdim],
            f"input {s.position}'s block already splits the contraction ({op.block_shape} of {op.shape})",
        )
        check(aff is not None and not any(aff[bdim]), f"input {s.position}'s index map moves along the contraction")
    check(len(ks) == 1, "the two sides' contraction lengths differ")
    lhs_free = [d for d in range(len(sides[0].ref_dims)) if d not in (lc[0], *lb)]
    rhs_free = [d for d in range(len(sides[1].ref_dims)) if d not in (rc[0], *rb)]
    out_dims = (
        *((0, sides[0].ref_dims[d]) for d in lb),
        *((0, sides[0].ref_dims[d]) for d in lhs_free),
        *((1, sides[1].ref_dims[d]) for d in rhs_free),
    )
    return Plan((sides[0], sides[1]), ks.pop(), tuple(out_dims), str(dot.outvars[0].aval.dtype))


def _inner_eqns(eqn: Any) -> list[Any]:
    """Every equation inside `eqn`'s sub-jaxprs (loops, branches), at any depth."""
    out: list[Any] = []
    for sub in subjaxprs(eqn):
        for e in sub.eqns:
            out.extend([e, *_inner_eqns(e)])
    return out


def _use_counts(jaxpr: Any) -> dict[int, int]:
    counts: dict[int, int] = {}
    for e in jaxpr.eqns:
        for v in e.invars:
            if hasattr(v, "aval") and not hasattr(v, "val"):
                counts[id(v)] = counts.get(id(v), 0) + 1
    for v in jaxpr.outvars:
        counts[id(v)] = counts.get(id(v), 0) + 1
    return counts


def _whole_read(jaxpr: Any, var: Any, uses: dict[int, int]) -> tuple[Any, tuple[int, ...]]:
    """The ref `var` is a whole read of (through `CHAIN` ops, each value used once), and per dim of `var` the ref
    dim it holds."""
    producer = {id(o): e for e in jaxpr.eqns for o in e.outvars}
    perm: list[int] | None = None
    while True:
        check(uses.get(id(var), 0) == 1, "a dot operand (or what it is built from) is used elsewhere in the kernel")
        eqn: Any = producer.get(id(var))
        check(eqn is not None, "a dot operand is not read from a ref in the kernel")
        name = eqn.primitive.name
        if name == "get":
            ref = eqn.invars[0]
            shape = tuple(getattr(ref.aval, "inner_aval", ref.aval).shape)
            check(tuple(eqn.outvars[0].aval.shape) == shape, "a dot operand is a slice of its ref, not the whole block")
            check(uses.get(id(ref), 0) == 1, "the ref a dot operand is read from is used elsewhere in the kernel")
            return ref, tuple(perm if perm is not None else range(len(shape)))
        check(name in CHAIN, f"a dot operand is computed ({name}) from its ref, not just read")
        if name == "transpose":
            p = list(eqn.params["permutation"])
            perm = [p[d] for d in perm] if perm is not None else p
        var = eqn.invars[0]


def pieces(ir: KernelIR, facts: CallFacts) -> tuple[int, ...]:
    """The piece sizes that split the contraction into several steps at the traced dims and at CHECK_DIMS."""
    try:
        lengths = [plan(ir, facts).k]
        check_dims = ir.workload.check_dims if ir.workload is not None else None
        if check_dims:
            lengths.append(plan(ir, facts, {**ir.dims, **check_dims}).k)
    except (PassNotApplicable, KernelError):
        return ()
    return tuple(p for p in PIECES if all(n % p == 0 and p < n for n in lengths))


@dataclass(frozen=True)
class SplitKPass(Pass):
    """Split a dot's contraction over a new grid axis: a kernel whose blocks hold the whole contraction of its one
    dot (`x_ref` (bm, K) and `w_ref` (N, K) read whole for `x @ w.T`, as LLM-written kernels with one-step grids and
    whole-array blocks are) gets an innermost "arbitrary" grid axis over `piece`-wide slices of K: those two inputs'
    blocks become `(bm, piece)` and `(N, piece)` at the new index, each step adds its partial dot (f32) into a VMEM
    scratch accumulator zeroed on the first step, and the rest of the body (bias, activation, a row softmax over the
    whole dot, the stores) runs once, on the last step, on the accumulated value, cast to the dot's dtype.

    The blocks stop growing with K: a kernel that does not fit VMEM (a 16384 x 16384 f32 weight in one block) runs,
    the weight's fetch overlaps the dot, and the tile pass can then size the other blocks. The piece is a module
    constant the tile pass can retune; at a size it does not divide, the contraction is one piece (the original
    kernel), so the kernel runs at every size it ran at before. The pattern is read from the body's jaxpr: exactly
    one dot, contracting one dim, whose two operands are whole reads of input refs through transposes and casts
    only, neither used anywhere else; in the source the dot sits in a top-level statement of the kernel that only
    plain assignments precede. Parameters: `call`, `piece` (contraction elements per step), `vmem_mib` (> 0: the
    call's VMEM limit, set in the same move where the new blocks still overflow the default).
    """

    name: ClassVar[str] = "split-k"
    call: int = 0
    piece: int = 512
    vmem_mib: int = 0

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        out: list[Pass] = []
        for c in ir.calls:
            if candidate(c):
                fits = (_with_vmem(cls(call=c.index, piece=p), ir, chip) for p in pieces(ir, c))
                out.extend(p for p in fits if p is not None)
        return tuple(out)

    def apply(self, ir: KernelIR) -> KernelIR:
        check(0 <= self.call < len(ir.calls), f"no pallas_call #{self.call}")
        facts = ir.calls[self.call]
        check(candidate(facts), "no dot in a plain kernel of this module (manual DMA, scalar prefetch or none)")
        check(self.piece > 0 and self.piece % 128 == 0, f"piece {self.piece} is not a positive multiple of 128")
        pl_plan = plan(ir, facts)
        check(
            self.piece < pl_plan.k and pl_plan.k % self.piece == 0,
            f"piece {self.piece} does not split the contraction of {pl_plan.k} into several steps",
        )
        site = kernel_site(ir, facts, " (the accumulator is zeroed with it)")
        loc, node, jnp, pltpu, pl = site.loc, site.node, site.jnp, site.pltpu, site.pl
        kernel, _ = own_kernel(loc, ir.calls, facts, node)  # refs one per operand; not shared with another call
        module_names = used_names(loc.wrapper.module)
        const, helper = fresh_name(module_names, "SPLIT_K"), fresh_name(module_names, "_split_k_piece")
        edits: dict[cst.CSTNode, cst.CSTNode] = {}
        dims = {s.position: facts.inputs[s.position].block_dim_of(s.contracted) for s in pl_plan.sides}
        piece = f"{helper}({{}})"
        k_text = split_specs_on_new_axis(loc, node, facts, dims, piece.format, edits, index="kk", along="K")
        out_texts = _block_texts(loc, node, facts, pl_plan)
        append_grid_axis(loc, node, f"{k_text} // {helper}({k_text})", edits)
        if facts.dimension_semantics is not None:
            edits.update(semantics_edit(loc, node, facts, lambda sem: (*sem, "arbitrary")))
        acc = fresh_name(used_names(kernel), "acc_ref")
        edits[kernel] = _rewrite_kernel(kernel, acc, len(facts.grid), pl_plan.dtype, (pl, jnp))
        which = [id(c) for c in pallas_call_nodes(loc)].index(id(node))
        loc2 = Located.of(replace_many(loc.wrapper.module, nested_into(loc, edits)))
        node2 = pallas_call_nodes(loc2)[which]
        edits2: dict[cst.CSTNode, cst.CSTNode] = {}
        shape = "(" + ", ".join(out_texts) + ("," if len(out_texts) == 1 else "") + ")"
        add_scratch(loc2, node2, [cst.parse_expression(f"{pltpu}.VMEM({shape}, {jnp}.float32)")], edits2)
        top = [k for k, st in enumerate(loc2.wrapper.module.body) if any(x is node2 for x in m.findall(st, m.Call()))]
        check(len(top) == 1, "the pallas_call is not inside one module-level statement")
        new_module = _insert_helper(replace_many(loc2.wrapper.module, edits2), top[0], const, helper, self.piece)
        try:
            new = ir.with_module(new_module, self.spec())
        except KernelError as e:  # the rewrite is ours, but what it reads is the user's: say what failed
            raise PassNotApplicable(f"the split kernel does not trace: {e.message}") from None
        _verify(facts, new.calls[self.call] if self.call < len(new.calls) else None, pl_plan, self.piece)
        if self.vmem_mib * 2**20 > (facts.vmem_limit_bytes or 0):
            value = cst.parse_expression(f"{self.vmem_mib} * 1024 * 1024")
            new = ir.with_module(
                set_compiler_param(new.module, new.calls[self.call], "vmem_limit_bytes", value), self.spec()
            )
        return new


def _with_vmem(p: SplitKPass, ir: KernelIR, chip: Chip) -> SplitKPass | None:
    """`p` with the VMEM limit its split call needs where its blocks (the rows and outputs it keeps whole) still
    overflow the chip's default scoped VMEM (as `fuse` does); None where no limit the chip allows holds them (a
    search would only watch the compiler refuse it) and where it declines; `p` as is otherwise."""
    try:
        mib = needed_step(p.apply(ir).calls[p.call], chip)
    except PassNotApplicable:
        return None
    return p if mib == 0 else replace(p, vmem_mib=mib) if mib else None


def _verify(old: CallFacts, new: CallFacts | None, p: Plan, piece: int) -> None:
    """The rewrite did what it says at the traced dims: one more grid axis of K / piece steps, both sides' blocks
    `piece` wide along K at that axis, the other operands unchanged."""
    check(new is not None, "the split module lost the pallas_call")
    assert new is not None
    check(new.grid == (*old.grid, p.k // piece), f"the split grid is {new.grid}, not {(*old.grid, p.k // piece)}")
    sides = {s.position: s for s in p.sides}
    check(
        (len(old.inputs), len(old.outputs)) == (len(new.inputs), len(new.outputs)),
        "the split call has other operands",
    )
    for k, (a, b) in enumerate(zip(old.inputs, new.inputs, strict=True)):
        want = list(a.block_shape)
        if k in sides:
            want[a.block_dim_of(sides[k].contracted)] = piece
        check(list(b.block_shape) == want, f"input {k}'s split block is {b.block_shape}, not {tuple(want)}")
    for a, b in zip(old.outputs, new.outputs, strict=True):
        check(
            (a.shape, a.block_shape) == (b.shape, b.block_shape),
            f"output {a.position} changed (a grid tuple the wrapper reads elsewhere too?)",
        )


def _block_texts(loc: Located, node: cst.Call, facts: CallFacts, p: Plan) -> list[str]:
    """Per dot output dim, the block dim it comes from as the wrapper writes it (the accumulator's shape)."""
    specs = spec_nodes(loc, node)
    out = []
    for which, ref_dim in p.out_dims:
        side = p.sides[which]
        shape, _ = blockspec_parts(specs[side.position])
        check(isinstance(shape, cst.Tuple | cst.List), f"input {side.position}'s block shape is not a literal tuple")
        assert isinstance(shape, cst.Tuple | cst.List)
        out.append(code(shape.elements[facts.inputs[side.position].block_dim_of(ref_dim)].value))
    return out


def _dot_nodes(kernel: cst.FunctionDef) -> list[cst.BaseExpression]:
    calls = [c for c in m.findall(kernel, m.Call()) if any(is_call_to(c, f) for f in DOT_FUNCS)]
    ops = [
        b
        for b in m.findall(kernel, m.BinaryOperation(operator=m.MatrixMultiply()))
        if isinstance(b, cst.BinaryOperation)
    ]
    return [*calls, *ops]  # type: ignore[list-item]


def _plain_prefix(stmt: cst.BaseStatement) -> bool:
    """A statement that may run on every K step: assigning names (no stores), a docstring, `pass`."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    for s in stmt.body:
        if isinstance(s, cst.Assign):
            if not all(isinstance(t.target, cst.Name | cst.Tuple) for t in s.targets):
                return False
            if any(isinstance(x, cst.Subscript) for t in s.targets for x in m.findall(t.target, m.Subscript())):
                return False
        elif isinstance(s, cst.AnnAssign):
            if not isinstance(s.target, cst.Name):
                return False
        elif not isinstance(s, cst.Pass) and not (isinstance(s, cst.Expr) and isinstance(s.value, cst.SimpleString)):
            return False
    return True


def _f32_dot(dot: cst.BaseExpression, jnp: str) -> cst.BaseExpression:
    """The dot computing its partial sum in f32."""
    f32 = cst.parse_expression(f"{jnp}.float32")
    if isinstance(dot, cst.BinaryOperation):
        return cst.parse_expression(
            f"{jnp}.matmul({code(dot.left)}, {code(dot.right)}, preferred_element_type={jnp}.float32)"
        )
    assert isinstance(dot, cst.Call)
    return set_keyword(dot, "preferred_element_type", f32)


def _rewrite_kernel(
    kernel: cst.FunctionDef, acc: str, axis: int, dtype: str, aliases: tuple[str, str]
) -> cst.FunctionDef:
    pl, jnp = aliases
    check(isinstance(kernel.body, cst.IndentedBlock), "the kernel is a one-line def")
    assert isinstance(kernel.body, cst.IndentedBlock)
    dots = _dot_nodes(kernel)
    check(len(dots) == 1, f"{len(dots)} dot expressions in the kernel's source: cannot tell which one to split")
    (dot,) = dots
    stmts = list(kernel.body.body)
    at = [i for i, s in enumerate(stmts) if any(x is dot for x in m.findall(s, m.BinaryOperation() | m.Call()))]
    check(len(at) == 1, "the dot is not in a statement of the kernel's own body")
    (i,) = at
    check(isinstance(stmts[i], cst.SimpleStatementLine), "the dot is inside a block (if / for / with / def)")
    bad = [s for s in stmts[:i] if not _plain_prefix(s)]
    check(not bad, f"a statement before the dot is not a plain assignment: {code(bad[0]).strip() if bad else ''}")
    used = used_names(kernel)
    part, kid, init, fin = (fresh_name(used, w) for w in ("k_part", "k_step", "_zero_acc", "_finish"))
    cast = "" if dtype == "float32" else f".astype({jnp}.{dtype})"
    rest = [replace_many(stmts[i], {dot: cst.parse_expression(f"{acc}[...]{cast}")}), *stmts[i + 1 :]]
    loc_names = grid_locals(rest, used | {part, kid, init, fin}, counts=True)
    rest = [loc_names.use(s) for s in rest]
    lines = loc_names.bind(pl)
    text = (
        f"{part} = {code(_f32_dot(dot, jnp))}\n"
        f"{kid} = {pl}.program_id({axis})\n" + "".join(f"{ln}\n" for ln in lines) + f"\n@{pl}.when({kid} == 0)\n"
        f"def {init}():\n"
        f"    {acc}[...] = {jnp}.zeros_like({acc})\n"
        f"\n{acc}[...] += {part}\n"
        f"\n@{pl}.when({kid} == {pl}.num_programs({axis}) - 1)\n"
        f"def {fin}():\n"
        f"    pass\n"
    )
    new = parse_statements(text)
    last = new[-1]
    assert isinstance(last, cst.FunctionDef) and isinstance(last.body, cst.IndentedBlock)
    first_rest = rest[0]
    if isinstance(first_rest, cst.SimpleStatementLine | cst.BaseCompoundStatement):
        first_rest = first_rest.with_changes(leading_lines=[])
    new[-1] = last.with_changes(body=last.body.with_changes(body=[first_rest, *rest[1:]]))
    dot_stmt = stmts[i]
    assert isinstance(dot_stmt, cst.SimpleStatementLine)
    new[0] = new[0].with_changes(leading_lines=dot_stmt.leading_lines)
    params = list(kernel.params.params)
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    params = [*params[:-1], params[-1].with_changes(comma=comma), cst.Param(cst.Name(acc), comma=params[-1].comma)]
    return kernel.with_changes(
        params=kernel.params.with_changes(params=params), body=kernel.body.with_changes(body=[*stmts[:i], *new])
    )


def _insert_helper(module: cst.Module, at: int, const: str, helper: str, piece: int) -> cst.Module:
    """`CONST = piece` and the helper that picks the piece (the whole contraction where the piece does not divide
    it), at module level before statement `at` (the one holding the pallas_call)."""
    body = list(module.body)
    text = (
        f"{const} = {piece}  # contraction elements per grid step (split-k)\n\n\n"
        f"def {helper}(k):\n"
        f'    """{const} where it divides the contraction, else the whole contraction in one step."""\n'
        f"    return {const} if k % {const} == 0 else k\n"
    )
    stmts: Sequence[cst.BaseStatement] = cst.parse_module(text).body
    lead = body[at].leading_lines
    body[at] = body[at].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
    stmts = [stmts[0].with_changes(leading_lines=lead), *stmts[1:]]
    stmts[-1] = stmts[-1].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
    return module.with_changes(body=[*body[:at], *stmts, *body[at:]])
