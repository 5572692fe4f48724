"""skip-masked-blocks: grid steps whose whole block is masked away skip their compute and issue no new DMA."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import libcst as cst
import libcst.matchers as m

from ..cost_model.hardware import Chip
from ..errors import check
from ..ir.builders import fresh_name
from ..ir.cst_edit import grid_locals, replace_many
from ..ir.facts import CallFacts
from ..ir.kernel_ir import KernelIR
from ..ir.mask_bounds import Mask, Reader, clamp_text, needed_text, neutral_fill, static_value
from ..ir.matchers import (
    Located,
    blockspec_parts,
    bound_values,
    code,
    enclosing_function,
    find_call_node,
    free_names,
    is_call_to,
    jnp_alias,
    kernel_body,
    pl_alias,
    spec_nodes,
)
from ..ir.scope import Scope, statements
from .base import Pass


def candidate(call: CallFacts) -> bool:
    """Cheap screen from the traced facts: an iota-built select and a reduction axis no output moves along."""
    prims = set(call.body.primitives)
    return (
        call.library_site is None  # a library's kernel body is not this file's to rewrite
        and not call.body.has_dma
        and "iota" in prims
        and bool(prims & {"select_n", "select"})
        and bool(_reduction_axes(call))
    )


def _reduction_axes(call: CallFacts) -> tuple[int, ...]:
    """Grid axes (more than one step) that no output's block index depends on."""
    return tuple(a for a, g in enumerate(call.grid) if g > 1 and all(a not in o.index_map.axes for o in call.outputs))


@dataclass(frozen=True)
class _Analysis:
    kernel: cst.FunctionDef
    start: int  # region of top-level kernel statements the skip wraps: body[start:stop]
    stop: int
    mask: Mask
    axis: int  # the reduction axis whose fully masked steps are skipped
    pid_locals: dict[int, str]


@dataclass(frozen=True)
class SkipMaskedBlocksPass(Pass):
    """Skip the grid steps whose block is fully masked. The kernel masks a value with
    `jnp.where(cond, x, fill)` where `cond` compares indices built as `pl.program_id(a) * BLOCK + iota`
    (causal `cols <= rows`, a causal mask with an offset, banded/sliding-window `&` of two such comparisons);
    the statements that compute and accumulate the masked value go under
    `@pl.when(<block holds an unmasked element>)`, and (with `clamp`) the index maps of the inputs that move along
    the skipped axis are clamped into the range of needed blocks, so a skipped step repeats the previous block index
    and the pipeline issues no DMA for it. Partially masked blocks keep the elementwise mask.

    Helps causal and windowed attention written to visit every key block (about half the steps of a causal grid are
    fully masked). Needs the skipped axis to be a reduction axis that no output moves along, a fill of `0` or a
    large negative value (then a fully masked step adds nothing to an online-softmax or sum accumulator), and the
    mask condition in the kernel's straight-line code. The "needed" test is per comparison, a necessary condition,
    so it never skips a block holding an unmasked element. Parameters: `call`, `clamp` (also clamp the index maps;
    needs the mask's constants to be module-level names or literals).
    """

    name: ClassVar[str] = "skip-masked-blocks"
    call: int = 0
    clamp: bool = True

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        return tuple(cls(call=c.index, clamp=k) for c in ir.calls if candidate(c) for k in (True, False))

    def apply(self, ir: KernelIR) -> KernelIR:
        check(0 <= self.call < len(ir.calls), f"no pallas_call #{self.call}")
        facts = ir.calls[self.call]
        check(not facts.body.has_dma, "the kernel does manual DMA (its copies would need skipping too)")
        check(bool(_reduction_axes(facts)), "no grid axis is a reduction that every output stays fixed along")
        loc = Located.of(ir.module)
        node = find_call_node(loc, facts)
        kernel = kernel_body(loc, node)
        check(kernel is not None, "cannot find the kernel function")
        assert kernel is not None
        namespace = vars(ir.workload.module) if ir.workload is not None else {}
        a = _analyse(kernel, facts, namespace)
        pl = pl_alias(ir.module)
        edits: dict[cst.CSTNode, cst.CSTNode] = {kernel: _wrap(a, pl)}
        if self.clamp:
            jnp = jnp_alias(ir.module)
            check(jnp is not None, "the module does not import jax.numpy (the clamped index maps need jnp.minimum)")
            assert jnp is not None
            _clamp_index_maps(loc, node, facts, a, namespace, pl, jnp, edits)
        return ir.with_module(replace_many(loc.wrapper.module, edits), self.spec())


