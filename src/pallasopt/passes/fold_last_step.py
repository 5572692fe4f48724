"""fold-last-step: a reduction's last update is added inside its finalize instead of stored and read back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import libcst as cst
import libcst.matchers as m

from ..cost_model.hardware import Chip
from ..errors import PassNotApplicable, check
from ..ir.builders import fresh_name
from ..ir.cst_edit import replace_many
from ..ir.facts import CallFacts
from ..ir.kernel_ir import KernelIR
from ..ir.matchers import (
    Located,
    code,
    find_call_node,
    is_call_to,
    jnp_alias,
    kernel_function,
    kernel_refs,
    module_names,
    pl_alias,
    used_names,
)
from .base import Pass, own_call

ELLIPSIS = m.Subscript(value=m.Name(), slice=[m.SubscriptElement(slice=m.Index(value=m.Ellipsis()))])


@dataclass(frozen=True)
class FoldLastStepPass(Pass):
    """Fold a reduction's last update into the finalize that follows it in pallas_call `call`'s kernel.

    A kernel that accumulates with `R[...] += E` on every step and then, on the last step (`@pl.when(C)`), reads
    `R[...]` to finish (an activation, a cast, a store to the output) stores the last partial sum to VMEM only to
    load it straight back, and the finalize cannot start until the whole update is stored. The rewrite runs the
    update under `pl.when(not C)` and has the finalize compute `R[...] + E` once into a local that its reads of
    `R[...]` use. Measured on a TPU v5e (bench/results/hw-v5e-2026-12-06c): 5% off a 4096x4096x8192 f32 matmul +
    Mish (1.807 -> 1.715 ms), 1-3% off matmul + bias + ReLU; the libtpu static estimate sees it (-6% cycles).

    Applies to the first `R[...] += E` (or `R[...] = R[...] + E`) statement of the kernel body directly followed by
    a `@pl.when(...)` function reading `R[...]`. The finalize must overwrite `R[...]` whole before any other use of
    `R` (then R ends as before), or, when it never writes R, R must be a scratch ref the kernel zeroes under another
    `pl.when` earlier and does not read after the finalize (its last value is dead). Declines when E or the condition
    reads R, the finalize reads R other than as `R[...]` before writing it, writes it in part or with `+=`, or nothing
    matches."""

    name: ClassVar[str] = "fold-last-step"
    call: int = 0

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        out: list[Pass] = []
        for c in ir.calls:
            if c.library_site is not None:
                continue
            try:
                _plan(ir, c)
            except PassNotApplicable:
                continue
            out.append(cls(call=c.index))
        return tuple(out)

    def apply(self, ir: KernelIR) -> KernelIR:
        facts = own_call(ir, self.call)
        kernel, new_kernel = _plan(ir, facts)
        new = ir.with_module(replace_many(ir.module, {kernel: new_kernel}), self.spec())
        got = new.calls[self.call]
        check(got.grid == facts.grid and got.operands == facts.operands, "the rewrite changed the call's blocks")
        return new


def _plan(ir: KernelIR, facts: CallFacts) -> tuple[cst.FunctionDef, cst.FunctionDef]:
    """The kernel function and its rewrite (declines with the reason)."""
    loc = Located.of(ir.module)
    kernel = kernel_function(loc, find_call_node(loc, facts))
    check(kernel is not None, "cannot find the kernel function (a module-level def the call runs)")
    assert kernel is not None
    refs = kernel_refs(kernel)
    check(refs is not None, "the kernel takes *args")
    assert refs is not None
    body = kernel.body
    check(isinstance(body, cst.IndentedBlock), "the kernel body is on one line")
    assert isinstance(body, cst.IndentedBlock)
    stmts = _first_step_zeroed(list(body.body), set(refs), jnp_alias(ir.module))
    scratch = set(refs[len(refs) - len(facts.scratch) :]) if facts.scratch else set()
    why = "no `R[...] += E` statement directly followed by a `@pl.when` finalize reading R[...]"
    for i in range(len(stmts) - 1):
        update = _update(stmts[i], set(refs))
        final = stmts[i + 1]
        if update is None or not isinstance(final, cst.FunctionDef) or _when_condition(final) is None:
            continue
        ref, term = update
        if not _reads(final, ref):
            continue
        try:
            new_stmts = _fold(stmts, i, ref, term, ref in scratch, ir.module, kernel)
        except PassNotApplicable as e:
            why = str(e)
            continue
        return kernel, kernel.with_changes(body=body.with_changes(body=new_stmts))
    raise PassNotApplicable(why)


def _first_step_zeroed(stmts: list[cst.BaseStatement], refs: set[str], jnp: str | None) -> list[cst.BaseStatement]:
    """The body with an assign-first reduction written as the add-every-step form the fold matches: two consecutive
    `@pl.when(X == 0)` (`R[...] = P`) and `@pl.when(X > 0)` (or `X != 0`, `X >= 1`: `R[...] += P`) functions, the
    same P, become `@pl.when(X == 0)` zeroing R and an unconditional `R[...] += P` (the body unchanged without
    them). On a TPU v5e the assign-first form was the slowest of the three (fused_07 0.869 ms against 0.836 with the
    zeroing, 0.826 folded; bench/results/hw-v5e-2026-12-06c)."""
    if jnp is None:
        return stmts
    for i in range(len(stmts) - 1):
        first, rest = _single_when(stmts[i]), _single_when(stmts[i + 1])
        if first is None or rest is None:
            continue
        (c0, s0), (c1, s1) = first, rest
        zero = m.Comparison(comparisons=[m.ComparisonTarget(operator=m.Equal(), comparator=m.Integer("0"))])
        after = m.Comparison(
            comparisons=[
                m.ComparisonTarget(operator=m.GreaterThan(), comparator=m.Integer("0"))
                | m.ComparisonTarget(operator=m.NotEqual(), comparator=m.Integer("0"))
                | m.ComparisonTarget(operator=m.GreaterThanEqual(), comparator=m.Integer("1"))
            ]
        )
        if not (m.matches(c0, zero) and m.matches(c1, after)):
            continue
        assert isinstance(c0, cst.Comparison) and isinstance(c1, cst.Comparison)
        if not c0.left.deep_equals(c1.left) or not isinstance(s0, cst.Assign):
            continue
        ne = isinstance(c1.comparisons[0].operator, cst.NotEqual)
        if not ne and not _step_index(c0.left, stmts[:i]):
            continue  # `X > 0` is the complement of `X == 0` only for X >= 0 (a program_id)
        target = s0.targets[0].target if len(s0.targets) == 1 else None
        if target is None or not m.matches(target, ELLIPSIS) or not isinstance(s1, cst.AugAssign):
            continue
        if not (isinstance(s1.operator, cst.AddAssign) and s1.target.deep_equals(target)):
            continue
        assert isinstance(target, cst.Subscript) and isinstance(target.value, cst.Name)
        ref = target.value.value
        if ref not in refs or not s0.value.deep_equals(s1.value) or _mentions(s0.value, ref):
            continue
        fn = stmts[i]
        assert isinstance(fn, cst.FunctionDef) and isinstance(fn.body, cst.IndentedBlock)
        line = fn.body.body[0]
        zeroed = s0.with_changes(value=cst.parse_expression(f"{jnp}.zeros_like({ref})"))
        reset = fn.with_changes(body=fn.body.with_changes(body=[line.with_changes(body=[zeroed])]))
        add = stmts[i + 1]
        assert isinstance(add, cst.FunctionDef) and isinstance(add.body, cst.IndentedBlock)
        update = add.body.body[0]
        assert isinstance(update, cst.SimpleStatementLine)
        return [*stmts[:i], reset, update.with_changes(leading_lines=add.leading_lines), *stmts[i + 2 :]]
    return stmts


def _step_index(x: cst.BaseExpression, before: Sequence[cst.BaseStatement]) -> bool:
    """`x` is `pl.program_id(a)` or a name the body last bound to one at its top level before."""
    if is_call_to(x, "program_id"):
        return True
    if not isinstance(x, cst.Name):
        return False
    value = None
    for stmt in before:
        for a in m.findall(stmt, m.Assign(targets=[m.AssignTarget(target=m.Name(x.value))])):
            assert isinstance(a, cst.Assign)
            value = a.value
    return value is not None and is_call_to(value, "program_id")


def _single_when(stmt: cst.BaseStatement) -> tuple[cst.BaseExpression, cst.BaseSmallStatement] | None:
    """(C, S) for a `@pl.when(C)` function whose body is the one simple statement S."""
    if not isinstance(stmt, cst.FunctionDef) or stmt.params.params or not isinstance(stmt.body, cst.IndentedBlock):
        return None
    cond = _when_condition(stmt)
    body = stmt.body.body
    if cond is None or len(body) != 1 or not isinstance(body[0], cst.SimpleStatementLine) or len(body[0].body) != 1:
        return None
    return cond, body[0].body[0]


def _update(stmt: cst.BaseStatement, refs: set[str]) -> tuple[str, cst.BaseExpression] | None:
    """(R, E) for a statement line `R[...] += E` or `R[...] = R[...] + E` with R a kernel ref."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    s = stmt.body[0]
    if isinstance(s, cst.AugAssign) and isinstance(s.operator, cst.AddAssign) and m.matches(s.target, ELLIPSIS):
        assert isinstance(s.target, cst.Subscript) and isinstance(s.target.value, cst.Name)
        name = s.target.value.value
        return (name, s.value) if name in refs else None
    if isinstance(s, cst.Assign) and len(s.targets) == 1 and m.matches(s.targets[0].target, ELLIPSIS):
        target = s.targets[0].target
        assert isinstance(target, cst.Subscript) and isinstance(target.value, cst.Name)
        name = target.value.value
        v = s.value
        if name in refs and isinstance(v, cst.BinaryOperation) and isinstance(v.operator, cst.Add):
            same = m.matches(v.left, m.Subscript(value=m.Name(name))) and m.matches(v.left, ELLIPSIS)
            return (name, v.right) if same else None
    return None


