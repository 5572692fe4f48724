"""Index arithmetic of a Triton kernel as affine forms over program ids and `tl.arange` vectors.

`pid * BLOCK + tl.arange(0, BLOCK)` is {"pid0": "BLOCK", "ar:BLOCK": "1"}; a name bound to a loaded value has no
affine form, which is how data-dependent pointer chasing is recognised.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from .source import code


@dataclass(frozen=True)
class Affine:
    """sum(coef * source) + const; coefficients and const are source text (evaluated in the launcher's scope)."""

    terms: tuple[tuple[str, str], ...] = ()  # (source, coef): source "pid0".."pid2" or "ar:SIZE"
    const: str | None = None

    def coef(self, source: str) -> str | None:
        return dict(self.terms).get(source)

    def sources(self) -> tuple[str, ...]:
        return tuple(s for s, _ in self.terms)

    def aranges(self) -> tuple[str, ...]:
        return tuple(s[3:] for s, _ in self.terms if s.startswith("ar:"))


def _add(a: Affine, b: Affine, sign: str = "+") -> Affine:
    terms = dict(a.terms)
    for s, c in b.terms:
        c = c if sign == "+" else f"-({c})"
        terms[s] = f"({terms[s]}) + ({c})" if s in terms else c
    if b.const is None:
        const = a.const
    elif a.const is None:
        const = b.const if sign == "+" else f"-({b.const})"
    else:
        const = f"({a.const}) {sign} ({b.const})"
    return Affine(tuple(terms.items()), const)


def _scale(a: Affine, k: str) -> Affine:
    def mul(c: str) -> str:
        return k if c == "1" else (c if k == "1" else f"({c}) * ({k})")

    return Affine(tuple((s, mul(c)) for s, c in a.terms), None if a.const is None else mul(a.const))


@dataclass
class IndexEnv:
    """What the affine evaluator knows: names bound to index forms, names that hold data, scalar names."""

    forms: dict[str, Affine] = field(default_factory=dict)
    data: set[str] = field(default_factory=set)


def _int_arg(call: cst.Call, pos: int, kw: str) -> cst.BaseExpression | None:
    for i, a in enumerate(call.args):
        if (a.keyword is None and i == pos) or (a.keyword is not None and a.keyword.value == kw):
            return a.value
    return None


def affine(e: cst.BaseExpression, env: IndexEnv) -> Affine | None:
    """The affine form of `e`, or None (not affine, or it depends on loaded data)."""
    if isinstance(e, cst.Integer):
        return Affine(const=e.value)
    if isinstance(e, cst.Name):
        if e.value in env.forms:
            return env.forms[e.value]
        if e.value in env.data:
            return None
        return Affine(const=e.value)
    if isinstance(e, cst.Call):
        f = code(e.func)
        if f in ("tl.program_id", "triton.language.program_id"):
            axis = _int_arg(e, 0, "axis")
            if isinstance(axis, cst.Integer):
                return Affine((("pid" + axis.value, "1"),))
            return None
        if f in ("tl.arange", "triton.language.arange"):
            start, end = _int_arg(e, 0, "start"), _int_arg(e, 1, "end")
            if start is None or end is None:
                return None
            size = code(end)
            ar = Affine(((f"ar:{size}", "1"),))
            return ar if code(start) == "0" else _add(ar, Affine(const=code(start)))
        if f in ("tl.cast", "triton.language.cast") and e.args:
            return affine(e.args[0].value, env)
        if isinstance(e.func, cst.Attribute) and e.func.attr.value in ("to", "cast") and e.func.value is not None:
            return affine(e.func.value, env)
        return None
    if isinstance(e, cst.BinaryOperation):
        a, b = affine(e.left, env), affine(e.right, env)
        if a is None or b is None:
            return None
        if isinstance(e.operator, cst.Add):
            return _add(a, b)
        if isinstance(e.operator, cst.Subtract):
            return _add(a, b, "-")
        if isinstance(e.operator, cst.Multiply):
            if not b.terms and b.const is not None:
                return _scale(a, b.const)
            if not a.terms and a.const is not None:
                return _scale(b, a.const)
        if not a.terms and not b.terms and a.const is not None and b.const is not None:
            return Affine(const=code(e))
        return None
    if isinstance(e, cst.UnaryOperation) and isinstance(e.operator, cst.Minus):
        u = affine(e.expression, env)
        return None if u is None else _scale(u, "-1")
    return None


def names_in(text: str) -> set[str]:
    """The bare names a piece of source text reads."""
    found: set[str] = set()

    class _V(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            found.add(node.value)

        def visit_Attribute(self, node: cst.Attribute) -> bool:
            node.value.visit(self)
            return False

    cst.parse_expression(text).visit(_V())
    return found
