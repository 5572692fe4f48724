"""Block masks read from a kernel body: `jnp.where(cond, x, fill)` whose `cond` compares integer indices built as
`program_id * block + iota (+ offsets)`, turned into "does this grid step's block hold any unmasked element".

Each side of a comparison is read as a linear form: iota terms (unit coefficients over one block dimension each),
program-id terms (coefficient source text) and constant terms (source text). Over one block an iota ranges over
[0, extent - 1], so the largest value of `right - left` is a closed form in the program ids; a constraint that cannot
hold anywhere in the block marks it fully masked. For a conjunction each constraint is tested on its own: that is a
necessary condition for the block to hold an unmasked element, so a block is only ever called masked when it is.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import libcst as cst
import libcst.matchers as m

from ..pyparse import parse_expression
from .matchers import code

Term = tuple[int, str]  # (sign, source text)


def _atom(text: str) -> str:
    """`text` parenthesized unless it is a name, a number or an attribute chain."""
    t = text.strip()
    return t if t.replace(".", "").replace("_", "").isalnum() else f"({t})"


@dataclass(frozen=True)
class Lin:
    """A linear integer form: sum of iota terms, program-id terms and constant terms."""

    iotas: tuple[tuple[int, int, str | None], ...] = ()  # (block dim, sign, extent text or None)
    pids: tuple[tuple[int, int, str], ...] = ()  # (grid axis, sign, coefficient text)
    consts: tuple[Term, ...] = ()
    names: frozenset[str] = frozenset()  # free names the constant and coefficient texts use

    def neg(self) -> Lin:
        return Lin(
            tuple((d, -s, e) for d, s, e in self.iotas),
            tuple((a, -s, c) for a, s, c in self.pids),
            tuple((-s, t) for s, t in self.consts),
            self.names,
        )

    def plus(self, other: Lin) -> Lin:
        return Lin(
            self.iotas + other.iotas, self.pids + other.pids, self.consts + other.consts, self.names | other.names
        )

    def scaled(self, factor: str, names: frozenset[str]) -> Lin | None:
        if self.iotas:
            return None  # a scaled iota would not cover every integer of its range
        f = _atom(factor)
        return Lin(
            (),
            tuple((a, s, f if c == "1" else f"{_atom(c)} * {f}") for a, s, c in self.pids),
            tuple((s, f"{_atom(t)} * {f}") for s, t in self.consts),
            self.names | names,
        )

    @property
    def is_const(self) -> bool:
        return not self.iotas and not self.pids


@dataclass(frozen=True)
class Constraint:
    """`form >= 0` somewhere in the block."""

    form: Lin


@dataclass(frozen=True)
class Mask:
    """A parsed mask condition: an and/or tree of constraints."""

    op: str  # "and" | "or" | "leaf"
    parts: tuple[Mask, ...] = ()
    leaf: Constraint | None = None

    def constraints(self) -> tuple[Constraint, ...]:
        if self.leaf is not None:
            return (self.leaf,)
        return tuple(c for p in self.parts for c in p.constraints())

    def substituted(self, values: Mapping[str, str]) -> Mask:
        """The mask with constant (and coefficient) terms that are exactly a name in `values` replaced by its text."""

        def sub(t: str) -> str:
            return values.get(t, t)  # the sum and product writers parenthesize compound texts

        if self.leaf is not None:
            f = self.leaf.form
            form = replace(
                f,
                pids=tuple((a, s, sub(c)) for a, s, c in f.pids),
                consts=tuple((s, sub(t)) for s, t in f.consts),
            )
            return replace(self, leaf=Constraint(form))
        return replace(self, parts=tuple(p.substituted(values) for p in self.parts))

    @property
    def conjunctive(self) -> bool:
        return self.op != "or" and all(p.conjunctive for p in self.parts)


class Reader:
    """Reads linear forms out of kernel-body expressions. `env` maps kernel locals (assigned once) to their value."""

    def __init__(
        self,
        env: Mapping[str, cst.BaseExpression],
        is_call: Callable[[cst.BaseExpression, str], bool],
        indices: Mapping[str, int] | None = None,
    ):
        """`indices`: names that stand for a block index along a pseudo axis, read like `program_id(axis)` (a loop
        counter over chunks, `fori_loop`'s index: see passes/skip_masked_chunks.py)."""
        self.env = env
        self.is_call = is_call
        self.indices = dict(indices or {})
        self.depth = 0

    def lin(self, e: cst.BaseExpression) -> Lin | None:
        self.depth += 1
        try:
            return self._lin(e) if self.depth < 40 else None
        finally:
            self.depth -= 1

    def _lin(self, e: cst.BaseExpression) -> Lin | None:
        if isinstance(e, cst.Integer):
            return Lin(consts=((1, e.value),))
        if isinstance(e, cst.Name):
            if e.value in self.indices:
                return Lin(pids=((self.indices[e.value], 1, "1"),))
            if e.value in self.env:
                form = self.lin(self.env[e.value])
                return _paired(form) if form is not None else None
            return Lin(consts=((1, e.value),), names=frozenset({e.value}))
        if isinstance(e, cst.UnaryOperation) and isinstance(e.operator, cst.Minus):
            inner = self.lin(e.expression)
            return inner.neg() if inner else None
        if isinstance(e, cst.BinaryOperation):
            a, b = self.lin(e.left), self.lin(e.right)
            if a is None or b is None:
                return None
            if isinstance(e.operator, cst.Add):
                return a.plus(b)
            if isinstance(e.operator, cst.Subtract):
                return a.plus(b.neg())
            if isinstance(e.operator, cst.Multiply):
                if b.is_const and not a.is_const:
                    return a.scaled(_const_text(b), b.names)
                if a.is_const and not b.is_const:
                    return b.scaled(_const_text(a), a.names)
                if a.is_const and b.is_const:
                    return Lin(consts=((1, code(e)),), names=a.names | b.names)
            if a.is_const and b.is_const and isinstance(e.operator, cst.FloorDivide):
                return Lin(consts=((1, code(e)),), names=a.names | b.names)
            return None
        if isinstance(e, cst.Call):
            args = [a.value for a in e.args]
            if self.is_call(e, "program_id") and len(args) == 1 and isinstance(args[0], cst.Integer):
                return Lin(pids=((int(args[0].evaluated_value), 1, "1"),))
            if self.is_call(e, "broadcasted_iota") and len(args) == 3 and isinstance(args[2], cst.Integer):
                dim = int(args[2].evaluated_value)
                return Lin(iotas=((dim, 1, self._extent(args[1], dim)),))
            return None
        if isinstance(e, cst.Attribute | cst.Subscript):
            # e.g. `s_ref.shape[2]`: a static value; free names are the refs and locals it reads
            if any(self.is_call(c, "program_id") for c in m.findall(e, m.Call()) if isinstance(c, cst.Call)):
                return None
            names = frozenset(n.value for n in m.findall(e, m.Name()) if isinstance(n, cst.Name))
            if names & set(self.env):
                return None
            return Lin(consts=((1, code(e)),), names=names)
        return None

    def _extent(self, shape: cst.BaseExpression, dim: int) -> str | None:
        while isinstance(shape, cst.Name) and shape.value in self.env:
            shape = self.env[shape.value]
        if isinstance(shape, cst.Tuple) and dim < len(shape.elements):
            el = shape.elements[dim].value
            form = self.lin(el)
            if form is not None and form.is_const and not (form.names & set(self.env)):
                return _const_text(form)
        return None

    def side(self, e: cst.BaseExpression) -> Lin | None:
        """One side of a comparison, with every iota's extent known (else None)."""
        form = self.lin(e)
        form = _paired(form) if form is not None else None
        if form is None or any(ext is None for _, _, ext in form.iotas):
            return None
        return form

    def mask(self, e: cst.BaseExpression) -> Mask | None:
        while isinstance(e, cst.Name) and e.value in self.env:
            e = self.env[e.value]
        if isinstance(e, cst.BinaryOperation) and isinstance(e.operator, cst.BitAnd | cst.BitOr):
            op = "and" if isinstance(e.operator, cst.BitAnd) else "or"
            return self._combine(op, (e.left, e.right))
        if isinstance(e, cst.Call) and (self.is_call(e, "logical_and") or self.is_call(e, "logical_or")):
            op = "and" if self.is_call(e, "logical_and") else "or"
            return self._combine(op, tuple(a.value for a in e.args))
        if isinstance(e, cst.Comparison) and len(e.comparisons) == 1:
            left, right = self.side(e.left), self.side(e.comparisons[0].comparator)
            if left is None or right is None:
                return None
            cmp_op = e.comparisons[0].operator
            one = Lin(consts=((1, "1"),))
            forms: list[Lin]
            if isinstance(cmp_op, cst.LessThanEqual):
                forms = [right.plus(left.neg())]
            elif isinstance(cmp_op, cst.LessThan):
                forms = [right.plus(left.neg()).plus(one.neg())]
            elif isinstance(cmp_op, cst.GreaterThanEqual):
                forms = [left.plus(right.neg())]
            elif isinstance(cmp_op, cst.GreaterThan):
                forms = [left.plus(right.neg()).plus(one.neg())]
            elif isinstance(cmp_op, cst.Equal):
                forms = [left.plus(right.neg()), right.plus(left.neg())]
            else:
                return None
            if not all(f.iotas or f.pids for f in forms):
                return None
            leaves = tuple(Mask("leaf", leaf=Constraint(f)) for f in forms)
            return leaves[0] if len(leaves) == 1 else Mask("and", leaves)
        return None

    def _combine(self, op: str, items: tuple[cst.BaseExpression, ...]) -> Mask | None:
        parts = [self.mask(x) for x in items]
        if any(p is None for p in parts) or len(parts) < 2:
            return None
        return Mask(op, tuple(p for p in parts if p is not None))


def _paired(form: Lin) -> Lin:
    """An iota of unknown extent (`iota(..., s.shape, d)`) in an index of the form `program_id(a) * block + iota`
    takes the program id's coefficient as its extent: the iota spans one block."""
    if len(form.iotas) == 1 and form.iotas[0][2] is None and len(form.pids) == 1 and form.pids[0][1] == 1:
        d, s, _ = form.iotas[0]
        return replace(form, iotas=((d, s, form.pids[0][2]),))
    return form


def _const_text(form: Lin) -> str:
    return _sum_text(list(form.consts))


def _sum_text(terms: list[Term]) -> str:
    out = ""
    for s, t in terms:
        t = _atom(t) if ("+" in t or "-" in t) else t
        if not out:
            out = t if s > 0 else f"-{_atom(t)}"
        else:
            out += f" + {t}" if s > 0 else f" - {t}"
    return out or "0"


def max_text(form: Lin, pid_text: Callable[[int], str]) -> str:
    """Source text of the largest value `form` takes over one block (program ids fixed)."""
    terms: list[Term] = []
    for a, s, c in form.pids:
        p = pid_text(a)
        terms.append((s, p if c == "1" else f"{p} * {_atom(c)}"))
    terms += list(form.consts)
    for _d, s, ext in form.iotas:
        if s > 0:
            assert ext is not None
            terms += [(1, ext), (-1, "1")]
        else:
            pass  # -iota is at most 0
    return _sum_text(_fold_ones(terms))


def _fold_ones(terms: list[Term]) -> list[Term]:
    """Merge the literal `1` terms into one integer (kept last)."""
    n = sum(s for s, t in terms if t == "1")
    rest = [(s, t) for s, t in terms if t != "1"]
    if n:
        rest.append((1 if n > 0 else -1, str(abs(n))))
    return rest


def needed_text(mask: Mask, pid_text: Callable[[int], str]) -> str:
    """Source text of "this block may hold an unmasked element" (a necessary condition, never a false skip)."""
    if mask.leaf is not None:
        return f"{max_text(mask.leaf.form, pid_text)} >= 0"
    joiner = " & " if mask.op == "and" else " | "
    return joiner.join(f"({needed_text(p, pid_text)})" for p in mask.parts)


def bound_on_axis(
    c: Constraint, axis: int, sign_of: Callable[[str], int | None], pid_text: Callable[[int], str]
) -> tuple[str, str] | None:
    """The bound constraint `c` puts on the block index along grid axis `axis`: ("lo"|"hi", source text), from
    `a * j + rest >= 0` with `rest` the block's largest value of the other terms. None when `c` does not involve the
    axis, the axis appears more than once, or the coefficient's sign is unknown."""
    on = [(s, t) for a, s, t in c.form.pids if a == axis]
    if len(on) != 1:
        return None
    s, coef = on[0]
    if sign_of(coef) != 1:
        return None  # only positive block strides (a module constant such as BLOCK_K, or a literal)
    rest = max_text(replace(c.form, pids=tuple(p for p in c.form.pids if p[0] != axis)), pid_text)
    k = _atom(coef)
    if s > 0:  # k*j + rest >= 0  <=>  j >= ceil(-rest / k) = -(rest // k)
        return "lo", f"-({_atom(rest)} // {k})" if coef != "1" else f"-{_atom(rest)}"
    return "hi", f"{_atom(rest)} // {k}" if coef != "1" else rest  # rest - k*j >= 0  <=>  j <= rest // k


def clamp_text(
    j: str,
    mask: Mask,
    axis: int,
    sign_of: Callable[[str], int | None],
    pid_text: Callable[[int], str],
    pl: str,
    jnp: str,
) -> str | None:
    """Source text of block index `j` along grid axis `axis` clamped into the range of blocks `mask` needs for the
    other axes' indices (`pid_text`): `jnp.maximum` / `jnp.minimum` with each constraint's bound (`bound_on_axis`),
    then kept on the grid for rows with no needed block (a lone `min(j, hi)` stays <= j, `max(j, lo)` >= j). A step
    outside the range repeats the index of the nearest needed one, so the pipeline issues no DMA for it. None when no
    constraint bounds the axis."""
    bounds = [bound_on_axis(c, axis, sign_of, pid_text) for c in mask.constraints()]
    los = [b[1] for b in bounds if b is not None and b[0] == "lo"]
    his = [b[1] for b in bounds if b is not None and b[0] == "hi"]
    if not (los or his):
        return None
    expr = j
    for lo in los:
        expr = f"{jnp}.maximum({expr}, {lo})"
    for hi in his:
        expr = f"{jnp}.minimum({expr}, {hi})"
    if his:
        expr = f"{jnp}.maximum({expr}, 0)"
    if los:
        expr = f"{jnp}.minimum({expr}, {pl}.num_programs({axis}) - 1)"
    return expr


_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
}


