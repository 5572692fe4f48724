"""skip-masked-groups: a loop step whose row mask leaves no row of the block unmasked skips its work."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

import libcst as cst
import libcst.matchers as m

from ..cost_model.hardware import Chip
from ..errors import KernelError, PassNotApplicable, check
from ..ir.builders import fresh_name
from ..ir.cst_edit import replace_many
from ..ir.kernel_ir import KernelIR
from ..ir.matchers import (
    Located,
    code,
    find_call_node,
    is_call_to,
    kernel_body,
    module_names,
    pl_alias,
    used_names,
)
from ..ir.scope import Scope, fori_loops, loop_body_def, statements
from .base import Pass

# `rows OP bound` -> the condition on the block's first row `base` and its row count `n` under which some row of
# [base, base + n) satisfies it (the mask is false on every row where this is false).
SOME_ROW = {
    ">=": "{bound} < {base} + {n}",
    ">": "{bound} + 1 < {base} + {n}",
    "<": "{base} < {bound}",
    "<=": "{base} <= {bound}",
}
FLIP = {">=": "<=", ">": "<", "<": ">", "<=": ">="}
# Calls a row tile's first index may be built from (anything else could be an array, not one scalar per block).
SCALAR_CALLS = ("program_id", "num_programs")


@dataclass(frozen=True)
class SkipMaskedGroupsPass(Pass):
    """Skip the work of a loop step whose row mask masks every row of the block: in a `jax.lax.fori_loop` body of
    pallas_call `call`'s kernel, an update `ref[...] += jnp.where(cond, part, 0)` whose `cond` bounds a row index
    `rows = base + iota` (`pl.program_id(0) * tm + jax.lax.broadcasted_iota(jnp.int32, shape, 0)`) by values the
    loop computes (a group's `start <= rows < end`, read from scalar-prefetched group sizes) is wrapped, with the
    statements before it that only feed it (the `part = jnp.dot(...)`), in `@pl.when(<some row of the block is
    unmasked>)`: `start < base + n and base < end`. A step it skips adds zeros, so the result is the same.

    Helps a ragged or grouped matmul written as one dot per group and row tile with a row mask (an LLM's first
    MoE or ragged-dot kernel, bench `llm_ragged_dot`): the groups whose rows miss the tile cost nothing. Measured on a
    TPU v5e (bench/results/hw-v5e-2026-12-07b): llm_ragged_dot's pick 69.1 -> 39.6 ms, and 22.5 ms (0.93x of XLA)
    at tm = 1024, where fewer groups meet each tile. The deviceless tiers cannot see it (how many steps skip depends
    on the group sizes, data), so the search offers it when it times candidates on the chip, or when named.
    Parameters: `call`, `loop` (which fori_loop of the kernel, in source order). Declines when the fill is not 0,
    the update is not `+=` into a ref, no comparison of the mask reads a `base + iota` row index, or the base is not
    one scalar per block (built from program ids, names and literals).
    """

    name: ClassVar[str] = "skip-masked-groups"
    search_needs_hardware: ClassVar[bool] = True
    call: int = 0
    loop: int = 0

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        out: list[Pass] = []
        loc = Located.of(ir.module)
        for c in ir.calls:
            prims = set(c.body.primitives)
            if c.library_site is not None or "iota" not in prims or not prims & {"scan", "while"}:
                continue
            kernel = kernel_body(loc, find_call_node(loc, c))
            if kernel is None or not isinstance(kernel.body, cst.IndentedBlock):
                continue
            for i, loop in enumerate(fori_loops(kernel)):
                try:
                    _update(loop_body_def(kernel, loop))
                except (PassNotApplicable, KernelError):  # no masked update there (`apply` says why)
                    continue
                out.append(cls(call=c.index, loop=i))
        return tuple(out)

    def apply(self, ir: KernelIR) -> KernelIR:
        check(0 <= self.call < len(ir.calls), f"no pallas_call #{self.call}")
        facts = ir.calls[self.call]
        check(facts.library_site is None, "the kernel body is in a library, not in this file")
        loc = Located.of(ir.module)
        kernel = kernel_body(loc, find_call_node(loc, facts))
        check(kernel is not None and isinstance(kernel.body, cst.IndentedBlock), "cannot find the kernel function")
        assert kernel is not None
        loops = fori_loops(kernel)
        check(0 <= self.loop < len(loops), f"no loop #{self.loop}: the kernel has {len(loops)} fori_loop(s)")
        loop = loops[self.loop]
        body = loop_body_def(kernel, loop)
        at, where = _update(body)
        stmts = statements(body)
        kernel_stmts = statements(kernel)
        kernel_env = Scope.of(kernel_stmts).env
        taken = module_names(ir.module) | used_names(kernel)
        first_row = fresh_name(taken, "_first_row")
        # The block's first row is computed before the loop: `pl.program_id` inside a loop body does not run in
        # interpret mode (the oracle's), and it is the same on every step.
        guard, base = _guard(where.args[0].value, {**kernel_env, **Scope.of(stmts[:at]).env}, first_row)
        moved = _feeding(stmts, at, used_names(cst.parse_expression(guard)))
        pl = pl_alias(ir.module)
        name = fresh_name(taken | {first_row}, "_unmasked_rows")
        block = "\n".join(code(s).strip("\n") for s in (*moved, stmts[at]))
        indented = "\n".join("    " + line if line else line for line in block.splitlines())
        new = cst.parse_module(f"@{pl}.when({guard})\ndef {name}():\n{indented}\n").body[0]
        head = stmts[at - len(moved)]
        assert isinstance(head, cst.SimpleStatementLine)  # `_feeding` and `_update` take such lines only
        gap = [cst.EmptyLine(indent=False)] if at - len(moved) > 0 else []  # a blank line before a decorated def
        new = new.with_changes(leading_lines=[*gap, *head.leading_lines])
        kept = [s for i, s in enumerate(stmts) if not at - len(moved) <= i <= at]
        kept.insert(at - len(moved), new)
        assert isinstance(body.body, cst.IndentedBlock) and isinstance(kernel.body, cst.IndentedBlock)
        edited = body.with_changes(body=body.body.with_changes(body=kept))
        hoisted = cst.parse_statement(f"{first_row} = {base}\n").with_changes(
            leading_lines=[cst.EmptyLine(indent=False)]
        )
        where_loop = next(i for i, st in enumerate(kernel_stmts) if loop in set(m.findall(st, m.Call())))
        check(
            _visible(base, kernel_stmts[:where_loop], kernel),
            "the row index's base reads names bound in the loop body: it cannot be computed before the loop",
        )
        outer = [edited if st is body else st for st in kernel_stmts]
        outer.insert(where_loop, hoisted)
        new_kernel = kernel.with_changes(body=kernel.body.with_changes(body=outer))
        return ir.with_module(replace_many(loc.wrapper.module, {kernel: new_kernel}), self.spec())


def _update(body: cst.FunctionDef) -> tuple[int, cst.Call]:
    """(index, where-call) of the body's top-level `ref[...] += jnp.where(cond, part, 0)`."""
    for i, stmt in enumerate(statements(body)):
        if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
            continue
        s = stmt.body[0]
        if isinstance(s, cst.AugAssign) and isinstance(s.operator, cst.AddAssign):
            v = s.value
            if isinstance(v, cst.Call) and is_call_to(v, "where") and len(v.args) == 3:
                check(isinstance(s.target, cst.Subscript), "the masked update is not into a ref (`ref[...] += ...`)")
                fill = v.args[2].value
                check(
                    isinstance(fill, cst.Integer | cst.Float) and float(fill.value) == 0.0,
                    f"the mask's fill `{code(fill)}` is not 0: a skipped step would not add nothing",
                )
                return i, v
    check(False, f"no `ref[...] += jnp.where(cond, x, 0)` in the top-level statements of `{body.name.value}`")
    raise AssertionError


def _conjuncts(cond: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The operands of a conjunction (`a & b & c`, `jnp.logical_and(a, b)`), parenthesized or not."""
    if isinstance(cond, cst.BinaryOperation) and isinstance(cond.operator, cst.BitAnd):
        return [*_conjuncts(cond.left), *_conjuncts(cond.right)]
    if isinstance(cond, cst.Call) and is_call_to(cond, "logical_and") and len(cond.args) == 2:
        return [*_conjuncts(cond.args[0].value), *_conjuncts(cond.args[1].value)]
    return [cond]


def _guard(cond: cst.BaseExpression, env: dict[str, cst.BaseExpression], first_row: str) -> tuple[str, str]:
    """The source of a scalar condition that is false only where `cond` is false on every row of the block, written
    with `first_row` for the block's first row index, and the source of that index."""
    parts: list[str] = []
    bases: set[str] = set()
    for c in _conjuncts(cond):
        if not isinstance(c, cst.Comparison) or len(c.comparisons) != 1:
            continue
        op = code(c.comparisons[0].operator).strip()
        left, right = c.left, c.comparisons[0].comparator
        if op not in SOME_ROW:
            continue
        for rows, bound, o in ((left, right, op), (right, left, FLIP[op])):
            rng = _row_range(rows, env)
            if rng is not None and _row_range(bound, env) is None:
                base, n = rng
                bases.add(base)
                parts.append("(" + SOME_ROW[o].format(bound=_atom(code(bound)), base=first_row, n=n) + ")")
                break
    check(bool(parts), "no comparison of the mask reads a row index `base + iota` of the block")
    check(len(bases) == 1, f"the mask compares {len(bases)} different row indices")
    return " & ".join(parts), bases.pop()


def _row_range(expr: cst.BaseExpression, env: dict[str, cst.BaseExpression]) -> tuple[str, str] | None:
    """(base, count) when `expr` (or the name it is bound to) is `base + iota` with a scalar base: its values are
    base, base + 1, ..., base + count - 1."""
    if isinstance(expr, cst.Name) and expr.value in env:
        expr = env[expr.value]
    if not isinstance(expr, cst.BinaryOperation) or not isinstance(expr.operator, cst.Add):
        return None
    for iota, base in ((expr.right, expr.left), (expr.left, expr.right)):
        count = _iota_count(iota)
        if count is not None and _scalar(base, env):
            return code(base).strip(), count
    return None


def _atom(text: str) -> str:
    """`text` as an operand: as it is when it is a name, an attribute, a subscript or a number, else parenthesized."""
    t = text.strip()
    return t if re.fullmatch(r"[\w.]+(\[[^\[\]]*\])?", t) else f"({t})"


def _iota_count(expr: cst.BaseExpression) -> str | None:
    """The number of values of `broadcasted_iota(dtype, shape, dim)` along `dim`, or of `iota(dtype, n)`."""
    if not isinstance(expr, cst.Call):
        return None
    args = [a.value for a in expr.args if a.keyword is None]
    if is_call_to(expr, "broadcasted_iota") and len(args) == 3 and isinstance(args[2], cst.Integer):
        shape, dim = args[1], int(args[2].value)
        if isinstance(shape, cst.Tuple) and dim < len(shape.elements):
            return _atom(code(shape.elements[dim].value))
        return f"{_atom(code(shape))}[{dim}]"
    if is_call_to(expr, "iota") and len(args) == 2:
        return _atom(code(args[1]))
    return None


def _scalar(expr: cst.BaseExpression, env: dict[str, cst.BaseExpression], depth: int = 0) -> bool:
    """`expr` is one scalar per grid step: program ids, literals, names bound to such values (or not bound in the
    kernel: parameters bound by `functools.partial`, module constants), attributes, arithmetic on them."""
    if depth > 20:
        return False
    if isinstance(expr, cst.Integer | cst.Float):
        return True
    if isinstance(expr, cst.Name):
        return expr.value not in env or _scalar(env[expr.value], env, depth + 1)
    if isinstance(expr, cst.Attribute):
        return True
    if isinstance(expr, cst.BinaryOperation):
        return _scalar(expr.left, env, depth + 1) and _scalar(expr.right, env, depth + 1)
    if isinstance(expr, cst.Call):
        return any(is_call_to(expr, f) for f in SCALAR_CALLS) and all(
            isinstance(a.value, cst.Integer) for a in expr.args
        )
    return False


def _visible(base: str, before: list[cst.BaseStatement], kernel: cst.FunctionDef) -> bool:
    """Every name `base` reads is a kernel parameter, bound by a kernel statement in `before`, or not bound in the
    kernel at all (a module constant, a name the kernel's closure holds)."""
    params = {p.name.value for p in kernel.params.params}
    bound_before, bound = Scope.of(before).bound, Scope.of(statements(kernel)).bound
    return all(n in params or n in bound_before or n not in bound for n in used_names(cst.parse_expression(base)))


def _feeding(stmts: list[cst.BaseStatement], at: int, guard_names: set[str]) -> list[cst.BaseStatement]:
    """The statements just before `stmts[at]` that bind one name read only by later ones of them and by the update:
    they move under the guard (the dot a skipped step does not need)."""
    moved: list[cst.BaseStatement] = []
    later = stmts[at + 1 :]
    for s in reversed(stmts[:at]):
        if not (isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1 and isinstance(s.body[0], cst.Assign)):
            break
        targets = s.body[0].targets
        if len(targets) != 1 or not m.matches(targets[0].target, m.Name()):
            break
        name = targets[0].target.value  # type: ignore[attr-defined]
        if name in guard_names or any(name in used_names(t) for t in later):
            break
        moved.insert(0, s)
    return moved