def _when_condition(fn: cst.FunctionDef) -> cst.BaseExpression | None:
    """C of a function decorated `@<pl>.when(C)` (one decorator), else None."""
    if len(fn.decorators) != 1:
        return None
    d = fn.decorators[0].decorator
    if isinstance(d, cst.Call) and is_call_to(d, "when") and len(d.args) == 1:
        return d.args[0].value
    return None


def _mentions(node: cst.CSTNode, name: str) -> bool:
    return bool(m.findall(node, m.Name(name)))


def _reads(node: cst.CSTNode, ref: str) -> bool:
    return any(m.matches(s, ELLIPSIS) for s in m.findall(node, m.Subscript(value=m.Name(ref))))


def _fold(
    stmts: Sequence[cst.BaseStatement],
    i: int,
    ref: str,
    term: cst.BaseExpression,
    is_scratch: bool,
    module: cst.Module,
    kernel: cst.FunctionDef,
) -> list[cst.BaseStatement]:
    final = stmts[i + 1]
    assert isinstance(final, cst.FunctionDef)
    cond = _when_condition(final)
    assert cond is not None
    check(not _mentions(term, ref), f"the update of {ref} reads {ref} itself")
    check(not _mentions(cond, ref), f"the finalize's condition reads {ref}")
    check(isinstance(final.body, cst.IndentedBlock), "the finalize is on one line")
    assert isinstance(final.body, cst.IndentedBlock)
    check(not final.params.params and final.params.star_arg is cst.MaybeSentinel.DEFAULT, "the finalize takes args")
    used = used_names(kernel) | module_names(module)
    total = fresh_name(used, "total")
    body, wrote = _rewrite_reads(final.body.body, ref, total)
    if not wrote:
        check(is_scratch, f"the finalize never writes {ref}, an output: its last value would be lost")
        check(_zeroed_before(stmts[:i], ref), f"{ref} is not reset under a pl.when before the update")
        later = stmts[i + 2 :]
        check(not any(_mentions(s, ref) for s in later), f"{ref} is used after the finalize")
    pl = pl_alias(module)
    jnp = jnp_alias(module)
    negated = _negation(cond, jnp)
    check(negated is not None, "cannot negate the finalize's condition (no jax.numpy import)")
    assert negated is not None
    name = fresh_name(used | {total}, "_accumulate")
    stub = cst.parse_statement(f"@{pl}.when({code(negated)})\ndef {name}():\n    pass")
    assert isinstance(stub, cst.FunctionDef) and isinstance(stub.body, cst.IndentedBlock)
    update = stmts[i]
    assert isinstance(update, cst.SimpleStatementLine)
    accumulate = stub.with_changes(body=stub.body.with_changes(body=[update.with_changes(leading_lines=[])]))
    atom = isinstance(term, cst.Call | cst.Name | cst.Subscript | cst.Attribute) and not term.lpar
    first = cst.parse_statement(f"{total} = {ref}[...] + {code(term) if atom else f'({code(term)})'}")
    new_final = final.with_changes(body=final.body.with_changes(body=[first, *body]))
    lines = update.leading_lines or ([cst.EmptyLine(indent=False)] if i else [])
    accumulate = accumulate.with_changes(leading_lines=lines)
    return [*stmts[:i], accumulate, new_final, *stmts[i + 2 :]]