def neutral_fill(fill: cst.BaseExpression, namespace: Mapping[str, Any]) -> bool:
    """`fill` is 0 or a large negative constant: a fully masked block then adds nothing to a sum or an online-softmax
    accumulator, so skipping it changes no result."""
    value = static_value(code(fill), namespace)
    return isinstance(value, int | float) and (value == 0 or value <= -1e9)


def static_value(text: str, namespace: Mapping[str, Any]) -> Any:
    """The value of a constant expression (literals, module names and their attributes, + - * //, unary minus)
    in a loaded module's namespace, without running code; None when it is anything else."""
    try:
        tree = parse_expression(text.strip()).body
    except SyntaxError:
        return None

    def ev(n: ast.expr) -> Any:
        if isinstance(n, ast.Constant) and isinstance(n.value, int | float):
            return n.value
        if isinstance(n, ast.Name):
            if n.id not in namespace:
                raise KeyError(n.id)
            return namespace[n.id]
        if isinstance(n, ast.Attribute):
            return getattr(ev(n.value), n.attr)
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return -ev(n.operand)
        if isinstance(n, ast.BinOp) and type(n.op) in _BINOPS:
            return _BINOPS[type(n.op)](ev(n.left), ev(n.right))
        raise ValueError(ast.dump(n))

    try:
        value = ev(tree)
    except (KeyError, ValueError, AttributeError, TypeError, ZeroDivisionError):
        return None
    return value if isinstance(value, int | float) else None