def _is_pid_stmt(s: cst.BaseStatement) -> bool:
    if not (isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1 and isinstance(s.body[0], cst.Assign)):
        return False
    v = s.body[0].value
    vals = [e.value for e in v.elements] if isinstance(v, cst.Tuple) else [v]
    return all(is_call_to(x, "program_id") for x in vals)


def _is_when_def(s: cst.BaseStatement) -> bool:
    return isinstance(s, cst.FunctionDef) and any(
        isinstance(d.decorator, cst.Call) and is_call_to(d.decorator, "when") for d in s.decorators
    )


def _analyse(kernel: cst.FunctionDef, facts: CallFacts, namespace: dict[str, Any]) -> _Analysis:
    body = statements(kernel)  # declines a one-line def
    scope = Scope.of(body)
    reader = Reader(scope.env, is_call_to)
    found: list[tuple[int, Mask, cst.Call]] = []
    for i, s in enumerate(body):
        for w in m.findall(s, m.Call(func=m.Attribute(attr=m.Name("where")) | m.Name("where"))):
            assert isinstance(w, cst.Call)
            if len(w.args) != 3:
                continue
            cond = w.args[0].value
            names = {n.value for n in m.findall(cond, m.Name()) if isinstance(n, cst.Name)}
            if names & scope.rebound:
                continue
            mask = reader.mask(cond)
            if mask is not None:
                found.append((i, mask, w))
    check(bool(found), "no jnp.where(cond, x, fill) whose cond compares program_id * block + iota indices")
    check(len(found) == 1, f"{len(found)} iota masks in the kernel: cannot tell which value they mask together")
    index, mask, where = found[0]
    check(
        neutral_fill(where.args[2].value, namespace),
        f"the mask's fill `{code(where.args[2].value)}` is not 0 or a large negative module-level value",
    )
    stmt = body[index]
    check(not _is_when_def(stmt), "the masked compute already sits under a pl.when")
    check(not _is_pid_stmt(stmt), "the mask sits in a program_id statement")
    start, stop = index, index + 1
    while start > 0 and not (_is_pid_stmt(body[start - 1]) or _is_when_def(body[start - 1])):
        start -= 1
    while stop < len(body) and not (_is_pid_stmt(body[stop]) or _is_when_def(body[stop])):
        stop += 1
    region = body[start:stop]
    check(not any(m.findall(s, m.Return()) for s in region), "the compute returns early")
    inside, before = scope.bound_in(start, stop), scope.bound_in(0, start)
    check(not (inside & before), f"{sorted(inside & before)} are assigned both before and inside the compute")
    after_names = {n.value for s in body[stop:] for n in m.findall(s, m.Name()) if isinstance(n, cst.Name)}
    check(not (inside & after_names), f"{sorted(inside & after_names)} are computed in the masked part but used after")
    free = set().union(*(c.form.names for c in mask.constraints()))
    check(not (free & inside), f"the mask reads {sorted(free & inside)}, computed inside the masked part")
    axes = {a for c in mask.constraints() for a, _, _ in c.form.pids}
    skippable = [a for a in _reduction_axes(facts) if a in axes]
    check(len(skippable) == 1, "the mask does not depend on exactly one reduction grid axis")
    return _Analysis(kernel, start, stop, mask, skippable[0], scope.pid_locals(start))


def _wrap(a: _Analysis, pl: str) -> cst.FunctionDef:
    """The kernel with body[start:stop] under `@pl.when(needed)`. Program ids the region or the condition read
    become locals bound before it (plain interpret mode cannot lower `program_id` inside a `pl.when` body)."""
    body = list(a.kernel.body.body)
    names = {n.value for n in m.findall(a.kernel, m.Name()) if isinstance(n, cst.Name)}
    region = body[a.start : a.stop]
    grid = grid_locals(
        region, names, also={a_ for c in a.mask.constraints() for a_, _, _ in c.form.pids}, bound=a.pid_locals
    )
    pids = grid.pids
    bind = [cst.parse_statement(line + "\n") for line in grid.bind(pl)]
    region = [grid.use(s) for s in region]
    cond = needed_text(a.mask, lambda ax: pids[ax])
    first = region[0]
    lead = list(getattr(first, "leading_lines", ()))
    region[0] = first.with_changes(leading_lines=[])  # type: ignore[attr-defined]
    fname = fresh_name(names, "_unmasked_block")
    when = cst.parse_statement(f"@{pl}.when({cond})\ndef {fname}():\n    pass\n")
    assert isinstance(when, cst.FunctionDef)
    if bind:
        bind[0] = bind[0].with_changes(leading_lines=lead)  # type: ignore[attr-defined]
        lead = []
    when = when.with_changes(leading_lines=lead, body=when.body.with_changes(body=region))
    new_body = [*body[: a.start], *bind, when, *body[a.stop :]]
    return a.kernel.with_changes(body=a.kernel.body.with_changes(body=new_body))