def _negation(cond: cst.BaseExpression, jnp: str | None) -> cst.BaseExpression | None:
    """`a != b` for `a == b`, else `jnp.logical_not(C)`."""
    if isinstance(cond, cst.Comparison) and len(cond.comparisons) == 1:
        c = cond.comparisons[0]
        if isinstance(c.operator, cst.Equal):
            return cond.with_changes(comparisons=[c.with_changes(operator=cst.NotEqual())])
    if jnp is None:
        return None
    return cst.parse_expression(f"{jnp}.logical_not({code(cond)})")


def _rewrite_reads(body: Sequence[cst.BaseStatement], ref: str, total: str) -> tuple[list[cst.BaseStatement], bool]:
    """The finalize's statements with every `ref[...]` read before its first write replaced by `total`, and whether
    it writes `ref` (a whole `ref[...] = v` statement at its top level; anything else that writes it declines)."""
    out: list[cst.BaseStatement] = []
    for k, stmt in enumerate(body):
        write = _whole_write(stmt, ref)
        if write is not None:
            value = write.value.visit(_Reads(ref, total))
            assert isinstance(value, cst.BaseExpression)
            _check_no_other_use(value, ref)
            line = stmt.with_changes(body=[write.with_changes(value=value)])  # type: ignore[union-attr]
            return [*out, line, *body[k + 1 :]], True
        check(not _writes(stmt, ref), f"the finalize writes {ref} other than whole (`{ref}[...] = v`)")
        new = stmt.visit(_Reads(ref, total))
        assert isinstance(new, cst.BaseStatement)
        _check_no_other_use(new, ref)
        out.append(new)
    return out, False


def _check_no_other_use(node: cst.CSTNode, ref: str) -> None:
    """Declines when `node` still uses `ref` (its reads of `ref[...]` replaced) other than for `.dtype`/`.shape`."""
    meta = m.Attribute(value=m.Name(ref), attr=m.Name("dtype") | m.Name("shape") | m.Name("ndim"))
    allowed = {id(a.value) for a in m.findall(node, meta) if isinstance(a, cst.Attribute)}
    for name in m.findall(node, m.Name(ref)):
        check(id(name) in allowed, f"the finalize uses {ref} other than as {ref}[...] before overwriting it")


def _whole_write(stmt: cst.BaseStatement, ref: str) -> cst.Assign | None:
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    s = stmt.body[0]
    if isinstance(s, cst.Assign) and len(s.targets) == 1:
        t = s.targets[0].target
        if m.matches(t, ELLIPSIS) and m.matches(t, m.Subscript(value=m.Name(ref))):
            return s
    return None


def _writes(stmt: cst.CSTNode, ref: str) -> bool:
    target = m.Subscript(value=m.Name(ref))
    return bool(
        m.findall(stmt, m.AssignTarget(target=target))
        or m.findall(stmt, m.AugAssign(target=target))
        or m.findall(stmt, m.Call(args=[m.ZeroOrMore(), m.Arg(value=m.Name(ref)), m.ZeroOrMore()]))
    )


def _zeroed_before(stmts: Sequence[cst.BaseStatement], ref: str) -> bool:
    """Some earlier top-level `@pl.when` function overwrites `ref[...]` whole (the running value's reset)."""
    return any(
        isinstance(s, cst.FunctionDef)
        and _when_condition(s) is not None
        and isinstance(s.body, cst.IndentedBlock)
        and any(_whole_write(b, ref) is not None for b in s.body.body)
        for s in stmts
    )


class _Reads(cst.CSTTransformer):
    """`ref[...]` -> `total` (reads only: the caller never passes a statement writing `ref`)."""

    def __init__(self, ref: str, total: str) -> None:
        self.ref, self.total = ref, total

    def leave_Subscript(self, original: cst.Subscript, updated: cst.Subscript) -> cst.BaseExpression:
        if m.matches(original, ELLIPSIS) and m.matches(original, m.Subscript(value=m.Name(self.ref))):
            return cst.Name(self.total)
        return updated