def _sign(text: str, namespace: dict[str, Any]) -> int | None:
    v = static_value(text, namespace)
    return (v > 0) - (v < 0) if isinstance(v, int) else None


def _clamp_index_maps(
    loc: Located,
    node: cst.Call,
    facts: CallFacts,
    a: _Analysis,
    namespace: dict[str, Any],
    pl: str,
    jnp: str,
    edits: dict[cst.CSTNode, cst.CSTNode],
) -> None:
    check(a.mask.conjunctive, "the mask has an `|`: its needed blocks are not one range per row")
    params = {p.name.value for p in a.kernel.params.params} | {p.name.value for p in a.kernel.params.kwonly_params}
    free = set().union(*(c.form.names for c in a.mask.constraints()))
    local = sorted(n for n in free if n in params or n not in namespace)
    # a value the wrapper binds with functools.partial or a forwarding lambda (`q_offset=sk - sq`) is visible to
    # index maps written in the same function: its value text replaces the name there
    bound = {n: v for n, v in bound_values(loc, node).items() if n in local}
    home = enclosing_function(loc, node)
    local = [n for n in local if n not in bound]
    check(not local, f"the mask reads {local}, which the index maps cannot see (make them module constants)")
    mask = a.mask.substituted({n: code(v) for n, v in bound.items()})
    bound_free = set().union(set(), *(free_names(v) for v in bound.values()))
    specs = spec_nodes(loc, node)
    movers = [o for o in facts.inputs if o.is_pipelined and a.axis in o.index_map.axes]
    check(bool(movers), "no blocked input moves along the skipped axis")
    done: set[int] = set()
    for op in movers:
        spec = specs[op.position] if op.position < len(specs) else None
        check(isinstance(spec, cst.Call), f"input {op.position}'s BlockSpec is not a call pallasopt can edit")
        assert isinstance(spec, cst.Call)
        if id(spec) in done:
            continue
        done.add(id(spec))
        _shape, lam = blockspec_parts(spec)
        if bound and isinstance(lam, cst.Lambda):
            check(
                enclosing_function(loc, lam) is home and home is not None,
                f"input {op.position}'s index map is not written in the function that binds {sorted(bound)}",
            )
            shadow = bound_free & {p.name.value for p in lam.params.params}
            check(not shadow, f"input {op.position}'s index map parameters shadow {sorted(shadow)}")
        check(isinstance(lam, cst.Lambda), f"input {op.position}'s index map is not a lambda")
        assert isinstance(lam, cst.Lambda)
        check(
            len(lam.params.params) >= len(facts.grid),
            f"input {op.position}'s index map takes fewer than {len(facts.grid)} indices",
        )
        edits[lam] = _clamped(lam, a.axis, mask, namespace, pl, jnp)


def _clamped(lam: cst.Lambda, axis: int, mask: Mask, namespace: dict[str, Any], pl: str, jnp: str) -> cst.Lambda:
    """`lam` with its index along the skipped axis clamped into the needed range of blocks for its row."""
    names = [p.name.value for p in lam.params.params]
    j = names[axis]
    expr = clamp_text(j, mask, axis, lambda t: _sign(t, namespace), lambda ax: names[ax], pl, jnp)
    check(expr is not None, "cannot solve the mask for a range of blocks along the skipped axis")
    assert expr is not None
    new_index = cst.parse_expression(expr)

    class Sub(cst.CSTTransformer):
        def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
            return new_index if original.value == j else updated

    body = lam.body.visit(Sub())
    assert isinstance(body, cst.BaseExpression)
    return lam.with_changes(body=body)
